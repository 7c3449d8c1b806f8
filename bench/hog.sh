#!/usr/bin/env bash
# Affinity-Accept §6.5 on this VM: one worker's CPU hogged by a pinned busy loop, `local` mode,
# balancer off vs on, side by side (A B A B), one-shot RPC from a client on the hogged CPU (its
# SYNs are processed there, so `local` mode queues them on the hogged worker; CPU 0 has room).
# usage: bench/hog.sh [ROUNDS] [DURATION]   → results/hog-balancer.{json,md}
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
duration=${2:-5s}
cargo build --release -q -p corelocal-cli -p corelocal-bench
bin=$PWD/target/release/corelocal
# The hog: a busy loop pinned to CPU 1 at normal priority, for the whole comparison.
taskset -c 1 sh -c 'while :; do :; done' &
hog=$!
trap 'kill $hog 2>/dev/null || true' EXIT
out=$(mktemp -d)
common="serve rpc --listen 127.0.0.1:{port} --cpus 0-1 --mode local --one-shot --stats-interval 0"
"$bin" bench compare --rounds "$rounds" --duration "$duration" --workload crr \
    --client-cpus 1 --server-cpu 0 --out "$out" \
    --server "balancer-off=rpc:$bin $common --balance off" \
    --server "balancer-on=rpc:$bin $common --balance on"
for ext in json md; do cp "$out"/bench-compare-*-crr.$ext results/hog-balancer.$ext; done
rm -rf "$out"
