#!/usr/bin/env bash
# Where a one-shot connection's server CPU goes (issue 15): perf (software cpu-clock samples;
# this VM has no hardware counters) on the server process while `corelocal bench` drives 64
# connections, and strace -c syscall counts per connection. Server on CPU 1, client on CPU 0,
# each in a fresh network namespace.
#   http: one HTTP request per connection (server closes): corelocal (io_uring, epoll), nginx,
#         the C epoll floor server → results/oneshot/oneshot-profile.md
#   kv1:  one memcached get per connection (client closes): corelocal (io_uring, epoll),
#         memcached -t 1, the io_uring kv floor → results/oneshot/oneshot-profile-kv1.md
#   (http also has http-uring-floor, the io_uring HTTP floor, run only when ONLY names it)
# usage: [ONLY="NAME ..."] [CONNS=64] [MD=FILE] bench/oneshot-profile.sh [SECONDS] [http|kv1]
#   ONLY: these servers, in this order; MD: write there instead of the file above.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-4}
workload=${2:-http}
cargo build --release -q -p corelocal-cli
bin=$PWD/target/release/corelocal
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/www" "$tmp/nginx/tmp" && printf 'hello\n' >"$tmp/www/hello"
cat >"$tmp/nginx/nginx.conf" <<CONF
worker_processes 1; worker_cpu_affinity 10; daemon off; error_log /dev/null; pid $tmp/nginx/pid;
events { worker_connections 20000; use epoll; multi_accept on; }
http { access_log off; client_body_temp_path $tmp/nginx/tmp; proxy_temp_path $tmp/nginx/tmp;
  fastcgi_temp_path $tmp/nginx/tmp; uwsgi_temp_path $tmp/nginx/tmp; scgi_temp_path $tmp/nginx/tmp;
  server { listen 127.0.0.1:8080 reuseport backlog=4096; location = /hello { return 200 "hello\n"; } } }
CONF
gcc -O2 -o "$tmp/floor" ../shared/tools/floor_server.c
gcc -O2 -pthread -o "$tmp/kv-uring-floor" crates/corelocal-bench/src/compare/kv_uring_floor_server.c
gcc -O2 -pthread -o "$tmp/http-uring-floor" crates/corelocal-bench/src/compare/http_uring_floor_server.c
conns=${CONNS:-64}
declare -A servers
case $workload in
  http)
    servers=(
      [corelocal-uring]="$bin serve http --listen 127.0.0.1:8080 --cpus 1 --stats-interval 0 --root $tmp/www --backend uring"
      [corelocal-epoll]="$bin serve http --listen 127.0.0.1:8080 --cpus 1 --stats-interval 0 --root $tmp/www --backend epoll"
      [nginx]="/usr/sbin/nginx -p $tmp/nginx -c $tmp/nginx/nginx.conf"
      [floor]="$tmp/floor 8080 1 1"
      [http-uring-floor]="$tmp/http-uring-floor 8080 1 1"
    )
    order="corelocal-uring corelocal-epoll nginx floor"
    client="crr --target http://127.0.0.1:8080/hello"
    md=results/oneshot/oneshot-profile.md
    title="One-shot HTTP" ;;
  kv1)
    servers=(
      [corelocal-uring]="$bin serve kv --listen 127.0.0.1:8080 --cpus 1 --stats-interval 0 --backend uring"
      [corelocal-epoll]="$bin serve kv --listen 127.0.0.1:8080 --cpus 1 --stats-interval 0 --backend epoll"
      [memcached]="taskset -c 1 /usr/bin/memcached -l 127.0.0.1 -p 8080 -t 1 -U 0 -c 20000 -u nobody"
      [kv-uring-floor]="$tmp/kv-uring-floor 8080 1 1"
    )
    order="corelocal-uring corelocal-epoll memcached kv-uring-floor"
    client="kv --target 127.0.0.1:8080 --keys 1000 --get-ratio 1 --txns-per-conn 1"
    md=results/oneshot/oneshot-profile-kv1.md
    title="One memcached get per connection" ;;
  *) echo "usage: $0 [SECONDS] [http|kv1]" >&2; exit 2 ;;
