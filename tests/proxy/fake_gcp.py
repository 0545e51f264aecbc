#!/usr/bin/env python3
"""A faithful fake of the Google Compute Engine metadata server.

What it follows, from Google Cloud's documentation (Compute Engine, "About VM metadata" and
"Access VM metadata"):
  https://cloud.google.com/compute/docs/metadata/overview
  https://cloud.google.com/compute/docs/metadata/querying-metadata
  https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys
  https://cloud.google.com/compute/docs/access/authenticate-workloads (service-account tokens)
  https://cloud.google.com/compute/docs/instances/verifying-instance-identity (identity tokens)
- Every request under /computeMetadata/v1/ must carry `Metadata-Flavor: Google`; without it:
  403. A request carrying `X-Forwarded-For` is refused (403): the server does not answer
  through proxies. Every answer carries `Metadata-Flavor: Google` (clients such as google-auth
  check it) and `Server: Metadata Server for VM`.
- A directory lists its entries one per line, subdirectories with a trailing "/"; a directory
  asked for without its trailing slash is redirected (301) to it. `?recursive=true` answers a
  directory as one JSON object (keys in camelCase, `alt=text` for text); a service account's
  recursive listing holds aliases, email and scopes, never its token.
- project/project-id, project/numeric-project-id, instance/zone (projects/NUM/zones/ZONE),
  instance/id, name, hostname, machine-type, instance/attributes/ (GKE's kube-env, cluster-name,
  cluster-location; startup-script), instance/network-interfaces/0/ (ip, mac, mtu, network,
  gateway, subnetmask; recursively a JSON list, one object per interface),
  instance/service-accounts/default/{email,scopes,aliases,token,identity}. token answers {"access_token", "expires_in", "token_type": "Bearer"};
  identity needs a non-empty `audience` (400 without) and answers a signed JWT.

Token and identity answers count as credentials in the log (fakemeta.py) and carry
fakemeta.LEAK_MARKER; so do kube-env and startup-script (kube-env holds the kubelet's
bootstrap credentials), also inside a recursive listing.

    fake_gcp.py --port 80 --log FILE
"""

import base64
import json
import re
import secrets
import time

from fakemeta import LEAK_MARKER, Answer, Fake, Secret, json_answer, serve

PROJECT = "natguard-test-project"
NUMERIC = "123456789012"
ZONE = "europe-west1-b"
EMAIL = f"{NUMERIC}-compute@developer.gserviceaccount.com"
SCOPES = "https://www.googleapis.com/auth/cloud-platform"
KUBE_ENV = f"KUBELET_CERT: LS0tLS1CRUdJTi{LEAK_MARKER}\nCA_CERT: LS0tLS1CRUdJTg==\n"
STARTUP = f"#!/bin/bash\necho {LEAK_MARKER} > /root/secret\n"
FLAVOR = {"Metadata-Flavor": "Google"}


def _token(req):
    return json_answer(200, {
        "access_token": "ya29." + LEAK_MARKER + secrets.token_urlsafe(120),
        "expires_in": 3599,
        "token_type": "Bearer",
    }, headers=FLAVOR, credential=True)


def _b64(obj):
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def _identity(req):
    audience = req.q("audience", "")
    if not audience:
        return Answer(400, "non-empty audience parameter required\n", headers=FLAVOR)
    now = int(time.time())
    jwt = ".".join([
        _b64({"alg": "RS256", "kid": "fake", "typ": "JWT"}),
        _b64({"aud": audience, "azp": NUMERIC, "email": EMAIL, "exp": now + 3600,
              "iat": now, "iss": "https://accounts.google.com", "sub": NUMERIC}),
        LEAK_MARKER + secrets.token_urlsafe(64),
    ])
    return Answer(200, jwt, headers=FLAVOR, credential=True)


