#!/usr/bin/env python3
"""A small DigitalOcean droplet metadata API for natguard's proxy tests:
`fake_do.py PORT LOGFILE`.

Plain GETs, no headers; indexes end in `/` and list one name a line (directories with a
trailing `/`), as DigitalOcean documents. Every request line is appended to LOGFILE.
"""
import http.server
import json
import socket
import socketserver
import sys
import threading

PORT = int(sys.argv[1])
LOG = sys.argv[2]
V1 = "/metadata/v1/"
PATHS = {
    V1: "id\nhostname\nuser-data\nvendor-data\npublic-keys\nregion\ninterfaces/\ndns/\ntags/\n",
    V1 + "id": "2756294",
    V1 + "hostname": "sample-droplet",
    V1 + "region": "nyc3",
    V1 + "interfaces/public/0/ipv4/address": "203.0.113.5",
    V1 + "user-data": "NODE-SECRET user data",
    V1 + "vendor-data": "NODE-SECRET vendor data",
    "/metadata/v1.json": json.dumps({"droplet_id": 2756294, "user_data": "NODE-SECRET"}),
}


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        with open(LOG, "a") as f:
            f.write(f"{self.command} {self.path}\n")
        code, body = (200, PATHS[self.path]) if self.path in PATHS else (404, "not found")
        b = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
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
