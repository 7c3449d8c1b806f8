#!/usr/bin/env bash
# CI guard on the one-shot fast path: instructions per connection of the server, counted by
# callgrind (user space only, deterministic in what it counts, blind to a busy machine), for
# one-shot HTTP and one memcached get per connection on both backends, compared with the
# committed baseline results/callgrind/baseline.json. Fails when a cell grows by more than the
# baseline's bound (bound_pct) and prints the functions that grew (self instructions per
# connection, against the baseline's per-function figures).
#
# Each cell is bench/callgrind-oneshot.sh's measurement (WARM connections first, then N
# measured, server on CPU 1, client on CPU 0, CONNS at a time), REPS times; the cell's figure is
# the minimum over the reps: a rep can only gain instructions from timing (a loop turn that
# finds less work), never lose them, so the minimum is the stable figure.
#
# usage: bench/callgrind-guard.sh [--update] [BIN]     (BIN: target/release/corelocal)
#   --update  rewrites the baseline from this run. Do it deliberately, in a commit of its own
#             that says why the count moved (the commit the baseline was taken at is recorded).
#   env: WARM N CONNS REPS CELLS override the baseline's workload (for experiments only; the
#        comparison is made only when they match the baseline's).
set -euo pipefail
cd "$(dirname "$0")/.."
update=0
if [ "${1:-}" = "--update" ]; then
  update=1
  shift
fi
bin=${1:-target/release/corelocal}
baseline=results/callgrind/baseline.json
command -v valgrind >/dev/null || { echo "callgrind-guard: valgrind is not installed" >&2; exit 2; }
[ -x "$bin" ] || { echo "callgrind-guard: no binary at $bin" >&2; exit 2; }

workload() { # KEY DEFAULT: the baseline's workload value unless overridden
  python3 - "$baseline" "$1" "$2" <<'EOF'
import json, os, sys
path, key, default = sys.argv[1:4]
try:
    print(json.load(open(path))["workload"][key])
except (OSError, KeyError):
    print(default)
EOF
}
export WARM=${WARM:-$(workload warm 3000)}
export N=${N:-$(workload n 1000)}
export CONNS=${CONNS:-$(workload conns 1)}
export REPS=${REPS:-$(workload reps 2)}
export CELLS=${CELLS:-$(workload cells "uring/http uring/kv epoll/http epoll/kv")}
keep=$(mktemp -d)
trap 'rm -rf "$keep"' EXIT
export KEEP=$keep

start=$(date +%s)
bench/callgrind-oneshot.sh "guard=$bin" | tee "$keep/log"
echo "callgrind-guard: measured in $(($(date +%s) - start)) s"

python3 - "$keep" "$baseline" "$update" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'EOF'
import json, os, re, subprocess, sys, time
keep, baseline_path, update, commit = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
here = os.path.dirname(os.path.abspath(baseline_path))
functions_py = os.path.join(os.getcwd(), "bench", "callgrind-functions.py")
workload = {k: os.environ[k.upper()] for k in ("warm", "n", "conns", "reps", "cells")}
workload = {k: (v if k == "cells" else int(v)) for k, v in workload.items()}
n = workload["n"]

cells = {}
for line in open(os.path.join(keep, "log")):
    m = re.match(r"guard (\w+) (\w+) rep (\d+): Ir\((\d+) conns\)=(\d+) per-conn=(\d+)", line)
    if m:
        backend, proto, rep, _, ir, _ = m.groups()
        cells.setdefault(f"{backend}/{proto}", []).append((int(ir) / n, int(rep)))

def functions(cell, rep):
    path = os.path.join(keep, f"guard-{cell.replace('/', '-')}-{rep}.callgrind")
    out = subprocess.run([sys.executable, functions_py, path, "--per", str(n), "--top", "80",
                          "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)

result = {}
for cell, reps in cells.items():
    best, rep = min(reps)
    result[cell] = {"ir_per_conn": round(best, 1),
                    "reps": [round(r, 1) for r, _ in sorted(reps, key=lambda x: x[1])],
                    "functions": functions(cell, rep)}

if update:
    old = {}
    try:
        old = json.load(open(baseline_path))
    except OSError:
        pass
    doc = {
        "_comment": old.get("_comment", [
            "Instructions (callgrind Ir, user space) per one-shot connection of the server, the",
            "baseline of bench/callgrind-guard.sh (run by .ci/run). To update it, deliberately:",
            "bench/callgrind-guard.sh --update on a release build, then commit this file alone",
            "with a message that says why the count moved. bound_pct: the growth that fails CI.",
        ]),
        "bound_pct": old.get("bound_pct", 3.0),
        "commit": commit,
        "taken": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "valgrind": subprocess.run(["valgrind", "--version"], capture_output=True,
                                   text=True).stdout.strip(),
        "workload": workload,
        "cells": result,
    }
    os.makedirs(here, exist_ok=True)
    with open(baseline_path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"callgrind-guard: baseline written to {baseline_path} (commit {commit})")
    sys.exit(0)

base = json.load(open(baseline_path))
if base["workload"] != workload:
    print(f"callgrind-guard: workload {workload} differs from the baseline's "
          f"{base['workload']}: nothing compared")
    sys.exit(2)
bound = float(base["bound_pct"])
failed = []
print(f"\n| cell | baseline ({base['commit']}) | now (reps) | change | bound |")
print("|---|---:|---:|---:|---:|")
for cell, b in base["cells"].items():
    if cell not in result:
        failed.append(cell)
        print(f"| {cell} | {b['ir_per_conn']} | missing | | |")
        continue
    r = result[cell]
    change = 100.0 * (r["ir_per_conn"] - b["ir_per_conn"]) / b["ir_per_conn"]
    bad = change > bound
    if bad:
        failed.append(cell)
    print(f"| {cell} | {b['ir_per_conn']} | {r['ir_per_conn']} ({', '.join(map(str, r['reps']))}) "
          f"| {change:+.2f}% | {bound}%{' FAIL' if bad else ''} |")
for cell in failed:
    if cell not in result:
        continue
    old, new = base["cells"][cell]["functions"], result[cell]["functions"]
    rows = []
    for k in set(old) | set(new):
        d = new.get(k, 0.0) - old.get(k, 0.0)
        rows.append((d, old.get(k, 0.0), new.get(k, 0.0), k))
    rows.sort(key=lambda r: -r[0])
    print(f"\n{cell}: functions that grew (self Ir per connection; a function absent on one side "
          f"may be inlined there or below the top 80)")
    print(f"{'baseline':>9} {'now':>9} {'change':>8}  function")
    for d, o, nw, k in rows[:20]:
        if d <= 0.5:
            break
        print(f"{o:9.1f} {nw:9.1f} {d:+8.1f}  {k[:120]}")
if failed:
    print(f"\ncallgrind-guard: FAIL: {', '.join(failed)} grew by more than {bound}% "
          "(if intended, update the baseline deliberately: see its _comment)")
    sys.exit(1)
print(f"\ncallgrind-guard: ok (every cell within +{bound}% of the baseline)")
EOF
