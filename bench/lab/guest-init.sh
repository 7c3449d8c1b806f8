#!/bin/bash
# PID 1 of the lab guest (started by bench/lab/initramfs-init on the host's root, overlaid): mount
# what a system needs, load the NIC, bring up eth0 as 10.77.0.2/24, run the command the host wrote
# to /lab-out/cmd, leave its output and exit code in /lab-out, power off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TERM=dumb LAB_GUEST=1
kv=$(sed -n 's/.*lab\.kver=\([^ ]*\).*/\1/p' /proc/cmdline)
accel=$(sed -n 's/.*lab\.accel=\([^ ]*\).*/\1/p' /proc/cmdline)
# proc, sys, dev, tmpfs, /lab-out and the modules are mounted by the initramfs.
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
ulimit -n 20000
hostname lab
modprobe virtio_net
ip link set lo up
for i in $(seq 50); do [ -e /sys/class/net/eth0 ] && break; sleep 0.1; done
ip addr add 10.77.0.2/24 dev eth0
ip link set eth0 up
touch /lab-out/up
nic_q=$(ls -d /sys/class/net/eth0/queues/rx-* 2>/dev/null | wc -l)
# virtio keeps numa_node on the PCI function above the virtio device.
nic_node=$(cat /sys/class/net/eth0/device/numa_node /sys/class/net/eth0/device/../numa_node 2>/dev/null | head -1)
{
    echo "kernel $(uname -r); accelerator $accel; vCPUs $(nproc) (online $(cat /sys/devices/system/cpu/online))"
    for n in /sys/devices/system/node/node[0-9]*; do echo "NUMA $(basename "$n"): CPUs $(cat "$n/cpulist")"; done
    echo "NIC eth0: $nic_q rx queues, NUMA node $nic_node, IRQs $(grep -c virtio.*input /proc/interrupts) input"
} >/lab-out/guest-info
mapfile -t cmd </lab-out/cmd
cd "$(cat /lab-out/cwd)" || cd /
rc=0
"${cmd[@]}" >/lab-out/output 2>&1 </dev/null || rc=$?
sync
echo "$rc" >/lab-out/rc.tmp && mv /lab-out/rc.tmp /lab-out/rc
sync
echo o >/proc/sysrq-trigger
sleep 10
