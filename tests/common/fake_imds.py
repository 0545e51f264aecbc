#!/usr/bin/env python3
"""A small IMDSv2 upstream for natguard's proxy tests and the demo: `fake_imds.py PORT LOGFILE
[WORD]`.

Only requests carrying the token it minted (PUT /latest/api/token with the TTL header) are
answered; others get 401, as an instance with IMDSv2 required does. Every request line is
appended to LOGFILE, so a test can show what the upstream saw. It serves on every address of
its namespace (the metadata addresses are on its lo). With WORD, `GET /` is answered with WORD
without a token, as the demo's plain clients expect of "the real metadata server". With
FAKE_IMDS_HOP_LIMIT=1 in the environment, token answers leave with an IP TTL (hop limit) of 1,
as an instance's IMDS with `HttpPutResponseHopLimit: 1` sends them: they reach the node, never a
pod behind it.
"""
import http.server
import json
import socketserver
import sys
import os
import secrets
import socket
import threading

PORT = int(sys.argv[1])
LOG = sys.argv[2]
WORD = sys.argv[3] if len(sys.argv) > 3 else None
HOP_LIMIT = os.environ.get("FAKE_IMDS_HOP_LIMIT")
TOKENS = set()
DOC = json.dumps({"region": "us-test-1", "availabilityZone": "us-test-1a",
                  "instanceId": "i-0123456789abcdef0", "instanceType": "m7g.large"})
PATHS = {
    "/latest/meta-data/": "ami-id\nhostname\niam/\nidentity-credentials/\ninstance-id\nplacement/\n",
    "/latest/meta-data/placement/region": "us-test-1",
    "/latest/meta-data/placement/availability-zone": "us-test-1a",
    "/latest/meta-data/instance-id": "i-0123456789abcdef0",
    "/latest/meta-data/iam/security-credentials/": "node-role",
    "/latest/meta-data/iam/security-credentials/node-role":
        json.dumps({"AccessKeyId": "AKIANODE", "SecretAccessKey": "NODE-SECRET"}),
    "/latest/user-data": "NODE-SECRET user data",
    "/latest/dynamic/instance-identity/document": DOC,
    "/latest/dynamic/instance-identity/pkcs7": "NODE-SECRET pkcs7",
}


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def note(self):
        with open(LOG, "a") as f:
            has = "x-aws-ec2-metadata-token" in {k.lower() for k in self.headers}
            f.write(f"{self.command} {self.path} from {self.client_address[0]} token={has}\n")

    def send(self, code, body):
        b = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(b)

    def do_PUT(self):
        self.note()
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        if self.path != "/latest/api/token" or not ttl:
            return self.send(400, "")
        if HOP_LIMIT:
            if self.connection.family == socket.AF_INET6:
                self.connection.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, int(HOP_LIMIT))
            else:
                self.connection.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, int(HOP_LIMIT))
        t = secrets.token_urlsafe(24)
        TOKENS.add(t)
        self.send_response(200)
        self.send_header("X-aws-ec2-metadata-token-ttl-seconds", ttl)
        self.send_header("Content-Length", str(len(t)))
        self.end_headers()
        self.wfile.write(t.encode())

    def do_GET(self):
        self.note()
        if WORD is not None and self.path == "/":
            return self.send(200, WORD + "\n")
        if self.headers.get("X-aws-ec2-metadata-token") not in TOKENS:
            return self.send(401, "")
        if self.path in PATHS:
            return self.send(200, PATHS[self.path])
        self.send(404, "")

    do_HEAD = do_GET


class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class S6(S):
    address_family = socket.AF_INET6

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        super().server_bind()


s4 = S(("0.0.0.0", PORT), H)
s6 = S6(("::", PORT), H)
threading.Thread(target=s6.serve_forever, daemon=True).start()
s4.serve_forever()
