#!/usr/bin/env bash
# Issue 36: the library's path costs what the built-in server's does. Server CPU per get of the
# `kv` example (crates/corelocal/examples/kv.rs, its line protocol: `GET key`) beside `corelocal
# serve kv` and memcached (text protocol: `get key`), one get per connection (kv1) and gets on
# keep-alive connections (kv), all misses over 1,000 keys: the same work per request. bench
# compare: A B C rounds alternating, each in a fresh network namespace, server on CPU 1,
# client on CPU 0.
# usage: [DRIVER=BIN] bench/kv-example.sh [ROUNDS]
# writes: results/library/kv-example-{kv1,kv}.{json,md}
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
# DRIVER=BIN: a corelocal binary kept aside, with the example at BIN's directory/examples/kv.
bin=${DRIVER:-}
if [ -z "$bin" ]; then
    cargo build --release -q -p corelocal-cli
    cargo build --release -q -p corelocal --example kv
    bin=$PWD/target/release/corelocal
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p results/library
for w in kv1 kv; do
    "$bin" bench compare --rounds "$rounds" --workload "$w" --conns 64 --baseline memcached \
        --out "$out/$w" --corelocal-bin "$bin" \
        --peer memcached --peer corelocal-kv --peer corelocal-kv-example
    cp "$out/$w"/bench-compare-*.json "results/library/kv-example-$w.json"
    cp "$out/$w"/bench-compare-*.md "results/library/kv-example-$w.md"
done
