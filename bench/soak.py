#!/usr/bin/env python3
"""Soak: mixed load against corelocal's rpc, http and kv servers with periodic graceful
restarts (binary-upgrade takeovers), recording client errors, resets and each server's RSS.

Runs itself inside a private network namespace (root: `unshare -n`). Three servers on
loopback, each on CPUs 0-1 (`--mode local`, eBPF steering):
  rpc  127.0.0.1:7500  `serve rpc`  <- `bench rpc -c 8` (keep-alive 64 B transactions)
  http 127.0.0.1:7501  `serve http` <- `bench crr --proto http` (one GET per connection)
                                    <- `bench http --urls paper` (sessions of 6 files, think time)
  kv   127.0.0.1:7502  `serve kv`   <- `bench kv -c 8` (90% get / 10% set)
plus a misbehaving client per server alternating garbage (80 KiB of random bytes) and slow
(1 byte / 50 ms) connections. Every PERIOD seconds the next server (round robin) is replaced by
a new process, alternating the two binary-upgrade forms: `--takeover PID` (the new process joins
the old reuseport group, the old one drains and exits) and `--takeover SOCKET` (the old process
passes its listening sockets over its `--upgrade-socket`, stops accepting and exits).

Pass criteria (exit status 1 when broken): every leg completed work; no leg sees an error at
all, takeovers included: at each takeover the old server moves every established connection
(between two requests, with the bytes it read and not yet handled) and kv's cache to the new
one; every old server exits 0 reporting "lost at close 0". Also recorded: kv's hit ratio (from
its `stats`, every second) in the last second before and the first second after each of its
takeovers: a cache that moved keeps it.

usage: bench/soak.py [--duration S] [--period S] [--out DIR] [--name NAME] [--bin PATH]
Writes OUT/NAME.json, OUT/NAME.md and OUT/NAME-rss.csv.
"""

import argparse
import csv
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

SERVERS = {  # name -> (port, serve arguments)
    "rpc": (7500, ["serve", "rpc"]),
    "http": (7501, ["serve", "http"]),
    "kv": (7502, ["serve", "kv"]),
}
SAMPLE_S = 1.0
LEG_CONNS = 8  # connections of the rpc, crr and kv legs
TAKEOVER_WINDOW_S = (-2.0, 8.0)  # errors this near a takeover are charged to it (drain 5 s;
# the bench timeline counts whole seconds from a truncated start time)
STARTUP_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 30.0
TAKEOVER_SETTLE_S = 10.0  # a takeover not over by then: the new process's threads are noted
TAKEOVER_DONE_S = 60.0  # a takeover not over by then is stuck (the old process is then reaped)


def describe(pid):
    """What a process looks like (for a failed takeover): its threads' states and wait
    channels, and its descriptors."""
    out = {}
    try:
        for tid in sorted(os.listdir(f"/proc/{pid}/task")):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                wchan = f.read()
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            out.setdefault("threads", []).append(f"{tid} {comm} {stat[stat.rindex(')') + 2]} {wchan}")
            try:
                with open(f"/proc/{pid}/task/{tid}/stack") as f:
                    out.setdefault("stacks", {})[tid] = f.read().split("\n")[:12]
            except OSError:
                pass
        out["fds"] = {fd: os.readlink(f"/proc/{pid}/fd/{fd}")
                      for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int)}
    except OSError as e:
        out["error"] = str(e)
    return out


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=int, default=600, help="seconds of load (default 600)")
    p.add_argument("--period", type=int, default=20, help="seconds between takeovers")
    p.add_argument("--out", default="results/soak", help="directory for the result files")
    p.add_argument("--name", default="soak", help="result file stem")
    p.add_argument("--bin", default=None, help="corelocal binary (default: target/release)")
    a = p.parse_args()
    if a.duration < 5 or a.period < 2:
        p.error("--duration must be >= 5 and --period >= 2")
    return a


def find_bin(given):
    for cand in [given, os.environ.get("CORELOCAL_BIN"), "target/release/corelocal",
                 "target/debug/corelocal"]:
        if cand and os.access(cand, os.X_OK):
            return os.path.abspath(cand)
    sys.exit("soak: no corelocal binary (build it: cargo build --release -p corelocal-cli)")


