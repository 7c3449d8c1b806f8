#!/usr/bin/env bash
# The paper's session workload driven by httperf against `corelocal serve http` (built-in
# 30,000-file site), as in issue 13 finding 5: --wsesslog=20000,0.1 (sessions of 1, 2, 3
# requests with 100 ms think time), --rate 2000 --timeout 5, server on CPU 1 (default flags
# otherwise), httperf on CPU 0, each round in a fresh network namespace. Servers alternate
# per round (A B A B); each run keeps the server's stats lines (1 s) so a stall would show.
# usage: bench/httperf-sessions.sh ROUNDS NAME=BINARY [NAME=BINARY…]
#   NAME=nginx runs nginx (one worker on CPU 1, the same files on disk, from
#   `corelocal files gen` with the first corelocal binary given) instead of a corelocal binary.
#   OUT=results/httperf/NAME-STEM picks the result file stem (default results/httperf/httperf-sessions).
#   → $OUT.{json,md}; httperf's own output of every run is summarised there (error kinds).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=$1; shift
tmp=$(mktemp -d)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
python3 - "$tmp/sessions.log" <<'PY'
import random, sys
rng = random.Random(13)
path = lambda i: f"/files/{i // 1000:02}/{i:05}.txt"
with open(sys.argv[1], "w") as f:
    for _ in range(1000):  # httperf reads at most 1000 sessions and cycles through them
        for burst in (1, 2, 3):
            for k in range(burst):
                f.write(("  " if k else "") + path(rng.randrange(30000)) + "\n")
        f.write("\n")
