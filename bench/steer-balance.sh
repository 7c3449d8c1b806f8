#!/usr/bin/env bash
# corelocal steer's balancer (issue 33), measured on nginx (Debian nginx-light, 2 workers,
# worker_cpu_affinity 01 10), each run in a fresh network namespace, the client pinned to CPU 0
# (on loopback its SYNs are processed there, so they belong to the worker pinned to CPU 0).
#
#   bench/steer-balance.sh [scenarios|cpu|all] [ROUNDS=3] [CONNS=30000]
#
# scenarios: the worker on CPU 0 stopped (SIGSTOP) or starved (moved to a cpu cgroup with the
#   least share while a busy loop in one with the most runs on CPU 0; the client joins the hog's
#   group at nice -20, so the hog starves the worker, not the client). 100 fresh one-shot
#   clients, one after another, each with 1 s from connect to the whole answer: answered,
#   failed, p50/p99 of the answered. Servers: nginx's default (one shared listener, no
#   reuseport), `listen … reuseport` + `steer attach --balance off`, and + `steer attach`
#   (balancer on, the default).
# cpu: nothing busy: `bench/steer.sh --inner nginx` with `steer attach --balance off` and with
#   the balancer, alternating (off, on / on, off), 64 concurrent one-shot connections with RPS
#   on lo: server CPU per connection (schedstat), locality, and the balancer's own CPU.
#
# Writes results/steer/balance-scenarios.{json,md} and results/steer/balance-cpu.{json,md}.
# Needs root (netns, eBPF, cgroups), nginx, python3, taskset.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${CORELOCAL:-$ROOT/target/release/corelocal}
PORT=18110
CLIENTS=100

if [[ "${1:-}" == "--inner" ]]; then
    variant=$2 scenario=$3 round=$4 work=$5
    mount -t sysfs sysfs /sys
    ip link set lo up
    d=$work/nginx
    mkdir -p "$d" && chmod 0777 "$d"
    rp=$([[ $variant == shared ]] && echo "" || echo " reuseport")
    cat > "$d/nginx.conf" <<EOF
worker_processes 2;
worker_cpu_affinity 01 10;
pid $d/nginx.pid;
error_log $d/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $d/body;
  server { listen 127.0.0.1:$PORT$rp; location / { return 200 "ok\n"; } }
}
EOF
    nginx -e "$d/error.log" -p "$d" -c "$d/nginx.conf"
    sleep 0.5
    pid=$(cat "$d/nginx.pid")
    case $variant in
    steer-off) "$BIN" steer attach --pid "$pid" --balance off > "$work/attach.txt" ;;
    steer-on) "$BIN" steer attach --pid "$pid" > "$work/attach.txt" ;;
    esac
    sleep 0.3
    victim=""
    for w in $(pgrep -P "$pid"); do
        [[ $(taskset -pc "$w" | awk '{print $NF}') == 0 ]] && victim=$w
    done
    hog_group=""
    case $scenario in
    stopped) kill -STOP "$victim" ;;
    starved)
        cg=$work/cg && mkdir -p "$cg" && mount -t cgroup -o cpu cgroup "$cg"
        mkdir -p "$cg/cl-low" "$cg/cl-high"
        echo 2 > "$cg/cl-low/cpu.shares"
        echo 262144 > "$cg/cl-high/cpu.shares"
        echo "$victim" > "$cg/cl-low/tasks"
        setsid bash -c "echo \$\$ > $cg/cl-high/tasks; exec taskset -c 0 sh -c 'while :; do :; done'" &
        hog=$!
        hog_group=$cg/cl-high/tasks
        sleep 0.2
        ;;
    esac
    python3 - "$PORT" "$CLIENTS" "$hog_group" > "$work/clients.json" <<'EOF'
import json, os, socket, sys, time
port, n, hog_group = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.sched_setaffinity(0, {0})
if hog_group:
    open(hog_group, 'w').write(str(os.getpid()))
    os.setpriority(os.PRIO_PROCESS, 0, -20)
