#!/usr/bin/env bash
# Issue 38: server CPU per HTTPS operation, corelocal (rustls, ring) against nginx (OpenSSL)
# and h2o (OpenSSL; Debian's 2.2.5), same ECDSA P-256 certificate chain, TLS 1.3, X25519, one
# worker each pinned to CPU 1, clients pinned to CPU 0; rounds alternate the servers (A B C A B
# C), every measurement in a fresh network namespace (unshare -n).
#   full:    openssl s_time -new   (a full handshake + GET /hello per connection)
#   resumed: openssl s_time -reuse (a resumed handshake, by ticket, + GET /hello)
#   ka:      wrk -t1 -c16 over HTTPS (keep-alive requests; handshakes are 16 of millions)
# Server CPU: the sum over the threads of the server and every process below it of
# /proc/PID/task/*/schedstat (ns, exact) — h2o forks a `neverbleed` process that does its RSA
# private-key operations (its ECDSA ones stay in the worker on 2.2.5) — from just before the client starts to just after it ends, divided by the operations the
# client completed. s_time is one connection at a time: the server is far from saturated, so
# this is CPU per operation at low load, the same for both servers.
# usage: bench/tls.sh [ROUNDS] [SECONDS]  (needs root for unshare -n; nginx, h2o, wrk, openssl)
#   env: CERT=ecdsa|rsa (the chain: ECDSA P-256 or RSA 2048), TLS=1.3|1.2 (what s_time asks
#        for; wrk's keep-alive row is TLS 1.3 only, so TLS=1.2 measures full and resumed),
#        NAME (the result file's name; default tls-cpu, or tls-cpu-CERT-TLS when either is set)
# writes: results/tls/NAME.json and results/tls/NAME.md
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
secs=${2:-5}
cert=${CERT:-ecdsa}
tls=${TLS:-1.3}
name=${NAME:-tls-cpu}
if [ "$cert" != ecdsa ] || [ "$tls" != 1.3 ]; then name=${NAME:-tls-cpu-$cert-tls${tls/./}}; fi
workloads="full resumed ka"
[ "$tls" = 1.2 ] && workloads="full resumed"
s_time_version=-tls1_3
[ "$tls" = 1.2 ] && s_time_version=-tls1_2
cargo build --release -q -p corelocal-cli
bin=$PWD/target/release/corelocal
certs=$PWD/crates/corelocal-apps/tests/tls
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
chmod 755 "$out" # h2o's worker runs as nobody and reads www
mkdir -p "$out/www" "$out/nginx/tmp"
printf 'hello\n' >"$out/www/hello"
# h2o: one thread, its own session tickets (on by default) and cache; OCSP stapling has no
# responder to ask here.
cat >"$out/h2o.conf" <<CONF
num-threads: 1
user: nobody
error-log: $out/h2o-error.log
access-log: /dev/null
listen:
  host: 127.0.0.1
  port: 8443
  ssl:
    certificate-file: $certs/$cert.pem
    key-file: $certs/$cert.key
    minimum-version: TLSv1.2
    ocsp-update-interval: 0
hosts:
  default:
    paths:
      /:
        file.dir: $out/www
CONF
cat >"$out/nginx/nginx.conf" <<CONF
worker_processes 1;
master_process off;
daemon off;
pid $out/nginx/nginx.pid;
error_log $out/nginx/error.log warn;
worker_rlimit_nofile 20000;
events { worker_connections 16384; }
http {
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 60s;
  client_body_temp_path $out/nginx/tmp; proxy_temp_path $out/nginx/tmp;
  fastcgi_temp_path $out/nginx/tmp; uwsgi_temp_path $out/nginx/tmp; scgi_temp_path $out/nginx/tmp;
  server {
    listen 127.0.0.1:8443 ssl reuseport backlog=4096;
    ssl_certificate $certs/$cert.pem;
    ssl_certificate_key $certs/$cert.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_ecdh_curve X25519:prime256v1:secp384r1;
    ssl_session_cache shared:SSL:10m;
    ssl_session_tickets on;
    root $out/www;
    sendfile on;
    default_type text/plain;
    location / { }
  }
}
CONF
corelocal_cmd="$bin serve http --listen 127.0.0.1:8080 --tls-listen 127.0.0.1:8443 --cpus 1 \
--stats-interval 0 --root $out/www --tls-cert $certs/$cert.pem --tls-key $certs/$cert.key"
nginx_cmd="taskset -c 1 nginx -c $out/nginx/nginx.conf"
h2o_cmd="taskset -c 1 h2o -c $out/h2o.conf"

# One measurement, run inside a fresh network namespace: SERVER WORKLOAD CMD → a JSON line.
cat >"$out/one.sh" <<'ONE'
set -euo pipefail
server=$1 workload=$2 cmd=$3 secs=$4 out=$5 version=$6
ip link set lo up
$cmd >"$out/server.log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do
    (exec 3<>/dev/tcp/127.0.0.1/8443) 2>/dev/null && break
    sleep 0.05
