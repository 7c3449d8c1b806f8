#!/usr/bin/env bash
# corelocal steer, measured: nginx (Debian nginx-light, 2 workers, worker_cpu_affinity 01 10,
# listen … reuseport) and a Python asyncio server started once per CPU with SO_REUSEPORT, each
# with and without `corelocal steer attach`, same client, alternating rounds (A B, then B A),
# each run in a fresh network namespace with RPS on lo spreading flows over CPUs 0-1.
#
#   bench/steer.sh [nginx|python|all] [ROUNDS=5] [CONNS=30000]
#
# Per run:
# - `corelocal bench crr` pinned to CPU 0, 64 concurrent one-shot HTTP connections, CONNS in
#   total; server CPU = the server processes' /proc/PID/task/*/schedstat run time over the
#   client's run ÷ connections (exact ns; softirq work that lands on a server thread counts);
# - locality: 200 keep-alive connections opened from CPU 0 and held; `corelocal steer status
#   --connections` reads SO_INCOMING_CPU of each connection the workers hold (with RPS the
#   CPU that processed a flow's packets is the one that processed its SYN) and counts those
#   held by the worker pinned to that CPU;
# - with steer: the program's per-CPU counters (SYNs steered / fallen back).
# Writes results/steer/steer-<server>$STEER_SUFFIX.json and .md (each run also records the 1-minute
# load average at its start). Needs root (netns, eBPF).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${CORELOCAL:-$ROOT/target/release/corelocal}
PORT=18100
HELD=200

if [[ "${1:-}" == "--inner" ]]; then
    server=$2 variant=$3 round=$4 conns=$5 work=$6
    mount -t sysfs sysfs /sys
    ip link set lo up
    echo 3 > /sys/class/net/lo/queues/rx-0/rps_cpus
    case $server in
    nginx)
        mkdir -p "$work/nginx" && chmod 0777 "$work/nginx"
        d=$work/nginx
        cat > "$d/nginx.conf" <<EOF
worker_processes 2;
worker_cpu_affinity 01 10;
pid $d/nginx.pid;
error_log $d/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $d/body;
  keepalive_requests 100000;
  server { listen 127.0.0.1:$PORT reuseport; location / { return 200 "ok\n"; } }
}
EOF
        nginx -e "$d/error.log" -p "$d" -c "$d/nginx.conf"
        sleep 0.3
        pid=$(cat "$d/nginx.pid")
        ;;
    python)
        setsid bash -c "taskset -c 0 python3 $ROOT/bench/steer_pyserver.py $PORT & taskset -c 1 python3 $ROOT/bench/steer_pyserver.py $PORT & wait" &
        pid=$!
        ;;
    esac
    for _ in $(seq 100); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1',$PORT)).close()" 2>/dev/null && break
        sleep 0.1
    done
    sleep 0.5
    # steer: attach with its balancer (the default); steer-off: `--balance off`.
    if [[ $variant == steer* ]]; then
        balance=$([[ $variant == steer-off ]] && echo off || echo on)
        "$BIN" steer attach --pid "$pid" --balance "$balance" > "$work/attach.txt" 2>&1
    fi
    balancer=$(pgrep -f "steer watch --pid $pid .*--started-by-attach" || true)
    bsched() { local s=0; for f in /proc/$balancer/task/*/schedstat; do [[ -r $f ]] && s=$((s + $(cut -d' ' -f1 "$f"))); done; echo $s; }
    tree="$pid $(ps -o pid= --ppid "$pid" | tr '\n' ' ')"
    sched() { local s=0; for p in $tree; do for f in /proc/$p/task/*/schedstat; do s=$((s + $(cut -d' ' -f1 "$f"))); done; done; echo $s; }
    load=$(cut -d' ' -f1 /proc/loadavg)
    before=$(sched)
    bbefore=$(bsched)
    "$BIN" bench crr --target 127.0.0.1:$PORT --path / --cpus 0 -n "$conns" --conns 64 \
        --json "$work/crr.json" --progress never > "$work/crr.md" 2>&1
    after=$(sched)
    bafter=$(bsched)
    # Locality: hold HELD keep-alive connections opened from CPU 0, read them on the server.
    python3 - "$PORT" "$HELD" "$BIN" "$pid" "$work/conn.json" <<'EOF'