SERVICE_ACCOUNT = {
    "aliases": "default",
    "email": EMAIL,
    "scopes": SCOPES,
    "token": _token,
    "identity": _identity,
}
TREE = {
    "project": {
        "project-id": PROJECT,
        "numeric-project-id": NUMERIC,
        "attributes": {"enable-oslogin": "TRUE"},
    },
    "instance": {
        "id": "4520031799277581759",
        "name": "gke-natguard-default-pool-1a2b3c4d-x1y2",
        "hostname": "gke-natguard-default-pool-1a2b3c4d-x1y2.c.natguard-test-project.internal",
        "machine-type": f"projects/{NUMERIC}/machineTypes/e2-standard-4",
        "zone": f"projects/{NUMERIC}/zones/{ZONE}",
        "network-interfaces": {"0": {
            "gateway": "10.128.0.1",
            "ip": "10.128.0.5",
            "mac": "42:01:0a:80:00:05",
            "mtu": "1460",
            "network": f"projects/{NUMERIC}/networks/default",
            "subnetmask": "255.255.240.0",
        }},
        "attributes": {
            "cluster-location": ZONE,
            "cluster-name": "natguard",
            "kube-env": Secret(KUBE_ENV),
            "startup-script": Secret(STARTUP),
        },
        "service-accounts": {
            "default": SERVICE_ACCOUNT,
            EMAIL: SERVICE_ACCOUNT,
        },
    },
}
NOT_FOUND = ("<!DOCTYPE html>\n<html lang=en>\n  <title>Error 404 (Not Found)!!1</title>\n"
             "  <p><b>404.</b> <ins>That\u2019s an error.</ins>\n")


def _camel(key):
    return re.sub(r"-([a-z])", lambda m: m.group(1).upper(), key)


def _recursive(node, found_secret):
    """A directory as JSON, the way the server gives it: no tokens, keys in camelCase, a
    directory of numbered entries (network-interfaces/) as a list."""
    if node and all(k.isdigit() for k in node):
        return [_recursive(node[k], found_secret) for k in sorted(node, key=int)]
    out = {}
    for k, v in node.items():
        if callable(v):
            continue  # token and identity are never part of a listing
        if isinstance(v, dict):
            out[_camel(k)] = _recursive(v, found_secret)
        elif k in ("aliases", "scopes"):
            out[_camel(k)] = v.split("\n")
        else:
            if isinstance(v, Secret):
                found_secret.append(k)
            out[_camel(k)] = str(v)
    return out


class Gcp(Fake):
    """The Compute Engine metadata server."""

    server_header = "Metadata Server for VM"

    def answer(self, req):
        if req.path == "/" and req.method in ("GET", "HEAD"):
            return Answer(200, "computeMetadata/\n", headers=FLAVOR)
        if req.headers.get("X-Forwarded-For") is not None:
            return Answer(403, "Your client does not have permission to get URL "
                          f"{req.path} from this server.\n", headers=FLAVOR)
        if req.headers.get("Metadata-Flavor") != "Google":
            return Answer(403, "Your client does not have permission to get URL "
                          f"{req.path} from this server. Missing Metadata-Flavor:Google header.\n",
                          headers=FLAVOR)
        if req.method not in ("GET", "HEAD"):
            return Answer(405, "", headers=FLAVOR)
        prefix = "/computeMetadata/v1"
        if req.path == "/computeMetadata/":
            return Answer(200, "v1/\n", headers=FLAVOR)
        if not (req.path == prefix or req.path.startswith(prefix + "/")):
            return Answer(404, NOT_FOUND, headers=FLAVOR, content_type="text/html")
        rest = req.path[len(prefix):]
        parts = [p for p in rest.split("/") if p]
        node = TREE
        for p in parts:
            if not isinstance(node, dict) or p not in node:
                return Answer(404, NOT_FOUND, headers=FLAVOR, content_type="text/html")
            node = node[p]
        if isinstance(node, dict):
            if not req.path.endswith("/"):
                return Answer(301, "", headers=dict(FLAVOR, Location=req.path + "/"))
            if req.q("recursive", "false").lower() == "true":
                found = []
                body = _recursive(node, found)
                if req.q("alt") == "text" and isinstance(body, dict):
                    text = "\n".join(f"{k} {v}" for k, v in body.items() if not isinstance(v, dict))
                    return Answer(200, text, headers=FLAVOR, credential=bool(found))
                return json_answer(200, body, headers=FLAVOR, credential=bool(found))
            names = [k + "/" if isinstance(v, dict) else k for k, v in node.items()]
            return Answer(200, "\n".join(names) + "\n", headers=FLAVOR)
        if callable(node):
            return node(req)
        if req.q("alt") == "json":
            return json_answer(200, str(node), headers=FLAVOR, credential=isinstance(node, Secret))
        return Answer(200, str(node), headers=FLAVOR, credential=isinstance(node, Secret))


if __name__ == "__main__":
    serve(Gcp())
