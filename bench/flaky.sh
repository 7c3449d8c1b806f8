#!/usr/bin/env bash
# How often a test fails under load: runs a test binary's FILTER (libtest's name filter) RUNS
# times in each of COPIES concurrent loops (the copies load the 2 CPUs the way CI's parallel
# tests do) and counts the failures per build. For a flaky test found by CI: the count before a
# fix and after it, side by side.
# usage: [COPIES=6] [RUNS=60] [OUT=results/flaky/NAME] bench/flaky.sh NAME FILTER LABEL=TESTBIN [LABEL=TESTBIN ...]
#   TESTBIN: a built test binary (cargo test --no-run prints its path).
#   writes OUT.json and OUT.md (default results/flaky/NAME); a failure's output is kept there
#   as OUT-LABEL-fail-N.log (the first three).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n 2,9p "$0" >&2; exit 2; }
name=$1 filter=$2
shift 2
copies=${COPIES:-6} runs=${RUNS:-60}
out=${OUT:-results/flaky/$name}
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rows=()
for spec in "$@"; do
  label=${spec%%=*} bin=${spec#*=}
  [ -x "$bin" ] || { echo "flaky: no test binary at $bin" >&2; exit 2; }
  loop() { # COPY: RUNS runs, one line per failure
    for i in $(seq "$runs"); do
      timeout 120 "$bin" "$filter" -q >"$tmp/$label-$1.log" 2>&1 ||
        { echo "$i" >>"$tmp/$label-$1.fails"; cp "$tmp/$label-$1.log" "$tmp/$label-fail-$1-$i.log"; }
    done
  }
  start=$(date +%s)
  for c in $(seq "$copies"); do loop "$c" & done
  wait
  fails=$( (cat "$tmp/$label"-*.fails 2>/dev/null || true) | wc -l)
  n=0
  for f in "$tmp/$label"-fail-*.log; do
    [ -e "$f" ] && [ $n -lt 3 ] || break
    n=$((n + 1))
    cp "$f" "$out-$label-fail-$n.log"
  done
  rows+=("$label $fails $((copies * runs)) $(( $(date +%s) - start ))")
  echo "flaky: $label: $fails of $((copies * runs)) runs failed" >&2
done
python3 - "$out" "$name" "$filter" "$copies" "$runs" "$(uname -r)" "$(nproc)" "${rows[@]}" <<'EOF'
import json, sys
out, name, filt, copies, runs, kernel, cpus = sys.argv[1:8]
builds = []
for row in sys.argv[8:]:
    label, fails, total, secs = row.split()
    builds.append({"label": label, "failed": int(fails), "runs": int(total), "seconds": int(secs)})
doc = {"name": name, "filter": filt, "copies": int(copies), "runs_per_copy": int(runs),
       "kernel": kernel, "cpus": int(cpus), "builds": builds}
json.dump(doc, open(out + ".json", "w"), indent=2)
with open(out + ".md", "w") as md:
    md.write(f"# {name}: failures under load\n\n")
    md.write(f"`COPIES={copies} RUNS={runs} bench/flaky.sh {name} {filt} …` — {copies} concurrent "
             f"loops of {runs} runs of the test binary's `{filt}` tests per build, {cpus} CPUs, "
             f"Linux {kernel}.\n\n| build | failed | runs | seconds |\n|---|---:|---:|---:|\n")
    for b in builds:
        md.write(f"| {b['label']} | {b['failed']} | {b['runs']} | {b['seconds']} |\n")
EOF
echo "flaky: wrote $out.json, $out.md" >&2
