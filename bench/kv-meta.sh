#!/usr/bin/env bash
# Meta-protocol get/set server CPU per operation, serve kv vs memcached 1.6.18, beside the
# text-protocol rows: `corelocal bench compare --peer memcached --peer corelocal-kv` for the
# workloads kv (text gets), kv-meta (mg), kv-set (text sets), kv-meta-set (ms), kv-mix and
# kv-meta-mix (90% gets / 10% sets over 1,000 keys). Each compare alternates the two servers
# round by round (A B A B), each run in a fresh network namespace, server pinned to CPU 1,
# client on CPU 0, 64 keep-alive connections. Then writes OUTDIR/kv/meta-vs-memcached.{json,md}:
# medians, min–max and spread of server CPU µs/op per server, and the per-round paired ratio.
#
# Usage: bench/kv-meta.sh [ROUNDS] [DURATION] [OUTDIR] [--summarize-only RAWDIR]
#   ROUNDS (default 5), DURATION (default 3s), OUTDIR (default results); the raw compare
#   output goes to RAWDIR (default OUTDIR/kv/raw-meta). Needs root (network namespaces),
#   memcached and a release build (cargo build --release -p corelocal-cli). KV_META_NOTE: a
#   sentence for the report (which build, the conditions).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
duration=${2:-3s}
out=${3:-results}
raw=$out/kv/raw-meta
summarize_only=0
if [[ ${4:-} == --summarize-only ]]; then
    summarize_only=1
    raw=${5:?--summarize-only needs the directory of the compare runs}
fi
bin=${CORELOCAL_BIN:-target/release/corelocal}
workloads=(kv-meta kv kv-meta-set kv-set kv-meta-mix kv-mix)
mkdir -p "$out/kv" "$raw"
if ((!summarize_only)); then
    for w in "${workloads[@]}"; do
        echo "$w start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$raw/progress.log"
        "$bin" bench compare --peer memcached --peer corelocal-kv --workload "$w" \
            --rounds "$rounds" --duration "$duration" --out "$raw" --corelocal-bin "$bin" \
            >"$raw/$w.log" 2>&1 || echo "$w: compare exited $? (see $raw/$w.log)" >&2
        echo "$w end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$raw/progress.log"
    done
fi
python3 - "$raw" "$out/kv" "bench/kv-meta.sh $*" "${KV_META_NOTE:-}" "${workloads[@]}" <<'EOF'
import glob, json, statistics, sys

raw, out, invocation, note, workloads = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
DISTURBED_OPS = 10_000
what = {
    "kv": "text `get` (every key missing: `END`)",
    "kv-meta": "meta `mg <key> v` (every key missing: `EN`)",
    "kv-set": "text `set <key> 0 0 100`",
    "kv-meta-set": "meta `ms <key> 100`",
    "kv-mix": "text 90% get / 10% set over 1,000 keys (gets hit)",
    "kv-meta-mix": "meta 90% mg / 10% ms over 1,000 keys (gets hit)",
}
rows, cmds = [], []
for w in workloads:
    files = sorted(glob.glob(f"{raw}/bench-compare-*-{w}.json"))
    if not files:
        print(f"kv-meta: no compare output for {w} in {raw}", file=sys.stderr)
        continue
    d = json.load(open(files[-1]))
    cmds.append(d["command_line"])
    servers = {s["server"]["name"]: s for s in d["by_conns"][0]["servers"]}
    mc, kv = servers["memcached"], servers["corelocal-kv"]
    by_round, disturbed = {}, []
    for name, s in (("memcached", mc), ("corelocal-kv", kv)):
        for r in s["runs"]:
            # A run that served under DISTURBED_OPS ops/s met other work on the shared CPUs
            # (these runs do 50,000–250,000): its round is left out of the paired ratios.
            if (r["txns_per_s"] or 0) < DISTURBED_OPS:
                disturbed.append(f"{name} round {r['round']}: {r['txns_per_s']:.0f} ops/s")
                by_round.setdefault(r["round"], {})["disturbed"] = True
            elif r["server_us_per_txn"]:
                by_round.setdefault(r["round"], {})[name] = r["server_us_per_txn"]
    by_round = {k: v for k, v in by_round.items() if not v.get("disturbed")}
    paired = [v["corelocal-kv"] / v["memcached"] for v in by_round.values() if len(v) == 2]
    def fig(s):
        u = s["server_us_per_txn"]
        return {k: u[k] for k in ("median", "min", "max", "spread", "n")} if u else None
    rows.append({
        "workload": w,
        "what": what.get(w, w),
        "memcached_us_per_op": fig(mc),
        "corelocal_kv_us_per_op": fig(kv),
        "ratio_of_medians": kv["cpu_ratio_vs_baseline"],
        "paired_round_ratios": sorted(paired),
        "paired_ratio_median": statistics.median(paired) if paired else None,
        "ops_per_s_median": {"memcached": mc["txns_per_s"]["median"],
                             "corelocal-kv": kv["txns_per_s"]["median"]},
        "failures": mc["failures"] + kv["failures"],
        "disturbed_runs": disturbed,
        "load_before": d["load_before"],
        "load_after": d["load_after"],
        "source": files[-1].split("/")[-1],
    })
