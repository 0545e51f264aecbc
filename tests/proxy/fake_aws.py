#!/usr/bin/env python3
"""A faithful fake of the Amazon EC2 instance metadata service (IMDS), IMDSv2 enforced.

What it follows, from AWS's documentation (EC2 User Guide):
- "Use the Instance Metadata Service to access instance metadata", "Use IMDSv2" and "Retrieve
  instance metadata": https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html
  A session token comes from `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds`
  (1 to 21600 seconds; missing or out of range: 400) and is answered with the same header; a
  PUT carrying `X-Forwarded-For` is refused (403: tokens are not handed out through proxies).
  Later requests carry it in `X-aws-ec2-metadata-token`; with IMDSv2 required (`HttpTokens:
  required`, the default here) a request without a valid token gets 401. Only GET/HEAD (and
  the token PUT) are served; other methods 405. The hop limit (`HttpPutResponseHopLimit`) is
  the IP TTL (IPv6 hop limit) of the token answer's packets: with `--hop-limit 1` they reach
  the host that asked and die at the first router, so a pod behind the node never gets a
  token, as on an instance with hop limit 1.
- "Instance metadata categories": https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html
  placement/region, placement/availability-zone, instance-id, instance-type, iam/info,
  iam/security-credentials/ (the role's name) and iam/security-credentials/ROLE (the role's
  temporary credentials: Code, LastUpdated, Type, AccessKeyId, SecretAccessKey, Token,
  Expiration), identity-credentials/ec2/security-credentials/ec2-instance, user-data.
  A directory lists its entries one per line, subdirectories with a trailing "/"; a leaf is
  also served with a trailing "/" (botocore asks for `placement/availability-zone/`).
- "Instance identity documents": https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instance-identity-documents.html
  /latest/dynamic/instance-identity/document (JSON), pkcs7, signature, rsa2048.
- The IPv6 endpoint is [fd00:ec2::254] (Nitro instances); this server listens on every address.

Every credential answer (role credentials, identity credentials) is counted in the log
(fakemeta.py) and carries fakemeta.LEAK_MARKER; so does user data, which holds secrets too.

    fake_aws.py --port 80 --log FILE [--imdsv1] [--hop-limit N] [--banner WORD]
                [--slow PATH SECONDS]
    (--imdsv1: HttpTokens optional; --hop-limit: HttpPutResponseHopLimit; --banner: `GET /`
    answers WORD without a token, so that scripts/demo.sh's plain clients can tell the real
    server from a proxy; --slow: GET PATH is answered SECONDS late, a slow metadata API)
"""

import json
import secrets
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

from fakemeta import LEAK_MARKER, Answer, Fake, json_answer, serve

ROLE = "natguard-node-role"
REGION = "eu-west-3"
ZONE = "eu-west-3b"
INSTANCE_ID = "i-0a1b2c3d4e5f67890"
INSTANCE_TYPE = "m6i.large"
ACCOUNT = "123456789012"
MAX_TTL = 21600

IDENTITY_DOCUMENT = {
    "accountId": ACCOUNT,
    "architecture": "x86_64",
    "availabilityZone": ZONE,
    "billingProducts": None,
    "devpayProductCodes": None,
    "marketplaceProductCodes": None,
    "imageId": "ami-0abcdef1234567890",
    "instanceId": INSTANCE_ID,
    "instanceType": INSTANCE_TYPE,
    "kernelId": None,
    "pendingTime": "2026-01-05T09:12:01Z",
    "privateIp": "10.0.1.23",
    "ramdiskId": None,
    "region": REGION,
    "version": "2017-09-30",
}


