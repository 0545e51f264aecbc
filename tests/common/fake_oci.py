#!/usr/bin/env python3
"""A small Oracle Cloud IMDSv2 for natguard's proxy tests: `fake_oci.py PORT LOGFILE`.

As Oracle documents IMDSv2: every request needs `Authorization: Bearer Oracle` (401 without),
a request carrying `Forwarded`, `X-Forwarded-For` or `X-Forwarded-Host` is refused (403), and
`/opc/v1` answers 404 (v1 disabled). Every request is appended to LOGFILE as
`METHOD PATH auth=VALUE fwd=yes|no`.
"""
import http.server
import json
import socket
import socketserver
import sys
import threading

PORT = int(sys.argv[1])
LOG = sys.argv[2]
V2 = "/opc/v2/"
INSTANCE = {
    "availabilityDomain": "Uocm:PHX-AD-1",
    "canonicalRegionName": "us-phoenix-1",
    "faultDomain": "FAULT-DOMAIN-2",
    "id": "ocid1.instance.oc1.phx.test",
    "region": "phx",
    "shape": "VM.Standard.E4.Flex",
    "metadata": {"user_data": "NODE-SECRET user data", "ssh_authorized_keys": "ssh-ed25519 NODE-SECRET"},
    "freeformTags": {"owner": "NODE-SECRET tag"},
}
PATHS = {
    V2 + "instance/": json.dumps(INSTANCE),
    V2 + "instance/region": "phx",
    V2 + "instance/canonicalRegionName": "us-phoenix-1",
    V2 + "instance/availabilityDomain": "Uocm:PHX-AD-1",
    V2 + "instance/metadata/": json.dumps(INSTANCE["metadata"]),
    V2 + "instance/metadata/user_data": "NODE-SECRET user data",
    V2 + "identity/cert.pem": "NODE-SECRET certificate",
    V2 + "identity/key.pem": "NODE-SECRET private key",
    V2 + "vnics/": json.dumps([{"privateIp": "10.0.0.5", "vnicId": "ocid1.vnic.oc1.phx.test"}]),
}
FORWARDING = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host")


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        auth = self.headers.get("Authorization")
        fwd = any(h in self.headers for h in FORWARDING)
        with open(LOG, "a") as f:
            f.write(f"{self.command} {self.path} auth={auth} fwd={'yes' if fwd else 'no'}\n")
        if not self.path.startswith(V2):
            code, body = 404, "not found"
        elif fwd:
            code, body = 403, "forwarded requests are rejected"
        elif auth != "Bearer Oracle":
            code, body = 401, "authorization required"
        elif self.path in PATHS:
            code, body = 200, PATHS[self.path]
        else:
            code, body = 404, "not found"
        b = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if body[:1] in "[{" else "text/plain")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(b)

    do_HEAD = do_GET


class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class S6(S):
    address_family = socket.AF_INET6

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        super().server_bind()


s6 = S6(("::", PORT), H)
threading.Thread(target=s6.serve_forever, daemon=True).start()
S(("0.0.0.0", PORT), H).serve_forever()
