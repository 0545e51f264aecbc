#!/usr/bin/env python3
"""A faithful fake of Oracle Cloud Infrastructure's instance metadata service, IMDSv2.

What it follows, from Oracle's documentation (Compute, "Getting Instance Metadata" and
"Upgrading to the Instance Metadata Service v2"):
  https://docs.oracle.com/en-us/iaas/Content/Compute/Tasks/gettingmetadata.htm
  https://docs.oracle.com/en-us/iaas/Content/Compute/Tasks/upgradingtoimdsv2.htm
- Every request under /opc/v2/ carries `Authorization: Bearer Oracle`; without it (or with
  another value): 401. A request carrying `Forwarded`, `X-Forwarded-For` or
  `X-Forwarded-Host` is rejected (403). IMDSv1 (/opc/v1/) is disabled here, as on an instance
  with legacy endpoints turned off: 404.
- /opc/v2/instance/ answers the instance as one JSON document (availabilityDomain,
  canonicalRegionName, faultDomain, id, region, regionInfo, shape, shapeConfig, metadata with
  user_data and ssh_authorized_keys, freeformTags, ...); any key of it is a path of its own
  (/opc/v2/instance/region answers `phx` as text, an object answers JSON). /opc/v2/vnics/
  lists the VNICs (JSON), /opc/v2/vnics/0/privateIp one field. /opc/v2/identity/ holds the
  instance principal's cert.pem, intermediate.pem and key.pem.
- Only GET/HEAD are served; other methods 405.

The instance principal's key and certificates, user data and SSH keys (and so the whole
instance document, which holds them) count as credentials in the log (fakemeta.py) and carry
fakemeta.LEAK_MARKER; so do the user-set tags.

    fake_oracle.py --port 80 --log FILE
"""

import json

from fakemeta import LEAK_MARKER, Answer, Fake, json_answer, serve

USER_DATA = f"#cloud-config\nruncmd:\n- echo {LEAK_MARKER} > /root/secret\n"
METADATA = {
    "ssh_authorized_keys": f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5{LEAK_MARKER} opc",
    "user_data": USER_DATA,
}
INSTANCE = {
    "availabilityDomain": "Uocm:PHX-AD-1",
    "faultDomain": "FAULT-DOMAIN-2",
    "compartmentId": "ocid1.compartment.oc1..natguardtest",
    "displayName": "natguard-node-0",
    "hostname": "natguard-node-0",
    "id": "ocid1.instance.oc1.phx.natguardtest",
    "image": "ocid1.image.oc1.phx.natguardtest",
    "metadata": METADATA,
    "region": "phx",
    "canonicalRegionName": "us-phoenix-1",
    "ociAdName": "phx-ad-1",
    "regionInfo": {"realmKey": "oc1", "realmDomainComponent": "oraclecloud.com",
                   "regionKey": "PHX", "regionIdentifier": "us-phoenix-1"},
    "shape": "VM.Standard.E4.Flex",
    "shapeConfig": {"ocpus": 1.0, "memoryInGBs": 16.0, "networkingBandwidthInGbps": 1.0,
                    "maxVnicAttachments": 2},
    "state": "Running",
    "timeCreated": 1767600000000,
    "agentConfig": {"monitoringDisabled": False, "managementDisabled": False},
    "definedTags": {"Oracle-Tags": {"CreatedBy": "natguard-test"}},
    "freeformTags": {"owner": f"{LEAK_MARKER} tag"},
}
VNICS = [{
    "vnicId": "ocid1.vnic.oc1.phx.natguardtest",
    "privateIp": "10.0.0.5",
    "vlanTag": 0,
    "macAddr": "02:00:17:00:00:05",
    "virtualRouterIp": "10.0.0.1",
    "subnetCidrBlock": "10.0.0.0/24",
    "nicIndex": 0,
}]


def _pem(kind, body):
    return f"-----BEGIN {kind}-----\n{body}\n-----END {kind}-----\n"


IDENTITY = {
    "cert.pem": _pem("CERTIFICATE", "MIIDYjCCAkqgAwIBAgIRAN" + LEAK_MARKER),
    "intermediate.pem": _pem("CERTIFICATE", "MIIEaDCCA1CgAwIBAgIQ" + LEAK_MARKER),
    "key.pem": _pem("RSA PRIVATE KEY", "MIIEpAIBAAKCAQEA" + LEAK_MARKER),
}
FORWARDING = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host")
V2 = "/opc/v2/"


def _node_answer(node, credential):
    if isinstance(node, (dict, list)):
        return json_answer(200, node, credential=credential)
    return Answer(200, str(node), credential=credential)


class Oracle(Fake):
    """Oracle Cloud's instance metadata service, IMDSv2 (v1 disabled)."""

    def answer(self, req):
        if not req.path.startswith(V2):
            return json_answer(404, {"code": "NotFound", "message": "Not Found"})
        if any(req.headers.get(h) is not None for h in FORWARDING):
            return json_answer(403, {"code": "Forbidden",
                                     "message": "requests with forwarding headers are rejected"})
        if req.headers.get("Authorization") != "Bearer Oracle":
            return json_answer(401, {"code": "NotAuthenticated",
                                     "message": "Authorization: Bearer Oracle required"})
        if req.method not in ("GET", "HEAD"):
            return Answer(405, "", headers={"Allow": "GET, HEAD"})
        parts = [p for p in req.path[len(V2):].split("/") if p]
        if not parts:
            return Answer(200, "instance/\nvnics/\nidentity/\n")
        top, rest = parts[0], parts[1:]
        if top == "identity":
            if not rest:
                return Answer(200, "\n".join(IDENTITY) + "\n")
            if len(rest) == 1 and rest[0] in IDENTITY:
                return Answer(200, IDENTITY[rest[0]], credential=True)
            return json_answer(404, {"code": "NotFound", "message": "Not Found"})
        roots = {"instance": INSTANCE, "vnics": VNICS}
        if top not in roots:
            return json_answer(404, {"code": "NotFound", "message": "Not Found"})
        node = roots[top]
        secret = top == "instance" and (not rest or rest[0] in ("metadata", "freeformTags"))
        for p in rest:
            if isinstance(node, dict) and p in node:
                node = node[p]
            elif isinstance(node, list) and p.isdigit() and int(p) < len(node):
                node = node[int(p)]
            else:
                return json_answer(404, {"code": "NotFound", "message": "Not Found"})
        return _node_answer(node, secret)


if __name__ == "__main__":
    serve(Oracle())