done
tree() { echo "$1"; for c in $(pgrep -P "$1" || true); do tree "$c"; done; }
cpu() {
    for p in $(tree "$pid"); do cat /proc/"$p"/task/*/schedstat 2>/dev/null || true; done |
        awk '{s += $1} END {printf "%.0f", s}'
}
before=$(cpu)
case $workload in
full | resumed)
    flag=-new; [ "$workload" = resumed ] && flag=-reuse
    text=$(taskset -c 0 openssl s_time -connect 127.0.0.1:8443 $flag $version -time "$secs" -www /hello \
        2>&1 </dev/null)
    ops=$(printf '%s\n' "$text" | awk '/connections in .* real seconds/ {print $1; exit}')
    # s_time prints `r` for each resumed connection, `*` for each full handshake.
    reused=$(printf '%s\n' "$text" | grep -E '^[*r]+$' | tr -cd 'r' | wc -c || true)
    ;;
ka)
    reused=0
    text=$(taskset -c 0 wrk -t1 -c16 -d"${secs}s" https://127.0.0.1:8443/hello 2>&1)
    ops=$(printf '%s\n' "$text" | awk '/requests in/ {print $1; exit}')
    ;;
esac
after=$(cpu)
kill "$pid"; wait "$pid" 2>/dev/null || true
printf '{"server":"%s","workload":"%s","ops":%s,"server_cpu_ns":%s,"s_time_r_marks":%s}\n' \
    "$server" "$workload" "${ops:-0}" "$((after - before))" "$reused"
ONE

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
: >"$out/rows.jsonl"
for r in $(seq 1 "$rounds"); do
    for w in $workloads; do
        for s in corelocal nginx h2o; do
            cmd=$corelocal_cmd; [ "$s" = nginx ] && cmd=$nginx_cmd; [ "$s" = h2o ] && cmd=$h2o_cmd
            unshare -n bash "$out/one.sh" "$s" "$w" "$cmd" "$secs" "$out" "$s_time_version" \
                | tee -a "$out/rows.jsonl"
        done
    done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p results/tls
python3 - "$out/rows.jsonl" "$rounds" "$secs" "$load_before" "$load_after" "$*" "$name" "$cert" "$tls" <<'PY'
import json, statistics, sys, platform, subprocess
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rounds, secs, load_before, load_after, args, name, cert, tls = sys.argv[2:10]
table = {}
for r in rows:
    if r["ops"] > 0:
        table.setdefault((r["workload"], r["server"]), []).append(r["server_cpu_ns"] / r["ops"] / 1000)
ver = lambda c: subprocess.run(c, capture_output=True, text=True, shell=True).stdout.strip()
result = {
    "command": (f"CERT={cert} TLS={tls} " if (cert, tls) != ("ecdsa", "1.3") else "")
               + f"bench/tls.sh {args}".strip(),
    "what": "server CPU (us) per HTTPS operation, schedstat of the threads of the server's process tree (h2o's neverbleed included) / client ops",
    "tls": f"TLS {tls}, X25519, " + ("ECDSA P-256" if cert == "ecdsa" else "RSA 2048")
           + f" chain (crates/corelocal-apps/tests/tls/{cert}.pem)",
    "servers": {"corelocal": "serve http --tls-listen (rustls 0.23, ring), 1 worker on CPU 1",
                "nginx": ver("nginx -v 2>&1") + ", OpenSSL, 1 worker, taskset CPU 1, "
                         "ssl_session_cache shared:SSL:10m, tickets on",
                "h2o": ver("h2o --version | head -1") + ", OpenSSL, num-threads 1, taskset CPU 1, "
                       "its own tickets"},
    "clients": {"full": "openssl s_time -new", "resumed": "openssl s_time -reuse",
                "ka": "wrk -t1 -c16 https"},
    "openssl": ver("openssl version"), "kernel": platform.release(),
    "rounds": int(rounds), "seconds_per_run": int(secs),
    "load_average_before": load_before, "load_average_after": load_after,
    "note": "a shared 2-CPU VM with other builds running: the load average says how busy",
    "rows": rows,
    "median_us_per_op": {f"{w}/{s}": round(statistics.median(v), 2) for (w, s), v in table.items()},
}
json.dump(result, open(f"results/tls/{name}.json", "w"), indent=1)
with open(f"results/tls/{name}.md", "w") as md:
    md.write(f"# Server CPU per HTTPS operation (µs, median of {rounds} rounds of {secs} s)\n\n")
    md.write(f"`{result['command']}`; {result['tls']}; load average {load_before} → {load_after} "
             "(a shared 2-CPU VM).\n\n")
    md.write("| workload | corelocal | nginx | h2o | corelocal / nginx | corelocal / h2o "
             "| runs (corelocal; nginx; h2o) |\n|---|---|---|---|---|---|---|\n")
    med = lambda v: statistics.median(v) if v else float("nan")
    for w in ["full", "resumed", "ka"]:
        c, n, h = (table.get((w, s), []) for s in ("corelocal", "nginx", "h2o"))
        if c and n:
            cm, nm, hm = med(c), med(n), med(h)
            runs = "; ".join(", ".join(f"{x:.1f}" for x in v) for v in (c, n, h))
            md.write(f"| {w} | {cm:.1f} | {nm:.1f} | {hm:.1f} | {cm / nm:.2f}× | {cm / hm:.2f}× "
                     f"| {runs} |\n")
print(open(f"results/tls/{name}.md").read())
PY