esac
order=${ONLY:-$order}
md=${MD:-$md}
for name in $order; do
  [ -n "${servers[$name]:-}" ] || { echo "no server $name for $workload" >&2; exit 2; }
done
{
  echo "# $title: where the server's CPU goes"
  echo
  echo "\`${ONLY:+ONLY=\"$ONLY\" }${CONNS:+CONNS=$CONNS }bench/oneshot-profile.sh $secs $workload\` — 2-core VM, Linux $(uname -r). Server on CPU 1, \`corelocal bench $client --conns $conns\` on CPU 0, fresh netns per server; \`perf record -e cpu-clock\` on the server process for ${secs} s (software clock: no hardware counters here), then \`strace -c -f\` for ${secs} s (its overhead slows the run; counts per connection are what matter)."
} >"$md"
for name in $order; do
  unshare -n bash -euo pipefail -c '
    ip link set lo up
    name=$1; cmd=$2; bin=$3; secs=$4; tmp=$5; client=$6; conns=$7
    $cmd >/dev/null 2>&1 &
    server=$!
    for _ in $(seq 100); do ss -ltn | grep -q ":8080 " && break; sleep 0.05; done
    # nginx: profile the worker, not the master.
    target=$server
    if [ "$name" = nginx ]; then target=$(pgrep -P $server | head -1); fi
    "$bin" bench $client --cpus 0 --conns $conns \
        --duration $((2 * secs + 3))s --warmup 0 --progress never --json "$tmp/$name-bench.json" \
        >/dev/null 2>&1 &
    client=$!
    sleep 1
    perf record -q -e cpu-clock -F 4999 -g -p "$target" -o "$tmp/$name.data" -- sleep "$secs" >/dev/null 2>&1
    timeout "$secs" strace -c -f -p "$target" -o "$tmp/$name.strace" >/dev/null 2>&1 || true
    wait $client || true
    kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true
  ' _ "$name" "${servers[$name]}" "$bin" "$secs" "$tmp" "$client" "$conns"
  served=$(python3 -c "import json;print(json.load(open('$tmp/$name-bench.json'))['throughput']['units'])")
  {
    echo
    echo "## $name"
    echo
    echo "By path: share of the server's samples under each kernel entry (perf report --children;"
    echo "the paths nest only where noted, so they need not sum to 100%):"
    echo
    echo "| accept (do_accept) | send (tcp_sendmsg) | receive (tcp_recvmsg) | close (tcp_close: FIN, the peer's reply, teardown) | sleep/wake (__schedule) | user space |"
    echo "|---|---|---|---|---|---|"
    perf report -q -i "$tmp/$name.data" --children --sort sym --stdio -g none 2>/dev/null >"$tmp/$name.children" || true
    perf report -q -i "$tmp/$name.data" --no-children --sort dso --stdio -g none 2>/dev/null >"$tmp/$name.dso" || true
    share() { awk -v s="$1" '$NF == s { print $1; exit }' "$tmp/$name.children"; }
    user=$(awk '$2 !~ /kernel/ { gsub("%", "", $1); u += $1 } END { printf "%.2f%%", u }' "$tmp/$name.dso")
    echo "| $(share do_accept) | $(share tcp_sendmsg) | $(share tcp_recvmsg) | $(share tcp_close) | $(share __schedule) | $user |"
    echo
    echo "Top symbols by self time (perf report --no-children --sort sym):"
    echo
    echo '```'
    { perf report -q -i "$tmp/$name.data" --no-children --sort sym --stdio -g none 2>/dev/null | grep -v "^$" | head -25; } || true
    echo '```'
    echo
    echo "Syscalls (strace -c, whole ${secs} s window; the bench ran $served connections over $((2 * secs + 3)) s):"
    echo
    echo '```'
    head -25 "$tmp/$name.strace"
    echo '```'
  } >>"$md"
done
cat "$md"
