"""The common part of the fake metadata upstreams (tests/proxy/fake_<cloud>.py), which
tests/proxy.rs and tests/proxy_sdks.rs run in the cloud namespace.

A fake is a threaded HTTP/1.1 server (keep-alive, like the clouds' own metadata servers) on one
port of every address of its network namespace, IPv4 and IPv6 (one dual-stack socket). Each
fake only decides what one request gets (`Fake.answer`); this module serves it and keeps the
record the tests read:

- `--log FILE`: one JSON line per request as it reached the upstream (method, path with its
  query, headers, client address), and what was answered (status, `credential`: whether the
  answer carried a credential). A test asserts on what reached the upstream and counts the
  credential answers (`credentials(FILE)`), so a leak through a proxy is seen here even when
  the client did not notice.
- every credential the fakes hand out carries LEAK_MARKER, so a test can also look for it in
  whatever a client printed.

Standard library only: the fakes run on any Python 3 (Debian 12's 3.11) without a virtualenv.
"""

import argparse
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

# In every secret a fake hands out (AWS SecretAccessKey and Token, GCP access and identity
# tokens, Azure access tokens, user data): a test finding it in a client's output found a leak.
LEAK_MARKER = "NATGUARDLEAKMARKER"


class Answer:
    """What a fake answers: status, body (str or bytes), headers, and whether it is a
    credential (counted in the log)."""

    def __init__(self, status, body="", headers=None, credential=False, content_type="text/plain",
                 hop_limit=None):
        self.status = status
        # The IP TTL / IPv6 hop limit of this answer's packets and of the rest of its connection
    # (AWS's HttpPutResponseHopLimit).
        self.hop_limit = hop_limit
        self.body = body.encode() if isinstance(body, str) else body
        self.headers = dict(headers or {})
        self.headers.setdefault("Content-Type", content_type)
        self.credential = credential


class Secret(str):
    """A value that is a secret: an answer holding it counts as a credential."""


def json_answer(status, obj, **kw):
    return Answer(status, json.dumps(obj, indent=2), content_type="application/json", **kw)


class Request:
    """One request as the fake sees it: method, path (undecoded, as sent), query (parsed),
    headers (a case-insensitive email.message.Message), body."""

    def __init__(self, method, target, headers, body, client):
        self.method = method
        self.target = target
        parts = urlsplit(target)
        self.path = parts.path
        self.query = parse_qs(parts.query, keep_blank_values=True)
        self.headers = headers
        self.body = body
        self.client = client

    def q(self, name, default=None):
        v = self.query.get(name)
        return v[-1] if v else default


class Fake:
    """A cloud's metadata API; subclasses implement `answer(req) -> Answer` and may add
    `server_header`."""

    server_header = "fake-metadata"

    def answer(self, req):
        raise NotImplementedError


class _Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def server_bind(self):
        # One socket for both families: 169.254.169.254 and fd00:ec2::254 alike.
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def serve(fake, argv=None):
    """Parses `--port` and `--log`, serves `fake` until killed."""
    p = argparse.ArgumentParser(description=type(fake).__doc__)
    p.add_argument("--port", type=int, default=80)
    p.add_argument("--log", required=True, help="where each request is recorded (JSON lines)")
    args = p.parse_args(argv)
    log = open(args.log, "a", buffering=1)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def version_string(self):
            return fake.server_header

        def log_message(self, fmt, *a):  # the JSON log is the record; keep stderr quiet
            pass

        def handle_one(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            client = self.client_address[0]
            if client.startswith("::ffff:"):
                client = client[len("::ffff:"):]
            req = Request(self.command, self.path, self.headers, body, client)
            try:
                ans = fake.answer(req)
            except Exception as e:  # a fake's bug must show, not hang a client
                ans = Answer(500, f"fake upstream error: {e!r}\n")
            record = {
                "method": self.command,
                "target": self.path,
                "path": req.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "client": client,
                "status": ans.status,
                "credential": ans.credential,
            }
            with lock:
                log.write(json.dumps(record) + "\n")
            if ans.hop_limit is not None:
                self.set_hops(ans.hop_limit)
            self.send_response(ans.status)
            for k, v in ans.headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(ans.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(ans.body)
            # The hop limit stays on the connection: TCP may retransmit the answer later, and a
            # retransmission with a higher TTL would carry it past the first router after all.

        def set_hops(self, n):
            sock = self.connection
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, n)
            if self.client_address[0].startswith("::ffff:"):
                # An IPv4 client on the dual-stack socket: its packets carry the IPv4 TTL.
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, n)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = do_OPTIONS = handle_one

    srv = _Server(("::", args.port), Handler)
    print(f"{type(fake).__name__} listening on port {args.port}", flush=True)
    srv.serve_forever()


def records(log_path):
    """Every request a fake recorded (for tests written in Python)."""
    with open(log_path) as f:
        return [json.loads(line) for line in f if line.strip()]


def credentials(log_path):
    """How many credential answers a fake gave."""
    return sum(1 for r in records(log_path) if r["credential"])


def listing(names):
    """A directory listing as the metadata servers give it: one name per line."""
    return "\n".join(names)


if __name__ == "__main__":
    sys.exit("fakemeta.py is a module; run one of the fake_<cloud>.py beside it")