def _iso(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def role_credentials():
    now = datetime.now(timezone.utc)
    return {
        "Code": "Success",
        "LastUpdated": _iso(now),
        "Type": "AWS-HMAC",
        "AccessKeyId": "ASIA" + "NGLEAK" + secrets.token_hex(5).upper(),
        "SecretAccessKey": LEAK_MARKER + secrets.token_urlsafe(22),
        "Token": LEAK_MARKER + secrets.token_urlsafe(300),
        "Expiration": _iso(now + timedelta(hours=6)),
    }


def _cred(_req):
    return json_answer(200, role_credentials(), credential=True)


def _user_data(_req):
    # User data is served as the bytes it was given (here a cloud-init script with a secret).
    return Answer(200, f"#!/bin/bash\nexport DB_PASSWORD={LEAK_MARKER}hunter2\n",
                  content_type="application/octet-stream", credential=True)


META = {
    "ami-id": "ami-0abcdef1234567890",
    "hostname": "ip-10-0-1-23.eu-west-3.compute.internal",
    "instance-id": INSTANCE_ID,
    "instance-type": INSTANCE_TYPE,
    "local-hostname": "ip-10-0-1-23.eu-west-3.compute.internal",
    "local-ipv4": "10.0.1.23",
    "mac": "0e:49:61:0f:c3:11",
    "placement": {
        "availability-zone": ZONE,
        "availability-zone-id": "euw3-az2",
        "region": REGION,
    },
    "iam": {
        "info": json.dumps({
            "Code": "Success",
            "LastUpdated": "2026-01-05T09:13:00Z",
            "InstanceProfileArn": f"arn:aws:iam::{ACCOUNT}:instance-profile/{ROLE}",
            "InstanceProfileId": "AIPAEXAMPLEPROFILEID1",
        }, indent=2),
        "security-credentials": {ROLE: _cred},
    },
    "identity-credentials": {"ec2": {
        "info": json.dumps({"Code": "Success", "AccountId": ACCOUNT}),
        "security-credentials": {"ec2-instance": _cred},
    }},
    "services": {"domain": "amazonaws.com", "partition": "aws"},
}
DYNAMIC = {
    "instance-identity": {
        "document": json.dumps(IDENTITY_DOCUMENT, indent=2),
        "pkcs7": "MIAGCSqGSIb3DQEHAqCAMIACAQExDzANBglghkgBZQMEAgEFADCABgkqhkiG9w0BBwGggCSA",
        "signature": "dExaYmFzZTY0LXNpZ25hdHVyZS1vZi10aGUtZG9jdW1lbnQ=",
        "rsa2048": "MIAGCSqGSIb3DQEHAqCAMIACAQExDzANBglghkgBZQMEAgEFADCABgkqhkiG9w0BBwGggCSA",
    },
}
LATEST = {"dynamic": DYNAMIC, "meta-data": META, "user-data": _user_data}
NOT_FOUND = ('<?xml version="1.0" encoding="iso-8859-1"?>\n<!DOCTYPE html>\n<html><head>'
             "<title>404 - Not Found</title></head><body><h1>404 - Not Found</h1></body></html>\n")


class Aws(Fake):
    """The EC2 instance metadata service (IMDSv2 required unless --imdsv1)."""

    server_header = "EC2ws"

    def __init__(self, imdsv1=False, hop_limit=None, banner=None, slow=None):
        self.imdsv1 = imdsv1
        self.slow = slow
        self.hop_limit = hop_limit
        self.banner = banner
        self.tokens = {}
        self.lock = threading.Lock()

    def answer(self, req):
        if req.path == "/latest/api/token":
            if req.method != "PUT":
                return Answer(405, "", headers={"Allow": "PUT"})
            return self.token(req)
        if self.banner is not None and req.path == "/" and req.method in ("GET", "HEAD"):
            return Answer(200, self.banner + "\n")
        if req.method not in ("GET", "HEAD"):
            return Answer(405, "", headers={"Allow": "GET, HEAD, PUT"})
        token = req.headers.get("X-aws-ec2-metadata-token")
        if token is not None:
            with self.lock:
                expiry = self.tokens.get(token)
            if expiry is None or expiry < time.monotonic():
                return Answer(401, "")
        elif not self.imdsv1:
            return Answer(401, "")
        if self.slow is not None and req.path == self.slow[0]:
            time.sleep(self.slow[1])
        return self.lookup(req.path)

    def token(self, req):
        if req.headers.get("X-Forwarded-For") is not None:
            return Answer(403, "")
        ttl = req.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        try:
            seconds = int(ttl)
        except (TypeError, ValueError):
            return Answer(400, "")
        if not 1 <= seconds <= MAX_TTL:
            return Answer(400, "")
        token = "AQAEA" + secrets.token_urlsafe(40)
        with self.lock:
            self.tokens[token] = time.monotonic() + seconds
        return Answer(200, token, headers={"X-aws-ec2-metadata-token-ttl-seconds": str(seconds)},
                      hop_limit=self.hop_limit)

    def lookup(self, path):
        if path == "/":
            return Answer(200, "1.0\n2007-01-19\n2021-07-15\nlatest")
        parts = [p for p in path.split("/") if p]
        if not parts or parts[0] != "latest":
            return Answer(404, NOT_FOUND, content_type="text/html")
        node = LATEST
        for p in parts[1:]:
            if not isinstance(node, dict) or p not in node:
                return Answer(404, NOT_FOUND, content_type="text/html")
            node = node[p]
        if isinstance(node, dict):
            names = [k + "/" if isinstance(v, dict) else k for k, v in node.items()]
            return Answer(200, "\n".join(names))
        if callable(node):
            return node(path)
        return Answer(200, node)


if __name__ == "__main__":
    args = sys.argv[1:]
    imdsv1 = "--imdsv1" in args
    args = [a for a in args if a != "--imdsv1"]
    hops = None
    if "--hop-limit" in args:
        i = args.index("--hop-limit")
        hops = int(args[i + 1])
        if not 1 <= hops <= 64:
            sys.exit(f"--hop-limit {hops}: AWS allows 1 to 64")
        del args[i:i + 2]
    banner = None
    if "--banner" in args:
        i = args.index("--banner")
        banner = args[i + 1]
        del args[i:i + 2]
    slow = None
    if "--slow" in args:
        i = args.index("--slow")
        slow = (args[i + 1], float(args[i + 2]))
        del args[i:i + 3]
    serve(Aws(imdsv1=imdsv1, hop_limit=hops, banner=banner, slow=slow), args)
