#!/usr/bin/env bash
# Issue 15's candidates, one A/B each: two corelocal builds (or one build with two option sets)
# side by side on the one-shot workloads — HTTP, one request per connection at 16 and 64
# connections (the server closes), and one memcached get per connection at 64 (the client
# closes). bench compare alternates A B A B, each run in a fresh network namespace, server on
# CPU 1, client on CPU 0; the figure is server CPU per op (schedstat) and its wake-ups per op.
# usage: [DRIVER=BIN] bench/oneshot-ab.sh NAME ROUNDS A_NAME=BIN[:ARGS] B_NAME=BIN[:ARGS]
#   e.g. bench/oneshot-ab.sh defer-accept 5 off=target/release/corelocal on=target/release/corelocal:'--defer-accept 1'
# writes: results/oneshot/ab-NAME-crr.{json,md}, results/oneshot/ab-NAME-kv1.{json,md}
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 4 ] || { sed -n 2,9p "$0" >&2; exit 2; }
name=$1 rounds=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/www" && printf 'hello\n' >"$out/www/hello"
servers() { # PROTO BASE_ARGS → --server flags for A and B
    for spec in "$A" "$B"; do
        local label=${spec%%=*} rest=${spec#*=}
        local bin=${rest%%:*} args=""
        [ "$rest" != "$bin" ] && args=${rest#*:}
        printf '%s\n' "--server" "$label=$1:$bin $2 $args"
    done
}
A=$3 B=$4
# The current build drives the runs (older builds may lack compare's options); DRIVER=BIN
# names another (a copy kept aside, to measure while the tree builds something else).
# ONLY=crr|kv1: one workload only.
driver=${DRIVER:-}
if [ -z "$driver" ]; then
    cargo build --release -q -p corelocal-cli
    driver=$PWD/target/release/corelocal
fi
base="--listen 127.0.0.1:{port} --cpus {cpu} --stats-interval 0"
run() { # WORKLOAD CONNS PROTO BASE_ARGS SUFFIX
    mapfile -t s < <(servers "$3" "$4")
    "$driver" bench compare --rounds "$rounds" --out "$out/$5" --workload "$1" --conns "$2" \
        --baseline "${A%%=*}" "${s[@]}"
    cp "$out/$5"/bench-compare-*.json "results/oneshot/ab-$name-$5.json"
    cp "$out/$5"/bench-compare-*.md "results/oneshot/ab-$name-$5.md"
}
# ONLY=crr or ONLY=kv1 runs one of the two.
[ "${ONLY:-crr}" = crr ] && run crr 16,64 http "serve http $base --root $out/www" crr
[ "${ONLY:-kv1}" = kv1 ] && run kv1 64 kv "serve kv $base" kv1
true
