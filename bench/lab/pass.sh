#!/usr/bin/env bash
# A whole pass of the lab's checks (bench/lab/checks.py) in a fresh guest, and its result files:
#   bench/lab/pass.sh                      # 16 vCPUs, 2 NUMA nodes, 8 queues, every check
#   bench/lab/pass.sh --cpus 80 --mem 3072 --checks locality-http-uring,nic-uring,cpus-holes,tune,top
#   LAB_STALL_ROUNDS=3 bench/lab/pass.sh --checks stall --name lab-16cpu-stall   # issue 35's stall hunt
# Writes results/lab/lab-<N>cpu.json and .md (guest kernel, vCPUs, accelerator, host load before
# and after, each check PASS/FAIL with its numbers); exit code 0 when every check passed.
# LAB_RESULTS=DIR writes them there instead (CI's bounded pass: nothing to commit).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
export PASS_CMD="bench/lab/pass.sh $*"
cpus=16 nodes=2 queues=8 mem=2048 checks="" timeout=2400 name=""
while [ $# -gt 0 ]; do
    case $1 in
    --cpus) cpus=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --queues) queues=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --checks) checks=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    *) echo "pass.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
name=${name:-lab-${cpus}cpu}
[ -x "$REPO/target/release/corelocal" ] || { echo "pass.sh: build first: cargo build --release -p corelocal-cli" >&2; exit 2; }
out=$REPO/target/lab/pass-$name-$(date -u +%Y%m%dT%H%M%S)
results=${LAB_RESULTS:-$REPO/results/lab}
mkdir -p "$out" "$results"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
# The commit the guest runs (taken now: the tree may move on while a long pass runs).
commit=$(git -C "$REPO" rev-parse --short HEAD)$(git -C "$REPO" diff --quiet HEAD -- bench/lab crates || echo "+changes")
t0=$(date +%s)
rc=0
"$HERE/lab.sh" run --cpus "$cpus" --nodes "$nodes" --queues "$queues" --mem "$mem" --timeout "$timeout" \
    --host-agent "$HERE/nic-agent.py" --out "$out" -- env LAB_CHECKS="$checks" LAB_CONNS_PER_CPU="${LAB_CONNS_PER_CPU:-4}" LAB_STALL_ROUNDS="${LAB_STALL_ROUNDS:-3}" python3 bench/lab/checks.py \
    | tee "$out/lab.log" || rc=$?
took=$(($(date +%s) - t0))
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
[ -f "$out/result.json" ] || { echo "pass.sh: no result.json (lab exit $rc); see $out" >&2; exit 1; }
python3 - "$out" "$results/$name" "$load_before" "$load_after" "$took" "$(nproc)" "$commit" <<'PY'
import json, sys, shutil, os
out, dest, lb, la, took, host_cpus, commit = sys.argv[1:]
r = json.load(open(f"{out}/result.json"))
g = r["guest"]
r["host"] = {"load_before": lb, "load_after": la, "cpus": int(host_cpus), "pass_seconds_with_boot": int(took),
             "commit": commit, "command": os.environ.get("PASS_CMD", "bench/lab/pass.sh")}
json.dump(r, open(dest + ".json", "w"), indent=1)
lines = [f"# Lab pass: {g['vcpus']} vCPUs, {len(g['numa_nodes'])} NUMA nodes, {g['nic_queues']}-queue virtio-net",
         "",
         f"Guest kernel {g['kernel']} (Debian's stock build), accelerator **{g['accelerator']}**, "
         f"NUMA {', '.join(f'{k}: {v}' for k, v in g['numa_nodes'].items())}, NIC on node {g['nic_numa_node']}. "
         f"Host: {host_cpus} CPUs, load {lb} before and {la} after; pass {took} s with boot "
         f"({g['seconds']} s of checks); commit {commit}. TCG timings are not performance.",
         "",
         f"**{r['passed']} of {r['total']} checks passed.**",
         "",
         "| check | result | numbers |",
         "|---|---|---|"]
for c in r["checks"]:
    nums = json.dumps(c["numbers"]).replace("|", "\\|")
    lines.append(f"| {c['check']} | {c['result']} | `{nums}` |")
open(dest + ".md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
for f in "$out"/threads-*.txt "$out"/stall-*.json; do [ -e "$f" ] && cp "$f" "$results/$name-$(basename "$f")"; done
echo "pass.sh: $results/$name.json and .md; guest files in $out"
exit "$rc"
