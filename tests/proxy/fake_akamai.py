#!/usr/bin/env python3
"""A faithful fake of Akamai Cloud's (Linode's) metadata service.

What it follows, from Akamai's documentation ("Use the Metadata service API") and Akamai's own
client (linode/py-metadata):
  https://techdocs.akamai.com/cloud-computing/docs/metadata-service-api
- Every request but the token's carries `Metadata-Token: <token>`, a token this service
  minted and that has not expired; without one: 401.
- `PUT /v1/token` with `Metadata-Token-Expiry-Seconds` (1 to 86400 here) mints a token; the
  answer is the token as text, or a JSON array holding it when the request asks for
  `Accept: application/json`. Without the header: 400.
- `GET /v1/instance` (id, host_uuid, label, region, type, tags, specs, backups),
  `/v1/network` (interfaces, ipv4, ipv6), `/v1/ssh-keys` (users and their public keys) and
  `/v1/user-data` (base64). Each answers text by default, one `key: value` line a field
  (nested fields dotted, list items indexed, a list of words repeated on lines of one key),
  and JSON to `Accept: application/json`.
- Only GET/HEAD are served besides the token's PUT; other methods 405.

User data and the SSH keys count as credentials in the log (fakemeta.py) and carry
fakemeta.LEAK_MARKER; so do the user-set tags (in every instance answer that holds them).

    fake_akamai.py --port 80 --log FILE
"""

import base64
import secrets
import threading
import time

from fakemeta import LEAK_MARKER, Answer, Fake, json_answer, serve

INSTANCE = {
    "id": 52781014,
    "host_uuid": "3f7d5ee4a8b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5",
    "label": "natguard-node-0",
    "region": "us-ord",
    "type": "g6-standard-2",
    "tags": ["team-a", f"{LEAK_MARKER}-tag"],
    "specs": {"vcpus": 2, "memory": 4096, "gpus": 0, "transfer": 4000, "disk": 81920},
    "backups": {"enabled": False, "status": None},
}
NETWORK = {
    "interfaces": [{"purpose": "public", "label": None, "ipam_address": None}],
    "ipv4": {"public": ["172.232.10.5/32"], "private": [], "shared": []},
    "ipv6": {"slaac": "2600:3c06::f03c:95ff:fe12:3456/128", "ranges": [],
             "link_local": "fe80::f03c:95ff:fe12:3456/64", "shared_ranges": []},
}
SSH_KEYS = {"users": {"root": [f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5{LEAK_MARKER} ops"]}}
USER_DATA = f"#cloud-config\nruncmd:\n- echo {LEAK_MARKER} > /root/secret\n"


def _lines(prefix, v):
    """Akamai's text form of a JSON value: `key: value` a line."""
    if isinstance(v, dict):
        return [l for k, x in v.items() for l in _lines(f"{prefix}.{k}" if prefix else k, x)]
    if isinstance(v, list):
        if all(isinstance(x, str) for x in v):
            return [f"{prefix}: {x}" for x in v]
        return [l for i, x in enumerate(v) for l in _lines(f"{prefix}[{i}]", x)]
    if v is None:
        return []
    if isinstance(v, bool):
        v = "true" if v else "false"
    return [f"{prefix}: {v}"]


def _doc(req, obj, credential):
    if (req.headers.get("Accept") or "").strip().lower() == "application/json":
        return json_answer(200, obj, credential=credential)
    return Answer(200, "\n".join(_lines("", obj)) + "\n", credential=credential)


class Akamai(Fake):
    """Akamai Cloud's (Linode's) metadata service: a token first, then text or JSON."""

    def __init__(self):
        self.tokens = {}
        self.lock = threading.Lock()

    def answer(self, req):
        if req.path == "/v1/token":
            if req.method != "PUT":
                return Answer(405, "", headers={"Allow": "PUT"})
            ttl = req.headers.get("Metadata-Token-Expiry-Seconds")
            if ttl is None or not ttl.isdigit() or not 1 <= int(ttl) <= 86400:
                return json_answer(400, {"errors": [{"reason": "Metadata-Token-Expiry-Seconds "
                                                               "must be 1 to 86400"}]})
            t = secrets.token_urlsafe(32)
            with self.lock:
                self.tokens[t] = time.monotonic() + int(ttl)
            if (req.headers.get("Accept") or "").strip().lower() == "application/json":
                return json_answer(200, [t])
            return Answer(200, t)
        with self.lock:
            until = self.tokens.get(req.headers.get("Metadata-Token") or "")
        if until is None or until < time.monotonic():
            return json_answer(401, {"errors": [{"reason": "Unauthorized"}]})
        if req.method not in ("GET", "HEAD"):
            return Answer(405, "", headers={"Allow": "GET, HEAD"})
        if req.path == "/v1/instance":
            return _doc(req, INSTANCE, credential=True)
        if req.path == "/v1/network":
            return _doc(req, NETWORK, credential=False)
        if req.path == "/v1/ssh-keys":
            return _doc(req, SSH_KEYS, credential=True)
        if req.path == "/v1/user-data":
            return Answer(200, base64.b64encode(USER_DATA.encode()).decode(), credential=True)
        return json_answer(404, {"errors": [{"reason": "Not found"}]})


if __name__ == "__main__":
    serve(Akamai())
