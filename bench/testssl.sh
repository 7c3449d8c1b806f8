#!/usr/bin/env bash
# Issue 38: `serve http`'s TLS examined by a scanner nobody here wrote: testssl.sh (Debian's
# package `testssl.sh`) runs its default checks (protocols, cipher suites and their order,
# server defaults, session resumption, vulnerabilities, client simulations) against corelocal
# and, with the same certificates, against nginx (OpenSSL, a typical modern configuration:
# TLSv1.2 TLSv1.3), each in a fresh network namespace. The result is every finding of either
# server whose severity is above OK/INFO, side by side, plus the counts by severity.
# usage: bench/testssl.sh [BIN]   (BIN: target/release/corelocal, built when absent)
#   needs root (unshare -n), testssl, nginx, openssl, python3
# writes: results/tls/testssl.json (both scans' findings) and results/tls/testssl.md
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/corelocal}
[ -x "$bin" ] || cargo build --release -q -p corelocal-cli
bin=$(realpath "$bin")
for tool in testssl nginx openssl python3 unshare; do
    command -v "$tool" >/dev/null || { echo "testssl.sh: needs $tool" >&2; exit 2; }
done
certs=$PWD/crates/corelocal-apps/tests/tls
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/www" "$out/nginx/tmp" results/tls
printf 'hello\n' >"$out/www/index.html"
cat >"$out/nginx/nginx.conf" <<CONF
worker_processes 1;
master_process off;
daemon off;
pid $out/nginx/nginx.pid;
error_log $out/nginx/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $out/nginx/tmp; proxy_temp_path $out/nginx/tmp;
  fastcgi_temp_path $out/nginx/tmp; uwsgi_temp_path $out/nginx/tmp; scgi_temp_path $out/nginx/tmp;
  server {
    listen 127.0.0.1:8443 ssl;
    ssl_certificate $certs/ecdsa.pem;
    ssl_certificate_key $certs/ecdsa.key;
    ssl_certificate $certs/rsa.pem;
    ssl_certificate_key $certs/rsa.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_tickets on;
    root $out/www;
  }
}
CONF
declare -A cmds=(
    [corelocal]="$bin serve http --listen 127.0.0.1:8080 --tls-listen 127.0.0.1:8443 --cpus 1 \
--stats-interval 0 --root $out/www --tls-cert $certs/ecdsa.pem --tls-key $certs/ecdsa.key \
--tls-cert $certs/rsa.pem --tls-key $certs/rsa.key"
    [nginx]="nginx -c $out/nginx/nginx.conf"
)

# One scan inside a fresh network namespace: SERVER CMD JSON.
cat >"$out/scan.sh" <<'SCAN'
set -euo pipefail
cmd=$1 json=$2 ca=$3
ip link set lo up
$cmd >"$(dirname "$json")/server.log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do
    (exec 3<>/dev/tcp/127.0.0.1/8443) 2>/dev/null && break
    sleep 0.05
done
testssl --quiet --color 0 --warnings off --openssl-timeout 10 --add-ca "$ca" \
    --jsonfile "$json" 127.0.0.1:8443 >"$(dirname "$json")/scan.txt" 2>&1 || true
kill "$pid"
wait "$pid" 2>/dev/null || true
SCAN
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date +%s)
for server in corelocal nginx; do
    mkdir -p "$out/$server"
    echo "testssl.sh: scanning $server" >&2
    unshare -n bash "$out/scan.sh" "${cmds[$server]}" "$out/$server/scan.json" "$certs/ca.pem"
    [ -s "$out/$server/scan.json" ] || { cat "$out/$server/scan.txt" "$out/$server/server.log" >&2;
        echo "testssl.sh: no findings from the $server scan" >&2; exit 1; }
done
elapsed=$(($(date +%s) - started))
commit=$(git rev-parse --short HEAD)
version=$(testssl --version 2>/dev/null | grep -o 'testssl *[0-9.]*' | head -1)
python3 - "$out" "$commit" "$version" "$load_before" "$elapsed" <<'PY'
import json, sys
out, commit, version, load, elapsed = sys.argv[1:]
RANK = {"CRITICAL": 5, "HIGH": 4, "MEDIUM": 3, "LOW": 2, "WARN": 1}
scans = {s: json.load(open(f"{out}/{s}/scan.json")) for s in ("corelocal", "nginx")}
def findings(rows):
    return {r["id"]: r for r in rows if r.get("severity") in RANK}
found = {s: findings(rows) for s, rows in scans.items()}
counts = {s: {sev: sum(1 for r in f.values() if r["severity"] == sev) for sev in RANK}
          for s, f in found.items()}
ids = sorted(set(found["corelocal"]) | set(found["nginx"]),
             key=lambda i: -max(RANK[found[s][i]["severity"]] for s in found if i in found[s]))
def cell(s, i):
    r = found[s].get(i)
    return f'{r["severity"]}: {r["finding"]}'.replace("|", "/") if r else "OK/INFO"
# What a user asks beyond the findings: protocols, resumption, and how many of testssl's
# simulated clients (browsers, OSes, libraries of many ages) got a connection.
KEY_ROWS = ["SSLv2", "SSLv3", "TLS1", "TLS1_1", "TLS1_2", "TLS1_3", "ALPN", "FS",
            "sessionresumption_ticket", "sessionresumption_ID", "TLS_session_ticket",
            "TLS_extensions", "cipher_order"]
facts = {s: {r["id"]: r["finding"] for r in rows if r["id"] in KEY_ROWS} for s, rows in scans.items()}
def sims(rows):
    sim = [r for r in rows if r["id"].startswith("clientsimulation-")]
    return sum(1 for r in sim if "No connection" not in r["finding"]), len(sim)
simulated = {s: sims(rows) for s, rows in scans.items()}
json.dump({"commit": commit, "testssl": version, "load_before": load, "elapsed_s": int(elapsed),
           "counts": counts, "facts": facts, "client_simulations_connected": simulated,
           "findings": {s: list(f.values()) for s, f in found.items()}},
          open("results/tls/testssl.json", "w"), indent=1)
with open("results/tls/testssl.md", "w") as md:
    md.write("# testssl.sh against `serve http --tls-listen` and nginx\n\n")
    md.write(f"`bench/testssl.sh` at {commit}, {version}, default checks, same ECDSA P-256 and RSA "
             f"chains for both (nginx/OpenSSL with `ssl_protocols TLSv1.2 TLSv1.3`), 127.0.0.1 in a "
             f"fresh network namespace each; {elapsed} s, load {load} at the start. Every finding "
             "above OK/INFO of either server (WARN: testssl could not test something).\n\n")
    md.write("| severity | corelocal | nginx |\n|---|---:|---:|\n")
    for sev in RANK:
        md.write(f"| {sev} | {counts['corelocal'][sev]} | {counts['nginx'][sev]} |\n")
    md.write("\n| fact | corelocal | nginx |\n|---|---|---|\n")
    for k in KEY_ROWS:
        md.write(f"| {k} | {facts['corelocal'].get(k, '—')} | {facts['nginx'].get(k, '—')} |\n"
                 .replace("`", ""))
    (cc, ct), (nc, nt) = simulated["corelocal"], simulated["nginx"]
    md.write(f"| simulated clients connected | {cc} of {ct} | {nc} of {nt} |\n")
    md.write("\n| check | corelocal | nginx |\n|---|---|---|\n")
    for i in ids:
        md.write(f"| {i} | {cell('corelocal', i)} | {cell('nginx', i)} |\n")
print(open("results/tls/testssl.md").read())
PY
