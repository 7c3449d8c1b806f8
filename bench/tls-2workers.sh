#!/usr/bin/env bash
# Issue 38: one-shot HTTPS on 2 workers (CPUs 0 and 1), one `openssl s_time` client pinned to
# each CPU, full handshakes then resumed ones (TLS 1.3 tickets), in a fresh network namespace:
# locality (connections each worker accepted from its own CPU's SYNs, from the server's
# --stats-file), resumption across workers (s_time's `r` marks: a client's tickets come from
# whichever worker served it last) and server CPU per connection (schedstat of its threads).
# usage: bench/tls-2workers.sh [SECONDS]  (root for unshare -n; openssl)
# writes: results/tls/tls-2workers.json and results/tls/tls-2workers.md
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
cargo build --release -q -p corelocal-cli
bin=$PWD/target/release/corelocal
certs=$PWD/crates/corelocal-apps/tests/tls
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/www"
printf 'hello\n' >"$out/www/hello"
cat >"$out/run.sh" <<'RUN'
set -euo pipefail
bin=$1 certs=$2 out=$3 secs=$4 flag=$5
ip link set lo up
"$bin" serve http --listen 127.0.0.1:8080 --tls-listen 127.0.0.1:8443 --cpus 0,1 \
    --stats-interval 0 --stats-file "$out/stats$flag.json" --root "$out/www" \
    --tls-cert "$certs/ecdsa.pem" --tls-key "$certs/ecdsa.key" >"$out/server.log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do
    (exec 3<>/dev/tcp/127.0.0.1/8443) 2>/dev/null && break
    sleep 0.05
done
cpu() { cat /proc/"$pid"/task/*/schedstat | awk '{s += $1} END {printf "%.0f", s}'; }
before=$(cpu)
for c in 0 1; do
    taskset -c $c openssl s_time -connect 127.0.0.1:8443 $flag -time "$secs" -www /hello \
        >"$out/client$c" 2>&1 </dev/null &
done
wait %2 %3
after=$(cpu)
kill "$pid"; wait "$pid" || true
ops=0 r=0
for c in 0 1; do
    ops=$((ops + $(awk '/connections in .* real seconds/ {print $1; exit}' "$out/client$c")))
    r=$((r + $(grep -E '^[*r]+$' "$out/client$c" | tr -cd 'r' | wc -c || true)))
done
printf '{"flag":"%s","ops":%s,"s_time_r_marks":%s,"server_cpu_ns":%s}\n' "$flag" "$ops" "$r" \
    "$((after - before))" >"$out/row$flag.json"
RUN
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for flag in -new -reuse; do
    unshare -n bash "$out/run.sh" "$bin" "$certs" "$out" "$secs" "$flag"
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p results/tls
python3 - "$out" "$secs" "$load_before" "$load_after" <<'PY'
import json, sys
out, secs, lb, la = sys.argv[1:5]
rows = []
for flag in ["-new", "-reuse"]:
    row = json.load(open(f"{out}/row{flag}.json"))
    stats = json.loads(open(f"{out}/stats{flag}.json").read().strip().splitlines()[-1])
    workers = [{k: w[k] for k in ("worker", "cpu", "accepted", "accepted_local", "stolen")}
               for w in stats["workers"]]
    acc = sum(w["accepted"] for w in workers)
    row.update(workers=workers,
               locality=round(sum(w["accepted_local"] for w in workers) / acc, 4) if acc else None,
               us_per_conn=round(row["server_cpu_ns"] / row["ops"] / 1000, 1) if row["ops"] else None)
    rows.append(row)
res = {"command": f"bench/tls-2workers.sh {secs}",
       "what": "one-shot HTTPS (GET /hello), 2 workers on CPUs 0,1, one openssl s_time per CPU",
       "load_average_before": lb, "load_average_after": la,
       "note": "a shared 2-CPU VM with other work running; clients share the server's CPUs",
       "rows": rows}
json.dump(res, open("results/tls/tls-2workers.json", "w"), indent=1)
with open("results/tls/tls-2workers.md", "w") as md:
    md.write(f"# One-shot HTTPS on 2 workers\n\n`{res['command']}`; load average {lb} → {la} "
             "(a shared 2-CPU VM; the clients run on the server's CPUs).\n\n")
    md.write("| handshakes | connections | resumed (s_time `r`) | locality | accepted per worker | stolen | server µs/conn |\n|---|---|---|---|---|---|---|\n")
    for r in rows:
        kind = "full" if r["flag"] == "-new" else "resumed (tickets)"
        per = " / ".join(str(w["accepted"]) for w in r["workers"])
        stolen = sum(w["stolen"] for w in r["workers"])
        md.write(f"| {kind} | {r['ops']} | {r['s_time_r_marks']} | {r['locality']} | {per} | {stolen} | {r['us_per_conn']} |\n")
print(open("results/tls/tls-2workers.md").read())
PY
