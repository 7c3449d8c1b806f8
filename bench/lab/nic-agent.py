#!/usr/bin/env python3
"""Host side of the lab's NIC checks, run by lab.sh inside the lab's network namespace (so its
connections reach the guest through the tap and the guest's 8-queue virtio NIC, where the queue
a flow hashes to decides the CPU that takes its SYN). The guest asks by writing
/lab-out/nic-go-NAME ("IP PORT N"); the agent makes N HTTP connections, one request each, and
answers in nic-done-NAME ({"served": K}). It stops when lab.sh kills it with QEMU."""

import json
import os
import socket
import sys
import time

OUT = os.environ["LAB_OUT"]
REQ = b"GET / HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n"
LIMIT = 10_000  # connections per request, at most


def one(ip, port):
    try:
        with socket.create_connection((ip, port), timeout=20) as s:
            s.sendall(REQ)
            return len(s.recv(4096)) > 0
    except OSError as e:
        print("connection failed:", e, flush=True)
        return False


def main():
    done = set()
    while True:
        for name in sorted(os.listdir(OUT)):
            if not name.startswith("nic-go-") or name.endswith(".tmp") or name in done:
                continue
            done.add(name)
            ip, port, n = open(os.path.join(OUT, name)).read().split()
            n = min(int(n), LIMIT)
            t0 = time.monotonic()
            served = sum(one(ip, int(port)) for _ in range(n))
            res = {"served": served, "sent": n, "seconds": round(time.monotonic() - t0, 1)}
            print(name, res, flush=True)
            tmp = os.path.join(OUT, "nic-done-" + name[len("nic-go-"):] + ".tmp")
            with open(tmp, "w") as f:
                json.dump(res, f)
            os.rename(tmp, tmp[:-4])
        time.sleep(0.3)


if __name__ == "__main__":
    sys.exit(main())
