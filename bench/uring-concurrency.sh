#!/usr/bin/env bash
# Concurrent idle connections held by ONE corelocal server process with the io_uring backend,
# while RLIMIT_NOFILE is 20,000: accepted connections are direct descriptors (per-ring tables).
# Reports user-space memory per idle connection (server RSS delta) and kernel slab per
# connection (both ends). Runs in a fresh network namespace.
#
# usage: bench/uring-concurrency.sh [HOLDERS] [CONNS_PER_HOLDER]    (default 3 × 17000)
# writes: results/backends/uring-concurrency.json and results/backends/uring-concurrency.md
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${CORELOCAL_IN_NETNS:-}" ]; then
    cargo build --release -q -p corelocal-cli
    exec env CORELOCAL_IN_NETNS=1 unshare -n "$0" "$@"
fi
holders=${1:-3}
per=${2:-17000}
bin=target/release
ip link set lo up
stats=$(mktemp)
"$bin/corelocal" serve rpc --listen 127.0.0.1:7000 --cpus 0-1 --workers-per-cpu 2 \
    --backend uring --mode fine --idle-timeout 10m --stats-interval 200ms --stats-file "$stats" \
    >/dev/null 2>"$stats.err" &
server=$!
sleep 1
kb() { awk -v k="$2" '$1 == k":" {print $2}' "$1"; }
rss0=$(kb /proc/$server/status VmRSS)
slab0=$(kb /proc/meminfo Slab)
pids=()
for i in $(seq "$holders"); do
    (sleep 600 | "$bin/corelocal-hold" 127.0.0.1:7000 "$per" 64 600 >"$stats.h$i") &
    pids+=($!)
done
deadline=$((SECONDS + 120))
while :; do
    done_count=$(cat "$stats".h* 2>/dev/null | grep -c '^verified' || true)
    [ "$done_count" -ge "$holders" ] && break
    [ $SECONDS -lt $deadline ] || { echo "holders did not finish"; cat "$stats".h* "$stats.err"; exit 1; }
    sleep 0.5
done
sleep 0.5
open=$(tail -n 1 "$stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"]["open"])')
rss1=$(kb /proc/$server/status VmRSS)
slab1=$(kb /proc/meminfo Slab)
fds=$(ls /proc/$server/fd | wc -l)
nofile=$(awk '/Max open files/ {print $4}' /proc/$server/limits)
kill -TERM $server
pkill -f corelocal-hold || true
wait $server || true
python3 - "$open" "$rss0" "$rss1" "$slab0" "$slab1" "$fds" "$nofile" "$holders" "$per" <<'PY'
import json, sys, platform, os
open_, rss0, rss1, slab0, slab1, fds, nofile, holders, per = map(int, sys.argv[1:])
r = {
    "what": "idle connections held by one corelocal serve rpc process (io_uring, 2 workers per CPU on CPUs 0-1, fine mode)",
    "command": f"bench/uring-concurrency.sh {holders} {per}",
    "host": {"kernel": platform.release(), "cpus": os.cpu_count()},
    "rlimit_nofile": nofile,
    "connections_open": open_,
    "server_fds_open": fds,
    "server_rss_kib_before": rss0,
    "server_rss_kib_after": rss1,
    "user_bytes_per_idle_conn": round((rss1 - rss0) * 1024 / max(open_, 1), 1),
    "kernel_slab_bytes_per_conn_both_ends": round((slab1 - slab0) * 1024 / max(open_, 1), 1),
}
json.dump(r, open("results/backends/uring-concurrency.json", "w"), indent=2)
md = f"""# One process, {open_:,} concurrent connections, RLIMIT_NOFILE {nofile:,}

`{r['command']}` (kernel {r['host']['kernel']}, {r['host']['cpus']} CPUs)

| connections open | server fds open | RLIMIT_NOFILE | server RSS before → after | user-space bytes / idle conn | kernel slab bytes / conn (both ends) |
|---:|---:|---:|---|---:|---:|
| {open_:,} | {fds} | {nofile:,} | {rss0:,} KiB → {rss1:,} KiB | {r['user_bytes_per_idle_conn']} | {r['kernel_slab_bytes_per_conn_both_ends']} |

Accepted connections are io_uring direct descriptors (4 rings × 20,000 slots); the process's fd
table holds only listeners, rings and eventfds. The clients are {holders} `corelocal-hold`
processes (each below its own fd limit); every connection was verified with one 64 B request.
"""
open("results/backends/uring-concurrency.md", "w").write(md)
print(md)
PY
rm -f "$stats" "$stats".*
