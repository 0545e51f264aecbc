#!/usr/bin/env python3
"""A small HTTP/1.1 server that keeps connections open, as a cloud metadata API does.

Usage: http_keepalive.py PORT BODY [ADDRESS...]

Listens on PORT of each ADDRESS, or of [::] (IPv4 included) when none is given, and answers
every request with BODY and a Content-Length, on the same connection for as long as the client keeps it: a client that
polls over one keep-alive connection reuses it. HTTP/1.0 requests without keep-alive and
requests with `Connection: close` are answered and then closed, so one-shot clients (wget,
curl, the tests' HTTP/1.0 GET) work too. Prints one line per answer with the peer's address
and port. Used by the root tests (the security tests' REAL metadata server binds only the
metadata addresses) and scripts/demo.sh.
"""
import socket
import sys
import threading


def keep_alive(request_line, headers):
    connection = headers.get("connection", "")
    if connection == "close":
        return False
    return request_line.endswith("HTTP/1.1") or connection == "keep-alive"


def serve(conn, peer, body):
    buf = b""
    with conn:
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(4096)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip().lower()
                keep = keep_alive(lines[0].strip(), headers)
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                    b"Content-Length: %d\r\nConnection: %s\r\n\r\n%s"
                    % (len(body), b"keep-alive" if keep else b"close", body)
                )
                print("answered", peer[0], peer[1], flush=True)
                if not keep:
                    return
        except OSError:
            return


def listen(addr, port, body):
    family = socket.AF_INET if addr and ":" not in addr else socket.AF_INET6
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        # Only the wildcard also takes IPv4; a given IPv6 address is that address alone.
        srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if addr == "::" else 1)
    srv.bind((addr, port))
    srv.listen(128)
    while True:
        conn, peer = srv.accept()
        threading.Thread(target=serve, args=(conn, peer, body), daemon=True).start()


def main():
    port = int(sys.argv[1])
    body = (sys.argv[2] + "\n").encode()
    addrs = sys.argv[3:] or ["::"]
    threads = [threading.Thread(target=listen, args=(a, port, body), daemon=True) for a in addrs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
