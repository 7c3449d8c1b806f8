#!/usr/bin/env bash
# Connection rate per client core: corelocal bench crr (io_uring+direct, io_uring, epoll) vs
# wrk -H 'Connection: close' vs shared/tools/crr_client, against the same server (floor_server
# or nginx) on CPU 1, client on CPU 0, each run in a fresh network namespace, clients in
# alternating order (A B C A B C …). Needs root (unshare -n), gcc, wrk, jq, nginx.
#
# usage: bench/clients.sh [floor|nginx] [ROUNDS] [SECONDS] [CONNS] [OUTDIR]
# Writes OUTDIR/bench-clients-<date>-<server>.md (and the raw per-run files beside it).
set -euo pipefail
SERVER=${1:-floor}
ROUNDS=${2:-3}
SECS=${3:-5}
CONNS=${4:-64}
OUT=${5:-results/clients}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${CORELOCAL_SHARED:-$ROOT/../shared}
[ -f "$SHARED/tools/crr_client.c" ] || SHARED=/work/shared
BENCH=${BENCH:-$ROOT/target/release/corelocal-bench}
[ -x "$BENCH" ] || BENCH=${CARGO_TARGET_DIR:-$ROOT/target}/release/corelocal-bench
[ -x "$BENCH" ] || { echo "build it first: cargo build --release -p corelocal-bench" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
gcc -O2 -pthread "$SHARED/tools/floor_server.c" -o "$WORK/floor_server"
gcc -O2 "$SHARED/tools/crr_client.c" -o "$WORK/crr_client"
DATE=$(date -u +%F)
RAW="$OUT/bench-clients-$DATE-$SERVER"
rm -rf "$RAW"  # a new run never mixes with an older one of the same day
mkdir -p "$RAW"
PORT=8080

case "$SERVER" in
  floor) SERVER_CMD="$WORK/floor_server $PORT 1 1" ;;
  nginx)
    mkdir -p "$WORK/nginx/tmp"
    cat > "$WORK/nginx/nginx.conf" <<EOF
worker_processes 1; master_process off; daemon off;
pid $WORK/nginx/nginx.pid; error_log $WORK/nginx/error.log warn;
worker_rlimit_nofile 20000;
events { worker_connections 16384; }
http { access_log off;
  client_body_temp_path $WORK/nginx/tmp; proxy_temp_path $WORK/nginx/tmp; fastcgi_temp_path $WORK/nginx/tmp;
  uwsgi_temp_path $WORK/nginx/tmp; scgi_temp_path $WORK/nginx/tmp;
  server { listen 127.0.0.1:$PORT reuseport backlog=4096;
    location = /hello { default_type text/plain; return 200 "hello\n"; } } }
EOF
    SERVER_CMD="nginx -p $WORK/nginx -c $WORK/nginx/nginx.conf" ;;
  *) echo "server: floor or nginx" >&2; exit 2 ;;
esac

