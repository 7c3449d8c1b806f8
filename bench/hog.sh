#!/usr/bin/env bash
# Affinity-Accept §6.5 on this VM, with a core that is really starved (issue 13): CPU 1 runs a
# busy loop at nice -20, the server's worker on CPU 1 is reniced to 19 (so it barely runs),
# one-shot RPC clients pinned to CPU 1 at nice -20 (their SYNs are processed there, so `local`
# mode queues them on the starved worker), --backlog 128. Balancer off vs on, alternating
# (A B A B), each run in a fresh network namespace. Needs root (nice -20, unshare -n).
# usage: bench/hog.sh [ROUNDS] [SECONDS] [BACKEND]  → results/balancer/hog-starved[-BACKEND].{json,md}
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
secs=${2:-5}
backend=${3:-auto}
cargo build --release -q -p corelocal-cli
bin=$PWD/target/release/corelocal
suffix=$([ "$backend" = auto ] && echo "" || echo "-$backend")
out=results/balancer/hog-starved$suffix
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One run inside a private network namespace: prints the bench JSON path.
one_run() { # balance round
    local balance=$1 round=$2 json=$tmp/$1-$2.json stats=$tmp/$1-$2-stats.json
    unshare -n bash -euo pipefail -c '
        ip link set lo up
        bin=$1; balance=$2; secs=$3; json=$4; stats=$5; backend=$6
        "$bin" serve rpc --one-shot --listen 127.0.0.1:7000 --cpus 0-1 --backlog 128 \
            --backend "$backend" --balance "$balance" --stats-interval 200ms \
            --stats-file "$stats" 2>/dev/null &
        server=$!
        for _ in $(seq 100); do ss -ltn | grep -q ":7000 " && break; sleep 0.05; done
        taskset -c 1 nice -n -20 sh -c "while :; do :; done" &
        hog=$!
        tid=$(grep -l "^corelocal-w1$" /proc/$server/task/*/comm | head -1 | cut -d/ -f5)
        renice -n 19 -p "$tid" >/dev/null
        nice -n -20 "$bin" bench crr --proto rpc --target 127.0.0.1:7000 --cpus 1 \
            --conns 64 --duration "${secs}s" --warmup 0 --timeout 1s --progress never \
            --max-error-rate 1 --json "$json" >/dev/null 2>&1 || true
        kill $hog; sleep 0.3; kill $server; wait $server 2>/dev/null || true
    ' _ "$bin" "$balance" "$secs" "$json" "$stats" "$backend"
}

for r in $(seq 1 "$rounds"); do
    for balance in off on; do
        one_run "$balance" "$r"
        echo "round $r balance $balance done" >&2
    done
done

python3 - "$tmp" "$rounds" "$secs" "$backend" "$out" <<'PY'
import json, statistics, sys, os, platform
tmp, rounds, secs, backend, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
runs = []
for r in range(1, rounds + 1):
    for bal in ("off", "on"):
        b = json.load(open(f"{tmp}/{bal}-{r}.json"))
        lines = [l for l in open(f"{tmp}/{bal}-{r}-stats.json") if l.strip()]
        st = json.loads(lines[-1]) if lines else {"workers": []}
        lat = b["latency"]["session"] or b["latency"]["txn"] or {}
        w = st.get("workers", [])
        runs.append({
            "balance": bal, "round": r,
            "conns_per_s": b["throughput"]["units_per_s"],
            "completed": b["throughput"]["units"],
            "p50_us": lat.get("p50_us"), "p99_us": lat.get("p99_us"),
            "errors": b["errors"]["total"],
            "timeouts": sum(k.get("count", 0) for k in b["errors"]["by_kind"] if "timeout" in json.dumps(k).lower()),
            "served_per_worker": [x.get("requests", 0) for x in w],
            "stolen_per_worker": [x.get("stolen", 0) for x in w],
            "migrated_in_per_worker": [x.get("migrated_in", 0) for x in w],
        })
def med(bal, key):
    v = [x[key] for x in runs if x["balance"] == bal and x[key] is not None]
    return (statistics.median(v), min(v), max(v)) if v else (None, None, None)
cmd = f"bench/hog.sh {rounds} {secs} {backend}"
doc = {"command": cmd, "machine": f"2-core VM ({platform.node()}), Linux {platform.release()}",
       "setup": "CPU 1: busy loop at nice -20; server worker on CPU 1 reniced to 19; "
                "clients: corelocal bench crr --proto rpc --cpus 1 --conns 64 --timeout 1s at nice -20; "
                "serve rpc --one-shot --cpus 0-1 --backlog 128; fresh netns per run",
       "backend": backend, "runs": runs}
json.dump(doc, open(out + ".json", "w"), indent=1)
with open(out + ".md", "w") as f:
    f.write(f"# Starved core: balancer off vs on ({backend} backend)\n\n`{cmd}` — {doc['machine']}.\n\n")
    f.write(doc["setup"] + ". Rounds alternate off, on.\n\n")
    f.write("| balancer | conn/s median (min–max) | p50 µs | p99 µs | errors (timeouts) median | served by worker 0 / worker 1 (median run) |\n|---|---|---|---|---|---|\n")
    for bal in ("off", "on"):
        c = med(bal, "conns_per_s"); p50 = med(bal, "p50_us"); p99 = med(bal, "p99_us"); e = med(bal, "errors")
        mine = sorted([x for x in runs if x["balance"] == bal], key=lambda x: x["conns_per_s"])[len([x for x in runs if x["balance"] == bal]) // 2]
        sp = " / ".join(str(v) for v in mine["served_per_worker"])
        f.write(f"| {bal} | {c[0]:.0f} ({c[1]:.0f}–{c[2]:.0f}) | {p50[0] or 0:.0f} | {p99[0] or 0:.0f} | {e[0]:.0f} | {sp} |\n")
    f.write("\nPer run:\n\n| balancer | round | conn/s | completed | p50 µs | p99 µs | errors | served per worker | stolen per worker | groups migrated in |\n|---|---|---|---|---|---|---|---|---|---|\n")
    for x in runs:
        f.write(f"| {x['balance']} | {x['round']} | {x['conns_per_s']:.0f} | {x['completed']} | {x['p50_us'] or 0:.0f} | {x['p99_us'] or 0:.0f} | {x['errors']} | {x['served_per_worker']} | {x['stolen_per_worker']} | {x['migrated_in_per_worker']} |\n")
print(open(out + ".md").read())
PY
