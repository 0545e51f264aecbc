#!/usr/bin/env python3
"""A faithful fake of DigitalOcean's droplet metadata API.

What it follows, from DigitalOcean's documentation ("Metadata API" reference and "How to
Retrieve Droplet Metadata"):
  https://docs.digitalocean.com/reference/api/metadata-api/
  https://docs.digitalocean.com/products/droplets/how-to/retrieve-droplet-metadata/
- Plain GETs, no token and no header. /metadata/v1.json answers the whole droplet as one JSON
  document (droplet_id, hostname, user_data, vendor_data, public_keys, region, interfaces,
  dns, tags, features, ...); /metadata/v1/ is the same tree as paths: a directory ends in "/"
  and lists its entries one per line (subdirectories with a trailing "/"), a leaf answers its
  value as text. id, hostname, user-data, vendor-data, public-keys, region,
  interfaces/{public,private}/0/{mac,type,ipv4/{address,netmask,gateway},anchor_ipv4/...},
  dns/nameservers, floating_ip/ and reserved_ip/ (ipv4/active), tags/, features/dhcp_enabled.
- Only GET/HEAD are served; other methods 405.

User data, vendor data and the whole document (which holds them) count as credentials in the
log (fakemeta.py) and carry fakemeta.LEAK_MARKER; so do the public keys.

    fake_digitalocean.py --port 80 --log FILE
"""

import json

from fakemeta import LEAK_MARKER, Answer, Fake, Secret, json_answer, serve


USER_DATA = Secret(f"#cloud-config\nruncmd:\n- echo {LEAK_MARKER} > /root/secret\n")
VENDOR_DATA = Secret(f"#cloud-config\ndisable_root: false\n# {LEAK_MARKER}\n")
PUBLIC_KEYS = Secret(f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5{LEAK_MARKER} ops")


def _iface(mac, address, netmask, gateway, anchor=None):
    iface = {"mac": mac, "type": "public" if anchor else "private",
             "ipv4": {"address": address, "netmask": netmask, "gateway": gateway}}
    if anchor:
        iface["anchor_ipv4"] = anchor
    return iface


# The tree in the order DigitalOcean's index lists it (dicts keep their order).
TREE = {
    "id": "2756294",
    "hostname": "sample-droplet",
    "user-data": USER_DATA,
    "vendor-data": VENDOR_DATA,
    "public-keys": PUBLIC_KEYS,
    "region": "nyc3",
    "interfaces": {
        "public": {"0": _iface("04:01:2a:0f:2a:01", "203.0.113.5", "255.255.240.0",
                               "203.0.113.1",
                               {"address": "10.17.0.5", "netmask": "255.255.0.0",
                                "gateway": "10.17.0.1"})},
        "private": {"0": _iface("04:01:2a:0f:2a:02", "10.132.0.5", "255.255.0.0",
                                "10.132.0.1")},
    },
    "dns": {"nameservers": "67.207.67.2\n67.207.67.3"},
    "floating_ip": {"ipv4": {"active": "false"}},
    "reserved_ip": {"ipv4": {"active": "false"}},
    "tags": {"k8s": "k8s", "k8s-worker": "k8s-worker"},
    "features": {"dhcp_enabled": "false"},
}


def _document():
    """/metadata/v1.json: the droplet as one document (numbers and lists where the API has
    them)."""
    def ifaces(kind):
        return [dict(v) for v in TREE["interfaces"][kind].values()]
    return {
        "droplet_id": int(TREE["id"]),
        "hostname": TREE["hostname"],
        "user_data": str(USER_DATA),
        "vendor_data": str(VENDOR_DATA),
        "public_keys": [str(PUBLIC_KEYS)],
        "auth_key": "",
        "region": TREE["region"],
        "interfaces": {"public": ifaces("public"), "private": ifaces("private")},
        "floating_ip": {"ipv4": {"active": False}},
        "reserved_ip": {"ipv4": {"active": False}},
        "dns": {"nameservers": TREE["dns"]["nameservers"].split("\n")},
        "tags": list(TREE["tags"]),
        "features": {"dhcp_enabled": False},
    }


NOT_FOUND = "404 page not found\n"


class Digitalocean(Fake):
    """DigitalOcean's droplet metadata API."""

    def answer(self, req):
        if req.method not in ("GET", "HEAD"):
            return Answer(405, "", headers={"Allow": "GET, HEAD"})
        if req.path == "/metadata/v1.json":
            return json_answer(200, _document(), credential=True)
        prefix = "/metadata/v1/"
        if not req.path.startswith(prefix):
            return Answer(404, NOT_FOUND)
        node = TREE
        for p in [p for p in req.path[len(prefix):].split("/") if p]:
            if not isinstance(node, dict) or p not in node:
                return Answer(404, NOT_FOUND)
            node = node[p]
        if isinstance(node, dict):
            return Answer(200, "".join(k + "/\n" if isinstance(v, dict) else k + "\n"
                                       for k, v in node.items()))
        return Answer(200, str(node), credential=isinstance(node, Secret))


if __name__ == "__main__":
    serve(Digitalocean())
