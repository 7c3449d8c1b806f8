#!/usr/bin/env python3
"""MegaPipe Figure 1 on this machine: corelocal serve rpc, io_uring vs epoll, side by side.

(a) 64 B messages, transactions per connection 1, 2, 4, ..., 128;
(b) 10 transactions per connection, message sizes 64 B .. 16 KiB.
Each point runs both backends alternately (uring, epoll, uring, epoll ...) for --rounds rounds,
each run in a fresh network namespace, server pinned to CPU 1 (one worker), client on CPU 0.
Reports throughput and server CPU-us per transaction (schedstat of the server's threads), medians.

usage: sudo bench/megapipe.py [--rounds 2] [--duration 3s] [--out results/backends/megapipe]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "corelocal")

RUN = r"""
set -e
ip link set lo up
"$BIN" serve rpc --listen 127.0.0.1:7000 --cpus 1 --backend "$BACKEND" --balance off \
    --req-size "$SIZE" --resp-size "$SIZE" --stats-interval 0 2>/dev/null &
S=$!
sleep 0.4
"$BIN" bench rpc --target 127.0.0.1:7000 --cpus 0 --conns 64 --msg-size "$SIZE" \
    --resp-size "$SIZE" --txns-per-conn "$TXNS" --duration "$DURATION" --warmup 1s \
    --server-pid $S --json "$JSON" >/dev/null 2>&1
kill -TERM $S; wait $S || true
"""


def run_one(backend, size, txns, duration):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    env = dict(os.environ, BIN=BIN, BACKEND=backend, SIZE=str(size), TXNS=str(txns),
               DURATION=duration, JSON=path)
    subprocess.run(["unshare", "-n", "bash", "-c", RUN], env=env, check=True)
    with open(path) as f:
        r = json.load(f)
    os.unlink(path)
    tput = r["throughput"]
    cpu = r["server_cpu"]
    return {"txns_per_s": tput["txns_per_s"], "server_us_per_txn": cpu["schedstat_us_per_op"],
            "errors": r["errors"]["total"]}


def point(size, txns, rounds, duration):
    runs = {"uring": [], "epoll": []}
    for _ in range(rounds):
        for backend in ("uring", "epoll"):
            runs[backend].append(run_one(backend, size, txns, duration))
    out = {"msg_bytes": size, "txns_per_conn": txns}
    for backend, rs in runs.items():
        out[backend] = {
            "txns_per_s": statistics.median(r["txns_per_s"] for r in rs),
            "server_us_per_txn": statistics.median(r["server_us_per_txn"] for r in rs),
            "server_us_per_txn_runs": [round(r["server_us_per_txn"], 2) for r in rs],
            "errors": sum(r["errors"] for r in rs),
        }
    out["cpu_ratio_uring_vs_epoll"] = out["uring"]["server_us_per_txn"] / out["epoll"]["server_us_per_txn"]
    print(f"size {size:>6} txns {txns:>4}: uring {out['uring']['server_us_per_txn']:.2f} us "
          f"epoll {out['epoll']['server_us_per_txn']:.2f} us ratio {out['cpu_ratio_uring_vs_epoll']:.3f}",
          file=sys.stderr)
    return out


def table(points, key):
    lines = [f"| {key} | uring txn/s | epoll txn/s | uring µs/txn | epoll µs/txn | uring ÷ epoll CPU |",
             "|---:|---:|---:|---:|---:|---:|"]
    for p in points:
        lines.append(f"| {p[key]} | {p['uring']['txns_per_s']:.0f} | {p['epoll']['txns_per_s']:.0f} | "
                     f"{p['uring']['server_us_per_txn']:.2f} | {p['epoll']['server_us_per_txn']:.2f} | "
                     f"{p['cpu_ratio_uring_vs_epoll']:.3f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", default="3s")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "backends", "megapipe"))
    a = ap.parse_args()
    load = open("/proc/loadavg").read().strip()
    fig_a = [point(64, t, a.rounds, a.duration) for t in (1, 2, 4, 8, 16, 32, 64, 128)]
    fig_b = [point(s, 10, a.rounds, a.duration) for s in (64, 256, 1024, 4096, 16384)]
    report = {"command": " ".join(sys.argv), "load_before": load, "rounds": a.rounds,
              "duration": a.duration, "server": "corelocal serve rpc, 1 worker on CPU 1",
              "client": "corelocal bench rpc, 64 connections on CPU 0",
              "figure_1a_64B_by_txns_per_conn": fig_a, "figure_1b_10txns_by_msg_size": fig_b}
    with open(a.out + ".json", "w") as f:
        json.dump(report, f, indent=2)
    md = f"""# MegaPipe Figure 1 on this VM: io_uring vs epoll backends

`{report['command']}` — {a.rounds} rounds per point, backends alternating, each run {a.duration}
after 1 s warm-up in a fresh network namespace; server: one worker pinned to CPU 1; client:
64 connections on CPU 0. Medians. Load average before: {load}.

## (a) 64 B messages, by transactions per connection

{table(fig_a, 'txns_per_conn')}

## (b) 10 transactions per connection, by message size (bytes)

{table(fig_b, 'msg_bytes')}

Server CPU per transaction is the server threads' schedstat run time over the window ÷
transactions. On loopback the client's CPU runs the receive path of what it sends, so
throughput is client-bound and server CPU per transaction is the figure that compares backends.
"""
    with open(a.out + ".md", "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
