#!/usr/bin/python3
"""prober.py: a pod's policy, probed over and over from inside the pod, while something
changes on the node (scripts/e2e/upgrade.sh replaces natguard under running pods).

  prober.py LOG   until SIGTERM: one probe after another, 10 ms apart

A probe opens a new TCP connection for each of three requests, because the node decides a
connection's NAT at its first packet: a long-lived connection would keep the policy it
started with and hide a change. The three requests are the three parts of a pod's policy:
  meta  GET http://169.254.169.254/          who answers: "proxy" (natguard's DNAT), "cloud"
                                             (the real metadata server: an exempt pod)
  in    GET http://10.200.0.2/cgi-bin/src    the source address a host inside the
                                             non-masquerade CIDRs sees (the pod's own)
  out   GET http://11.0.0.2/cgi-bin/src      the source address a host outside sees (the node's:
                                             masqueraded)
Each probe appends one line to LOG, flushed at once:
  probe seq=S start=EPOCH end=EPOCH meta=WORD in=WORD out=WORD
WORD is the answer's body, or error:KIND when there was none (a reset, a refusal, a timeout:
2 s per request). EPOCH is the wall clock in seconds, as `date +%s.%N` prints it.
"""

import signal
import socket
import sys
import time

INTERVAL = 0.01
TIMEOUT = 2.0
TARGETS = (
    ("meta", "169.254.169.254", "/"),
    ("in", "10.200.0.2", "/cgi-bin/src"),
    ("out", "11.0.0.2", "/cgi-bin/src"),
)


def get(host, path):
    try:
        with socket.create_connection((host, 80), timeout=TIMEOUT) as s:
            s.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError as e:
        return "error:" + type(e).__name__
    head, sep, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n")[0].split()
    if not sep or len(status) < 2 or status[1] != b"200":
        return "error:bad-answer"
    word = body.decode(errors="replace").strip().replace(" ", "_")
    return word or "error:empty"


def main():
    log = open(sys.argv[1], "a", buffering=1)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    seq = 0
    while True:
        seq += 1
        start = time.time()
        answers = [f"{name}={get(host, path)}" for name, host, path in TARGETS]
        log.write(f"probe seq={seq} start={start:.6f} end={time.time():.6f} {' '.join(answers)}\n")
        time.sleep(INTERVAL)


if __name__ == "__main__":
    main()
