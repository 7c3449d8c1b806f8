#!/usr/bin/env bash
# Re-records the result files committed under results/clients/bench-clients-* and
# results/compare/bench-compare-*: client comparison against
# floor_server and nginx, then A B A B server comparisons (one-shot and keep-alive).
# Needs root (network namespaces), gcc, wrk, jq, nginx; builds the binaries first.
# usage: bench/record.sh [ROUNDS] [SECONDS]
set -euo pipefail
ROUNDS=${1:-3}
SECS=${2:-5}
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -p corelocal-bench -p corelocal-cli
BIN=$CARGO_TARGET_DIR/release
export BENCH=$BIN/corelocal-bench
echo "load average: $(cat /proc/loadavg)"
bench/clients.sh floor "$ROUNDS" "$SECS" 64 results/clients
bench/clients.sh nginx "$ROUNDS" "$SECS" 64 results/clients
"$BENCH" compare --peer floor --peer nginx --peer corelocal-rpc --workload crr \
  --rounds "$ROUNDS" --duration "${SECS}s" --corelocal-bin "$BIN/corelocal" --out results/compare
"$BENCH" compare --peer floor --peer nginx --peer corelocal-rpc --workload ka \
  --rounds "$ROUNDS" --duration "${SECS}s" --corelocal-bin "$BIN/corelocal" --out results/compare
