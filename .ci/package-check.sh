#!/usr/bin/env bash
# The Debian package installs, runs and leaves nothing behind: builds it (cargo-deb, from
# crates/corelocal-cli/Cargo.toml's [package.metadata.deb]), installs it with dpkg, runs the
# installed `corelocal --version` and `corelocal memcached` against a client that sets and
# gets a key, verifies every unit it ships with `systemd-analyze verify` (when there is one),
# then removes it and checks that none of its files is left.
#
# Usage: .ci/package-check.sh [--keep]   (--keep: leave the package installed)
# Needs root (dpkg -i), cargo-deb (installed here from crates.io when missing) and
# dpkg-shlibdeps (dpkg-dev) for the package's library dependencies.
# PACKAGE_PROFILE=dev packages the debug build (a quicker check; cargo-deb reads the
# manifest's `target/release/` as the profile's directory); default: release.
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0
[[ ${1:-} == --keep ]] && keep=1

say() { echo "package-check: $*" >&2; }
die() {
    say "FAILED: $*"
    exit 1
}

((EUID == 0)) || die "needs root (dpkg -i)"
if ! cargo deb --version >/dev/null 2>&1; then
    say "installing cargo-deb from crates.io"
    cargo install --quiet --locked cargo-deb
fi

# --- build: the binary, then what the package ships beside it ------------------------------
profile=${PACKAGE_PROFILE:-release}
out=target/$profile
[[ $profile == dev ]] && out=target/debug
cargo build --profile "$profile" --quiet -p corelocal-cli
generated=$out/generated
rm -rf "$generated"
"$out/corelocal" generate man "$generated/man"
"$out/corelocal" generate completions "$generated/completions"
rm -rf target/debian
fast=()
[[ $profile == dev ]] && fast=(--fast) # a debug binary is large: quicker compression
deb=$(cargo deb --no-build --profile "$profile" "${fast[@]}" -p corelocal-cli | tail -n1)
[[ -f $deb ]] || die "cargo deb gave no package (got: $deb)"
say "built $deb"
dpkg-deb --info "$deb" | sed -n 's/^ \(Package\|Version\|Depends\):/  \1:/p' >&2

# --- install and run ------------------------------------------------------------------------
dpkg -r corelocal >/dev/null 2>&1 || true
dpkg -i "$deb" >/dev/null || die "dpkg -i $deb"
files=$(dpkg -L corelocal)
conffiles=$(dpkg-query -W -f='${Conffiles}\n' corelocal | awk 'NF { print $1 }')
say "installed: $(grep -c . <<<"$files") paths, $(grep -c . <<<"$conffiles") conffiles"
for want in /usr/bin/corelocal /lib/systemd/system/corelocal-http.service \
    /lib/systemd/system/corelocal-memcached.service /lib/systemd/system/corelocal-steer@.service \
    /usr/share/man/man1/corelocal.1 /usr/share/man/man1/corelocal-memcached.1 \
    /usr/share/bash-completion/completions/corelocal /usr/share/zsh/vendor-completions/_corelocal \
    /usr/share/fish/vendor_completions.d/corelocal.fish; do
    grep -qx "$want" <<<"$files" || die "the package lacks $want"
done
/usr/bin/corelocal --version >&2 || die "corelocal --version"
/usr/bin/corelocal memcached -V >&2 || die "corelocal memcached -V"

# A free port (the kernel's pick, released), then the installed command on it.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
/usr/bin/corelocal memcached -p "$port" -U 0 -l 127.0.0.1 >"$log" 2>&1 &
server=$!
cleanup() {
    kill -TERM "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    rm -f "$log"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
    grep -q "listening on" "$log" && break
    kill -0 "$server" 2>/dev/null || { cat "$log" >&2; die "corelocal memcached exited"; }
    sleep 0.1
done
grep -q "listening on" "$log" || { cat "$log" >&2; die "corelocal memcached did not listen"; }
answer=$(python3 - "$port" <<'PY'
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
c.sendall(b"set package-check 0 0 5\r\nhello\r\nget package-check\r\n")
got = b""
while not got.endswith(b"END\r\n"):
    chunk = c.recv(4096)
    if not chunk:
        break
    got += chunk
print(got.decode().replace("\r\n", "|"))
PY
)
[[ $answer == "STORED|VALUE package-check 0 5|hello|END|" ]] || die "set/get answered: $answer"
say "corelocal memcached -p $port -U 0: set and get answered ($answer)"
cleanup
trap - EXIT

# --- the units --------------------------------------------------------------------------------
if command -v systemd-analyze >/dev/null 2>&1; then
    # Documentation=man:… pages are looked up when man is there (they are in the package).
    man=no
    command -v man >/dev/null 2>&1 && man=yes
    # The template is verified as one instance of it; its server unit need not exist.
    for unit in corelocal-http.service corelocal-memcached.service corelocal-steer@nginx.service; do
        out=$(systemd-analyze verify --man="$man" "$unit" 2>&1) ||
            die "systemd-analyze verify $unit: $out"
        # Other units' complaints (the host's own) are not ours; ours must have none.
        if grep -i "corelocal" <<<"$out" | grep -v "nginx.service" >&2; then
            die "systemd-analyze verify $unit complains (above)"
        fi
        say "systemd-analyze verify $unit: clean"
    done
else
    say "no systemd-analyze here: the units are not verified (apt-get install systemd)"
fi

((keep)) && { say "kept installed (--keep)"; exit 0; }

# --- remove: nothing left but configuration an operator edited ---------------------------------
dpkg -r corelocal >/dev/null || die "dpkg -r corelocal"
left=()
while IFS= read -r path; do
    [[ -z $path || -d $path ]] && continue
    grep -qx "$path" <<<"$conffiles" && continue
    [[ -e $path || -L $path ]] && left+=("$path")
done <<<"$files"
((${#left[@]} == 0)) || die "left behind after dpkg -r: ${left[*]}"
[[ -d /usr/share/doc/corelocal ]] && die "left behind after dpkg -r: /usr/share/doc/corelocal"
say "dpkg -r corelocal: none of its $(grep -c . <<<"$files") paths left"
# Its maintainer scripts keep a removed package known to dpkg ("rc") until purged.
dpkg --purge corelocal >/dev/null || die "dpkg --purge corelocal"
say "OK"
