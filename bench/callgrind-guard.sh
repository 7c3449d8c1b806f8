#!/usr/bin/env bash
# CI guard on the one-shot fast path: instructions per connection of the server, counted by
# callgrind (user space only, deterministic in what it counts, blind to a busy machine), for
# one-shot HTTP and one memcached get per connection on both backends, compared with the
# committed baseline results/callgrind/baseline.json. Fails when a cell grows by more than the
# baseline's bound (bound_pct) and prints the functions that grew (self instructions per
# connection, against the baseline's per-function figures).
#
# Each cell is bench/callgrind-oneshot.sh's measurement with PACED (WARM connections one at a
# time first, then N measured by bench/oneshot-paced.py: one connection at a time, PACED ms
# between its steps, so that every step finds the server idle and the loop turns per
# connection do not depend on scheduling; at 3 ms a server sharing its CPU with a busy loop
# sometimes had not finished a step when the next came, and two steps shared a turn), of the
# worker's thread only, REPS times. Two figures are
# guarded, each the median over the reps: instructions per connection outside glibc malloc's
# internals (`Ir (steady)`: those depend on the heap's layout, which a once-a-second Date header
# or the warm-up's history moves by a few hundred instructions per connection) and calls into
# the allocator per connection (which do not). The total Ir is printed, not guarded.
#
# usage: bench/callgrind-guard.sh [--update] [BIN]     (BIN: target/release/corelocal)
#   --update  rewrites the baseline from this run. Do it deliberately, in a commit of its own
#             that says why the count moved (the commit the baseline was taken at is recorded).
#   env: BASELINE (another baseline file); RESULT=FILE also writes this run's figures as JSON;
#        WARM N CONNS REPS CELLS PACED override the baseline's workload (for experiments
#        only; the comparison is made only when they match the baseline's).
set -euo pipefail
cd "$(dirname "$0")/.."
update=0
if [ "${1:-}" = "--update" ]; then
  update=1
  shift
fi
bin=${1:-target/release/corelocal}
baseline=${BASELINE:-results/callgrind/baseline.json}
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
export N=${N:-$(workload n 200)}
export CONNS=${CONNS:-$(workload conns 1)}
export REPS=${REPS:-$(workload reps 2)}
export CELLS=${CELLS:-$(workload cells "uring/http uring/kv epoll/http epoll/kv")}
export PACED=${PACED:-$(workload paced 10)}
# The path measured is the deferred-accept one (accept, read, answer and close in one turn),
# the one a busy worker takes: paced one at a time, an adaptive worker would be idle and not
# defer, which is another path (and not the baseline's).
export SERVE_ARGS=${SERVE_ARGS:---defer-accept-adaptive off}
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
workload = {k: os.environ[k.upper()] for k in ("warm", "n", "conns", "reps", "cells", "paced")}
workload = {k: (v if k == "cells" else int(v)) for k, v in workload.items()}
n = workload["n"]

def tool(*args):
    out = subprocess.run([sys.executable, functions_py, *args, "--per", str(n)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)

cells = {}
for line in open(os.path.join(keep, "log")):
    m = re.match(r"guard (\w+) (\w+) rep (\d+): ", line)
    if m:
        backend, proto, rep = m.groups()
        cell = f"{backend}/{proto}"
        path = os.path.join(keep, f"guard-{backend}-{proto}-{rep}.callgrind")
        cells.setdefault(cell, []).append((tool("--summary", path), path))

result = {}
for cell, reps in cells.items():
    # The median rep: a rep whose steps shared a loop turn (the server slow to finish one on
    # a busy machine) comes out lower, an unlucky one higher; one of three is outvoted.
    ordered = sorted(reps, key=lambda r: r[0]["ir_steady"])
    best, path = ordered[(len(ordered) - 1) // 2]
    result[cell] = {
        "ir_steady_per_conn": best["ir_steady"],
        "alloc_calls_per_conn": sorted(r[0]["alloc_calls"] for r in reps)[(len(reps) - 1) // 2],
        "ir_per_conn": best["ir"],
        "reps_ir_steady": [r[0]["ir_steady"] for r in reps],
        "reps_ir": [r[0]["ir"] for r in reps],
        "functions": tool(path, "--top", "80", "--json"),
    }

if os.environ.get("RESULT"):
    with open(os.environ["RESULT"], "w") as f:
        json.dump({"commit": commit, "workload": workload, "cells": result}, f, indent=1)

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
ALLOC_CALLS_SLACK_PER_CONN = 0.5
failed = []
print(f"\n| cell | metric | baseline ({base['commit']}) | now | change | bound |")
print("|---|---|---:|---:|---:|---:|")
for cell, b in base["cells"].items():
    if cell not in result:
        failed.append(cell)
        print(f"| {cell} | | | missing | | |")
        continue
    r = result[cell]
    bad_cell = False
    for metric, label in (("ir_steady_per_conn", "Ir (steady) / conn"),
                          ("alloc_calls_per_conn", "allocator calls / conn"),
                          ("ir_per_conn", "Ir (all) / conn, not guarded")):
        growth = r[metric] - b[metric]
        allowed = b[metric] * bound / 100.0
        if metric == "alloc_calls_per_conn":
            # Near zero a percentage means nothing: half a call per connection is allowed
            # (a once-a-second allocation shows as a few hundredths), one more is not.
            allowed = max(allowed, ALLOC_CALLS_SLACK_PER_CONN)
        change = f"{100.0 * growth / b[metric]:+.2f}%" if b[metric] else f"{growth:+.2f}"
        guarded = "not guarded" not in label
        bad = guarded and growth > allowed
        bad_cell |= bad
        print(f"| {cell} | {label} | {b[metric]} | {r[metric]} | {change} "
              f"| {str(bound) + '%' if guarded else '—'}{' FAIL' if bad else ''} |")
    if bad_cell:
        failed.append(cell)
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