# One run in a fresh namespace: server on CPU1, the client command on CPU0.
# Prints "conns_per_s server_us_per_conn client_us_per_conn".
run_one() { # name
  local name=$1 f="$RAW/r$round-$1"
  unshare -n -- bash -s "$name" "$f" <<EOS
set -e
ip link set lo up
taskset -c 1 $SERVER_CMD >/dev/null 2>&1 &
SPID=\$!
for i in \$(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.05; done
sleep 0.2
sched() { cat /proc/\$SPID/task/*/schedstat 2>/dev/null | awk '{s+=\$1} END {printf "%.0f", s}'; }
s0=\$(sched)
case "\$1" in
  uring-direct|uring-fd|epoll|uring-direct-linger0)
    e=\${1%-linger0}; [ \$e = uring-direct ] && e=uring
    l=; [ "\$1" != "\${1%-linger0}" ] && l=--linger0
    "$BENCH" crr --target 127.0.0.1:$PORT --proto http --path /hello --cpus 0 --conns $CONNS \
      --duration ${SECS}s --warmup 0 --engine \$e \$l --progress never --json "\$2.json" >"\$2.txt" 2>&1
    s1=\$(sched)
    jq -r --arg s0 \$s0 --arg s1 \$s1 '"\(.throughput.conns_per_s) \((((\$s1|tonumber)-(\$s0|tonumber))/1000)/.throughput.conns) \(.client_cpu.us_per_unit)"' "\$2.json" ;;
  wrk)
    /usr/bin/time -f "%e %U %S" -o "\$2.time" taskset -c 0 wrk -t1 -c$CONNS -d${SECS}s -H 'Connection: close' \
      http://127.0.0.1:$PORT/hello >"\$2.txt" 2>&1
    s1=\$(sched)
    n=\$(awk '/requests in/ {print \$1}' "\$2.txt")
    read el u k < "\$2.time"
    awk -v n=\$n -v el=\$el -v u=\$u -v k=\$k -v s0=\$s0 -v s1=\$s1 'BEGIN {printf "%.0f %.2f %.2f\n", n/el, (s1-s0)/1000/n, (u+k)*1e6/n}' ;;
  crr_client|crr_client-linger0)
    l=; [ "\$1" = crr_client-linger0 ] && l=linger0
    /usr/bin/time -f "%e %U %S" -o "\$2.time" "$WORK/crr_client" $PORT 0 $CONNS $SECS \$l >"\$2.txt" 2>&1
    s1=\$(sched)
    n=\$(awk '{print \$2}' "\$2.txt")
    read el u k < "\$2.time"
    awk -v n=\$n -v el=\$el -v u=\$u -v k=\$k -v s0=\$s0 -v s1=\$s1 'BEGIN {printf "%.0f %.2f %.2f\n", n/el, (s1-s0)/1000/n, (u+k)*1e6/n}' ;;
esac
kill \$SPID 2>/dev/null || echo "server died during the run" >&2; wait \$SPID 2>/dev/null || true
EOS
}

CLIENTS=${CLIENTS:-"uring-direct uring-fd epoll crr_client wrk uring-direct-linger0 crr_client-linger0"}
echo "load before: $(cat /proc/loadavg)" | tee "$RAW/load"
for round in $(seq "$ROUNDS"); do
  for c in $CLIENTS; do
    line=$(run_one "$c" || true)
    # A run whose server died (or whose client failed) prints no figures: left out, and said so.
    if [ "$(echo "$line" | wc -w)" -eq 3 ]; then
      echo "$round $c $line" | tee -a "$RAW/runs.txt"
    else
      echo "$round $c failed: ${line:-no output}" | tee -a "$RAW/failed.txt"
    fi
  done
done
LOAD_AFTER=$(cat /proc/loadavg)
MD="$OUT/bench-clients-$DATE-$SERVER.md"
{
  echo "# Client connection rate: corelocal bench crr vs wrk vs crr_client ($SERVER)"
  echo
  echo "\`bench/clients.sh $SERVER $ROUNDS $SECS $CONNS\` — server \`$SERVER_CMD\` on CPU 1, client on CPU 0, $CONNS"
  echo "connections, ${SECS}s per run, each run in a fresh network namespace, clients alternating each round."
  echo "Load average before: $(cut -d' ' -f1-3 "$RAW/load" | sed 's/load before: //'); after: $(echo "$LOAD_AFTER" | cut -d' ' -f1-3)."
  if awk '{exit !($1 >= 1.0)}' /proc/loadavg; then
    echo "Load average ≥ 1 at the end: other work may have shared the CPUs; compare ratios, not absolute figures."
  fi
  echo
  echo "| client | conn/s: median (min–max) | ratio vs wrk | ratio vs crr_client | server CPU µs/conn | client CPU µs/conn | conn per client CPU-second | ratio vs wrk |"
  echo "|---|---|---|---|---|---|---|---|"
  med() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
  wrk_med=$(awk '$2=="wrk" {print $3}' "$RAW/runs.txt" | med)
  crr_med=$(awk '$2=="crr_client" {print $3}' "$RAW/runs.txt" | med)
  wrk_k=$(awk '$2=="wrk" {print $5}' "$RAW/runs.txt" | med)
  for c in $CLIENTS; do
    m=$(awk -v c=$c '$2==c {print $3}' "$RAW/runs.txt" | med)
    lo=$(awk -v c=$c '$2==c {print $3}' "$RAW/runs.txt" | sort -g | head -1)
    hi=$(awk -v c=$c '$2==c {print $3}' "$RAW/runs.txt" | sort -g | tail -1)
    s=$(awk -v c=$c '$2==c {print $4}' "$RAW/runs.txt" | med)
    k=$(awk -v c=$c '$2==c {print $5}' "$RAW/runs.txt" | med)
    awk -v c="$c" -v m=$m -v lo=$lo -v hi=$hi -v w=$wrk_med -v r=$crr_med -v s=$s -v k=$k -v wk=$wrk_k \
      'BEGIN {printf "| %s | %.0f (%.0f–%.0f) | %.3f | %.3f | %.2f | %.2f | %.0f | %.3f |\n", c, m, lo, hi, m/w, m/r, s, k, 1e6/k, wk/k}'
  done
  echo
  echo "Runs (round client conn/s server-µs/conn client-µs/conn):"
  echo
  echo '```'
  cat "$RAW/runs.txt"
  [ -f "$RAW/failed.txt" ] && { echo "left out:"; cat "$RAW/failed.txt"; }
  echo '```'
  echo
  echo "conn per client CPU-second = 10⁶ / client CPU µs per connection (median): the connection rate one fully"
  echo "available client core sustains, which holds when other work shares the CPUs and wall-clock conn/s does not."
  echo "The ratio vs wrk in that column is wrk's client µs/conn over this client's."
  echo
  echo "uring-direct = \`corelocal bench crr --engine uring\` (socket→setsockopt→bind→connect→send→recv as one"
  echo "linked io_uring chain into a fixed-file slot, close through the ring); uring-fd = the same with ordinary fds"
  echo "(socket/setsockopt/bind as syscalls); epoll = the fallback engine. wrk: \`wrk -t1 -c$CONNS -H 'Connection: close'\`"
  echo "pinned with taskset; crr_client: shared/tools/crr_client.c. Client CPU for wrk/crr_client is user+sys from"
  echo "/usr/bin/time over the whole run (includes start-up); for corelocal bench, its thread's CPU time in the window."
  echo "*-linger0: SO_LINGER 0 on the client (its close sends RST: the server keeps no TIME_WAIT, and the client's"
  echo "CPU, which runs the server's receive path on loopback, skips building it); ratios vs wrk are only fair without it."
} > "$MD"
cat "$MD"
