#!/usr/bin/env python3
"""A small GCE metadata server for natguard's proxy tests: `fake_gce.py PORT LOGFILE`.

As the real server: `Metadata-Flavor: Google` is required (403 without), a request with
`X-Forwarded-For` is refused (403), and every answer carries `Metadata-Flavor: Google` and
`Server: Metadata Server for VM`. Every request line is appended to LOGFILE.
"""
import http.server
import json
import socket
import socketserver
import sys
import threading

PORT = int(sys.argv[1])
LOG = sys.argv[2]
V1 = "/computeMetadata/v1/"
NICS = [{"ip": "10.128.0.5", "network": "projects/1/networks/default"}]
PATHS = {
    "/": "computeMetadata/\n",
    "/computeMetadata/": "v1/\n",
    V1: "instance/\nproject/\n",
    V1 + "instance/": "attributes/\nhostname\nid\nnetwork-interfaces/\nservice-accounts/\nzone\n",
    V1 + "instance/zone": "projects/1/zones/us-test1-a",
    V1 + "instance/id": "1234567890",
    V1 + "project/project-id": "test-project",
    V1 + "instance/attributes/": "cluster-name\nkube-env\nstartup-script\n",
    V1 + "instance/attributes/cluster-name": "test-cluster",
    V1 + "instance/attributes/kube-env": "NODE-SECRET kube-env",
    V1 + "instance/service-accounts/default/token": json.dumps({"access_token": "NODE-SECRET"}),
    # The proxy re-serialises the query in its canonical order.
    V1 + "instance/network-interfaces/?alt=json&recursive=true": json.dumps(NICS),
}


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        with open(LOG, "a") as f:
            f.write(f"{self.command} {self.path}\n")
        if "X-Forwarded-For" in self.headers or self.headers.get("Metadata-Flavor") != "Google":
            code, body = 403, "Missing Metadata-Flavor:Google header"
        elif self.path in PATHS:
            code, body = 200, PATHS[self.path]
        else:
            code, body = 404, "not found"
        b = body.encode()
        self.send_response(code)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(b)

    do_HEAD = do_GET

    def version_string(self):
        return "Metadata Server for VM"


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