out = []
for _ in range(n):
    t0 = time.monotonic()
    try:
        s = socket.create_connection(('127.0.0.1', port), timeout=1.0)
        s.sendall(b'GET / HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n')
        got = b''
        while not got.endswith(b'ok\n'):
            left = 1.0 - (time.monotonic() - t0)
            if left <= 0:
                raise TimeoutError
            s.settimeout(left)
            k = s.recv(4096)
            if not k:
                raise ConnectionError('closed')
            got += k
        took = time.monotonic() - t0
        out.append(took if took <= 1.0 else None)
    except Exception:
        out.append(None)
    finally:
        try:
            s.close()
        except Exception:
            pass
print(json.dumps(out))
EOF
    case $scenario in
    stopped) kill -CONT "$victim" ;;
    starved) kill "$hog" 2>/dev/null || true; echo "$victim" > "$work/cg/tasks" ;;
    esac
    redirected=0
    if [[ $variant == steer-on ]]; then
        redirected=$("$BIN" steer status --pid "$pid" --json | python3 -c \
            'import json,sys; print(sum(c["redirected"] for g in json.load(sys.stdin)["groups"] for c in g["counts"]))')
    fi
    kill -QUIT "$pid"
    sleep 0.3
    python3 - "$variant" "$scenario" "$round" "$work/clients.json" "$redirected" <<'EOF'
import json, sys
variant, scenario, rnd, path, redirected = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
lat = json.load(open(path))
ok = sorted(x for x in lat if x is not None)
q = lambda p: ok[min(len(ok) - 1, int(p * len(ok)))] * 1e3 if ok else None
print(json.dumps({'variant': variant, 'scenario': scenario, 'round': rnd,
                  'answered': len(ok), 'failed': len(lat) - len(ok),
                  'p50_ms': q(0.5), 'p99_ms': q(0.99), 'syns_redirected': redirected}))
EOF
    exit 0
fi

which=${1:-all}
rounds=${2:-3}
conns=${3:-30000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
load() { cut -d' ' -f1 /proc/loadavg; }

if [[ $which == scenarios || $which == all ]]; then
    runs=$work/scenarios.jsonl
    : > "$runs"
    for r in $(seq 1 "$rounds"); do
        for scenario in stopped starved; do
            for v in shared steer-off steer-on; do
                mkdir -p "$work/run"
                l=$(load)
                unshare -n -m bash "$0" --inner "$v" "$scenario" "$r" "$work/run" \
                    | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['loadavg_1m']=$l; print(json.dumps(d))" >> "$runs"
                tail -1 "$runs" >&2
                rm -rf "$work/run"
            done
        done
    done
    python3 - "$runs" "$ROOT/results/steer/balance-scenarios" "$rounds" <<'EOF'
import json, statistics as st, sys, platform, datetime
runs, out, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(runs)]
date = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')
summary = {'date': date, 'machine': '2-core KVM guest, Linux %s' % platform.release(),
           'command': 'bench/steer-balance.sh scenarios %d' % rounds, 'clients_per_run': 100,
           'runs': rows}
json.dump(summary, open(out + '.json', 'w'), indent=1)
names = {'shared': "nginx's default (one shared listener)",
         'steer-off': 'reuseport + `steer attach --balance off`',
         'steer-on': 'reuseport + `steer attach` (balancer)'}
lines = []
for sc in ('stopped', 'starved'):
    for v in ('shared', 'steer-off', 'steer-on'):
        rs = [r for r in rows if r['scenario'] == sc and r['variant'] == v]
        ans = [r['answered'] for r in rs]
        p99 = [r['p99_ms'] for r in rs if r['p99_ms'] is not None]
        lines.append(f"| {sc} | {names[v]} | {', '.join(map(str, ans))} | {min(ans)} | "
                     f"{max(p99):.1f} | {sum(r['syns_redirected'] for r in rs)} | "
                     f"{', '.join(str(r['loadavg_1m']) for r in rs)} |" if p99 else
                     f"| {sc} | {names[v]} | {', '.join(map(str, ans))} | {min(ans)} | – | "
                     f"{sum(r['syns_redirected'] for r in rs)} | {', '.join(str(r['loadavg_1m']) for r in rs)} |")
