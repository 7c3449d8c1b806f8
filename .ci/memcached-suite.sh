#!/usr/bin/env bash
# memcached's own text-protocol tests (the Perl suite in t/ of memcached 1.6.18, the version
# Debian bookworm ships) run unmodified against `corelocal memcached`, which reads memcached's
# command line natively and serves it with `serve kv`: the harness's ./memcached-debug is a
# one-line wrapper that runs the binary under that name (memcached's debug build: `debugtime`
# on), with --backend after `--`.
#
# Usage:
#   .ci/memcached-suite.sh [--backend auto|epoll|uring] [--bin PATH] [--reference] [--tls]
#                          [TEST...]
#   .ci/memcached-suite.sh --all [--bin PATH]
#     --backend    passed to `serve kv` (default: auto)
#     --bin        the corelocal binary (default: cargo build --release -p corelocal-cli, then
#                  target/release/corelocal)
#     --reference  run the same tests against Debian's memcached binary instead (proves the
#                  harness: memcached 1.6.18 passes all of them)
#     --tls        the TLS pass: SSL_TEST=1, memcached's switch for its TLS tests (each server
#                  started with -Z -o ssl_chain_cert=t/server_crt.pem,ssl_key=t/server_key.pem,
#                  every client an IO::Socket::SSL one: Debian's libio-socket-ssl-perl);
#                  default tests: the six t/ssl_*.t and the 46 below, over TLS
#     --all        what CI runs: --reference, then the default backend, then --backend epoll;
#                  then --tls --reference and --tls (default backend)
#     TEST...      test names (default: the 46 below), e.g. getset flush-all
#
# TLS: Debian's memcached 1.6.18 is built with TLS (OpenSSL), and with SSL_TEST=1 it passes all
# six t/ssl_*.t (cert_refresh, ports, proto_version, session_resumption, settings,
# verify_modes) and all 46 default files. `corelocal memcached` maps -Z and -o ssl_* onto
# `serve kv --tls-*` (rustls): the same files pass against it; `expirations` (debug build
# only) runs over TLS against ours alone, as in the plain pass.
#
# The source comes from Debian's source package through a private apt configuration (its own
# sources list, lists and cache under the work directory; the system's apt config is not
# touched) and is kept in ${MEMCACHED_SUITE_DIR:-target/memcached-suite} for the next run.
# Exits non-zero, naming the failed files, if any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

version=1.6.18
# Every file that passes against memcached itself and both of our backends (README.md, "serve
# kv": the table of all files and why the others do not apply).
tests_default=(00-startup ascii-auth bogus-commands cas chunked-items daemonize dash-M evictions
    flags flush-all getandtouch getset idle-timeout incrdecr issue_104 issue_108 issue_14 issue_152
    issue_163 issue_183 issue_192 issue_29 issue_3 issue_41 issue_42 issue_61 issue_67 issue_68
    issue_70 item_size_max lru-crawler malicious-commands maxconns metaget multiversioning noreply
    quit restart shutdown stats stats-conns stats-detail strtol-testing touch watcher
    watcher_connid)
# memcached's TLS tests: they skip unless SSL_TEST=1 (--tls).
tests_tls=(ssl_cert_refresh ssl_ports ssl_proto_version ssl_session_resumption ssl_settings
    ssl_verify_modes)
# Files that need memcached's debug build (`debugtime`), which Debian does not ship: run
# against serve kv only (run as memcached-debug, corelocal turns the command on).
tests_debug_only=(expirations)

backend=auto
bin=
reference=0
tls=0
all=0
tests=()
while (($#)); do
    case "$1" in
    --backend) backend=$2; shift 2 ;;
    --backend=*) backend=${1#*=}; shift ;;
    --bin) bin=$2; shift 2 ;;
    --bin=*) bin=${1#*=}; shift ;;
    --reference) reference=1; shift ;;
    --tls) tls=1; shift ;;
    --all) all=1; shift ;;
    -h | --help) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "memcached-suite: unknown option $1" >&2; exit 64 ;;
    *) tests+=("${1%.t}"); shift ;;
    esac