progress = open(f"{raw}/progress.log").read() if glob.glob(f"{raw}/progress.log") else ""
doc = {
    "title": "meta-protocol get/set server CPU per operation: serve kv vs memcached 1.6.18",
    "machine": "2-core VM (the project's shared development machine; other sessions building "
               "and benchmarking at the same time)",
    "command": invocation,
    "note": note,
    "compare_commands": cmds,
    "progress": progress.splitlines(),
    "rows": rows,
}
json.dump(doc, open(f"{out}/meta-vs-memcached.json", "w"), indent=1)

def f(u):
    return "—" if not u else f"{u['median']:.2f} ({u['min']:.2f}–{u['max']:.2f}, ±{u['spread'] * 50:.0f}%)"
md = ["# serve kv vs memcached 1.6.18: meta-protocol get/set server CPU per operation", ""]
md += ["Server CPU µs/op (schedstat run time of the server's threads ÷ operations) median over "
       "rounds (min–max, ±half-spread); ratio = corelocal-kv ÷ memcached (below 1: less CPU). "
       "Each compare alternates the servers round by round, each run in a fresh network "
       "namespace, server pinned to CPU 1, client on CPU 0, 64 keep-alive connections, 1 s "
       "warm-up. Paired ratio: the two servers' runs of the same round divided, median "
       "(min–max) over the rounds where neither run was disturbed (served under "
       f"{DISTURBED_OPS} ops/s, or failed: other sessions' work on the shared CPUs); the "
       "medians and the ratio of medians take every run that reported.", ""]
md += ["| workload | requests | memcached µs/op | corelocal-kv µs/op | ratio of medians | paired ratio median (min–max), rounds | ops/s medians (memcached / kv) | disturbed runs | load before → after |",
       "|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    p = r["paired_round_ratios"]
    pr = f"{r['paired_ratio_median']:.3f} ({p[0]:.3f}–{p[-1]:.3f}), {len(p)}" if p else "—"
    ratio = f"{r['ratio_of_medians']:.3f}" if r["ratio_of_medians"] else "—"
    ops = r["ops_per_s_median"]
    md.append(f"| {r['workload']} | {r['what']} | {f(r['memcached_us_per_op'])} | "
              f"{f(r['corelocal_kv_us_per_op'])} | {ratio} | {pr} | "
              f"{ops['memcached']:.0f} / {ops['corelocal-kv']:.0f} | {len(r['disturbed_runs'])} | "
              f"{' '.join(r['load_before'].split()[:3])} → {' '.join(r['load_after'].split()[:3])} |")
fails = [f"{r['workload']}: " + x.replace("\n", " / ") for r in rows for x in r["failures"]]
md += ["", f"Machine: {doc['machine']}.", ""] + ([note, ""] if note else []) + [ "Command: `" + doc["command"] + "`; the compare runs:", ""]
md += [f"- `{c}`" for c in cmds]
md += ["", "Failures: " + ("; ".join(fails) if fails else "none."), ""]
dist = [f"{r['workload']}: {x}" for r in rows for x in r["disturbed_runs"]]
md += ["Disturbed runs: " + ("; ".join(dist) if dist else "none."), ""]
md += ["Throughput here is client-bound and swings with the other work on the machine "
       "(both CPUs are shared); server CPU per op is the figure that compares the servers. "
       "The per-run tables, latency percentiles and per-run reports are in the compare output "
       "named in the JSON (`source`)."]
open(f"{out}/meta-vs-memcached.md", "w").write("\n".join(md) + "\n")
print(f"kv-meta: wrote {out}/meta-vs-memcached.json and .md", file=sys.stderr)
EOF
