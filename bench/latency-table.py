#!/usr/bin/env python3
"""Summarises bench/latency.sh's runs of one workload: per load, each server's achieved rate,
p50 / p99 / p99.9 (median over rounds, min–max) and server CPU per op, and corelocal ÷ peer at
each percentile. usage: latency-table.py OUT WORKLOAD PEER PEAK LOADS "ROUNDS DURATION CONNS"
Writes OUT/latency-WORKLOAD.json and OUT/latency-WORKLOAD.md."""

import glob
import json
import os
import sys


def load_compare(path):
    files = glob.glob(os.path.join(path, "bench-compare-*.json"))
    if not files:
        sys.exit(f"latency-table: no comparison in {path}")
    return json.load(open(files[0]))


def spread(s):
    return None if s is None else {k: s[k] for k in ("median", "min", "max") if k in s}


def main():
    out, workload, peer, peak, loads, setup = sys.argv[1:7]
    rounds, duration, conns = setup.split()
    rows = []
    for load in loads.split(","):
        d = load_compare(os.path.join(out, f"{workload}-{load}"))
        servers = d["by_conns"][0]["servers"]
        for s in servers:
            rows.append({"load_pct": int(load), "rate": int(peak) * int(load) // 100,
                         "server": s["server"]["name"],
                         "ops_per_s": spread(s["txns_per_s"]),
                         "server_us_per_op": spread(s["server_us_per_txn"]),
                         "p50_us": spread(s["p50_us"]), "p99_us": spread(s["p99_us"]),
                         "p999_us": spread(s.get("p999_us")),
                         "errors": sum(r["errors"] for r in s["runs"]),
                         "failures": len(s["failures"]),
                         "load_avg": [r["load"] for r in s["runs"]]})
    res = {"workload": workload, "peer": peer, "peer_peak_per_s": int(peak),
           "rounds": int(rounds), "duration": duration, "conns": int(conns), "rows": rows}
    json.dump(res, open(os.path.join(out, f"latency-{workload}.json"), "w"), indent=1)
    open(os.path.join(out, f"latency-{workload}.md"), "w").write(markdown(res))
    print(markdown(res))


def fmt(s, digits=0):
    if not s:
        return "–"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def ratio(rows, load, key, peer):
    mine = [r for r in rows if r["load_pct"] == load and r["server"] != peer]
    theirs = [r for r in rows if r["load_pct"] == load and r["server"] == peer]
    if not mine or not theirs or not mine[0][key] or not theirs[0][key]:
        return "–"
    return f"{mine[0][key]['median'] / theirs[0][key]['median']:.2f}"


def markdown(res):
    w, peer = res["workload"], res["peer"]
    what = {"crr": "one-shot HTTP (GET /hello, one request per connection)",
            "kv1": "one memcached get per connection"}.get(w, w)
    lines = [f"# Latency at fixed load: {what}, corelocal vs {peer}", "",
             f"    bench/latency.sh {res['rounds']}   (DURATION={res['duration']} CONNS={res['conns']})", "",
             f"Open loop (`bench {w} --rate R`: each request timed from when it was due), {res['conns']} "
             f"client connections on CPU 0, one server worker / process on CPU 1, a fresh network "
             f"namespace per run, the servers alternating in each of {res['rounds']} rounds of "
             f"{res['duration']}. Loads are shares of {peer}'s closed-loop peak here, "
             f"{res['peer_peak_per_s']}/s (on 2 cores partly the client's limit). Latencies in µs, "
             f"median over rounds (min–max); ratio = corelocal ÷ {peer} at the median.", "",
             "| load | rate/s | server | achieved ops/s | server CPU µs/op | p50 | p99 | p99.9 | errors |",
             "|---|---:|---|---|---|---|---|---|---:|"]
    for r in res["rows"]:
        lines.append(f"| {r['load_pct']}% | {r['rate']} | {r['server']} | {fmt(r['ops_per_s'])} | "
                     f"{fmt(r['server_us_per_op'], 2)} | {fmt(r['p50_us'], 1)} | {fmt(r['p99_us'], 1)} | "
                     f"{fmt(r['p999_us'], 1)} | {r['errors']} |")
    lines += ["", f"| load | p50 ratio | p99 ratio | p99.9 ratio | server CPU ratio |", "|---|---:|---:|---:|---:|"]
    for load in sorted({r["load_pct"] for r in res["rows"]}):
        lines.append(f"| {load}% | {ratio(res['rows'], load, 'p50_us', peer)} | "
                     f"{ratio(res['rows'], load, 'p99_us', peer)} | {ratio(res['rows'], load, 'p999_us', peer)} | "
                     f"{ratio(res['rows'], load, 'server_us_per_op', peer)} |")
    lines += ["", "Load averages per run are in the JSON (`load_avg`).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
