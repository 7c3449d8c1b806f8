#!/usr/bin/env bash
# Latency at fixed load (issue 34): open-loop, coordinated-omission-free runs (`bench … --rate`:
# each request is timed from when it was due, not from when the client got round to it) at
# 50%, 80% and 95% of the peer's one-worker peak, corelocal and the peer alternating in each
# round (`bench compare`, a fresh network namespace per run, server on CPU 1, client on CPU 0).
#   one-shot HTTP (crr, GET /hello, one request per connection): corelocal-http vs nginx
#   one get per connection (kv1):                                corelocal-kv   vs memcached -t 1
# The peak is the peer's median closed-loop rate over ROUNDS runs at 64 connections (on this
# 2-core VM that is the client's limit as much as the server's: said in the result).
# usage: bench/latency.sh [ROUNDS] [LOADS]   (defaults: 3 and 50,80,95)
#   env: DURATION (each run, default 10s), CONNS (client connections, default 64),
#        WORKLOADS (default "crr kv1"), OUT (default results/latency)
# writes: OUT/latency-WORKLOAD.{json,md} (the summary) and OUT/WORKLOAD-LOAD/ (each compare)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3} loads=${2:-50,80,95}
duration=${DURATION:-10s} conns=${CONNS:-64} out=${OUT:-results/latency}
cargo build --release -q -p corelocal-cli
bin=$PWD/target/release/corelocal
mkdir -p "$out"
compare() { # DIR WORKLOAD PEERS... [-- EXTRA...]
    local dir=$1 workload=$2
    shift 2
    rm -rf "$dir" && mkdir -p "$dir"
    "$bin" bench compare --rounds "$rounds" --duration "$duration" --conns "$conns" \
        --workload "$workload" --out "$dir" --corelocal-bin "$bin" "$@" >"$dir/log.txt" 2>&1 ||
        { tail -20 "$dir/log.txt" >&2; exit 1; }
    # Each run's own report and plots (~250 KiB a comparison) stay out of the repository.
    find "$dir" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
}
for workload in ${WORKLOADS:-crr kv1}; do
    case $workload in
        crr) peer=nginx mine=corelocal-http ;;
        kv1) peer=memcached mine=corelocal-kv ;;
        *) echo "latency.sh: unknown workload $workload" >&2; exit 2 ;;
    esac
    compare "$out/$workload-peak" "$workload" --peer "$peer" --peer "$mine"
    peak=$(python3 -c 'import json,sys,glob
d=json.load(open(glob.glob(sys.argv[1]+"/bench-compare-*.json")[0]))
print(int(next(s for s in d["by_conns"][0]["servers"] if s["server"]["name"]==sys.argv[2])["txns_per_s"]["median"]))' \
        "$out/$workload-peak" "$peer")
    echo "latency.sh: $workload: $peer's closed-loop peak $peak/s"
    for load in ${loads//,/ }; do
        rate=$((peak * load / 100))
        echo "latency.sh: $workload at $load% ($rate/s) ..."
        compare "$out/$workload-$load" "$workload" --peer "$peer" --peer "$mine" -- --rate "$rate"
    done
    python3 bench/latency-table.py "$out" "$workload" "$peer" "$peak" "$loads" "$rounds $duration $conns"
done