import os, socket, subprocess, sys
port, n, binary, pid, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
os.sched_setaffinity(0, {0})
held = []
for _ in range(n):
    s = socket.create_connection(('127.0.0.1', port))
    s.sendall(b'GET / HTTP/1.1\r\nHost: b\r\n\r\n')
    got = b''
    while not got.endswith(b'ok\n'):
        got += s.recv(4096)
    held.append(s)
with open(out, 'w') as f:
    subprocess.run([binary, 'steer', 'status', '--pid', pid, '--connections', '--json'], stdout=f, check=True)
EOF
    "$BIN" steer status --pid "$pid" --json > "$work/status.json"
    kill -- -"$pid" 2>/dev/null || kill "$pid"
    sleep 0.2
    python3 - "$server" "$variant" "$round" "$before" "$after" "$work" "$load" "$bbefore" "$bafter" <<'EOF'
import json, sys
server, variant, rnd, before, after, work = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
load = float(sys.argv[7])
balancer_ns = int(sys.argv[9]) - int(sys.argv[8])
crr = json.load(open(work + '/crr.json'))
conn = json.load(open(work + '/conn.json'))['connections']
st = json.load(open(work + '/status.json'))['groups'][0]
conns = crr['throughput']['conns']
print(json.dumps({
    'server': server, 'variant': variant, 'round': rnd,
    'conns': conns, 'conns_per_s': crr['throughput']['conns_per_s'],
    'errors': crr['errors']['total'],
    'server_cpu_us_per_conn': (after - before) / 1000 / max(conns, 1),
    'balancer_cpu_ms': balancer_ns / 1e6,
    'run_s': crr['throughput'].get('duration_s') or conns / max(crr['throughput']['conns_per_s'], 1),
    'held': sum(r['conns'] for r in conn), 'held_local': sum(r['local'] for r in conn),
    'held_per_worker': [r['conns'] for r in conn],
    'method': st['method'], 'loadavg_1m': load,
    'syn_steered': sum(c['steered'] for c in st['counts']),
    'syn_fallback': sum(c['fallback'] for c in st['counts']),
}))
EOF
    exit 0
fi

which=${1:-all}
rounds=${2:-5}
conns=${3:-30000}
servers=$([[ $which == all ]] && echo "nginx python" || echo "$which")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for server in $servers; do
    runs=$work/$server.jsonl
    : > "$runs"
    for r in $(seq 1 "$rounds"); do
        order=$([[ $((r % 2)) == 1 ]] && echo "hash steer" || echo "steer hash")
        for v in $order; do
            mkdir -p "$work/run"
            unshare -n -m bash "$0" --inner "$server" "$v" "$r" "$conns" "$work/run" >> "$runs"
            tail -1 "$runs" >&2
            rm -rf "$work/run"
        done
    done
    python3 - "$server" "$runs" "$ROOT/results/steer/steer-$server${STEER_SUFFIX:-}" "$rounds" "$conns" <<'EOF'
import json, statistics as st, sys, os, platform, datetime
server, runs, out, rounds, conns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rows = [json.loads(l) for l in open(runs)]
def by(v): return [r for r in rows if r['variant'] == v]
def med(v, k): return st.median(r[k] for r in by(v))
pairs = []
for r in range(1, rounds + 1):
    h = [x for x in rows if x['round'] == r and x['variant'] == 'hash'][0]
    s = [x for x in rows if x['round'] == r and x['variant'] == 'steer'][0]
    pairs.append(s['server_cpu_us_per_conn'] / h['server_cpu_us_per_conn'])
