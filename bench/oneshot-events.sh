#!/usr/bin/env bash
# Kernel events per one-shot connection, counted (not sampled, so not skewed by a busy machine):
# each build serves one-shot HTTP (`bench crr --proto http`) and one memcached get per
# connection (`bench kv --txns-per-conn 1`) on each backend, in a fresh network namespace,
# server on CPU 1, client on CPU 0, 4 connections at a time. After WARM connections, `perf record
# -a` takes these tracepoints over N connections: syscalls entered (by name), io_uring requests
# submitted (by opcode), handed to io-wq and armed as polls (by opcode), io_uring task-work runs,
# softirqs run and packets sent in each process's context, context switches and wake-ups done,
# TCP resets sent / received. Events are split by process (server / client) and thread kind (io-wq worker
# or not) and divided by N.
# usage: bench/oneshot-events.sh LABEL=BIN [LABEL=BIN ...]   (env: WARM, N, PROTOS, BACKENDS, JSON)
# BIN `floor` runs the C io_uring floor of the protocol instead (http_uring_floor_server.c,
# kv_uring_floor_server.c, from crates/corelocal-bench/src/compare; its backend column reads
# uring whatever BACKENDS says, and it runs once), driven by the first other BIN's client or
# target/release/corelocal's.
# prints one block per run; JSON=FILE also writes the counts as JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
warm=${WARM:-500}
n=${N:-2000}
conns=${CONNS:-4}
protos=${PROTOS:-"http kv"}
backends=${BACKENDS:-"uring epoll"}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/www" && printf 'hello\n' >"$tmp/www/hello"
driver=
for spec in "$@"; do
  if [ "${spec#*=}" = floor ]; then
    for proto in http kv; do
      gcc -O2 -pthread -o "$tmp/${proto}-floor" "crates/corelocal-bench/src/compare/${proto}_uring_floor_server.c"
    done
  elif [ -z "$driver" ]; then
    driver=$(realpath "${spec#*=}")
  fi
done
driver=${driver:-$PWD/target/release/corelocal}
events=raw_syscalls:sys_enter,io_uring:io_uring_submit_req,io_uring:io_uring_queue_async_work
events=$events,io_uring:io_uring_poll_arm,io_uring:io_uring_local_work_run
events=$events,io_uring:io_uring_task_work_run,irq:softirq_entry,net:net_dev_xmit
events=$events,exceptions:page_fault_user,exceptions:page_fault_kernel,sched:sched_switch,sched:sched_wakeup,tcp:tcp_send_reset,tcp:tcp_receive_reset

# run LABEL BIN BACKEND PROTO -> one JSON line on stdout
run() {
  local label=$1 bin=$2 backend=$3 proto=$4 out=$tmp/ev.$RANDOM
  unshare -n bash -euo pipefail -c '
    ip link set lo up
    bin=$1; backend=$2; proto=$3; warm=$4; n=$5; out=$6; www=$7; events=$8; conns=$9
    driver=${10}; floor=${11}
    case $proto in
      http) serve="serve http --root $www"
            client="crr --target 127.0.0.1:8080 --proto http --path /hello" ;;
      kv) serve="serve kv"
          client="kv --target 127.0.0.1:8080 --keys 1000 --get-ratio 1 --txns-per-conn 1" ;;
    esac
    if [ "$bin" = floor ]; then
      taskset -c 1 "$floor" 8080 1 1 >/dev/null 2>&1 &
    else
      taskset -c 1 "$bin" $serve --listen 127.0.0.1:8080 --cpus 1 --stats-interval 0 \
        --backend "$backend" >/dev/null 2>&1 &
    fi
    server=$!
    for _ in $(seq 100); do ss -ltn | grep -q ":8080 " && break; sleep 0.05; done
    bench() {
      "$driver" bench $client --cpus 0 --conns "$conns" --requests "$1" --warmup 0 --progress never \
        --json "$out.json" >/dev/null 2>&1 &
      echo $! >"$out.cpid"
      wait $!
      python3 -c "import json,sys; e=json.load(open(sys.argv[1]))[\"errors\"][\"total\"]; sys.exit(e != 0)" "$out.json"
    }
    bench "$warm"
    perf record -q -a -m 8192 -e "$events" -o "$out.perf" 2>"$out.perflog" &
    perf=$!
    sleep 2
    bench "$n"
    kill -INT $perf; wait $perf 2>/dev/null || true
    echo $server >"$out.pid"
    kill -KILL $server; wait $server 2>/dev/null || true
  ' _ "$bin" "$backend" "$proto" "$warm" "$n" "$out" "$tmp/www" "$events" "$conns" \
    "$driver" "$tmp/${proto}-floor"
  perf script -i "$out.perf" -F pid,tid,comm,event,trace 2>/dev/null |
    python3 bench/oneshot-events-tally.py "$(cat "$out.pid")" "$(cat "$out.cpid")" "$n" "$label" "$backend" "$proto"
  cat "$out.perflog" >&2
  rm -f "$out"*
}

lines=()
for spec in "$@"; do
  label=${spec%%=*}
  bin=${spec#*=}
  backends_here=$backends
  [ "$bin" = floor ] && backends_here=uring
  for backend in $backends_here; do
    for proto in $protos; do
      line=$(run "$label" "$bin" "$backend" "$proto")
      lines+=("$line")
      python3 -c '
import json, sys
r = json.loads(sys.argv[1])
print("%s %s %s (per connection, N=%d)" % (r["label"], r["backend"], r["proto"], r["n"]))
for who in ("server", "client"):
    for k, v in sorted(r[who].items()):
        print(f"  {who:6} {k:48} {v:8.3f}")
' "$line"
    done
  done
done
if [ -n "${JSON:-}" ]; then
  printf '%s\n' "${lines[@]}" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
json.dump(rows, open(sys.argv[1], "w"), indent=1)
' "$JSON"
fi
