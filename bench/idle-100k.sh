#!/usr/bin/env bash
# One process holding 100,000+ idle connections with RLIMIT_NOFILE 20,000, in the default mode
# (`local`, balancer on), 3 workers per CPU, and still answering new clients at once (issue 13).
# Holders are `corelocal-hold` processes pinned half to CPU 0, half to CPU 1 (their SYNs are
# processed there, so `local` mode spreads each CPU's connections over its 3 workers). While
# they hold, 200 new one-shot clients per CPU are timed. Runs in a fresh network namespace.
#
# With SKEW=1 every holder is pinned to CPU 1: all SYNs land on CPU 1's three workers, which
# fill up to their descriptor table and stop accepting; CPU 0's workers must take the rest from
# their queues (a worker that cannot accept counts as busy for the balancer).
#
# usage: [SKEW=1] bench/idle-100k.sh [HOLDERS] [CONNS_PER_HOLDER]   (default 6 × 17000)
# writes: results/idle/idle-100k.json and results/idle/idle-100k.md (SKEW=1: results/idle/idle-100k-skewed.*)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${CORELOCAL_IN_NETNS:-}" ]; then
    cargo build --release -q -p corelocal-cli
    exec env CORELOCAL_IN_NETNS=1 unshare -n "$0" "$@"
fi
holders=${1:-6}
per=${2:-17000}
bin=target/release
ip link set lo up
stats=$(mktemp)
"$bin/corelocal" serve rpc --listen 127.0.0.1:7000 --workers-per-cpu 3 --idle-timeout 10m \
    --stats-interval 500ms --stats-file "$stats" >/dev/null 2>"$stats.err" &
server=$!
sleep 1
head -1 "$stats.err"
pids=()
for i in $(seq "$holders"); do
    cpu=$((i % 2)); [ -n "${SKEW:-}" ] && cpu=1
    (sleep 900 | taskset -c $cpu "$bin/corelocal-hold" 127.0.0.1:7000 "$per" 64 900 >"$stats.h$i") &
    pids+=($!)
done
started=$SECONDS
deadline=$((SECONDS + 300))
while :; do
    done_count=$(cat "$stats".h* 2>/dev/null | grep -c '^verified' || true)
    [ "$done_count" -ge "$holders" ] && break
    [ $SECONDS -lt $deadline ] || { echo "holders did not finish"; cat "$stats".h* "$stats.err"; exit 1; }
    sleep 0.5
done
verify_s=$((SECONDS - started))
sleep 1
probe() { # cpu → JSON of a 200-connection one-shot probe from that CPU
    "$bin/corelocal" bench crr --proto rpc --target 127.0.0.1:7000 --cpus "$1" --conns 1 \
        --requests 200 --timeout 2s --progress never --json "$stats.p$1" >/dev/null 2>&1 || true
    cat "$stats.p$1"
}
probe 0 >/dev/null
probe 1 >/dev/null
sleep 0.6
tail -n 1 "$stats" >"$stats.last"
nofile=$(awk '/Max open files/ {print $4}' /proc/$server/limits)
fds=$(ls /proc/$server/fd | wc -l)
rss=$(awk '$1 == "VmRSS:" {print $2}' /proc/$server/status)
kill -TERM $server
pkill -f corelocal-hold || true
for p in "${pids[@]}"; do pkill -P "$p" sleep 2>/dev/null || true; done
wait $server || true
python3 - "$stats" "$nofile" "$fds" "$rss" "$holders" "$per" "${SKEW:-}" "$verify_s" <<'PY'
import json, sys, platform, os
stats, nofile, fds, rss, holders, per = sys.argv[1], *map(int, sys.argv[2:7])
skew, verify_s = sys.argv[7] == "1", float(sys.argv[8])
stem = "results/idle/idle-100k-skewed" if skew else "results/idle/idle-100k"
last = json.load(open(stats + ".last"))
workers = last["workers"]
probes = {}
for cpu in (0, 1):
    b = json.load(open(f"{stats}.p{cpu}"))
    lat = b["latency"]["session"] or b["latency"]["txn"]
    probes[cpu] = {"completed": b["throughput"]["units"], "errors": b["errors"]["total"],
                   "p50_us": lat["p50_us"], "p99_us": lat["p99_us"], "max_us": lat["max_us"]}
open_total = last["total"]["open"]
acc = sum(w["accepted"] for w in workers)
loc = sum(w["accepted_local"] for w in workers)
r = {"what": "idle connections held by one `corelocal serve rpc --workers-per-cpu 3` (default: local mode, balancer on, io_uring)",
     "command": ("SKEW=1 " if skew else "") + f"bench/idle-100k.sh {holders} {per}",
     "holders_pinned": "all on CPU 1" if skew else "half on CPU 0, half on CPU 1",
     "all_verified_after_s": verify_s,
     "stolen_per_worker": [w["stolen"] for w in workers], "machine": f"2-core VM, Linux {platform.release()}",
     "rlimit_nofile": nofile, "server_fds_open": fds, "server_rss_kib": rss,
     "connections_open": open_total, "open_per_worker": [w["open"] for w in workers],
     "locality": round(loc / max(acc, 1), 4), "probes_while_holding": probes}
json.dump(r, open(stem + ".json", "w"), indent=2)
md = f"""# One process, {open_total:,} idle connections, RLIMIT_NOFILE {nofile:,}, default mode

`{r['command']}` — {r['machine']}. Server: `corelocal serve rpc --workers-per-cpu 3 --idle-timeout 10m`
(local mode, eBPF steering, balancer on, io_uring). Holders: {holders} `corelocal-hold` processes × {per:,}
connections, pinned {r['holders_pinned']}, each connection verified with one 64 B request (every one
answered, all within {verify_s:.1f} s of the holders' start; a holder fails on any 30 s wait).

| connections open | per worker | stolen per worker | server fds | RSS | locality |
|---:|---|---|---:|---:|---:|
| {open_total:,} | {r['open_per_worker']} | {r['stolen_per_worker']} | {fds} | {rss:,} KiB | {r['locality']:.4f} |

New clients while they are held (200 one-shot connections from each CPU, one at a time):

| client CPU | completed | errors | p50 µs | p99 µs | max µs |
|---|---:|---:|---:|---:|---:|
""" + "".join(f"| {c} | {p['completed']} | {p['errors']} | {p['p50_us']:.0f} | {p['p99_us']:.0f} | {p['max_us']:.0f} |\n" for c, p in probes.items())
open(stem + ".md", "w").write(md)
print(md)
PY
rm -f "$stats" "$stats".*
