#!/usr/bin/env bash
# Instructions per one-shot connection of the server, counted by callgrind (deterministic in
# what it counts; this VM has no hardware counters): each binary serves one-shot HTTP
# (`bench crr --proto http`) and one-shot kv (`bench kv --txns-per-conn 1`) on each backend
# under `valgrind --tool=callgrind`, in a fresh network namespace. WARM connections first, then
# `callgrind_control --dump` zeroes the counters, N connections are measured and dumped again:
# start-up and stop are left out, and the per-connection figure is the second dump's total / N
# (the worker's thread: the other threads' work is periodic, not per connection). Server on
# CPU 1, client on CPU 0, 4 connections at a time.
# usage: bench/callgrind-oneshot.sh LABEL=BIN [LABEL=BIN ...]
#   (env: WARM, N, REPS, CONNS (4), CELLS ("uring/http uring/kv epoll/http epoll/kv"), KEEP=DIR
#   keeps each measured profile as DIR/LABEL-BACKEND-PROTO-REP.callgrind, PACED=GAP_MS measures
#   with bench/oneshot-paced.py instead: one connection at a time, GAP_MS between its steps, so
#   that the server's loop turns per connection do not depend on scheduling)
# prints one line per run and a markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
warm=${WARM:-200}
n=${N:-2000}
reps=${REPS:-2}
conns=${CONNS:-4}
cells=${CELLS:-"uring/http uring/kv epoll/http epoll/kv"}
keep=${KEEP:-}
paced=${PACED:-}
serve_args=${SERVE_ARGS:-}  # more `serve` options (e.g. the guard's --defer-accept-adaptive off)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/www" && printf 'hello\n' >"$tmp/www/hello"

# run BIN BACKEND PROTO -> Ir of the server over N connections
run() { # BIN BACKEND PROTO NAME
  local bin=$1 backend=$2 proto=$3 out=$tmp/cg.$RANDOM
  unshare -n bash -euo pipefail -c '
    ip link set lo up
    bin=$1; backend=$2; proto=$3; warm=$4; n=$5; out=$6; www=$7; conns=$8; paced=$9
    serve_args=${10}
    case $proto in
      http) serve="serve http --root $www"
            client="crr --target 127.0.0.1:8080 --proto http --path /hello" ;;
      kv) serve="serve kv"
          client="kv --target 127.0.0.1:8080 --keys 1000 --get-ratio 1 --txns-per-conn 1" ;;
    esac
    taskset -c 1 valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out" \
      "$bin" $serve --listen 127.0.0.1:8080 --cpus 1 --stats-interval 0 \
      --backend "$backend" $serve_args >/dev/null 2>&1 &
    server=$!
    for _ in $(seq 600); do ss -ltn | grep -q ":8080 " && break; sleep 0.1; done
    bench() { # REQUESTS CONNS
      "$bin" bench $client --cpus 0 --conns "$2" --requests "$1" --warmup 0 --progress never \
        --json "$out.json" >/dev/null 2>&1
      python3 -c "import json,sys; e=json.load(open(sys.argv[1]))[\"errors\"][\"total\"]; sys.exit(e != 0)" "$out.json"
    }
    # Paced: the warm-up goes one connection at a time too, so that the state of the allocator
    # that it leaves does not depend on how its connections overlapped.
    bench "$warm" "$([ -n "$paced" ] && echo 1 || echo "$conns")"
    callgrind_control --dump=warm "$server" >/dev/null 2>&1
    if [ -n "$paced" ]; then
      taskset -c 0 python3 bench/oneshot-paced.py "$proto" 127.0.0.1 8080 "$n" "$paced"
    else
      bench "$n" "$conns"
    fi
    callgrind_control --dump=measured "$server" >/dev/null 2>&1
    kill -KILL $server; wait $server 2>/dev/null || true
  ' _ "$bin" "$backend" "$proto" "$warm" "$n" "$out" "$tmp/www" "$conns" "$paced" "$serve_args"
  # The worker's thread only: per-connection work is its; the other threads' is periodic
  # (the main thread's counters sample, kv's crawler), so it would depend on the run's length.
  local worker
  worker=$(grep -l "Worker<S,B>::run" "$out".2-* | head -n 1)
  [ -n "$keep" ] && cp "$worker" "$keep/$4.callgrind"
  callgrind_annotate "$worker" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
  rm -f "$out"*
}

declare -a rows
for spec in "$@"; do
  label=${spec%%=*}
  bin=${spec#*=}
  for cell in $cells; do
    backend=${cell%/*} proto=${cell#*/}
    {
      for rep in $(seq "$reps"); do
        ir=$(run "$bin" "$backend" "$proto" "$label-$backend-$proto-$rep")
        per=$((ir / n))
        echo "$label $backend $proto rep $rep: Ir($n conns)=$ir per-conn=$per"
        rows+=("| $label | $backend | $proto | $rep | $ir | $per |")
      done
    }
  done
done
echo
echo "| build | backend | workload | rep | Ir ($n conns) | Ir per connection |"
echo "|---|---|---|---|---:|---:|"
printf '%s\n' "${rows[@]}"