def reexec_in_netns():
    if os.environ.get("SOAK_INNER"):
        return
    if os.geteuid() != 0:
        sys.exit("soak: needs root (it runs in its own network namespace)")
    env = dict(os.environ, SOAK_INNER="1")
    os.execvpe("unshare", ["unshare", "-n", "--", sys.executable] + sys.argv, env)


def wait_listening(port, deadline):
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


class Server:
    """One served port: the current process and the log of every process it had."""

    def __init__(self, name, binary, tmp):
        self.name, self.binary = name, binary
        self.port, self.args = SERVERS[name]
        self.log = open(os.path.join(tmp, f"server-{name}.log"), "w+")
        self.tmp = tmp
        self.proc = None
        self.generation = 0
        self.sock = None  # the current process's upgrade socket
        self.stopped = []  # (pid, exit code)
        self.takeovers = {"pid": 0, "socket": 0}
        self.failed_takeovers = []
        self.stuck_takeovers = []
        self.settlers = []  # one thread per takeover: the new process's first seconds

    def spawn(self, takeover=None):
        self.generation += 1
        sock = os.path.join(self.tmp, f"{self.name}-{self.generation}.sock")
        # Per-worker counters every second, kept with the raw files of a failed run.
        stats = os.path.join(self.tmp, f"{self.name}-{self.generation}-stats.jsonl")
        cmd = [self.binary] + self.args + ["--listen", f"127.0.0.1:{self.port}", "--cpus", "0-1",
                                           "--stats-interval", "1s", "--stats-file", stats,
                                           "--upgrade-socket", sock]
        if takeover:
            cmd += ["--takeover", str(takeover)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        self.sock = sock
        return proc

    def start(self):
        self.proc = self.spawn()
        if not wait_listening(self.port, time.time() + STARTUP_TIMEOUT_S):
            sys.exit(f"soak: {self.name} server did not start (see its log)")

    def take_over(self):
        """Replaces the process, alternating `--takeover PID` and `--takeover SOCKET`."""
        old, old_sock = self.proc, self.sock
        form = "pid" if self.generation % 2 else "socket"
        new = self.spawn(takeover=old.pid if form == "pid" else self.sock)
        self.proc = new
        self.takeovers[form] += 1
        settler = threading.Thread(target=self.settle, args=(old, old_sock, new, form),
                                   daemon=True)
        settler.start()
        self.settlers.append(settler)

    def settle(self, old, old_sock, new, form):
        """Waits until the takeover is over: the old process exits (the new one told it to),
        or the new one exits, which is a failed takeover: the old one still serves, so it stays
        the current process (killing it would leave the port unserved, which is not what a
        failed upgrade does) and the failure is recorded with what the old process looked like.
        Neither within TAKEOVER_DONE_S is a stuck takeover, recorded with both processes'
        threads (the new one's at TAKEOVER_SETTLE_S too, when it is still running then);
        the old process is reaped as at a stop."""
        started = time.time()
        early_look = None
        while time.time() - started < TAKEOVER_DONE_S:
            code = new.poll()
            if code is not None:
                self.failed_takeovers.append({"form": form, "new_pid": new.pid, "exit": code,
                                              "old_pid": old.pid, "old_state": describe(old.pid),
                                              "new_state_early": early_look})
                self.stopped.append((new.pid, code))
                if self.proc is new:
                    self.proc, self.sock = old, old_sock
                return
            if old.poll() is not None:
                self.stopped.append((old.pid, old.returncode))
                return
            if early_look is None and time.time() - started > TAKEOVER_SETTLE_S:
                early_look = describe(new.pid)
            time.sleep(0.05)
        self.stuck_takeovers.append({"form": form, "new_pid": new.pid, "old_pid": old.pid,
                                     "new_state_early": early_look,
                                     "new_state": describe(new.pid),
                                     "old_state": describe(old.pid)})
        self.reap(old)

    def reap(self, proc):
        try:
            code = proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "killed: did not stop in time"
        self.stopped.append((proc.pid, code))

    def stop(self):
        # A takeover still settling finishes first: a SIGTERM to a process still starting
        # would read as a failed takeover.
        for t in self.settlers:
            t.join(timeout=TAKEOVER_DONE_S + STOP_TIMEOUT_S)
        self.proc.terminate()
        self.reap(self.proc)

    def rss_kib(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def stop_reports(self):
        # Across lines: the old process's stop line and the new one's first lines go to the
        # same file at the same moment, and a line written in pieces can be cut by another.
        self.log.seek(0)
        text = self.log.read()
        pattern = r"stopped \|[^\n]*?accepted while draining (\d+) \|.*?lost at close (\d+)"
        return [{"drain_accepted": int(m[1]), "lost_at_close": int(m[2])}
                for m in re.finditer(pattern, text, re.S)]


def bench_legs(binary, duration, tmp):
    """The well-behaved load: (name, command) pairs, each writing tmp/NAME.json."""
    common = ["-d", f"{duration}s", "--progress", "never", "--timeout", "10s"]
    legs = {
        "rpc-keepalive": ["bench", "rpc", "-t", "127.0.0.1:7500", "-c", str(LEG_CONNS),
                          "--txns-per-conn", "0", "--cpus", "0"],
        "http-crr": ["bench", "crr", "--proto", "http", "--path", "/64.txt",
                     "-t", "127.0.0.1:7501", "-c", str(LEG_CONNS), "--cpus", "1"],
        "http-sessions": ["bench", "http", "-t", "http://127.0.0.1:7501/", "--urls", "paper",
                          "-c", "16", "--cpus", "0"],
        "kv": ["bench", "kv", "-t", "127.0.0.1:7502", "-c", str(LEG_CONNS), "--cpus", "1"],
    }
    return {name: [binary] + cmd + common + ["--json", os.path.join(tmp, name + ".json")]
            for name, cmd in legs.items()}


def misbehave(port, end, tally):
    """Alternates a garbage connection and a slow one until `end`; counts what happened."""
    rng = random.Random(port)
    while time.time() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(rng.randbytes(4096) * 20)
                s.recv(100)
            tally["garbage"] += 1
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                for _ in range(10):
                    s.sendall(b"x")
                    time.sleep(0.05)
            tally["slow"] += 1
        except OSError as e:
            tally["errors"][type(e).__name__ + ":" + str(e.errno)] = \
                tally["errors"].get(type(e).__name__ + ":" + str(e.errno), 0) + 1


def kv_stats(port):
    """(pid, get_hits, get_misses) from kv's `stats`, or None."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"stats\r\n")
            data = b""
            while not data.endswith(b"END\r\n"):
                chunk = s.recv(65536)
                if not chunk:
                    return None
                data += chunk
    except OSError:
        return None
    stats = dict(line.split(" ", 2)[1:] for line in data.decode().split("\r\n")
                 if line.startswith("STAT ") and line.count(" ") >= 2)
    try:
        return int(stats["pid"]), int(stats["get_hits"]), int(stats["get_misses"])
    except (KeyError, ValueError):
        return None


def probe_kv(port, end, samples):
    """Samples kv's counters every second until `end`: (unix time, pid, hits, misses)."""
    while time.time() < end:
        got = kv_stats(port)
        if got:
            samples.append((time.time(),) + got)
        time.sleep(SAMPLE_S)


def hit_ratios(samples, takeovers):
    """kv's hit ratio over the last interval before each kv takeover and the first interval
    after the new process answered `stats` (counters restart with each process)."""
    out = []
    for t in (t for t in takeovers if t["server"] == "kv"):
        before = [s for s in samples if s[0] <= t["unix"]][-2:]
        after = [s for s in samples if s[0] > t["unix"]]
        pid_before = before[-1][1] if before else None
        new = [s for s in after if s[1] != pid_before][:2]
        out.append({"t_s": t["t_s"], "before": interval_ratio(before),
                    "after": interval_ratio(new) if len(new) == 2 else None})
    return out


def interval_ratio(pair):
    if len(pair) != 2 or pair[0][1] != pair[1][1]:
        return None
    hits, misses = pair[1][2] - pair[0][2], pair[1][3] - pair[0][3]
    return round(hits / (hits + misses), 4) if hits + misses else None


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"{path}: {e}"}


LEG_SERVER = {"rpc-keepalive": "rpc", "http-crr": "http", "http-sessions": "http", "kv": "kv"}


def leg_summary(name, report, takeovers):
    """Errors of one leg, split into those near a takeover of its server and the rest."""
    if "error" in report:
        return {"ok": False, "error": report["error"]}
    errors = report.get("errors") or {}
    units = (report.get("throughput") or {}).get("units", 0)
    server = LEG_SERVER[name]
    times = [t["unix"] for t in takeovers if t["server"] == server]
    lo, hi = TAKEOVER_WINDOW_S
    at_takeover = other = 0
    for sec in report.get("timeline") or []:
        t = report.get("started_unix", 0) + sec["t_s"]
        if any(lo <= t - tt <= hi for tt in times):
            at_takeover += sec["errors"]
        else:
            other += sec["errors"]
    allowed = 0  # connections move to the new server: nothing is closed under a client
    return {"units": units, "unit": (report.get("throughput") or {}).get("unit"),
            "errors": errors.get("total", 0), "errors_by_kind": errors.get("by_kind", []),
            "errors_at_takeovers": at_takeover, "errors_elsewhere": other,
            "errors_at_takeovers_allowed": allowed,
            "ok": units > 0 and other == 0 and at_takeover <= allowed}


def run(a):
    binary = find_bin(a.bin)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    tmp = tempfile.mkdtemp(prefix="soak-")
    servers = {name: Server(name, binary, tmp) for name in SERVERS}
    for s in servers.values():
        s.start()
    legs = {name: subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                   stderr=open(os.path.join(tmp, name + ".err"), "w"))
            for name, cmd in bench_legs(binary, a.duration, tmp).items()}
    end = time.time() + a.duration + 1  # the bench warm-up is 1 s
    bad = {name: {"garbage": 0, "slow": 0, "errors": {}} for name in servers}
    threads = [threading.Thread(target=misbehave, args=(servers[n].port, end, bad[n]), daemon=True)
               for n in servers]
    kv_samples = []
    threads.append(threading.Thread(target=probe_kv, args=(servers["kv"].port, end, kv_samples),
                                    daemon=True))
    for t in threads:
        t.start()
    rss_rows, takeovers, start = [], [], time.time()
    order, next_restart = list(servers), start + a.period
    while any(p.poll() is None for p in legs.values()):
        now = time.time()
        rss_rows.append([round(now - start, 1)] + [servers[n].rss_kib() for n in order])
        if now >= next_restart and now < end:
            name = order[len(takeovers) % len(order)]
            servers[name].take_over()
            takeovers.append({"t_s": round(now - start, 1), "unix": now, "server": name})
            next_restart += a.period
        time.sleep(SAMPLE_S)
    for t in threads:
        t.join(timeout=STOP_TIMEOUT_S)
    for s in servers.values():
        s.stop()
    code = write_results(a, tmp, servers, legs, bad, rss_rows, takeovers, order,
                         hit_ratios(kv_samples, takeovers))
    if code == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # the results are in --out
    else:
        print(f"soak: the servers' and legs' raw files are kept in {tmp}", file=sys.stderr)
    return code


