#!/usr/bin/env python3
"""A faithful fake of the Alibaba Cloud ECS instance metadata service (100.100.100.200).

What it follows, from Alibaba Cloud's documentation (ECS, "Instance metadata"):
  https://www.alibabacloud.com/help/en/ecs/user-guide/view-instance-metadata
  https://www.alibabacloud.com/help/en/ecs/user-guide/manage-instance-metadata (security
  hardening mode: tokens required)
  https://www.alibabacloud.com/help/en/ecs/user-guide/attach-an-instance-ram-role-to-an-ecs-instance
- Security hardening mode (the default here): a token from `PUT /latest/api/token` with
  `X-aliyun-ecs-metadata-token-ttl-seconds` (1 to 21600; missing or out of range: 400), sent
  back in `X-aliyun-ecs-metadata-token`; a request without a valid token gets 403. A token
  PUT carrying `X-Forwarded-For` is refused (403). Only GET (and the token PUT) are served.
- /latest/meta-data/: region-id, zone-id, instance-id, instance/instance-type, hostname,
  image-id, mac, network-type, private-ipv4, vpc-id, vswitch-id, ram/security-credentials/
  (the role's name) and ram/security-credentials/ROLE (AccessKeyId, AccessKeySecret,
  SecurityToken, Expiration, LastUpdated, Code); /latest/user-data;
  /latest/dynamic/instance-identity/document and pkcs7.

Role credentials and user data count as credentials in the log (fakemeta.py) and carry
fakemeta.LEAK_MARKER.

    fake_alibaba.py --port 80 --log FILE [--normal]   (--normal: tokens optional)
"""

import json
import secrets
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

from fakemeta import LEAK_MARKER, Answer, Fake, json_answer, serve

ROLE = "natguard-node-ram-role"
REGION = "cn-hangzhou"
ZONE = "cn-hangzhou-i"
MAX_TTL = 21600


def _cred(_path):
    now = datetime.now(timezone.utc)
    return json_answer(200, {
        "AccessKeyId": "STS.NGLEAK" + secrets.token_hex(8).upper(),
        "AccessKeySecret": LEAK_MARKER + secrets.token_urlsafe(22),
        "SecurityToken": LEAK_MARKER + secrets.token_urlsafe(300),
        "Expiration": (now + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "LastUpdated": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "Code": "Success",
    }, credential=True)


META = {
    "hostname": "iZbp1natguard0000000Z",
    "image-id": "aliyun_3_x64_20G_alibase_20240819.vhd",
    "instance": {"instance-type": "ecs.g7.large", "instance-name": "natguard-node"},
    "instance-id": "i-bp1natguard0000000",
    "mac": "00:16:3e:00:00:01",
    "network-type": "vpc",
    "private-ipv4": "172.16.0.10",
    "ram": {"security-credentials": {ROLE: _cred}},
    "region-id": REGION,
    "vpc-id": "vpc-bp1natguard",
    "vswitch-id": "vsw-bp1natguard",
    "zone-id": ZONE,
}
LATEST = {
    "meta-data": META,
    "user-data": lambda _p: Answer(200, f"#!/bin/sh\nexport SECRET={LEAK_MARKER}\n", credential=True),
    "dynamic": {"instance-identity": {
        "document": json.dumps({"zone-id": ZONE, "serial-number": "4acd2b47-b328-4762-852f-998",
                                "instance-id": META["instance-id"], "region-id": REGION,
                                "private-ipv4": "172.16.0.10", "owner-account-id": "1609xxxxxxxx",
                                "mac": META["mac"], "image-id": META["image-id"],
                                "instance-type": "ecs.g7.large"}),
        "pkcs7": "MIIDJwYJKoZIhvcNAQcCoIIDGDCCAxQCAQExCzAJBgUrDgMCGgUAMIIBYQYJKoZIhvcNAQcBoII",
    }},
}
NOT_FOUND = "<html><head><title>404 Not Found</title></head><body><h1>404 Not Found</h1></body></html>\n"


class Alibaba(Fake):
    """The ECS instance metadata service (security hardening mode unless --normal)."""

    server_header = "Tengine"

    def __init__(self, normal=False):
        self.normal = normal
        self.tokens = {}
        self.lock = threading.Lock()

    def answer(self, req):
        if req.path == "/latest/api/token":
            if req.method != "PUT":
                return Answer(405, "")
            if req.headers.get("X-Forwarded-For") is not None:
                return Answer(403, "")
            try:
                ttl = int(req.headers.get("X-aliyun-ecs-metadata-token-ttl-seconds"))
            except (TypeError, ValueError):
                return Answer(400, "")
            if not 1 <= ttl <= MAX_TTL:
                return Answer(400, "")
            token = secrets.token_urlsafe(32)
            with self.lock:
                self.tokens[token] = time.monotonic() + ttl
            return Answer(200, token)
        if req.method != "GET":
            return Answer(405, "")
        token = req.headers.get("X-aliyun-ecs-metadata-token")
        if token is not None:
            with self.lock:
                exp = self.tokens.get(token)
            if exp is None or exp < time.monotonic():
                return Answer(401, "")
        elif not self.normal:
            return Answer(403, "")
        parts = [p for p in req.path.split("/") if p]
        if not parts or parts[0] != "latest":
            return Answer(404, NOT_FOUND, content_type="text/html")
        node = LATEST
        for p in parts[1:]:
            if not isinstance(node, dict) or p not in node:
                return Answer(404, NOT_FOUND, content_type="text/html")
            node = node[p]
        if isinstance(node, dict):
            return Answer(200, "\n".join(k + "/" if isinstance(v, dict) else k for k, v in node.items()))
        if callable(node):
            return node(req.path)
        return Answer(200, node)


if __name__ == "__main__":
    normal = "--normal" in sys.argv
    serve(Alibaba(normal=normal), [a for a in sys.argv[1:] if a != "--normal"])
