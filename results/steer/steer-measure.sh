#!/usr/bin/env bash
# What `corelocal steer` saves on nginx, two ways, each in a fresh network namespace:
#
#   results/steer/steer-measure.sh [DURATION_S=20] [WINDOW_S=1] [PAIRS=5] [AB_WINDOW_S=3]
#
# nginx (Debian nginx-light, 2 workers, worker_cpu_affinity 01 10, listen … reuseport,
# access_log off) under a two-CPU one-shot load: `corelocal bench crr --proto http --cpus 0-1
# --conns 64` (one pinned client thread per CPU; on loopback a SYN is processed on the CPU
# that sent it, so without steering half of each CPU's connections go to the other CPU's
# worker).
# 1. `corelocal steer measure --pid NGINX --duration DURATION_S --window WINDOW_S` while the
#    load runs: ABBA windows, server CPU per connection and IPIs per connection on and off.
# 2. The same figure from outside: PAIRS pairs of AB_WINDOW_S bench runs, one with `corelocal
#    steer attach`, one after `corelocal steer detach`, alternating the order (ABBA); server
#    CPU = schedstat of nginx's processes over each bench run (this script's own reading),
#    connections = PassiveOpens over the same run, IPIs = RES + CAL of /proc/interrupts.
# Writes results/steer/steer-measure.json (both parts, raw) and prints a summary; the .md is
# written from them. Needs root (netns, eBPF) and the release binary.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${CORELOCAL:-$ROOT/target/release/corelocal}
PORT=18150

if [[ "${1:-}" == "--inner" ]]; then
    part=$2 dur=$3 win=$4 pairs=$5 abwin=$6 work=$7
    ip link set lo up
    d=$work/nginx
    mkdir -p "$d" && chmod 0777 "$d"
    cat > "$d/nginx.conf" <<EOF
