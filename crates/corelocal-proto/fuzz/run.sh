#!/bin/sh
# Runs every fuzz target for SECS seconds (default 300) from the committed seeds and writes a
# summary per target to results/fuzz/fuzz-<target>.txt. Needs nightly and cargo-fuzz.
set -u
SECS=${1:-300}
cd "$(dirname "$0")"
RESULTS=../../../results/fuzz
mkdir -p "$RESULTS"
for t in http_request memcache_line http_conn kv_conn sockperf_stream; do
    mkdir -p corpus/$t
    cp -n seeds/$t/* corpus/$t/ 2>/dev/null
    log=$(mktemp)
    cargo +nightly fuzz run -O $t corpus/$t -- -max_total_time="$SECS" -max_len=8192 \
        -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 >"$log" 2>&1
    rc=$?
    {
        echo "target: $t"
        echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "host: $(uname -srm), $(nproc) CPUs"
        echo "rustc: $(rustc +nightly --version)"
        echo "command: cargo +nightly fuzz run -O $t corpus/$t -- -max_total_time=$SECS -max_len=8192 -rss_limit_mb=2048 -timeout=10"
        echo "exit: $rc (0 = no crash, leak, timeout or OOM)"
        echo "crash artifacts: $(ls artifacts/$t 2>/dev/null | wc -l)"
        grep -E "^stat::|Done [0-9]+ runs|SUMMARY|panicked|ERROR" "$log"
        echo "last progress line:"
        grep -E "^#[0-9]+" "$log" | tail -1
    } >"$RESULTS/fuzz-$t.txt"
    rm -f "$log"
done
