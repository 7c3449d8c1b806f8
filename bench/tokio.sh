#!/usr/bin/env bash
# axum on corelocal-tokio vs the same axum app on tokio's default multi-thread runtime.
#
#   A  corelocal-tokio: `--example axum --cpus 0-1 --mode local` (2 pinned current-thread
#      runtimes, best steering: eBPF as root)
#   B  tokio multi-thread: `--example axum-multithread --threads 2` (`axum::serve` on a
#      2-worker-thread runtime, not pinned — how it is deployed)
#   C  (with ACTIX=1) actix-web 4 defaults, `--workers 2`: bench/actix, the same two routes
#      and bodies (actix handlers, not axum's), one acceptor thread handing off to the workers
#   D  (with BALANCE=ab, instead of B and C) A with `--balance off`: what the balancer's
#      monitor thread and steal checks cost when nothing is busy (A/D ratios)
#
# Same handlers (crates/corelocal-tokio/examples/common/app.rs), release builds, same client.
# Each run in a fresh network namespace (unshare -n, lo up), A B A B … alternating, per round:
#   crr-c0   one-shot HTTP: corelocal bench crr --proto http --path / --cpus 0   (client on CPU 0)
#   crr-c01  one-shot HTTP: corelocal bench crr --proto http --path / --cpus 0-1 (a pinned client
#            thread per CPU: SYNs processed on both CPUs, like RSS)
#   ka-c0    keep-alive: taskset -c 0 wrk -t1 --latency
#   ka-c01   keep-alive: taskset -c 0-1 wrk -t2 --latency
# Server CPU per request: /proc/PID/task/*/schedstat (ns, exact) over the run (crr: the bench's
# own --server-pid window). Locality: during each run a probe pinned to each client CPU opens
# 100 fresh connections, GET /cpu, and counts answers from the client's CPU (same measure for
# A and B); for A also the server's own counters (accepted_local / accepted).
#
# usage: bench/tokio.sh [ROUNDS] [SECONDS] [CONNS] [OUT]   (needs root, wrk, jq, python3)
#   env: ACTIX=1 adds C; BALANCE=ab compares A with D only (files tokio-balance-ab.*);
#   LOADS="ka-c0 ka-c01" runs only those loads; APPEND=1 appends to the runs file
#   (OUT/tokio-vs-multithread.runs.jsonl) instead of starting it afresh.
# Writes OUT/tokio-vs-multithread.json and .tables.md.
#
# usage: bench/tokio.sh blocked [ROUNDS] [OUT]   (needs root, python3)
#   Issue 33's scenario, per round and in a fresh network namespace each: the `blocked` example
#   (an axum handler blocks its thread 6 s; then 50 fresh clients pinned to that CPU, 2 s
#   timeout each) on corelocal-tokio with --balance on (eBPF: redirect + steal), on with cbpf
#   steering (steal only), off, and on tokio's multi-thread runtime. Writes
#   OUT/tokio-blocked.runs.jsonl and OUT/tokio-blocked.json (per-variant summary).
set -euo pipefail
if [ "${1:-}" = blocked ]; then
  ROUNDS=${2:-3}
  OUT=${3:-results/tokio}
  ROOT=$(cd "$(dirname "$0")/.." && pwd)
  cd "$ROOT"
  cargo build --release -p corelocal-tokio --example blocked >&2
  EX=${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/blocked
  mkdir -p "$OUT"
  RAW="$OUT/tokio-blocked.runs.jsonl"
  : > "$RAW"
  HOST="$(nproc) CPUs, $(uname -r), load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  for round in $(seq "$ROUNDS"); do
    for v in "on:--server corelocal --balance on" "on-cbpf:--server corelocal --balance on --steering cbpf" \
             "off:--server corelocal --balance off" "multithread:--server multithread"; do
      line=$(unshare -n -- bash -c "ip link set lo up; $EX ${v#*:}")
      echo "{\"variant\":\"${v%%:*}\",\"round\":$round,\"loadavg1\":$(cut -d' ' -f1 /proc/loadavg),${line#\{}" | tee -a "$RAW" >&2
    done
  done
  HOST="$HOST; load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  python3 - "$RAW" "$OUT" "$HOST" <<'EOF'
import json, statistics as st, sys, datetime
raw, out, host = sys.argv[1:4]
runs = [json.loads(l) for l in open(raw) if l.strip()]
summary = {}
for v in dict.fromkeys(r["variant"] for r in runs):
    rs = [r for r in runs if r["variant"] == v]
    def med(k):
        xs = [r[k] for r in rs if r[k] is not None]
        return st.median(xs) if xs else None
    summary[v] = {"steering": rs[0]["steering"], "runs": len(rs),
                  "answered": [r["answered"] for r in rs], "failed": [r["failed"] for r in rs],
                  "p50_ms": [r["p50_ms"] for r in rs], "p99_ms": [r["p99_ms"] for r in rs],
                  "p50_ms_median": med("p50_ms"), "p99_ms_median": med("p99_ms"),
                  "stolen": [r["stolen"] for r in rs], "redirects": [r["redirects"] for r in rs]}
doc = {"date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "host": host,
       "command": "bench/tokio.sh blocked", "summary": summary, "runs": runs}
json.dump(doc, open(f"{out}/tokio-blocked.json", "w"), indent=1)
print("| variant | steering | answered within 2 s, per round | p50 ms, per round | p99 ms, per round (None: a failure) | stolen | redirect episodes |")
print("|---|---|---|---|---|---|---|")
for v, m in summary.items():
    print(f"| {v} | {m['steering']} | {m['answered']} | {m['p50_ms']} | {m['p99_ms']} | {m['stolen']} | {m['redirects']} |")
EOF
  exit 0
fi
ROUNDS=${1:-5}
SECS=${2:-5}
CONNS=${3:-64}
OUT=${4:-results/tokio}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
cargo build --release -p corelocal-cli -p corelocal-tokio --examples --bins >&2
REL=${CARGO_TARGET_DIR:-$ROOT/target}/release
A_CMD="$REL/examples/axum --listen 127.0.0.1:8080 --cpus 0-1 --mode local"
B_CMD="$REL/examples/axum-multithread --listen 127.0.0.1:8080 --threads 2"
C_CMD="$ROOT/bench/actix/target/release/actix-peer --listen 127.0.0.1:8080 --workers 2"
D_CMD="$A_CMD --balance off"
SERVERS="A B"
NAME=tokio-vs-multithread
if [ "${BALANCE:-}" = ab ]; then
  SERVERS="A D"
  NAME=tokio-balance-ab
elif [ "${ACTIX:-0}" = 1 ]; then
  cargo build --release --manifest-path bench/actix/Cargo.toml >&2
  SERVERS="A B C"
fi
BENCH="$REL/corelocal"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

cat > "$WORK/probe.py" <<'EOF'
import os, socket, sys
port, cpu, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
os.sched_setaffinity(0, {cpu})
same = total = 0
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /cpu HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n")
    data = b""
    while True:
        b = s.recv(4096)
        if not b:
            break
        data += b
    s.close()
    body = data.split(b"\r\n\r\n", 1)[1].strip()
    total += 1
    same += int(body) == cpu
print(same, total)
EOF

# One run: prints one JSON object.
run_one() { # server(A|B) load round
  local server=$1 load=$2 round=$3 cmd
  case $server in A) cmd=$A_CMD ;; B) cmd=$B_CMD ;; C) cmd=$C_CMD ;; D) cmd=$D_CMD ;; esac
  unshare -n -- bash -s "$server" "$load" "$round" <<EOS
