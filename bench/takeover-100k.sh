#!/usr/bin/env bash
# A binary upgrade of a server holding 100,000+ established connections (issue 23): one
# `corelocal serve rpc --workers-per-cpu 3` (RLIMIT_NOFILE 20,000: io_uring direct descriptors)
# holds HOLDERS × PER connections of `corelocal-hold`, each verified with one request; then a
# successor takes over by socket. The old process moves every connection (SCM_RIGHTS, 64 per
# message; never more than 4,096 ordinary descriptors in flight per side) and exits; then every
# holder checks every connection again with one more request on the new process. Runs in a
# fresh network namespace.
#
# With APP=kv the server is `serve kv --memory-mb 1400` filled with ITEMS (default 1,000,000)
# items of 1 KiB before the holders connect (they send a meta no-op): the cache moves too, and
# a sample of 1,000 items is read back afterwards.
#
# usage: [APP=kv [ITEMS=N]] bench/takeover-100k.sh [HOLDERS] [PER]   (default 6 × 17000)
# writes: results/takeover/takeover-100k.json and .md (APP=kv: takeover-100k-kv.*)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${CORELOCAL_IN_NETNS:-}" ]; then
    cargo build --release -q -p corelocal-cli
    exec env CORELOCAL_IN_NETNS=1 unshare -n "$0" "$@"
fi
holders=${1:-6}
per=${2:-17000}
bin=target/release
ip link set lo up
tmp=$(mktemp -d)
app=${APP:-rpc}
items=${ITEMS:-1000000}
[ "$app" = kv ] || items=0
req=64; extra=(); stem=results/takeover/takeover-100k
if [ "$app" = kv ]; then req=mn; extra=(--memory-mb 1400); stem=$stem-kv; fi
serve() { exec "$bin/corelocal" serve "$app" --listen 127.0.0.1:7000 --workers-per-cpu 3 --idle-timeout 10m \
    --stats-interval 0 --drain-timeout 60s --takeover-timeout 60s "${extra[@]}" "$@" >/dev/null; }
