#!/bin/sh
# Soak: mixed load against `corelocal serve rpc` with a takeover (binary-upgrade restart) every
# PERIOD seconds; records client errors (bench JSON) and the serving process's RSS each second.
# Runs itself inside a private network namespace (root). Usage:
#   bench/soak.sh [--duration SECS] [--period SECS] [--out DIR]
set -eu
DUR=60; PERIOD=10; OUT=results
while [ $# -gt 0 ]; do case $1 in
  --duration) DUR=$2; shift 2;; --period) PERIOD=$2; shift 2;; --out) OUT=$2; shift 2;;
  *) echo "unknown argument $1" >&2; exit 2;; esac; done
BIN=${CORELOCAL_BIN:-target/release/corelocal}
[ -x "$BIN" ] || BIN=target/debug/corelocal
if [ -z "${SOAK_INNER:-}" ]; then
  mkdir -p "$OUT"
  exec env SOAK_INNER=1 unshare -n -- "$0" --duration "$DUR" --period "$PERIOD" --out "$OUT"
fi
ip link set lo up
ADDR=127.0.0.1:7500
TMP=$(mktemp -d)
serve() { "$BIN" serve rpc --listen $ADDR --cpus 0-1 --stats-interval 0 "$@" >/dev/null 2>>"$TMP/server.log" & echo $!; }
PID=$(serve); sleep 0.5
"$BIN" bench crr -t $ADDR -d "${DUR}s" -c 8 --progress never --json "$TMP/crr.json" >/dev/null 2>&1 &
B1=$!
"$BIN" bench rpc -t $ADDR -d "${DUR}s" -c 8 --progress never --json "$TMP/rpc.json" >/dev/null 2>&1 &
B2=$!
python3 - "$DUR" <<'PY' > "$TMP/misbehaving.json" &
import socket, sys, time, os
end = time.time() + float(sys.argv[1]); garbage = slow = errs = 0
while time.time() < end:
    try:  # garbage: random bytes, expect a close
        s = socket.create_connection(("127.0.0.1", 7500), timeout=5); s.sendall(os.urandom(4096) * 20)
        s.recv(100); s.close(); garbage += 1
        s = socket.create_connection(("127.0.0.1", 7500), timeout=5)  # slow: 1 byte / 50 ms
        for _ in range(10): s.sendall(b"x"); time.sleep(0.05)
        s.close(); slow += 1
    except OSError: errs += 1
print('{"garbage":%d,"slow":%d,"errors":%d}' % (garbage, slow, errs))
PY
B3=$!
START=$(date +%s); NEXT=$((START + PERIOD)); RESTARTS=0
echo "t_s,pid,rss_kib" > "$TMP/rss.csv"
while kill -0 $B1 2>/dev/null; do
  NOW=$(date +%s)
  echo "$((NOW - START)),$PID,$(awk '/VmRSS/{print $2}' /proc/$PID/status 2>/dev/null || echo 0)" >> "$TMP/rss.csv"
  if [ "$NOW" -ge "$NEXT" ]; then
    PID=$(serve --takeover "$PID"); RESTARTS=$((RESTARTS + 1)); NEXT=$((NOW + PERIOD))
  fi
  sleep 1
done
wait $B2 $B3 || true
kill -TERM "$PID"; wait "$PID" || true
cp "$TMP/rss.csv" "$OUT/soak-rss.csv"
python3 - "$TMP" "$OUT" "$DUR" "$RESTARTS" <<'PY'
import json, sys, csv
tmp, out, dur, restarts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def load(p):
    try: return json.load(open(p))
    except Exception as e: return {"error": str(e)}
rss = [int(r["rss_kib"]) for r in csv.DictReader(open(tmp + "/rss.csv")) if r["rss_kib"] != "0"]
res = {"duration_s": dur, "takeovers": restarts, "crr": load(tmp + "/crr.json"),
       "rpc": load(tmp + "/rpc.json"), "misbehaving": json.load(open(tmp + "/misbehaving.json")),
       "rss_kib": {"min": min(rss), "max": max(rss), "samples": len(rss)},
       "server_log_stopped": [l.strip() for l in open(tmp + "/server.log") if "stopped" in l]}
json.dump(res, open(out + "/soak.json", "w"), indent=1)
print(json.dumps({k: res[k] for k in ("duration_s", "takeovers", "misbehaving", "rss_kib")}))
PY
