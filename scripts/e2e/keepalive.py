#!/usr/bin/python3
"""keepalive.py: the client end of a long-lived HTTP/1.1 connection, as metadata clients keep
it (the server end is tests/common/http_keepalive.py).

  keepalive.py client HOST:PORT LOG   one TCP connection; a GET every 0.5 s on it, for as long as
                                      it works; on an error (reset, EOF, 2 s without an answer)
                                      the connection is closed and a new one opened

The client appends one line per event to LOG (flushed at once):
  connect conn=N lport=P at=EPOCH
  connect-error at=EPOCH error=...
  req seq=S conn=N lport=P sent=EPOCH answer=WORD
  req seq=S conn=N lport=P sent=EPOCH error=...
EPOCH is the wall clock (seconds, as `date +%s.%N`) at which the request was sent.
The end-to-end tests use it wherever a connection must outlive a change of policy.
"""

import socket
import sys
import time

INTERVAL = 0.5
TIMEOUT = 2.0


def addr(spec):
    host, _, port = spec.rpartition(":")
    return host, int(port)


def read_answer(f):
    status = f.readline()
    if not status:
        raise ConnectionError("EOF")
    if not status.startswith(b"HTTP/1.1 200"):
        raise ValueError("status %r" % status.strip())
    length = None
    while True:
        line = f.readline()
        if not line:
            raise ConnectionError("EOF in headers")
        if line in (b"\r\n", b"\n"):
            break
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    if length is None:
        raise ValueError("no Content-Length")
    body = f.read(length)
    if len(body) != length:
        raise ConnectionError("EOF in body")
    return body.decode(errors="replace").strip()


def client(spec, logpath):
    host, port = addr(spec)
    request = ("GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % host).encode()
    log = open(logpath, "a", buffering=1)
    sock = f = None
    conn = seq = lport = 0
    while True:
        if sock is None:
            try:
                sock = socket.create_connection((host, port), timeout=TIMEOUT)
            except OSError as e:
                log.write("connect-error at=%.3f error=%s\n" % (time.time(), e))
                time.sleep(INTERVAL)
                continue
            conn += 1
            lport = sock.getsockname()[1]
            f = sock.makefile("rb")
            log.write("connect conn=%d lport=%d at=%.3f\n" % (conn, lport, time.time()))
        seq += 1
        sent = time.time()
        try:
            sock.sendall(request)
            word = read_answer(f)
            log.write("req seq=%d conn=%d lport=%d sent=%.3f answer=%s\n" % (seq, conn, lport, sent, word))
        except (OSError, ValueError) as e:
            log.write("req seq=%d conn=%d lport=%d sent=%.3f error=%s: %s\n"
                      % (seq, conn, lport, sent, type(e).__name__, e))
            f.close()
            sock.close()
            sock = f = None
        time.sleep(INTERVAL)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "client":
        client(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