worker_processes 2;
worker_cpu_affinity 01 10;
pid $d/nginx.pid;
error_log $d/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $d/body;
  server { listen 127.0.0.1:$PORT reuseport; location / { return 200 "ok\n"; } }
}
EOF
    nginx -e "$d/error.log" -p "$d" -c "$d/nginx.conf"
    # The daemon writes its PID file after the launcher returns.
    for _ in $(seq 100); do [[ -s $d/nginx.pid ]] && break; sleep 0.05; done
    sleep 0.5
    pid=$(cat "$d/nginx.pid")
    trap 'kill -QUIT "$pid" 2> /dev/null || true' EXIT
    tree="$pid $(ps -o pid= --ppid "$pid" | tr '\n' ' ')"
    sched() { local s=0; for p in $tree; do for f in /proc/$p/task/*/schedstat; do s=$((s + $(cut -d' ' -f1 "$f"))); done; done; echo $s; }
    opens() { awk '/^Tcp:/ { if (!h) { for (i = 1; i <= NF; i++) if ($i == "PassiveOpens") c = i; h = 1 } else print $c }' /proc/net/snmp; }
    ipis() { awk '$1 == "RES:" || $1 == "CAL:" { for (i = 2; i <= 3; i++) s += $i } END { print s }' /proc/interrupts; }
    load() {
        "$BIN" bench crr --proto http --target "http://127.0.0.1:$PORT/" --cpus 0-1 --conns 64 \
            -d "$1" --warmup 0 --progress never --json "$2" > /dev/null 2>&1
    }
    if [[ $part == measure ]]; then
        # The load outlasts the run (each window also pays for switching and settling);
        # stopped when measure is done.
        load "$((dur * 2 + 10))s" "$work/load.json" &
        lp=$!
        sleep 1
        "$BIN" steer measure --pid "$pid" --duration "${dur}s" --window "${win}s" \
            --method ebpf --json > "$work/measure.json"
        kill "$lp" 2> /dev/null || true
        wait "$lp" 2> /dev/null || true
    else
        : > "$work/ab.jsonl"
        for p in $(seq 0 $((pairs - 1))); do
            if (( p % 2 == 0 )); then order="on off"; else order="off on"; fi
            for state in $order; do
                if [[ $state == on ]]; then
                    "$BIN" steer attach --pid "$pid" --method ebpf > /dev/null 2>&1
                else
                    "$BIN" steer detach --pid "$pid" > /dev/null 2>&1
                fi
                sleep 0.2
                s0=$(sched) o0=$(opens) i0=$(ipis)
                load "${abwin}s" "$work/ab-$p-$state.json"
                s1=$(sched) o1=$(opens) i1=$(ipis)
                units=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['throughput']['units'])" "$work/ab-$p-$state.json")
                echo "{\"pair\": $p, \"steered\": $([[ $state == on ]] && echo true || echo false), \"cpu_ns\": $((s1 - s0)), \"accepted\": $((o1 - o0)), \"ipis\": $((i1 - i0)), \"bench_units\": $units}" >> "$work/ab.jsonl"
            done
        done
        "$BIN" steer detach --pid "$pid" > /dev/null 2>&1
    fi
    exit 0
fi

dur=${1:-20} win=${2:-1} pairs=${3:-5} abwin=${4:-3}
work=$(mktemp -d /tmp/steer-measure.XXXXXX)
trap 'rm -rf "$work"' EXIT
load0=$(cat /proc/loadavg)
unshare -n -- "$0" --inner measure "$dur" "$win" "$pairs" "$abwin" "$work"
load1=$(cat /proc/loadavg)
unshare -n -- "$0" --inner ab "$dur" "$win" "$pairs" "$abwin" "$work"
load2=$(cat /proc/loadavg)
python3 - "$work" "$ROOT/results/steer/steer-measure.json" "$load0" "$load1" "$load2" \
    "$dur" "$win" "$pairs" "$abwin" <<'EOF'
import json, statistics, subprocess, sys
work, out, l0, l1, l2 = sys.argv[1:6]
dur, win, pairs, abwin = (float(x) for x in sys.argv[6:10])
m = json.load(open(f"{work}/measure.json"))
ab = [json.loads(l) for l in open(f"{work}/ab.jsonl")]
for w in ab:
    w["ns_per_conn"] = w["cpu_ns"] / w["accepted"] if w["accepted"] else None
    w["ipis_per_conn"] = w["ipis"] / w["accepted"] if w["accepted"] else None
def ratios(key):
    rs = []
    for p in sorted({w["pair"] for w in ab}):
        on = [w for w in ab if w["pair"] == p and w["steered"]][0]
        off = [w for w in ab if w["pair"] == p and not w["steered"]][0]
        if on[key] is not None and off[key]:
            rs.append(on[key] / off[key])
    return {"median": statistics.median(rs), "min": min(rs), "max": max(rs), "pairs": len(rs)} if rs else None
side = lambda on, key: statistics.median([w[key] for w in ab if w["steered"] == on and w[key] is not None])
summary = {
    "on_median_ns_per_conn": side(True, "ns_per_conn"),
    "off_median_ns_per_conn": side(False, "ns_per_conn"),
    "cpu_ratio": ratios("ns_per_conn"),
    "ipi_ratio": ratios("ipis_per_conn"),
}
host = {
    "uname": subprocess.run(["uname", "-r"], capture_output=True, text=True).stdout.strip(),
    "nproc": subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip(),
    "nginx": subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip(),
}
json.dump({
    "command": f"results/steer/steer-measure.sh {int(dur)} {int(win)} {int(pairs)} {int(abwin)}",
    "host": host,
    "loadavg": {"start": l0, "between": l1, "end": l2},
    "measure": m,
    "outside_ab": {"windows": ab, "summary": summary},
}, open(out, "w"), indent=1)
r = m["cpu_ratio"]; i = m["ipi_ratio"]
print(f"steer measure: CPU/conn on÷off {r['median']:.3f} ({r['min']:.3f}–{r['max']:.3f}, {r['pairs']} pairs); "
      f"IPIs/conn {i['median']:.3f} ({i['min']:.3f}–{i['max']:.3f})")
r = summary["cpu_ratio"]; i = summary["ipi_ratio"]
print(f"outside A/B:   CPU/conn on÷off {r['median']:.3f} ({r['min']:.3f}–{r['max']:.3f}, {r['pairs']} pairs); "
      f"IPIs/conn {i['median']:.3f} ({i['min']:.3f}–{i['max']:.3f})")
print(f"loadavg: {l0} | {l1} | {l2}")
EOF