set -e
ip link set lo up
$cmd >/dev/null 2>"$WORK/server.err" &
SPID=\$!
for i in \$(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/8080) 2>/dev/null && break; sleep 0.05; done
sleep 0.3
sched() { cat /proc/\$SPID/task/*/schedstat 2>/dev/null | awk '{s+=\$1} END {printf "%.0f\\n", s}'; }
SERVER=\$1
LOAD1=\$(cut -d' ' -f1 /proc/loadavg)
stats() { if [ "\$SERVER" = A ] || [ "\$SERVER" = D ]; then curl -s http://127.0.0.1:8080/metrics.json | jq -c '.total | {accepted, accepted_local}'; else echo '{"accepted":0,"accepted_local":0}'; fi; }
case "\$2" in *c01) CPUS="0 1"; CL=0-1 ;; *) CPUS=0; CL=0 ;; esac
drops() { nstat -asz 2>/dev/null | awk '\$1=="TcpRetransSegs"{r=\$2} \$1=="TcpExtListenDrops"{d=\$2} END {printf "{\\"retrans_segs\\":%d,\\"listen_drops\\":%d}\\n", r, d}'; }
probe() { sleep 1.5; for c in \$CPUS; do python3 "$WORK/probe.py" 8080 \$c 100; done | awk '{s+=\$1; t+=\$2} END {print s, t}' > "$WORK/probe.out"; }
probe &
PROBE=\$!
st0=\$(stats)
s0=\$(sched)
case "\$2" in
  crr-*)
    "$BENCH" bench crr --target 127.0.0.1:8080 --proto http --path / --cpus \$CL --conns $CONNS \
      --duration ${SECS}s --warmup 1s --server-pid \$SPID --progress never --max-error-rate 1 \
      --json "$WORK/crr.json" >"$WORK/crr.txt" 2>&1
    wait \$PROBE
    st1=\$(stats)
    jq -c --arg s "\$1" --arg l "\$2" --arg r "\$3" --argjson st0 "\$st0" --argjson st1 "\$st1" --arg load1 "\$LOAD1" --arg probe "\$(cat $WORK/probe.out)" '{
      server: \$s, load: \$l, round: (\$r|tonumber), loadavg1_before: (\$load1|tonumber),
      req_per_s: .throughput.units_per_s, requests: .throughput.units,
      server_us_per_req: .server_cpu.schedstat_us_per_op,
      server_cores_busy: .server_cpu.cores_busy,
      p50_us: .latency.txn.p50_us, p99_us: .latency.txn.p99_us,
      errors: .errors.total,
      probe_same: (\$probe|split(" ")[0]|tonumber), probe_total: (\$probe|split(" ")[1]|tonumber),
      accepted: (\$st1.accepted - \$st0.accepted), accepted_local: (\$st1.accepted_local - \$st0.accepted_local)
    } + \$net' --argjson net "\$(drops)" "$WORK/crr.json" ;;
  ka-*)
    T=1; [ "\$CL" = 0-1 ] && T=2
    taskset -c \$CL wrk -t\$T -c$CONNS -d${SECS}s --latency http://127.0.0.1:8080/ >"$WORK/wrk.txt" 2>&1
    s1=\$(sched)
    wait \$PROBE
    st1=\$(stats)
    n=\$(awk '/requests in/ {print \$1}' "$WORK/wrk.txt")
    p50=\$(awk '\$1=="50%" {print \$2}' "$WORK/wrk.txt")
    p99=\$(awk '\$1=="99%" {print \$2}' "$WORK/wrk.txt")
    rps=\$(awk '/Requests\/sec/ {print \$2}' "$WORK/wrk.txt")
    err=\$(awk '/Non-2xx|Socket errors/ {e=1} END {print e+0}' "$WORK/wrk.txt")
    us() { awk -v v="\$1" 'BEGIN { if (v ~ /us\$/) print v+0; else if (v ~ /ms\$/) print (v+0)*1000; else print (v+0)*1e6 }'; }
    read ps pt < "$WORK/probe.out"
    jq -nc --arg s "\$1" --arg l "\$2" --argjson r "\$3" --argjson n "\$n" --argjson rps "\$rps" \
      --argjson cpu "\$(( s1 - s0 ))" --argjson p50 "\$(us \$p50)" --argjson p99 "\$(us \$p99)" \
      --argjson err "\$err" --argjson ps "\$ps" --argjson pt "\$pt" --argjson st0 "\$st0" --argjson st1 "\$st1" --argjson load1 "\$LOAD1" '{
      server: \$s, load: \$l, round: \$r, loadavg1_before: \$load1, req_per_s: \$rps, requests: \$n,
      server_us_per_req: (\$cpu / 1000 / \$n), server_cores_busy: (\$cpu / 1e9 / $SECS),
      p50_us: \$p50, p99_us: \$p99, errors: \$err,
      probe_same: \$ps, probe_total: \$pt,
      accepted: (\$st1.accepted - \$st0.accepted), accepted_local: (\$st1.accepted_local - \$st0.accepted_local)
    } + \$net' --argjson net "\$(drops)" ;;
esac
kill -TERM \$SPID; wait \$SPID || true
EOS
}

RAW="$OUT/$NAME.runs.jsonl"
[ "${APPEND:-0}" = 1 ] || : > "$RAW"
HOST="$(nproc) CPUs, $(uname -r), load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$ROUNDS"); do
  for load in ${LOADS:-crr-c0 crr-c01 ka-c0 ka-c01}; do
    for server in $SERVERS; do
      line=$(run_one "$server" "$load" "$round")
      echo "$line" | tee -a "$RAW" >&2
    done
  done
done
HOST="$HOST; load after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$RAW" "$OUT" "$HOST" "$ROUNDS" "$SECS" "$CONNS" "$NAME" <<'EOF'
import json, statistics as st, sys, datetime
raw, out, host, rounds, secs, conns, name = sys.argv[1:8]
runs = [json.loads(l) for l in open(raw) if l.strip()]
servers = sorted({r["server"] for r in runs})
names = {"A": "corelocal-tokio (local, 2 pinned current-thread runtimes)",
         "B": "tokio multi-thread (axum::serve, 2 worker threads)",
         "C": "actix-web 4 defaults (1 acceptor + 2 workers)",
         "D": "corelocal-tokio with --balance off"}
loads = {"crr-c0": "one-shot HTTP, client on CPU 0 (corelocal bench crr)",
         "crr-c01": "one-shot HTTP, client threads on CPUs 0 and 1 (corelocal bench crr)",
         "ka-c0": "keep-alive HTTP, wrk -t1 on CPU 0",
         "ka-c01": "keep-alive HTTP, wrk -t2 on CPUs 0-1"}
metrics = ["server_us_per_req", "req_per_s", "p50_us", "p99_us", "locality_probe", "locality_counted"]
for r in runs:
    r["locality_probe"] = r["probe_same"] / r["probe_total"] if r["probe_total"] else None
    r["locality_counted"] = r["accepted_local"] / r["accepted"] if r["accepted"] else None
summary = {}
for load in loads:
    summary[load] = {}
    for s in servers:
        rs = [r for r in runs if r["load"] == load and r["server"] == s]
        m = {}
        for k in metrics:
            v = [r[k] for r in rs if r[k] is not None]
            if v:
                m[k] = {"median": st.median(v), "min": min(v), "max": max(v), "n": len(v)}
        m["errors"] = sum(r["errors"] for r in rs)
        summary[load][s] = m
    # Server CPU per request of A over each other server, paired per round.
    for x in [s for s in servers if s != "A"]:
        rx = []
        for rd in sorted({r["round"] for r in runs}):
            a = [r for r in runs if r["load"] == load and r["server"] == "A" and r["round"] == rd]
            o = [r for r in runs if r["load"] == load and r["server"] == x and r["round"] == rd]
            if a and o:
                rx.append(a[0]["server_us_per_req"] / o[0]["server_us_per_req"])
        if rx:
            summary[load][f"cpu_ratio_A_over_{x}"] = {"median": st.median(rx), "min": min(rx),
                                                     "max": max(rx), "per_round": rx}
doc = {"date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "host": host,
       "rounds": int(rounds), "seconds": int(secs), "conns": int(conns),
       "servers": names, "loads": loads, "summary": summary, "runs": runs}
json.dump(doc, open(f"{out}/{name}.json", "w"), indent=1)

def f(m, k, fmt):
    if k not in m: return "–"
    x = m[k]
    return f"{fmt(x['median'])} ({fmt(x['min'])}–{fmt(x['max'])})"
us = lambda v: f"{v:.1f}"
k = lambda v: f"{v/1000:.1f}k"
ms = lambda v: f"{v/1000:.2f}"
pct = lambda v: f"{100*v:.0f}%"
lines = []
for load, title in loads.items():
    lines.append(f"### {title}\n")
    lines.append("| server | server CPU µs/req | req/s | p50 ms | p99 ms | answered on client's CPU (probe) | counted local |")
    lines.append("|---|---|---|---|---|---|---|")
    for s in servers:
        m = summary[load][s]
        lines.append(f"| {s}: {names[s]} | {f(m,'server_us_per_req',us)} | {f(m,'req_per_s',k)} | {f(m,'p50_us',ms)} | {f(m,'p99_us',ms)} | {f(m,'locality_probe',pct)} | {f(m,'locality_counted',pct)} |")
    errs = ", ".join(f"{s} {summary[load][s]['errors']}" for s in servers)
    for x in [s for s in servers if s != "A"]:
        r = summary[load].get(f"cpu_ratio_A_over_{x}")
        if r:
            lines.append(f"\nServer CPU per request A/{x}, paired per round: median **{r['median']:.2f}** "
                         f"({r['min']:.2f}–{r['max']:.2f}).")
    lines.append(f"Errors {errs}.")
    lines.append("")
open(f"{out}/{name}.tables.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