def write_results(a, tmp, servers, legs, bad, rss_rows, takeovers, order, kv_hits):
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.name + "-rss.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s"] + [f"{n}_rss_kib" for n in order])
        w.writerows(rss_rows)
    per_server = {}
    for n, s in servers.items():
        rss = [row[1 + order.index(n)] for row in rss_rows if row[1 + order.index(n)] > 0]
        stops = s.stop_reports()
        per_server[n] = {
            "processes": len(s.stopped), "exit_codes": [c for _, c in s.stopped],
            "exit_pids": list(s.stopped),
            "takeovers_by_form": s.takeovers, "failed_takeovers": s.failed_takeovers,
            "stuck_takeovers": s.stuck_takeovers,
            "stop_reports": stops, "lost_at_close": sum(r["lost_at_close"] for r in stops),
            "rss_kib": {"min": min(rss, default=0), "max": max(rss, default=0)},
            "misbehaving": bad[n]}
    res = {"duration_s": a.duration, "period_s": a.period, "takeovers": takeovers,
           "legs": {n: leg_summary(n, load(os.path.join(tmp, n + ".json")), takeovers)
                    for n in legs},
           "servers": per_server, "kv_hit_ratio_at_takeovers": kv_hits}
    res["failures"] = failures(res["legs"], per_server)
    res["pass"] = not res["failures"]
    if res["failures"]:
        res["server_log_tails"] = {n: log_tail(s.log) for n, s in servers.items()}
    with open(os.path.join(a.out, a.name + ".json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(a.out, a.name + ".md"), "w") as f:
        f.write(markdown(a, res))
    print(json.dumps({"pass": res["pass"], "takeovers": len(takeovers),
                      "legs": {n: (l.get("units"), l.get("errors")) for n, l in res["legs"].items()},
                      "lost_at_close": {n: s["lost_at_close"] for n, s in per_server.items()}}))
    return 0 if res["pass"] else 1


def failures(legs, per_server):
    """Each broken pass criterion, in words: what a failed run prints first."""
    out = [f"leg {n}: {l.get('error') or 'errors away from takeovers or none allowed there'}"
           for n, l in legs.items() if not l["ok"]]
    for n, s in per_server.items():
        out += [f"{n}: pid {pid} exited {code}" for pid, code in s["exit_pids"] if code != 0]
        out += [f"{n}: failed takeover ({f['form']}), new pid {f['new_pid']} exited {f['exit']}"
                for f in s["failed_takeovers"]]
        out += [f"{n}: stuck takeover ({f['form']}), new pid {f['new_pid']}, old pid "
                f"{f['old_pid']}: threads in the JSON" for f in s["stuck_takeovers"]]
        if s["lost_at_close"]:
            out.append(f"{n}: lost at close {s['lost_at_close']}")
        if len(s["stop_reports"]) != s["processes"]:
            out.append(f"{n}: {len(s['stop_reports'])} stop lines for {s['processes']} processes")
    return out


def log_tail(log, lines=40):
    log.seek(0)
    return log.read().splitlines()[-lines:]


def markdown(a, res):
    lines = [f"# Soak: {a.duration} s, a takeover every {a.period} s", "",
             f"    bench/soak.py --duration {a.duration} --period {a.period} --name {a.name}", "",
             f"Takeovers: {len(res['takeovers'])} "
             f"({', '.join(sorted(set(t['server'] for t in res['takeovers'])))}). "
             f"Pass: **{res['pass']}**.", "",
             "| leg | units | errors | at takeovers (allowed) | elsewhere | errors by kind |",
             "|---|---|---|---|---|---|"]
    for n, l in res["legs"].items():
        kinds = ", ".join(f"{k['name']} {k['count']}" for k in l.get("errors_by_kind") or [])
        lines.append(f"| {n} | {l.get('units', '-')} {l.get('unit') or ''} | {l.get('errors', '-')} "
                     f"| {l.get('errors_at_takeovers', '-')} ({l.get('errors_at_takeovers_allowed', '-')}) "
                     f"| {l.get('errors_elsewhere', '-')} | {kinds or l.get('error') or ''} |")
    lines += ["", "| server | processes | takeovers PID / socket | lost at close | accepted while draining | RSS KiB min–max "
              "| garbage / slow conns | misbehaving-client errors |", "|---|---|---|---|---|---|---|---|"]
    for n, s in res["servers"].items():
        drained = sum(r["drain_accepted"] for r in s["stop_reports"])
        m = s["misbehaving"]
        t = s["takeovers_by_form"]
        lines.append(f"| {n} | {s['processes']} | {t['pid']} / {t['socket']} | {s['lost_at_close']} | {drained} | "
                     f"{s['rss_kib']['min']}–{s['rss_kib']['max']} | {m['garbage']} / {m['slow']} "
                     f"| {m['errors'] or 0} |")
    for n, s in res["servers"].items():
        for f in s["failed_takeovers"]:
            lines.append(f"- **{n}: failed takeover** ({f['form']}): new pid {f['new_pid']} exited "
                         f"{f['exit']}; old pid {f['old_pid']} kept serving (its state: "
                         f"{a.name}.json)")
    if res["failures"]:
        lines += ["", "Failed: " + "; ".join(res["failures"]) + "."]
        for n, tail in res.get("server_log_tails", {}).items():
            lines += ["", f"Last lines of the {n} servers' log:", ""] + ["    " + l for l in tail]
    hits = res.get("kv_hit_ratio_at_takeovers") or []
    if hits:
        fmt = lambda r: "-" if r is None else f"{r:.3f}"
        lines += ["", "kv hit ratio in the second before / after each kv takeover: "
                  + ", ".join(f"{h['t_s']:.0f} s: {fmt(h['before'])} / {fmt(h['after'])}"
                              for h in hits) + "."]
    lines += ["", f"RSS per second: {a.name}-rss.csv.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    args = parse_args()
    reexec_in_netns()
    sys.exit(run(args))
