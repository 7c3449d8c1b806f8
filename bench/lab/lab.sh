#!/usr/bin/env bash
# The many-core lab: boot Debian's stock kernel in a QEMU guest with N vCPUs over NUMA nodes and a
# multi-queue virtio-net NIC on a tap inside a private network namespace, with this host's root
# filesystem shared read-only (9p, an overlay in the guest makes it writable there only), run one
# command inside, bring back its output and exit code. See bench/lab/README.md.
#
#   bench/lab/lab.sh setup                       # packages + kernel from the Debian archive
#   bench/lab/lab.sh run [options] -- CMD ARGS   # exit code = CMD's exit code in the guest
#
# Options of `run` (defaults in brackets):
#   --cpus N [16]  --nodes K [2]  --queues Q [8]  --mem MiB [2048]  --accel auto|kvm|tcg [auto]
#   --timeout S [900]  (the whole run, boot included; QEMU is killed past it, exit code 124)
#   --host-agent SCRIPT  runs SCRIPT on the host side, inside the lab's network namespace, while
#                        the guest runs (LAB_OUT = the directory the guest sees as /lab-out)
#   --out DIR      where the run's files go [target/lab/run-TIMESTAMP]
#
# Nothing touches the host's network: the tap, the bridge and QEMU live in a namespace made by
# `unshare -n` that vanishes with the run.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
LAB=${LAB_DIR:-$REPO/target/lab}
# The kernel the lab boots: Debian 12's 6.12 backport (the issue's "stock Debian 6.12").
KPKG=${LAB_KERNEL_PKG:-linux-image-6.12.101+deb12-amd64}
KVER=${KPKG#linux-image-}
KROOT=$LAB/kernel-$KVER

die() { echo "lab: $*" >&2; exit 2; }

setup() {
    [ "$(id -u)" = 0 ] || die "setup needs root (apt-get)"
    local need=()
    command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
    [ -x /bin/busybox ] && /bin/busybox --list | grep -qx insmod || need+=(busybox-static)
    command -v depmod >/dev/null || need+=(kmod)
    if [ ${#need[@]} -gt 0 ]; then
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
    fi
    if [ ! -f "$KROOT/boot/vmlinuz-$KVER" ]; then
        mkdir -p "$LAB/dl"
        (cd "$LAB/dl" && apt-get download "$KPKG")
        rm -rf "$KROOT.tmp" && mkdir -p "$KROOT.tmp"
        dpkg-deb -x "$LAB"/dl/"${KPKG}"_*.deb "$KROOT.tmp"
        depmod -b "$KROOT.tmp" "$KVER"
        mv "$KROOT.tmp" "$KROOT"
    fi
    build_initramfs
    echo "lab: ready: kernel $KVER in $KROOT"
}

# A tiny initramfs: static busybox, the 9p modules (decompressed), and init that mounts the host's
# root over 9p and switches to bench/lab/guest-init.sh on it.
build_initramfs() {
    local ir=$LAB/initramfs-$KVER
    rm -rf "$ir" && mkdir -p "$ir"/{bin,mod,proc,sys,dev,newroot}
    cp /bin/busybox "$ir/bin/busybox"
    local m
    for m in kernel/fs/netfs/netfs kernel/net/9p/9pnet kernel/net/9p/9pnet_virtio kernel/fs/9p/9p \
        kernel/fs/overlayfs/overlay; do
        xz -dc "$KROOT/lib/modules/$KVER/$m.ko.xz" >"$ir/mod/$(basename "$m").ko"
    done
    cp "$HERE/initramfs-init" "$ir/init"
    chmod +x "$ir/init"
    (cd "$ir" && find . | busybox cpio -o -H newc 2>/dev/null) | gzip -1 >"$LAB/initramfs-$KVER.gz"
}

# Whether KVM can boot this kernel here: probed once (a short boot that must reach the guest's
# init), remembered in $LAB/accel-probe. A nested paravirtual KVM may exist and still hang a stock
# kernel, so /dev/kvm alone proves nothing.
probe_accel() {
    local f=$LAB/accel-probe-$KVER
    if [ -f "$f" ]; then cat "$f"; return; fi
    local a=tcg
    if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
        local d
        d=$(mktemp -d "$LAB/probe.XXXXXX")
        if LAB_PROBE=1 "$0" run --accel kvm --cpus 2 --nodes 1 --queues 1 --mem 512 --timeout 40 \
            --out "$d" -- true >"$d/probe.log" 2>&1; then
            a=kvm
        fi
        rm -rf "$d"
    fi
    echo "$a" >"$f"
    echo "$a"
}

run() {
    local cpus=16 nodes=2 queues=8 mem=2048 accel=auto timeout=900 agent="" out=""
    while [ $# -gt 0 ]; do
        case $1 in
        --cpus) cpus=$2; shift 2 ;;
        --nodes) nodes=$2; shift 2 ;;
        --queues) queues=$2; shift 2 ;;
        --mem) mem=$2; shift 2 ;;
        --accel) accel=$2; shift 2 ;;
        --timeout) timeout=$2; shift 2 ;;
        --host-agent) agent=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --) shift; break ;;
        *) die "unknown option $1 (see the head of $0)" ;;
        esac
    done
    [ $# -gt 0 ] || die "run needs a command after --"
    [ -f "$KROOT/boot/vmlinuz-$KVER" ] && [ -f "$LAB/initramfs-$KVER.gz" ] || die "run '$0 setup' first"
    [ "$cpus" -ge 1 ] && [ "$cpus" -le 255 ] || die "--cpus 1..255 (the i440fx machine's limit without an IOMMU)"
    [ "$nodes" -ge 1 ] && [ $((cpus % nodes)) = 0 ] || die "--nodes must divide --cpus"
    [ $((mem % nodes)) = 0 ] || die "--nodes must divide --mem"
    [ "$queues" -ge 1 ] && [ "$queues" -le 64 ] || die "--queues 1..64"
    if [ "$accel" = auto ]; then accel=$(probe_accel); fi
    out=${out:-$LAB/run-$(date -u +%Y%m%dT%H%M%S)-$$}
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    rm -f "$out"/{rc,output,up,guest-info}
    # The command, as the guest's init reads it: one argument per line, in a file, so no quoting
    # survives two shells.
    printf '%s\n' "$@" >"$out/cmd"
    printf '%s\n' "$REPO" >"$out/cwd"

    local per=$((cpus / nodes)) nmem=$((mem / nodes)) numa=() n
    for ((n = 0; n < nodes; n++)); do
        numa+=(-object "memory-backend-ram,id=m$n,size=${nmem}M"
            -numa "node,nodeid=$n,cpus=$((n * per))-$((n * per + per - 1)),memdev=m$n")
    done
    # The NIC sits behind an expander bridge on the last node, so its sysfs numa_node says so and
    # `tune` has a node to prefer.
    local nicbus=() last=$((nodes - 1))
    if [ "$nodes" -gt 1 ]; then
        nicbus=(-device "pxb,id=pxb1,bus_nr=64,numa_node=$last,bus=pci.0")
    fi
    local accel_args=(-accel tcg,thread=multi,tb-size=256)
    [ "$accel" = kvm ] && accel_args=(-accel kvm -cpu host)
    local qemu=(qemu-system-x86_64 -machine pc "${accel_args[@]}" -nographic -no-reboot
        -smp "$cpus,sockets=$nodes,cores=$per,threads=1" -m "$mem" "${numa[@]}"
        -kernel "$KROOT/boot/vmlinuz-$KVER" -initrd "$LAB/initramfs-$KVER.gz"
        -append "console=ttyS0 loglevel=5 panic=-1 rdinit=/init lab.init=$HERE/guest-init.sh lab.kver=$KVER lab.accel=$accel lab.nodes=$nodes"
        -fsdev "local,id=fsroot,path=/,security_model=none,readonly=on,multidevs=remap"
        -device "virtio-9p-pci,fsdev=fsroot,mount_tag=labroot"
        -fsdev "local,id=fsmod,path=$KROOT/lib/modules/$KVER,security_model=none,readonly=on"
        -device "virtio-9p-pci,fsdev=fsmod,mount_tag=labmod"
        -fsdev "local,id=fsout,path=$out,security_model=none"
        -device "virtio-9p-pci,fsdev=fsout,mount_tag=labout"
        "${nicbus[@]}"
        -netdev "tap,id=n0,ifname=labtap0,script=no,downscript=no,vhost=off,queues=$queues"
        -device "virtio-net-pci,netdev=n0,mq=on,vectors=$((2 * queues + 2)),mac=52:54:00:12:34:56${nicbus:+,bus=pxb1}"
        -serial "file:$out/console.log" -monitor none)

    echo "lab: accelerator $accel; ${cpus} vCPUs over $nodes NUMA node(s); ${queues}-queue virtio-net; ${mem} MiB; kernel $KVER; host load $(cut -d' ' -f1-3 /proc/loadavg)"
    local t0=$SECONDS rc=0
    # The namespace: a tap and a bridge (10.77.0.1/24, the guest is 10.77.0.2), QEMU, and the host
    # agent; all of it is gone when unshare's shell exits.
    LAB_OUT=$out LAB_AGENT=$agent LAB_TIMEOUT=$timeout unshare -n -- bash -c '
        set -e
        ip link set lo up
        ip tuntap add dev labtap0 mode tap multi_queue
        ip link add labbr0 type bridge
        ip link set labtap0 master labbr0
        ip addr add 10.77.0.1/24 dev labbr0
        ip link set labtap0 up
        ip link set labbr0 up
        agent_pid=
        if [ -n "$LAB_AGENT" ]; then "$LAB_AGENT" >"$LAB_OUT/agent.log" 2>&1 & agent_pid=$!; fi
        rc=0
        nice -n 10 timeout -k 5 "$LAB_TIMEOUT" "$@" || rc=$?
        if [ -n "$agent_pid" ]; then kill "$agent_pid" 2>/dev/null || true; wait "$agent_pid" 2>/dev/null || true; fi
        exit $rc
    ' lab "${qemu[@]}" || rc=$?
    local took=$((SECONDS - t0))
    [ -f "$out/guest-info" ] && sed 's/^/lab: guest: /' "$out/guest-info"
    [ -f "$out/output" ] && cat "$out/output"
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "lab: timed out after ${took}s (QEMU killed); console: $out/console.log" >&2
        exit 124
    fi
    if [ ! -f "$out/rc" ]; then
        echo "lab: the guest did not report an exit code (QEMU rc $rc, ${took}s); console: $out/console.log" >&2
        tail -n 20 "$out/console.log" >&2 || true
        exit 125
    fi
    local grc
    grc=$(cat "$out/rc")
    echo "lab: exit code $grc after ${took}s (boot included); files in $out"
    exit "$grc"
}

case ${1:-} in
setup) shift; setup "$@" ;;
run) shift; run "$@" ;;
*) die "usage: $0 setup | run [options] -- CMD ARGS" ;;
esac
