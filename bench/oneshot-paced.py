#!/usr/bin/env python3
"""A paced one-shot client for instruction counts (bench/callgrind-oneshot.sh with PACED).

usage: oneshot-paced.py http|kv HOST PORT N GAP_MS

N connections, one at a time; each connects, waits GAP_MS, sends one request (HTTP `GET
/hello` with `Connection: close`, or memcached `get k`), reads the whole answer (HTTP: to the
server's close; kv: to `END`), waits GAP_MS, closes, and waits GAP_MS again. Every step reaches
a server that has finished with the last one, so the server's loop turns per connection — and
its instruction count — do not depend on how the two processes happen to be scheduled (as long
as the server finishes each step within GAP_MS). Exits 1 on any error or wrong answer.
"""
import socket
import sys
import time


def main():
    proto, host, port, n, gap = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
        float(sys.argv[5]) / 1000.0
    if proto == "http":
        request = b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    else:
        request = b"get k\r\n"
    for i in range(n):
        s = socket.create_connection((host, port))
        time.sleep(gap)
        s.sendall(request)
        answer = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
            if proto == "kv" and answer.endswith(b"END\r\n"):
                break
        if proto == "http":
            ok = answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello\n")
        else:
            ok = answer == b"END\r\n"
        if not ok:
            print(f"connection {i}: unexpected answer {answer[:200]!r}", file=sys.stderr)
            sys.exit(1)
        time.sleep(gap)
        s.close()
        time.sleep(gap)


if __name__ == "__main__":
    main()
