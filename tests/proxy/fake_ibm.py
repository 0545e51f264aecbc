#!/usr/bin/env python3
"""A faithful fake of IBM Cloud VPC's metadata service.

What it follows, from IBM's documentation (VPC, "Accessing metadata", "Identity operations"
and the VPC Metadata and Identity API references):
  https://cloud.ibm.com/docs/vpc?topic=vpc-imd-about
  https://cloud.ibm.com/docs/vpc?topic=vpc-imd-identity-operations
  https://cloud.ibm.com/apidocs/vpc-metadata
- Every request carries `version=YYYY-MM-DD` (2022-03-01 or later here); without it: 400.
- `PUT /instance_identity/v1/token?version=...` (and `/identity/v1/token`) with
  `Metadata-Flavor: ibm` (else 400) and an optional JSON body whose `expires_in` is 5 to 3600
  (300 without it; else 400) answers JSON: `access_token`, `created_at`, `expires_at`,
  `expires_in`.
- Every other request carries `Authorization: Bearer <token>` with a token it minted that has
  not expired; without one: 401. `GET /metadata/v1/instance` answers the instance (id, crn,
  name, profile, zone, vpc, image, resource_group, vcpu, memory, network interfaces),
  `/metadata/v1/instance/network_interfaces` its interfaces, `/metadata/v1/placement_groups`
  its placement groups, `/metadata/v1/instance/initialization` the SSH keys, user accounts and
  default trusted profile it was created with, `/metadata/v1/keys` the SSH keys.
  `POST /instance_identity/v1/iam_token` trades the token for an IAM access token.

The initialization data, the keys and IAM tokens count as credentials in the log (fakemeta.py)
and carry fakemeta.LEAK_MARKER.

    fake_ibm.py --port 80 --log FILE
"""

import json
import re
import secrets
import threading
import time
from datetime import datetime, timedelta, timezone

from fakemeta import LEAK_MARKER, Answer, Fake, json_answer, serve

INSTANCE = {
    "id": "0717_5f6e7d8c-1a2b-3c4d-5e6f-7a8b9c0d1e2f",
    "crn": "crn:v1:bluemix:public:is:eu-de-2:a/123456::instance:0717_5f6e7d8c",
    "name": "natguard-node-0",
    "profile": {"name": "bx2-2x8"},
    "zone": {"name": "eu-de-2"},
    "vpc": {"id": "r010-1a2b3c4d", "name": "natguard-vpc"},
    "image": {"id": "r010-5e6f7a8b", "name": "ibm-debian-12"},
    "resource_group": {"id": "0be5ad401ae913d8ff665d92680664ed", "name": "default"},
    "vcpu": {"architecture": "amd64", "count": 2},
    "memory": 8,
    "network_interfaces": [{"id": "0717-aaaa", "name": "eth0",
                            "primary_ip": {"address": "10.243.0.5"}}],
}
INITIALIZATION = {
    "keys": [{"id": "r010-key", "name": "ops", "public_key": f"ssh-ed25519 AAAA{LEAK_MARKER}"}],
    "user_accounts": [{"resource_type": "host_user_account", "username": "root",
                       "encrypted_password": f"{LEAK_MARKER}"}],
    "default_trusted_profile": {"target": {"id": "Profile-9fd84246", "name": f"{LEAK_MARKER}"}},
}
KEYS = {"keys": INITIALIZATION["keys"]}
PLACEMENT = {"placement_groups": [{"id": "r010-pg", "name": "spread", "strategy": "host_spread"}]}
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
TOKEN_PATHS = ("/instance_identity/v1/token", "/identity/v1/token")


def _error(status, code, message):
    return json_answer(status, {"errors": [{"code": code, "message": message}]})


def _stamp(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class Ibm(Fake):
    """IBM Cloud VPC's metadata service."""

    def __init__(self):
        self.tokens = {}
        self.lock = threading.Lock()

    def answer(self, req):
        version = req.q("version")
        if version is None or not DATE.match(version) or version < "2022-03-01":
            return _error(400, "bad_request", "version=YYYY-MM-DD (2022-03-01 or later) required")
        if req.path in TOKEN_PATHS:
            if req.method != "PUT":
                return Answer(405, "", headers={"Allow": "PUT"})
            if req.headers.get("Metadata-Flavor") != "ibm":
                return _error(400, "missing_metadata_flavor", "Metadata-Flavor: ibm required")
            ttl = 300
            if req.body:
                try:
                    body = json.loads(req.body)
                    ttl = body.get("expires_in", 300)
                except (ValueError, AttributeError):
                    return _error(400, "bad_request", "the body is not a JSON object")
            if not isinstance(ttl, int) or not 5 <= ttl <= 3600:
                return _error(400, "bad_request", "expires_in must be 5 to 3600")
            t = secrets.token_urlsafe(48)
            with self.lock:
                self.tokens[t] = time.monotonic() + ttl
            now = datetime.now(timezone.utc)
            return json_answer(200, {"access_token": t, "created_at": _stamp(now),
                                     "expires_at": _stamp(now + timedelta(seconds=ttl)),
                                     "expires_in": ttl})
        auth = req.headers.get("Authorization") or ""
        with self.lock:
            until = self.tokens.get(auth[len("Bearer "):] if auth.startswith("Bearer ") else "")
        if until is None or until < time.monotonic():
            return _error(401, "missing_authorization", "Authorization: Bearer <token> required")
        if req.path == "/instance_identity/v1/iam_token" and req.method == "POST":
            return json_answer(200, {"access_token": f"eyJ{LEAK_MARKER}", "expires_in": 3600},
                               credential=True)
        if req.method not in ("GET", "HEAD"):
            return Answer(405, "", headers={"Allow": "GET, HEAD"})
        docs = {
            "/metadata/v1/instance": (INSTANCE, False),
            "/metadata/v1/instance/network_interfaces":
                ({"network_interfaces": INSTANCE["network_interfaces"]}, False),
            "/metadata/v1/placement_groups": (PLACEMENT, False),
            "/metadata/v1/instance/initialization": (INITIALIZATION, True),
            "/metadata/v1/keys": (KEYS, True),
        }
        if req.path in docs:
            doc, secret = docs[req.path]
            return json_answer(200, doc, credential=secret)
        return _error(404, "not_found", "not found")


if __name__ == "__main__":
    serve(Ibm())