summary = {
    'server': server, 'rounds': rounds, 'conns_per_run': conns,
    'machine': '2-core KVM guest (Linux %s); other engineers\' builds were running concurrently' % platform.release(),
    'date': datetime.datetime.utcnow().strftime('%Y-%m-%d %H:%M UTC'),
    'hash': {'server_cpu_us_per_conn_median': med('hash', 'server_cpu_us_per_conn'),
             'conns_per_s_median': med('hash', 'conns_per_s'),
             'locality_median': st.median(r['held_local'] / r['held'] for r in by('hash'))},
    'steer': {'server_cpu_us_per_conn_median': med('steer', 'server_cpu_us_per_conn'),
              'conns_per_s_median': med('steer', 'conns_per_s'),
              'locality_median': st.median(r['held_local'] / r['held'] for r in by('steer')),
              'syn_steered_total': sum(r['syn_steered'] for r in by('steer')),
              'syn_fallback_total': sum(r['syn_fallback'] for r in by('steer'))},
    'server_cpu_ratio_steer_over_hash_per_round': pairs,
    'server_cpu_ratio_median': st.median(pairs),
    'runs': rows,
}
json.dump(summary, open(out + '.json', 'w'), indent=1)
h, s = summary['hash'], summary['steer']
srv = {'nginx': 'nginx 1.22.1 (Debian nginx-light), 2 workers, `worker_cpu_affinity 01 10`, `listen 127.0.0.1:%d reuseport`, access_log off' ,
       'python': 'Python asyncio server (bench/steer_pyserver.py: `asyncio.start_server(reuse_port=True)`), one process per CPU under `taskset -c 0` / `-c 1`'}[server]
md = f"""# corelocal steer: {server} with and without `steer attach`

`bench/steer.sh {server} {rounds} {conns}` — {summary['date']}, {summary['machine']}.

Server: {srv % 18100 if '%d' in srv else srv}. Client: `corelocal bench crr --cpus 0 --conns 64 -n {conns}` (one-shot HTTP
GET, client closes), pinned to CPU 0; RPS on lo (`rps_cpus` = 3) spreads flows over CPUs 0–1,
so SYNs are processed on both CPUs. Each run in a fresh network namespace; rounds alternate the
order (hash, steer / steer, hash). Server CPU = schedstat run time of all server processes over
the client's run ÷ connections. Locality = share of 200 held keep-alive connections (opened
from CPU 0) that the worker pinned to the CPU that processed them holds (`steer status
--connections`).

| | kernel hash | steer attach (eBPF) |
|---|---|---|
| locality (median of {rounds}) | {h['locality_median']*100:.1f}% | {s['locality_median']*100:.1f}% |
| server CPU µs / connection (median) | {h['server_cpu_us_per_conn_median']:.2f} | {s['server_cpu_us_per_conn_median']:.2f} |
| connections/s (median; client-bound) | {h['conns_per_s_median']:.0f} | {s['conns_per_s_median']:.0f} |
| SYNs steered / fell back (program counters, all runs) | – | {s['syn_steered_total']} / {s['syn_fallback_total']} |

Server CPU steer ÷ hash, paired per round: {', '.join('%.3f' % p for p in pairs)} (median {summary['server_cpu_ratio_median']:.3f}).

| round | variant | load 1m | conns | conn/s | errors | server CPU µs/conn | held local / held (per worker) | SYNs steered / fallback |
|---|---|---|---|---|---|---|---|---|
""" + "\n".join(
    f"| {r['round']} | {r['variant']} | {r.get('loadavg_1m', '?')} | {r['conns']} | {r['conns_per_s']:.0f} | {r['errors']} | {r['server_cpu_us_per_conn']:.2f} | {r['held_local']}/{r['held']} ({'/'.join(map(str, r['held_per_worker']))}) | {r['syn_steered']} / {r['syn_fallback']} |"
    for r in rows) + "\n"
open(out + '.md', 'w').write(md)
print(md)
EOF
done
