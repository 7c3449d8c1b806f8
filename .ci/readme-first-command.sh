#!/usr/bin/env bash
# Runs README.md's first set-up command exactly as written (taken from the README, so the two
# cannot drift apart), waits for the server's "listening on" line and fetches / from it.
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=$(awk '/^```sh/ { inside = 1; next } inside { print; exit }' README.md)
case "$cmd" in
    *"serve http"*) ;;
    *) echo "README's first command is not a server: $cmd" >&2; exit 1 ;;
esac
url=${README_URL:-http://127.0.0.1:8080/}
log=$(mktemp)
echo "README's first command: $cmd"
setsid bash -c "exec $cmd" >"$log" 2>&1 &
pid=$!
cleanup() { kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; rm -f "$log"; }
trap cleanup EXIT
# The command builds in release mode first: allow it 30 minutes.
for _ in $(seq 1 1800); do
    grep -q "listening on" "$log" && break
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "the command exited before listening:" >&2
        cat "$log" >&2
        exit 1
    fi
    sleep 1
done
grep "listening on" "$log"
body=$(curl -fsS --max-time 5 "$url")
case "$body" in
    *"<html"*|*"<!DOCTYPE"*|*"<!doctype"*) echo "GET / answered ($(printf %s "$body" | wc -c) bytes of HTML)" ;;
    *) echo "GET / did not answer the index page: $(printf %s "$body" | head -c 200)" >&2; exit 1 ;;
esac
