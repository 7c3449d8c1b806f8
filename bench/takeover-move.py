#!/usr/bin/env python3
"""Takeover time against cache size and open connections: `serve kv` is filled with ITEMS
items of VALUE bytes and holds CONNS idle keep-alive connections, then a successor takes over
by socket (`--takeover SOCKET`). Measured: the wall time from starting the successor to the
old process's exit, the move as both processes report it (connections, state bytes, ms), and
afterwards that every connection still answers and a sample of items reads back.

usage: bench/takeover-move.py [--bin PATH] [--out DIR] [--name NAME] [--conns N]
                              [--sizes ITEMSxVALUE,...] [--memory-mb MB]
Writes OUT/NAME.json and OUT/NAME.md.
"""

import argparse, json, os, re, resource, socket, subprocess, sys, tempfile, time

PORT = 7610


def rt(s, req, end):
    s.sendall(req)
    buf = b""
    while not buf.endswith(end):
        d = s.recv(1 << 20)
        if not d:
            raise RuntimeError(f"EOF after {buf[-80:]!r}")
        buf += d
    return buf


def fill(items, value_bytes, conns=4):
    """Pipelined `set`s (noreply) over a few connections, then one round trip each."""
    value = b"v" * value_bytes
    socks = [socket.create_connection(("127.0.0.1", PORT)) for _ in range(conns)]
    batch = 2000
    for start in range(0, items, batch):
        s = socks[(start // batch) % conns]
        req = b"".join(b"set k%d %d 0 %d noreply\r\n%s\r\n" % (i, i & 0xffff, value_bytes, value)
                       for i in range(start, min(items, start + batch)))
        s.sendall(req)
    for s in socks:
        rt(s, b"mn\r\n", b"MN\r\n")
        s.close()


def spawn(binary, extra, log, memory_mb):
    cmd = [binary, "serve", "kv", "--listen", f"127.0.0.1:{PORT}", "--stats-interval", "0",
           "--memory-mb", str(memory_mb), "--drain-timeout", "30s", "--takeover-timeout", "60s"] + extra
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))


def wait_port():
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", PORT)).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("server did not start")


def one(binary, tmp, items, value_bytes, conns, memory_mb):
    sock_a, sock_b = os.path.join(tmp, "a.sock"), os.path.join(tmp, "b.sock")
    old = spawn(binary, ["--upgrade-socket", sock_a], os.path.join(tmp, "old.log"), memory_mb)
    wait_port()
    t = time.time()
    fill(items, value_bytes)
    fill_s = time.time() - t
    idle = [socket.create_connection(("127.0.0.1", PORT)) for _ in range(conns)]
    for s in idle:  # every one established in the server (deferred accept waits for data)
        rt(s, b"mn\r\n", b"MN\r\n")
    t0 = time.time()
    new = spawn(binary, ["--takeover", sock_a, "--upgrade-socket", sock_b],
                os.path.join(tmp, "new.log"), memory_mb)
    old.wait(timeout=600)
    exit_s = time.time() - t0
    # Every connection answers on the new process; a sample of items reads back.
    alive = sum(1 for s in idle if rt(s, b"mn\r\n", b"MN\r\n") == b"MN\r\n")
    probe = socket.create_connection(("127.0.0.1", PORT))
    sample = range(0, items, max(1, items // 1000))
    hits = sum(1 for i in sample if rt(probe, b"mg k%d v\r\n" % i, b"\r\n").startswith(b"VA"))
    answer_s = time.time() - t0
    new.terminate()
    new.wait(timeout=60)
    for s in idle:
        s.close()
    logs = open(os.path.join(tmp, "old.log")).read() + open(os.path.join(tmp, "new.log")).read()
    moved = re.search(r"moved to pid \d+: (\d+) connections and (\d+) bytes of state in (\d+) ms", logs)
    took = re.search(r"--takeover: took (\d+) connections and (\d+) bytes of state in (\d+) ms", logs)
    return {"items": items, "value_bytes": value_bytes, "conns": conns, "fill_s": round(fill_s, 2),
            "old_exit_s": round(exit_s, 3), "all_answered_s": round(answer_s, 3),
            "conns_alive_after": alive, "items_sampled": len(sample), "items_hit": hits,
            "old_reports": {"conns": int(moved[1]), "state_bytes": int(moved[2]), "ms": int(moved[3])} if moved else None,
            "new_reports": {"conns": int(took[1]), "state_bytes": int(took[2]), "ms": int(took[3])} if took else None}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/corelocal")
    p.add_argument("--out", default="results/takeover")
    p.add_argument("--name", default="takeover-move")
    p.add_argument("--conns", type=int, default=10000)
    p.add_argument("--sizes", default="0x1024,250000x1024,1000000x1024")
    p.add_argument("--memory-mb", type=int, default=1400)
    a = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    rows = []
    for size in a.sizes.split(","):
        items, value = (int(x) for x in size.split("x"))
        with tempfile.TemporaryDirectory(prefix="takeover-move-") as tmp:
            row = one(a.bin, tmp, items, value, a.conns, a.memory_mb)
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    meta = {"command": "bench/takeover-move.py " + " ".join(sys.argv[1:]), "machine": os.uname().nodename,
            "cpus": os.cpu_count(), "loadavg": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M")}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.name + ".json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(a.out, a.name + ".md"), "w") as f:
        f.write(f"# Takeover time vs cache size, {a.conns} open connections\n\n")
        f.write(f"`{meta['command']}` on {meta['cpus']} CPUs, load average {meta['loadavg'][0]:.2f}, {meta['date']}. ")
        f.write("Successor by `--takeover SOCKET`; the old process moves every connection between "
                "requests and, once its workers stopped, its cache; the new process serves once both are in.\n\n")
        f.write("| items × value | state moved | conns moved | move (old's report) | old exits after | every conn + 1,000 items answered after | conns alive | items hit |\n|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            o = r["old_reports"] or {}
            f.write(f"| {r['items']:,} × {r['value_bytes']} B | {o.get('state_bytes', 0) / 2**20:.0f} MiB | {o.get('conns', '?')} | "
                    f"{o.get('ms', '?')} ms | {r['old_exit_s']} s | {r['all_answered_s']} s | {r['conns_alive_after']}/{r['conns']} | "
                    f"{r['items_hit']}/{r['items_sampled']} |\n")


if __name__ == "__main__":
    main()
