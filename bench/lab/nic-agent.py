#!/usr/bin/env python3
"""Host side of the lab's NIC checks, run by lab.sh inside the lab's network namespace (so its
connections reach the guest through the tap and the guest's 8-queue virtio NIC, where the queue
a flow hashes to decides the CPU that takes its SYN). The guest asks by writing
/lab-out/nic-go-NAME ("IP PORT N"); the agent makes N HTTP connections, one request each, and
answers in nic-done-NAME ({"served": K}). For `sweep forward` over the real queues the guest
writes nic-udp-NAME ("PREFIX PORT FLOWS PPS SECONDS"): the agent routes PREFIX.0/24 via the guest
(which forwards it back out eth0: a hairpin router), turns forwarding off in this namespace (so
what comes back is dropped here, not sent round again), sends 18-byte UDP datagrams over FLOWS
flows at about PPS for SECONDS and answers {"sent": K}. It stops when lab.sh kills it with QEMU."""

import json
import os
import socket
import subprocess
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


def udp(prefix, port, flows, pps, secs):
    """UDP through the guest as a router: FLOWS flows (destination address and port), paced."""
    with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
        f.write("0")
    subprocess.run(["ip", "route", "replace", f"{prefix}.0/24", "via", "10.77.0.2"], check=False)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = b"x" * 18
    sent = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < secs:
        for f in range(flows):
            try:
                s.sendto(payload, (f"{prefix}.{1 + f % 250}", port + f))
                sent += 1
            except OSError:
                pass
        ahead = sent / pps - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    s.close()
    subprocess.run(["ip", "route", "del", f"{prefix}.0/24"], check=False)
    return {"sent": sent, "seconds": round(time.monotonic() - t0, 1)}


def main():
    done = set()
    while True:
        for name in sorted(os.listdir(OUT)):
            kind = next((k for k in ("nic-go-", "nic-udp-") if name.startswith(k)), None)
            if not kind or name.endswith(".tmp") or name in done:
                continue
            done.add(name)
            words = open(os.path.join(OUT, name)).read().split()
            if kind == "nic-udp-":
                prefix, port, flows, pps, secs = words
                res = udp(prefix, int(port), max(1, min(int(flows), 1000)), max(1, min(int(pps), 100_000)),
                          min(float(secs), 120))
            else:
                ip, port, n = words
                n = min(int(n), LIMIT)
                t0 = time.monotonic()
                served = sum(one(ip, int(port)) for _ in range(n))
                res = {"served": served, "sent": n, "seconds": round(time.monotonic() - t0, 1)}
            print(name, res, flush=True)
            tmp = os.path.join(OUT, "nic-done-" + name[len(kind):] + ".tmp")
            with open(tmp, "w") as f:
                json.dump(res, f)
            os.rename(tmp, tmp[:-4])
        time.sleep(0.3)


if __name__ == "__main__":
    sys.exit(main())
