#!/usr/bin/env bash
# Issue 15 (and issue 13's before/after): server CPU per operation, one-shot and keep-alive,
# corelocal against nginx, the C epoll floor servers (HTTP and kv) and memcached, side by side (bench compare:
# A B A B rounds, each run in a fresh network namespace, server on CPU 1, client on CPU 0).
# usage: bench/oneshot.sh [ROUNDS] [BEFORE_BINARY]
#   BEFORE_BINARY: an older `corelocal` to compare with (e.g. a build of an earlier commit).
# writes: results/oneshot/oneshot-*.{json,md} (one pair per workload)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
before=${2:-}
cargo build --release -q -p corelocal-cli
bin=$PWD/target/release/corelocal
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The same 6-byte /hello nginx's and the floor's presets answer.
mkdir -p "$out/www" && printf 'hello\n' >"$out/www/hello"
http="serve http --listen 127.0.0.1:{port} --cpus {cpu} --stats-interval 0 --root $out/www"
kv="serve kv --listen 127.0.0.1:{port} --cpus {cpu} --stats-interval 0"
rpc="serve rpc --one-shot --listen 127.0.0.1:{port} --cpus {cpu} --stats-interval 0"
with_before() { # PROTO ARGS → a --server for the older binary, if given
    [ -n "$before" ] && printf '%s\n' "--server" "before=$1:$before $2"
    return 0
}
run() { # NAME ARGS… → results/oneshot/oneshot-NAME.{json,md}
    local name=$1; shift
    "$bin" bench compare --rounds "$rounds" --out "$out/$name" --corelocal-bin "$bin" "$@"
    cp "$out/$name"/bench-compare-*.json "results/oneshot/oneshot-$name.json"
    cp "$out/$name"/bench-compare-*.md "results/oneshot/oneshot-$name.md"
}
mapfile -t b_http < <(with_before http "$http")
mapfile -t b_kv < <(with_before kv "$kv")
# One-shot HTTP at four concurrencies: corelocal (io_uring and epoll), nginx, the floors (epoll
# and io_uring: no user-space work).
run http-crr --workload crr --conns 16,64,256,1024 --baseline nginx \
    --server "corelocal=http:$bin $http" --server "corelocal-epoll=http:$bin $http --backend epoll" \
    "${b_http[@]}" --peer nginx --peer floor --peer http-uring-floor
# Keep-alive HTTP.
run http-ka --workload ka --conns 64 --baseline nginx \
    --server "corelocal=http:$bin $http" "${b_http[@]}" --peer nginx --peer floor --peer http-uring-floor
# memcached gets: 1 and 100 per connection; kv-floor and kv-uring-floor are the C epoll and
# io_uring floors for this protocol (no user work: what the kernel and the interface cost).
for w in kv1 kv100; do
    run "$w" --workload "$w" --conns 64 --baseline memcached \
        --server "corelocal=kv:$bin $kv" --server "corelocal-epoll=kv:$bin $kv --backend epoll" \
        "${b_kv[@]}" --peer memcached --peer kv-floor --peer kv-uring-floor
done
# MegaPipe's one transaction per connection: io_uring against our own epoll.
run rpc-crr-backends --workload crr --conns 64 --baseline epoll \
    --server "epoll=rpc:$bin $rpc --backend epoll" --server "uring=rpc:$bin $rpc --backend uring"