done
defaulted=0
if ((!${#tests[@]})); then
    tests=("${tests_default[@]}")
    defaulted=1
    ((tls && !all)) && tests=("${tests_tls[@]}" "${tests[@]}")
fi
if ((defaulted && !reference && !all)); then
    tests+=("${tests_debug_only[@]}")
fi

if ((all)); then
    bin_args=()
    [[ -n $bin ]] && bin_args=(--bin "$bin")
    failed=()
    ours=("${tests[@]}")
    ((defaulted)) && ours+=("${tests_debug_only[@]}")
    "$0" --reference "${tests[@]}" || failed+=("memcached $version itself")
    "$0" "${bin_args[@]}" "${ours[@]}" || failed+=("serve kv (default backend)")
    "$0" "${bin_args[@]}" --backend epoll "${ours[@]}" || failed+=("serve kv --backend epoll")
    if ((defaulted)); then
        "$0" --tls --reference || failed+=("memcached $version itself over TLS")
        "$0" "${bin_args[@]}" --tls || failed+=("serve kv over TLS")
    fi
    if ((${#failed[@]})); then
        printf 'memcached-suite: FAILED: %s\n' "${failed[@]}" >&2
        exit 1
    fi
    echo "memcached-suite: memcached $version's tests pass against memcached itself and serve kv (default and epoll backends; and over TLS)" >&2
    exit 0
fi

work=${MEMCACHED_SUITE_DIR:-$repo/target/memcached-suite}
mkdir -p "$work"
work=$(cd "$work" && pwd)
src=$work/memcached-$version

die() {
    echo "memcached-suite: $*" >&2
    exit 1
}

# --- the suite's source, from Debian's source package --------------------------------------
fetch_source() {
    command -v apt-get >/dev/null || die "apt-get is needed to fetch memcached's source package"
    local apt=$work/apt
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/dl"
    # The machine's own Debian mirror (deb822 or one-line format), else Debian's; the release
    # is bookworm whatever the machine runs, since the tests are pinned to its memcached.
    local mirror suite=${MEMCACHED_SUITE_RELEASE:-bookworm}
    mirror=$(grep -hoE '^(URIs:|deb) +(\[[^]]*\] +)?https?://[^ ]+/debian/?( |$)' \
        /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
        grep -oE 'https?://[^ ]+' | head -n1 || true)
    mirror=${mirror:-http://deb.debian.org/debian}
    local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    local signed=
    [[ -r $keyring ]] && signed="[signed-by=$keyring] "
    echo "deb-src ${signed}${mirror%/} $suite main" >"$apt/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
        -o "Dir::Cache::archives=$apt/cache/archives" -o APT::Sandbox::User=root)
    echo "memcached-suite: fetching memcached's source package ($mirror $suite)" >&2
    apt-get "${opts[@]}" -qq update >&2 || die "apt-get update (private source list) failed"
    (cd "$apt/dl" && apt-get "${opts[@]}" -qq source --download-only memcached >&2) ||
        die "apt-get source memcached failed"
    local orig=$apt/dl/memcached_$version.orig.tar.xz
    [[ -f $orig ]] || die "$suite's memcached source is not $version: $(ls "$apt/dl")"
    # The upstream tarball is enough: Debian's patches do not touch t/.
    rm -rf "$src.tmp" && mkdir -p "$src.tmp"
    tar -xJf "$orig" -C "$src.tmp" --strip-components=1 "memcached-$version/t" \
        "memcached-$version/version.m4"
    grep -q "\[$version\]" "$src.tmp/version.m4" || die "the source is not memcached $version"
    mv "$src.tmp" "$src"
}
[[ -f $src/t/lib/MemcachedTest.pm ]] || fetch_source

if ((tls)); then
    perl -MIO::Socket::SSL -e1 2>/dev/null ||
        die "--tls needs IO::Socket::SSL (apt-get install libio-socket-ssl-perl)"
    export SSL_TEST=1
else
    # An SSL_TEST from the caller's environment would turn the plain pass into a TLS one.
    unset SSL_TEST
fi

# --- the "build directory": t/, ./memcached-debug and ./timedrun ---------------------------
# Removed first: whatever an earlier run left there (once a link, which writing through
# would have overwritten its target).
rm -f "$src/memcached-debug"
if ((reference)); then
    real=$(command -v memcached || true)
    [[ -n $real ]] || die "--reference needs Debian's memcached (apt-get install memcached)"
    "$real" -V | grep -q "^memcached $version\$" || die "$real is not memcached $version"
    # The harness would use a unix socket when -h mentions one; hide it so that the reference
    # runs over TCP (-p/-U) exactly as our server does.
    # `-o relaxed_privileges` exists only in memcached's debug build, which Debian does not ship.
    cat >"$src/memcached-debug" <<EOF
#!/bin/bash
if [ "\$1" = -h ]; then "$real" -h | grep -v unix-socket; exit 0; fi
args=()
while ((\$#)); do
    if [ "\$1" = -o ] && [ "\$2" = relaxed_privileges ]; then shift 2; continue; fi
    args+=("\$1"); shift
done
# Its output goes to the server log, as ours does: a server a test leaves behind must not
# hold the test's output pipe open, or prove waits for it.
if [ -n "\${MEMCACHED_SHIM_LOG:-}" ]; then exec >>"\$MEMCACHED_SHIM_LOG" 2>&1; fi
exec "$real" "\${args[@]}"
EOF
    chmod +x "$src/memcached-debug"
    label="memcached $version ($real)"
else
    if [[ -z $bin ]]; then
        # Always through cargo (a no-op when up to date): a stale binary would test old code.
        cargo build --release -p corelocal-cli >&2
        bin=$repo/target/release/corelocal
    fi
    bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
    [[ -x $bin ]] || die "no corelocal binary at $bin"
    # The binary under memcached's debug build's name; the server's messages (stderr; it
    # writes nothing on stdout, the test's TAP stream) to the server log.
    # shellcheck disable=SC2016
    printf '#!/bin/bash\nexec -a memcached-debug "%s" "$@" -- $CORELOCAL_KV_ARGS 2>>"$MEMCACHED_SHIM_LOG"\n' \
        "$bin" >"$src/memcached-debug"
    chmod +x "$src/memcached-debug"
    label="corelocal memcached -- --backend $backend ($bin)"
fi
((tls)) && label="$label, over TLS (SSL_TEST=1)"
# memcached's timedrun runs the server under a time limit; ours keeps the server's pid (the
# harness signals it) and the whole run has a limit instead.
printf '#!/bin/sh\nshift\nexec "$@"\n' >"$src/timedrun"
chmod +x "$src/timedrun"

export CORELOCAL_KV_ARGS="--backend $backend"
log=$work/server.log
: >"$log"
export MEMCACHED_SHIM_LOG=$log

files=()
for t in "${tests[@]}"; do
    [[ -f $src/t/$t.t ]] || die "no test t/$t.t in memcached $version"
    files+=("t/$t.t")
done

echo "memcached-suite: ${#files[@]} test files against $label" >&2
cd "$src"
# prove and every server it starts form one process group (setsid), so that whatever a failed
# test leaves running can be stopped without touching anything else.
set +e
setsid -w timeout 600 prove -j2 "${files[@]}" &
pid=$!
wait $pid
rc=$?
set -e
kill -INT -- -"$pid" 2>/dev/null && sleep 1 && kill -KILL -- -"$pid" 2>/dev/null
if ((rc != 0)); then
    echo "memcached-suite: FAILED against $label (prove exit $rc; server output: $log)" >&2
    tail -n 20 "$log" >&2 || true
    exit 1
fi
# That it was our server that answered: each file started at least one.
if ((!reference)); then
    started=$(grep -c "^corelocal serve kv: listening on" "$log" || true)
    if ((started < ${#files[@]})); then
        echo "memcached-suite: FAILED: $started corelocal servers started for ${#files[@]} files" >&2
        exit 1
    fi
fi
echo "memcached-suite: all ${#files[@]} files passed against $label" >&2
