#!/usr/bin/env python3
"""A faithful fake of Scaleway's instance metadata API.

What it follows, from Scaleway's documentation (Instances, "Using the instance metadata" and
the user data API) and the Instance API's `Metadata` object (scaleway-sdk-go, api/instance/v1):
  https://www.scaleway.com/en/docs/instances/how-to/use-instance-metadata/
  https://www.scaleway.com/en/developers/api/instance/user-data
- Plain GETs, no token. `/conf` answers the instance as shell variables, one `KEY=VALUE` a
  line (lists as `KEY=N` then `KEY_i=...` or `KEY_i_FIELD=...`); `/conf?format=json` answers
  the same as one JSON document (id, name, hostname, commercial_type, zone, project,
  organization, location, public_ip, private_ip, ipv6, ssh_public_keys, tags, volumes, ...).
- `/user_data` lists the user data keys, `/user_data/<key>` answers one (Scaleway serves them
  only to a client whose source port is below 1024).
- Only GET/HEAD are served; other methods 405.

The SSH keys, the user-set tags and user data count as credentials in the log (fakemeta.py) and
carry fakemeta.LEAK_MARKER.

    fake_scaleway.py --port 80 --log FILE [--json-always]
    (--json-always: `/conf` answers JSON even without `format=json`, an upstream that does not
    answer in the form asked)
"""

import sys

from fakemeta import LEAK_MARKER, Answer, Fake, json_answer, serve

CONF = {
    "id": "0b5a5a3c-6d5e-4f1a-9a2b-3c4d5e6f7a8b",
    "name": "natguard-node-0",
    "hostname": "natguard-node-0",
    "organization": "11111111-2222-3333-4444-555555555555",
    "project": "11111111-2222-3333-4444-555555555555",
    "commercial_type": "PRO2-XS",
    "zone": "fr-par-2",
    "state_detail": "booted",
    "location": {"zone_id": "par2", "platform_id": "14", "cluster_id": "27",
                 "hypervisor_id": "1101", "node_id": "9"},
    "public_ip": {"address": "51.15.200.10", "dynamic": False, "family": "inet"},
    "private_ip": "10.64.20.5",
    "ipv6": {"address": "2001:bc8:1210:4a2::1", "gateway": "2001:bc8:1210:4a2::", "netmask": "64"},
    "ssh_public_keys": [{"key": f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5{LEAK_MARKER} ops",
                         "fingerprint": "256 MD5:12:34:56:78 ops (ssh-ed25519)"}],
    "tags": ["team-a", f"{LEAK_MARKER}-tag"],
    "timezone": "Europe/Paris",
}
USER_DATA = {"cloud-init": f"#cloud-config\nruncmd:\n- echo {LEAK_MARKER} > /root/secret\n"}


def _shell(prefix, v):
    """Scaleway's shell form of a JSON value."""
    if isinstance(v, dict):
        return [l for k, x in v.items() for l in _shell(f"{prefix}_{k.upper()}", x)]
    if isinstance(v, list):
        out = [f"{prefix}={len(v)}"]
        for i, x in enumerate(v):
            out += _shell(f"{prefix}_{i}", x)
        return out
    if isinstance(v, bool):
        v = "True" if v else "False"
    s = str(v)
    return [f"{prefix}='{s}'" if " " in s else f"{prefix}={s}"]


def _conf_text():
    lines = []
    for k, v in CONF.items():
        lines += _shell(k.upper(), v)
    return "\n".join(lines) + "\n"


class Scaleway(Fake):
    """Scaleway's instance metadata API."""

    def __init__(self, json_always=False):
        self.json_always = json_always

    def answer(self, req):
        if req.method not in ("GET", "HEAD"):
            return Answer(405, "", headers={"Allow": "GET, HEAD"})
        if req.path == "/conf":
            if req.q("format") == "json" or self.json_always:
                return json_answer(200, CONF, credential=True)
            return Answer(200, _conf_text(), credential=True)
        if req.path in ("/user_data", "/user_data/"):
            return json_answer(200, {"user_data": list(USER_DATA)})
        if req.path.startswith("/user_data/") and req.path[len("/user_data/"):] in USER_DATA:
            return Answer(200, USER_DATA[req.path[len("/user_data/"):]], credential=True)
        return Answer(404, "Not Found\n")


if __name__ == "__main__":
    args = sys.argv[1:]
    json_always = "--json-always" in args
    serve(Scaleway(json_always=json_always), [a for a in args if a != "--json-always"])
