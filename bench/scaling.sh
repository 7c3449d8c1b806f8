#!/usr/bin/env bash
# Seed 000's scaling experiment (Affinity-Accept §6) in one command, on whatever cores the host
# has: one-shot HTTP and one-shot RPC connections against `corelocal serve` in each listener
# mode — stock (one shared listener), fine (one listener per worker, kernel hash), local (the
# SYN's CPU picks the listener) with the balancer off and on — at 1, 2, 4, … N workers, then the
# starved-core case (a busy loop at nice −20 on worker 0's core) at N workers. Each run in a
# fresh network namespace; the client (`corelocal bench crr`) pinned to its own cores.
#
# usage: sudo bench/scaling.sh [SECONDS] [ROUNDS] [NAME]      (default 5 3 scaling-<N>core)
#   env: CLIENT_CPUS  the client's CPUs (default: the top quarter of the online CPUs, at least
#                     one; with 2 CPUs or fewer the client shares the server's CPUs, and the
#                     markdown says so)
#        WORKERS      worker counts to run (default: 1 2 4 … N, N = online CPUs − client CPUs,
#                     N itself always included)
#        CONNS        concurrent connections (default 64)
#        BIN          a built `corelocal` (default: cargo build --release -p corelocal-cli)
#        MACHINE      a label for the markdown (default: "N-CPU host")
# Writes results/scaling/NAME.json (every run), NAME.md (tables) and NAME.svg (server CPU per
# connection and connections per second against workers, one line per mode).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
rounds=${2:-3}
online=$(getconf _NPROCESSORS_ONLN)
conns=${CONNS:-64}
if [ -z "${BIN:-}" ]; then
    cargo build --release -q -p corelocal-cli
    BIN=$PWD/target/release/corelocal
fi
if [ -n "${CLIENT_CPUS:-}" ]; then
    client=$CLIENT_CPUS
    shared=0
elif [ "$online" -le 2 ]; then
    client=0-$((online - 1))
    shared=1
else
    nclient=$(( online / 4 > 0 ? online / 4 : 1 ))
    client=$((online - nclient))-$((online - 1))
    shared=0
fi
if [ "$shared" = 1 ]; then
    nmax=$online
else
    # The server's CPUs are the ones before the client's first.
    nmax=${client%%[-,]*}
fi
[ "$nmax" -ge 1 ] || { echo "no CPU left for the server (client on $client)" >&2; exit 2; }
if [ -n "${WORKERS:-}" ]; then
    workers=$WORKERS
else
    workers=""
    w=1
    while [ "$w" -lt "$nmax" ]; do workers="$workers $w"; w=$((w * 2)); done
    workers="$workers $nmax"
fi
name=${3:-scaling-${online}core}
out=results/scaling/$name
mkdir -p results/scaling
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/www" && printf 'hello\n' >"$tmp/www/hello"
echo "CPUs: $online online; client on $client (shared: $shared); workers: $workers" >&2