PY
out_stem=${OUT:-results/httperf/httperf-sessions}
site_bin=""
for spec in "$@"; do [ "${spec#*=}" != nginx ] && [ -z "$site_bin" ] && site_bin=${spec#*=}; done
for spec in "$@"; do
    if [ "${spec#*=}" = nginx ]; then
        "${site_bin:-target/release/corelocal}" files gen --out "$tmp/site" >/dev/null
        mkdir -p "$tmp/nginx/tmp"
        cat >"$tmp/nginx/nginx.conf" <<NGINX
worker_processes 1;
master_process off;
daemon off;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/error.log warn;
worker_rlimit_nofile 20000;
events { worker_connections 16384; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path $tmp/nginx/tmp; proxy_temp_path $tmp/nginx/tmp;
  fastcgi_temp_path $tmp/nginx/tmp; uwsgi_temp_path $tmp/nginx/tmp; scgi_temp_path $tmp/nginx/tmp;
  server {
    listen 127.0.0.1:8080 reuseport backlog=4096;
    root $tmp/site;
    sendfile on; tcp_nopush on;
    open_file_cache max=8000 inactive=60s; open_file_cache_valid 60s;
    types { text/plain txt; text/html html; } default_type text/plain;
    location / { }
  }
}
NGINX
        break
    fi
done
for r in $(seq 1 "$rounds"); do
    for spec in "$@"; do
        name=${spec%%=*}; bin=${spec#*=}
        unshare -n bash -euo pipefail -c '
            ip link set lo up
            bin=$1; log=$2; out=$3
            if [ "$bin" = nginx ]; then
                taskset -c 1 nginx -c "$4/nginx/nginx.conf" >"$out.stats" 2>"$out.err" &
            else
                "$bin" serve http --listen 127.0.0.1:8080 --cpus 1 --stats-interval 1s --json \
                    >"$out.stats" 2>"$out.err" &
            fi
            server=$!
            for _ in $(seq 200); do ss -ltn | grep -q ":8080 " && break; sleep 0.05; done
            # Every 250 ms: bytes waiting unread in the server'"'"'s sockets and in its accept
            # queue (a stalled server has both growing; a stalled client has neither).
            ( while kill -0 $server 2>/dev/null; do
                  ss -Htn state established "( sport = :8080 )" |
                      awk -v t="$(date +%s.%N)" "{q += \$1; n++} END {printf \"%s %d %d\\n\", t, q, n}"
                  sleep 0.25
              done >"$out.recvq" ) &
            taskset -c 0 httperf --server 127.0.0.1 --port 8080 --wsesslog=20000,0.1,"$log" \
                --rate 2000 --timeout 5 >"$out.httperf" 2>&1 || true
            kill -TERM $server; wait $server 2>/dev/null || true
        ' _ "$bin" "$tmp/sessions.log" "$tmp/$name-$r" "$tmp"
        echo "round $r $name: $(grep -E '^Errors: total' "$tmp/$name-$r.httperf")" >&2
    done
done
python3 - "$tmp" "$rounds" "$out_stem" "$@" <<'PY'
import json, re, sys, platform
tmp, rounds, stem, specs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
names = [s.split("=", 1)[0] for s in specs]
runs = []
for r in range(1, rounds + 1):
    for n in names:
        out = open(f"{tmp}/{n}-{r}.httperf").read()
        num = lambda pat: int(re.search(pat, out).group(1)) if re.search(pat, out) else None
        stats = []
        for line in open(f"{tmp}/{n}-{r}.stats"):
            try:
                stats.append(json.loads(line))
            except ValueError:
                pass
        # Requests per stats interval: a stall would show as an interval with none while
        # connections are open.
        reqs = [s["total"]["requests"] for s in stats]
        per_s = [b - a for a, b in zip(reqs, reqs[1:])]
        opens = [s["total"]["open"] for s in stats]
        recvq = [l.split() for l in open(f"{tmp}/{n}-{r}.recvq") if l.strip()]
        unread_max = max((int(x[1]) for x in recvq), default=0)
        # Established connections at the busiest sample: httperf select()s, so past about
        # 1,000 open connections it fails sessions itself (fd-unavail), whatever the server.
        conns_max = max((int(x[2]) for x in recvq if len(x) > 2), default=0)
        # Longest run of samples with unread request bytes in the server's sockets.
        run_len = best = 0
        for x in recvq:
            run_len = run_len + 1 if int(x[1]) > 0 else 0
            best = max(best, run_len)
        runs.append({"server": n, "round": r, "unread_bytes_max": unread_max,
                     "established_max": conns_max,
                     "unread_longest_s": best * 0.25,
                     "replies_2xx": num(r"Reply status: 1xx=\d+ 2xx=(\d+)"),
                     "errors": num(r"Errors: total (\d+)"),
                     "client_timeouts": num(r"client-timo (\d+)"),
                     "error_kinds": {k: int(v) for k, v in re.findall(
                         r"(client-timo|socket-timo|connrefused|connreset|fd-unavail|"
                         r"addrunavail|ftab-full|other) (\d+)", out) if int(v)},
                     "fd_unavail": num(r"fd-unavail (\d+)"),
                     "sessions_ok": num(r"Session rate \[sess/s\]: .*?\((\d+)/\d+\)"),
                     "requests_per_second_server": per_s,
                     "open_per_second_server": opens[1:],
                     "stall_intervals": sum(1 for d, o in zip(per_s, opens[1:]) if d == 0 and o > 0)})
cmd = "bench/httperf-sessions.sh " + " ".join([str(rounds)] + specs)
if stem != "results/httperf/httperf-sessions":
    cmd = f"OUT={stem} " + cmd
json.dump({"command": cmd, "machine": f"2-core VM, Linux {platform.release()}", "runs": runs},
          open(stem + ".json", "w"), indent=1)
with open(stem + ".md", "w") as f:
    f.write(f"# httperf session workload (issue 13, finding 5)\n\n`{cmd}` — 2-core VM, Linux {platform.release()}.\n\n")
    f.write("20,000 sessions (1, 2, 3 requests, 100 ms think) over the built-in 30,000 files, httperf `--rate 2000 --timeout 5` on CPU 0, `corelocal serve http --cpus 1` (default flags otherwise), fresh netns per run, servers alternating per round. A *stall interval* is a 1 s stats interval in which the server answered nothing while connections were open.\n\n")
    f.write("*Unread* is what `ss` showed every 250 ms in the server's sockets' receive queues: requests the server had not read yet (a stalled server shows it growing and lasting).\n\n")
    f.write("| server | round | 2xx replies | httperf errors | client-timo | fd-unavail | established max | stall intervals | unread bytes max | longest unread stretch | server req/s per interval |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    for x in runs:
        f.write(f"| {x['server']} | {x['round']} | {x['replies_2xx']} | {x['errors']} | {x['client_timeouts']} | {x['fd_unavail']} | {x['established_max']} | {x['stall_intervals']} | {x['unread_bytes_max']} | {x['unread_longest_s']:.2f} s | {x['requests_per_second_server']} |\n")
    f.write("\n| server | rounds | rounds with errors | errors (sum) | error kinds |\n|---|---|---|---|---|\n")
    for n in names:
        mine = [x for x in runs if x["server"] == n]
        kinds = {}
        for x in mine:
            for k, v in x["error_kinds"].items():
                kinds[k] = kinds.get(k, 0) + v
        f.write(f"| {n} | {len(mine)} | {sum(1 for x in mine if x['errors'])} | "
                f"{sum(x['errors'] or 0 for x in mine)} | {kinds or '-'} |\n")
print(open(stem + ".md").read())
PY
