#!/usr/bin/env bash
# Records the overload figures: SYN flood, connection flood past --conns-per-worker, slow readers
# (epoll and io_uring), from crates/corelocal-cli/tests/overload.rs run one test at a time. The
# tests assert bounds, never timings; this keeps the numbers they measured.
# Needs root (private network namespaces, raw sockets) and python3.
# usage: bench/overload.sh [OUTDIR]   → OUTDIR/overload.json (default OUTDIR: results/overload)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:-results/overload}")
RUNS=$(mktemp -d)
trap 'rm -rf "$RUNS"' EXIT
LOAD="$(cat /proc/loadavg)"
echo "load average: $LOAD"
CORELOCAL_RECORD=$RUNS cargo test -p corelocal-cli --test overload -- --test-threads=1
mkdir -p "$OUT"
python3 - "$RUNS" "$OUT/overload.json" "$LOAD" <<'PY'
import json, pathlib, platform, sys
runs, out, load = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
doc = {
    "command": "bench/overload.sh (CORELOCAL_RECORD=DIR cargo test -p corelocal-cli --test overload -- --test-threads=1)",
    "kernel": platform.release(),
    "load_average_before": load,
    "scenarios": {p.stem: json.loads(p.read_text()) for p in sorted(runs.glob("*.json"))},
}
pathlib.Path(out).write_text(json.dumps(doc, indent=1) + "\n")
print(f"wrote {out}: {', '.join(doc['scenarios'])}")
PY