md = f"""# steer's balancer: a stopped or starved nginx worker

`{summary['command']}` — {date}, {summary['machine']}.

nginx 2 workers (`worker_cpu_affinity 01 10`); the worker on CPU 0 stopped (`kill -STOP`) or
starved (cgroup cpu.shares 2 vs a busy loop at 262144 on CPU 0); 100 fresh one-shot clients
from CPU 0, one after another, 1 s each from connect to the whole answer. Fresh network
namespace per run; rounds listed in order.

| worker on CPU 0 | server | answered of 100, per round | worst | worst p99 of answered (ms) | SYNs redirected (all rounds) | load 1m per round |
|---|---|---|---|---|---|---|
""" + "\n".join(lines) + "\n"
open(out + '.md', 'w').write(md)
print(md)
EOF
fi

if [[ $which == cpu || $which == all ]]; then
    runs=$work/cpu.jsonl
    : > "$runs"
    for r in $(seq 1 "$rounds"); do
        order=$([[ $((r % 2)) == 1 ]] && echo "steer-off steer" || echo "steer steer-off")
        for v in $order; do
            mkdir -p "$work/run"
            unshare -n -m bash "$ROOT/bench/steer.sh" --inner nginx "$v" "$r" "$conns" "$work/run" >> "$runs"
            tail -1 "$runs" >&2
            rm -rf "$work/run"
        done
    done
    python3 - "$runs" "$ROOT/results/steer/balance-cpu" "$rounds" "$conns" <<'EOF'
import json, statistics as st, sys, platform, datetime
runs, out, rounds, conns = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = [json.loads(l) for l in open(runs)]
date = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')
pairs = []
for r in range(1, rounds + 1):
    off = [x for x in rows if x['round'] == r and x['variant'] == 'steer-off'][0]
    on = [x for x in rows if x['round'] == r and x['variant'] == 'steer'][0]
    pairs.append(on['server_cpu_us_per_conn'] / off['server_cpu_us_per_conn'])
def med(v, k): return st.median(x[k] for x in rows if x['variant'] == v)
def loc(v): return st.median(x['held_local'] / x['held'] for x in rows if x['variant'] == v)
bal = [x['balancer_cpu_ms'] / x['run_s'] / 10 for x in rows if x['variant'] == 'steer']
summary = {'date': date, 'machine': '2-core KVM guest, Linux %s' % platform.release(),
           'command': 'bench/steer-balance.sh cpu %d %d' % (rounds, conns),
           'ratio_on_over_off_per_round': pairs, 'ratio_median': st.median(pairs),
           'balancer_cpu_pct_of_one_cpu': bal, 'runs': rows}
json.dump(summary, open(out + '.json', 'w'), indent=1)
md = f"""# steer's balancer when nothing is busy: nginx CPU per connection, balancer on vs off

`{summary['command']}` — {date}, {summary['machine']}.

nginx 2 workers, `listen … reuseport`, `steer attach` with the balancer (on) and with
`--balance off`; `corelocal bench crr --cpus 0 --conns 64 -n {conns}`, RPS on lo over CPUs 0–1;
rounds alternate the order. Server CPU = schedstat of nginx's processes ÷ connections.

| | balance off | balance on |
|---|---|---|
| server CPU µs / connection (median) | {med('steer-off', 'server_cpu_us_per_conn'):.2f} | {med('steer', 'server_cpu_us_per_conn'):.2f} |
| locality (held connections, median) | {loc('steer-off')*100:.1f}% | {loc('steer')*100:.1f}% |
| connections/s (median; client-bound) | {med('steer-off', 'conns_per_s'):.0f} | {med('steer', 'conns_per_s'):.0f} |

On ÷ off per round: {', '.join('%.3f' % p for p in pairs)} (median {st.median(pairs):.3f}).
The balancer's own CPU (its threads' schedstat over the client's run): {', '.join('%.2f%%' % b for b in bal)} of one CPU.

| round | variant | load 1m | conn/s | errors | server CPU µs/conn | held local / held | balancer CPU ms |
|---|---|---|---|---|---|---|---|
""" + "\n".join(f"| {x['round']} | {x['variant']} | {x['loadavg_1m']} | {x['conns_per_s']:.0f} | {x['errors']} | {x['server_cpu_us_per_conn']:.2f} | {x['held_local']}/{x['held']} | {x['balancer_cpu_ms']:.1f} |" for x in rows) + "\n"
open(out + '.md', 'w').write(md)
print(md)
EOF
fi
