#!/usr/bin/env python3
"""Tallies `perf script -F pid,tid,comm,event,trace` output for bench/oneshot-events.sh.

usage: perf script ... | oneshot-events-tally.py SERVER_PID CLIENT_PID N LABEL BACKEND PROTO
Prints one JSON line: events per connection for the server process and the client, split into io-wq workers (`iou-wrk-*`) and the other threads.
"""
import json
import re
import sys
from collections import Counter

server_pid, client_pid, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
label, backend, proto = sys.argv[4:7]

names = {}
with open("/usr/include/x86_64-linux-gnu/asm/unistd_64.h") as f:
    for line in f:
        m = re.match(r"#define __NR_(\w+)\s+(\d+)", line)
        if m:
            names[int(m.group(2))] = m.group(1)

line_re = re.compile(r"^\s*(.*?)\s+(\d+)/(\d+)\s+([\w:]+):\s*(.*)$")
counts = {"server": Counter(), "client": Counter()}
for line in sys.stdin:
    m = line_re.match(line)
    if not m:
        continue
    comm, pid, _tid, event, trace = m.groups()
    pid = int(pid)
    if pid == server_pid:
        who = "server"
    elif pid == client_pid:
        who = "client"
    else:
        continue
    thread = "io-wq " if comm.startswith("iou-wrk") else ""
    if event == "raw_syscalls:sys_enter":
        nr = int(re.match(r"NR (\d+)", trace).group(1))
        key = f"{thread}syscall {names.get(nr, nr)}"
        if names.get(nr) == "io_uring_enter":
            # (fd, to_submit, min_complete, flags, ...): a wait asks for a completion.
            args = [int(a, 16) for a in re.search(r"\((.*)\)", trace).group(1).split(",")]
            counts[who][key + (" (wait)" if args[2] else " (submit)")] += 1
    elif event in ("io_uring:io_uring_submit_req", "io_uring:io_uring_queue_async_work",
                   "io_uring:io_uring_poll_arm"):
        op = re.search(r"opcode (\w+)", trace).group(1)
        kind = {"io_uring_submit_req": "uring submit", "io_uring_queue_async_work":
                "uring to io-wq", "io_uring_poll_arm": "uring poll armed"}[event.split(":")[1]]
        key = f"{thread}{kind} {op}"
    elif event == "irq:softirq_entry":
        key = f"{thread}softirq " + re.search(r"action=(\w+)", trace).group(1)
    elif event == "sched:sched_switch":
        # Counted for the thread switched out (prev): the times it slept or was preempted.
        key = f"{thread}context switch"
    else:
        key = f"{thread}{event.split(':')[1]}"
    counts[who][key] += 1

out = {"label": label, "backend": backend, "proto": proto, "n": n}
for who, c in counts.items():
    out[who] = {k: round(v / n, 4) for k, v in sorted(c.items())}
    out[who]["syscalls (all)"] = round(
        sum(v for k, v in c.items() if "syscall " in k and not k.endswith(")")) / n, 4)
print(json.dumps(out))