# One run in a private network namespace: KIND MODE BALANCE WORKERS HOG ROUND → $tmp/ID.json
one_run() {
    local kind=$1 mode=$2 balance=$3 w=$4 hog=$5 round=$6
    local id="$kind-$mode-$balance-w$w-hog$hog-r$round"
    unshare -n bash -euo pipefail -c '
        ip link set lo up
        bin=$1; kind=$2; mode=$3; balance=$4; w=$5; hog=$6; secs=$7; json=$8; client=$9
        conns=${10}; www=${11}
        if [ "$kind" = http ]; then
            serve=(serve http --root "$www"); bench=(--proto http --path /hello)
        else
            serve=(serve rpc --one-shot); bench=(--proto rpc)
        fi
        "$bin" "${serve[@]}" --listen 127.0.0.1:7000 --cpus "0-$((w - 1))" --mode "$mode" \
            --balance "$balance" --stats-interval 0 >/dev/null 2>&1 &
        server=$!
        for _ in $(seq 100); do ss -ltn | grep -q ":7000 " && break; sleep 0.05; done
        hogpid=""
        if [ "$hog" = 1 ]; then
            taskset -c 0 nice -n -20 sh -c "while :; do :; done" &
            hogpid=$!
        fi
        taskset -c "$client" "$bin" bench crr "${bench[@]}" --target 127.0.0.1:7000 \
            --cpus "$client" --conns "$conns" --duration "${secs}s" --warmup 1s --timeout 1s \
            --progress never --max-error-rate 1 --server-pid "$server" --json "$json" \
            >/dev/null 2>&1 || true
        if [ -n "$hogpid" ]; then kill "$hogpid"; fi
        kill "$server"; wait "$server" 2>/dev/null || true
    ' _ "$BIN" "$kind" "$mode" "$balance" "$w" "$hog" "$secs" "$tmp/$id.json" "$client" \
        "$conns" "$tmp/www"
    echo "$id" >>"$tmp/runs.txt"
    echo "done: $id" >&2
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
nmax_w=${workers##* }
for r in $(seq 1 "$rounds"); do
    for kind in http rpc; do
        for w in $workers; do
            one_run "$kind" stock off "$w" 0 "$r"
            one_run "$kind" fine off "$w" 0 "$r"
            one_run "$kind" local off "$w" 0 "$r"
            if [ "$w" -ge 2 ]; then one_run "$kind" local on "$w" 0 "$r"; fi
        done
        # The starved core: a busy loop at nice -20 on worker 0's CPU.
        one_run "$kind" stock off "$nmax_w" 1 "$r"
        one_run "$kind" fine off "$nmax_w" 1 "$r"
        one_run "$kind" local off "$nmax_w" 1 "$r"
        if [ "$nmax_w" -ge 2 ]; then one_run "$kind" local on "$nmax_w" 1 "$r"; fi
    done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$tmp" "$out" "$secs" "$rounds" "$client" "$shared" "$online" "$conns" \
    "$load_before" "$load_after" "${MACHINE:-$online-CPU host}" "$*" <<'PY'
import json, os, platform, statistics, sys
(tmp, out, secs, rounds, client, shared, online, conns, load0, load1, machine,
 args) = sys.argv[1:13]
shared = shared == "1"
def lat(b, q):
    # A one-shot connection is one transaction: request sent → answer (connect included).
    l = b["latency"].get("session") or b["latency"].get("txn") or {}
    return l.get(q + "_us", l.get(q))

runs = []
for rid in open(os.path.join(tmp, "runs.txt")).read().split():
    kind, mode, balance, w, hog, r = rid.split("-")
    row = {"workload": kind, "mode": mode, "balance": balance, "workers": int(w[1:]),
           "starved": hog == "hog1", "round": int(r[1:])}
    try:
        b = json.load(open(os.path.join(tmp, rid + ".json")))
        cpu = b.get("server_cpu") or {}
        row.update({
            "conns_per_s": b["throughput"]["units_per_s"],
            "server_cpu_us_per_conn": cpu.get("schedstat_us_per_op"),
            "server_cores_busy": cpu.get("cores_busy"),
            "p50_us": lat(b, "p50"),
            "p99_us": lat(b, "p99"),
            "errors": b["errors"]["total"],
        })
    except (OSError, ValueError, KeyError) as e:
        row["error"] = f"no result: {e}"
    runs.append(row)

def line_name(r):
    return r["mode"] + (" + balancer" if r["balance"] == "on" else "")

def med(rows, key):
    v = [x[key] for x in rows if x.get(key) is not None]
    return statistics.median(v) if v else None

cells = {}
for r in runs:
    cells.setdefault((r["workload"], r["starved"], line_name(r), r["workers"]), []).append(r)
summary = []
for (kind, starved, line, w), rows in sorted(cells.items()):
    summary.append({"workload": kind, "starved": starved, "mode": line, "workers": w,
                    "runs": len(rows),
                    "conns_per_s": med(rows, "conns_per_s"),
                    "server_cpu_us_per_conn": med(rows, "server_cpu_us_per_conn"),
                    "p99_us": med(rows, "p99_us"),
                    "errors": sum(x.get("errors") or 0 for x in rows)})
cmd = "bench/scaling.sh" + (" " + args if args else "")
note = (f"The client shares the server's CPUs ({client}): this host has {online} CPUs, too few "
        "to give the client cores of its own, so the figures include the client's load on the "
        "same cores and are not the paper's setup; in the starved runs the busy loop's CPU also "
        "runs one of the client's threads." if shared else
        f"Client pinned to CPUs {client}, server workers on CPUs 0…N−1.")
doc = {"command": cmd, "machine": machine, "kernel": platform.release(), "cpus_online": int(online),
       "client_cpus": client, "client_shares_server_cpus": shared, "seconds": float(secs),
       "rounds": int(rounds), "conns": int(conns), "load_before": load0, "load_after": load1,
       "note": note, "summary": summary, "runs": runs}
json.dump(doc, open(out + ".json", "w"), indent=1)

LINES = ["stock", "fine", "local", "local + balancer"]
def fmt(v, d=1):
    return "–" if v is None else f"{v:,.{d}f}"
md = [f"# Scaling: one-shot HTTP and RPC by listener mode and worker count ({machine})", "",
      f"`{cmd}` — {machine}, Linux {platform.release()}, {online} CPUs online; "
      f"{secs} s per run after 1 s of warm-up, {rounds} round(s), {conns} connections, "
      f"each run in a fresh network namespace. Load average before {load0}, after {load1}.", "",
      f"**{note}**", "",
      "Server CPU is µs per connection from the server's schedstat; conn/s and p99 from the "
      "client; medians over the rounds. `local + balancer` is `--mode local --balance on`; the "
      "other rows run `--balance off`. Starved: a busy loop at nice −20 pinned to worker 0's "
      "CPU, at the largest worker count.", ""]
for kind, title in (("http", "One-shot HTTP (GET /hello, server closes)"),
                    ("rpc", "One-shot RPC (64 B request and answer, `serve rpc --one-shot`)")):
    for starved in (False, True):
        rows = [s for s in summary if s["workload"] == kind and s["starved"] == starved]
        if not rows:
            continue
        md += [f"## {title}" + (" — starved core" if starved else ""), "",
               "| mode | workers | conn/s | server CPU µs/conn | p99 µs | errors |",
               "|---|---|---|---|---|---|"]
        for line in LINES:
            for s in sorted((x for x in rows if x["mode"] == line), key=lambda x: x["workers"]):
                md.append(f"| {line} | {s['workers']} | {fmt(s['conns_per_s'], 0)} | "
                          f"{fmt(s['server_cpu_us_per_conn'], 2)} | {fmt(s['p99_us'], 0)} | "
                          f"{s['errors']} |")
        md.append("")
md += [f"Plot: [{os.path.basename(out)}.svg]({os.path.basename(out)}.svg). Every run: "
       f"{os.path.basename(out)}.json.", ""]
open(out + ".md", "w").write("\n".join(md))

# SVG: 2 × 2 panels (HTTP, RPC) × (conn/s, server CPU µs/conn) against workers.
COLORS = {"stock": "#d62728", "fine": "#ff7f0e", "local": "#1f77b4", "local + balancer": "#2ca02c"}
W, H, PW, PH, ML, MT = 960, 640, 400, 220, 70, 50
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
       f'font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{W/2}" y="20" text-anchor="middle" font-size="15">Scaling by listener mode '
       f'({machine}{", client sharing the server CPUs" if shared else ""})</text>']
panels = [("http", "conns_per_s", "HTTP one-shot: conn/s"),
          ("http", "server_cpu_us_per_conn", "HTTP one-shot: server CPU µs/conn"),
          ("rpc", "conns_per_s", "RPC one-shot: conn/s"),
          ("rpc", "server_cpu_us_per_conn", "RPC one-shot: server CPU µs/conn")]
for i, (kind, key, title) in enumerate(panels):
    ox, oy = ML + (i % 2) * (PW + 90), MT + (i // 2) * (PH + 90)
    rows = [s for s in summary if s["workload"] == kind and not s["starved"]
            and s[key] is not None]
    ws = sorted({s["workers"] for s in rows}) or [1]
    ymax = max([s[key] for s in rows] or [1]) * 1.15
    xpos = lambda w: ox + (PW * (ws.index(w) + 0.5) / len(ws))
    ypos = lambda v: oy + PH - PH * v / ymax
    svg.append(f'<text x="{ox + PW/2}" y="{oy - 10}" text-anchor="middle">{title}</text>')
    svg.append(f'<rect x="{ox}" y="{oy}" width="{PW}" height="{PH}" fill="none" stroke="#888"/>')
    for k in range(5):
        v = ymax * k / 4
        svg.append(f'<line x1="{ox}" x2="{ox+PW}" y1="{ypos(v):.1f}" y2="{ypos(v):.1f}" '
                   f'stroke="#eee"/><text x="{ox-6}" y="{ypos(v)+4:.1f}" text-anchor="end">'
                   f'{v:,.0f}</text>')
    for w in ws:
        svg.append(f'<text x="{xpos(w):.1f}" y="{oy+PH+16}" text-anchor="middle">{w}</text>')
    svg.append(f'<text x="{ox+PW/2}" y="{oy+PH+32}" text-anchor="middle">workers</text>')
    for line in LINES:
        pts = sorted((s["workers"], s[key]) for s in rows if s["mode"] == line)
        if not pts:
            continue
        c = COLORS[line]
        svg.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="' +
                   " ".join(f"{xpos(w):.1f},{ypos(v):.1f}" for w, v in pts) + '"/>')
        for w, v in pts:
            svg.append(f'<circle cx="{xpos(w):.1f}" cy="{ypos(v):.1f}" r="3" fill="{c}"/>')
for j, line in enumerate(LINES):
    x = ML + j * 180
    svg.append(f'<line x1="{x}" x2="{x+24}" y1="{H-14}" y2="{H-14}" stroke="{COLORS[line]}" '
               f'stroke-width="3"/><text x="{x+30}" y="{H-10}">{line}</text>')
svg.append("</svg>")
open(out + ".svg", "w").write("\n".join(svg) + "\n")
print(out + ".md")
PY