fill() { python3 - "$items" <<'PY'
import socket, sys
items = int(sys.argv[1]); value = b"v" * 1024
s = socket.create_connection(("127.0.0.1", 7000))
for start in range(0, items, 2000):
    s.sendall(b"".join(b"set k%d 0 0 1024 noreply\r\n%s\r\n" % (i, value) for i in range(start, min(items, start + 2000))))
s.sendall(b"mn\r\n"); buf = b""
while not buf.endswith(b"MN\r\n"): buf += s.recv(4096)
PY
}
sample() { python3 - "$items" <<'PY'
import socket, sys
items = int(sys.argv[1]); s = socket.create_connection(("127.0.0.1", 7000)); hits = 0
for i in range(0, items, max(1, items // 1000)):
    s.sendall(b"mg k%d v\r\n" % i); buf = b""
    while not buf.endswith(b"\r\n") or (buf.startswith(b"VA") and buf.count(b"\r\n") < 2): buf += s.recv(4096)
    hits += buf.startswith(b"VA")
print(hits)
PY
}
serve --upgrade-socket "$tmp/a.sock" 2>"$tmp/old.err" &
old=$!
sleep 1
[ "$items" -gt 0 ] && fill
fds=()
for i in $(seq "$holders"); do
    mkfifo "$tmp/h$i.in"
    taskset -c $((i % 2)) "$bin/corelocal-hold" 127.0.0.1:7000 "$per" "$req" 900 <"$tmp/h$i.in" >"$tmp/h$i.out" 2>&1 &
    exec {fd}>"$tmp/h$i.in"
    fds+=("$fd")
done
wait_verified() { # rounds → waits until every holder printed that many `verified` lines
    local deadline=$((SECONDS + 300))
    while :; do
        local n=0
        for i in $(seq "$holders"); do
            [ "$(grep -c '^verified' "$tmp/h$i.out" || true)" -ge "$1" ] && n=$((n + 1))
        done
        [ "$n" -ge "$holders" ] && return 0
        if grep -q "corelocal-hold:" "$tmp"/h*.out || [ $SECONDS -ge $deadline ]; then
            echo "holders failed:"; cat "$tmp"/h*.out; return 1
        fi
        sleep 0.2
    done
}
wait_verified 1
started=$(date +%s.%N)
serve --takeover "$tmp/a.sock" --upgrade-socket "$tmp/b.sock" 2>"$tmp/new.err" &
new=$!
wait $old || true
exited=$(date +%s.%N)
for fd in "${fds[@]}"; do echo check >&"$fd"; done
wait_verified 2
checked=$(date +%s.%N)
hits=0; [ "$items" -gt 0 ] && hits=$(sample)
kill -TERM $new; wait $new || true
for fd in "${fds[@]}"; do exec {fd}>&-; done
python3 - "$tmp" "$holders" "$per" "$started" "$exited" "$checked" "$app" "$items" "$hits" "$stem" <<'PY'
import json, os, platform, re, sys
tmp, holders, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
started, exited, checked = map(float, sys.argv[4:7])
app, items, hits, stem = sys.argv[7], int(sys.argv[8]), int(sys.argv[9]), sys.argv[10]
old, new = open(f"{tmp}/old.err").read(), open(f"{tmp}/new.err").read()
outs = [open(f"{tmp}/h{i}.out").read() for i in range(1, holders + 1)]
second = sum(int(o.split("verified ")[2].split()[0]) for o in outs if o.count("verified ") >= 2)
moved = re.search(r"moved to pid \d+: (\d+) connections and (\d+) bytes of state in (\d+) ms \((.*)\)", old)
took = re.search(r"took (\d+) connections and \d+ bytes of state in (\d+) ms", new)
r = {"command": (f"APP={app} ITEMS={items} " if app == "kv" else "") + f"bench/takeover-100k.sh {holders} {per}",
     "app": app, "items": items, "items_sampled_hit": hits,
     "state_bytes": int(moved[2]) if moved else None, "state_summary": moved[4] if moved else None, "machine": f"2-core VM, Linux {platform.release()}",
     "loadavg": os.getloadavg(), "connections": holders * per,
     "moved_by_old": int(moved[1]) if moved else None, "move_ms_old": int(moved[3]) if moved else None,
     "taken_by_new": int(took[1]) if took else None, "move_ms_new": int(took[2]) if took else None,
     "old_exit_s": round(exited - started, 3), "all_checked_again_s": round(checked - started, 3),
     "verified_after": second, "old_log_tail": old.splitlines()[-3:], "new_log_tail": new.splitlines()[-3:]}
os.makedirs("results/takeover", exist_ok=True)
json.dump(r, open(stem + ".json", "w"), indent=2)
cache = (f" filled with {items:,} items of 1 KiB (`--memory-mb 1400`; {r['state_summary']}; "
         f"{hits} of 1,000 sampled items read back after)") if app == "kv" else ""
open(stem + ".md", "w").write(f"""# A binary upgrade with {r['connections']:,} established connections

`{r['command']}` — {r['machine']}, load average {r['loadavg'][0]:.2f}. Server: `corelocal serve {app}
--workers-per-cpu 3` (io_uring, RLIMIT_NOFILE 20,000){cache}; {holders} `corelocal-hold` processes × {per:,}
connections, each verified with one request; then `--takeover SOCKET`; then every connection is
checked again with one more request, now answered by the new process.

| connections | state moved | moved (old's count) | taken (new's count) | move, old's report | old process exited after | all checked again after | answered after the upgrade |
|---:|---:|---:|---:|---:|---:|---:|---:|
| {r['connections']:,} | {(r['state_bytes'] or 0) / 2**20:,.0f} MiB | {r['moved_by_old']:,} | {r['taken_by_new']:,} | {r['move_ms_old']} ms | {r['old_exit_s']} s | {r['all_checked_again_s']} s | {second:,} |
""")
print(json.dumps(r))
PY
rm -rf "$tmp"
