//! Server CPU cost from /proc: a process's utime+stime (exact totals, clock ticks), its
//! threads' schedstat run time (ns), and the per-CPU user/sys/softirq split of /proc/stat.
//! The parsers are [`corelocal::procfs`]'s; `snapshot` reads the files.

use corelocal::procfs::{
    parse_pid_stat, parse_schedstat, parse_schedstat_runs, parse_stat, CpuTimes,
};
use serde::Serialize;
use std::path::Path;

/// A point-in-time reading.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// utime+stime ticks of the process (None: not readable).
    pub ticks: Option<u64>,
    /// Sum of the threads' schedstat run ns.
    pub sched_ns: Option<u64>,
    /// Sum of the threads' schedstat timeslices (times scheduled in).
    pub sched_runs: Option<u64>,
    /// Threads seen.
    pub threads: usize,
    /// Per-CPU counters.
    pub cpus: Vec<(usize, CpuTimes)>,
}

/// Reads the process `pid` (if any) and /proc/stat.
pub fn snapshot(pid: Option<u32>) -> Snapshot {
    snapshot_at(Path::new("/proc"), pid)
}

/// As [`snapshot`], with /proc at `root` (tests use a fake tree).
pub fn snapshot_at(root: &Path, pid: Option<u32>) -> Snapshot {
    let mut s = Snapshot {
        cpus: std::fs::read_to_string(root.join("stat"))
            .map(|t| parse_stat(&t))
            .unwrap_or_default(),
        ..Default::default()
    };
    if let Some(pid) = pid {
        let dir = root.join(pid.to_string());
        s.ticks = std::fs::read_to_string(dir.join("stat"))
            .ok()
            .and_then(|t| parse_pid_stat(&t))
            .map(|(u, k)| u + k);
        if let Ok(rd) = std::fs::read_dir(dir.join("task")) {
            let (mut sum, mut runs) = (0, 0);
            for e in rd.flatten() {
                let Ok(text) = std::fs::read_to_string(e.path().join("schedstat")) else {
                    continue;
                };
                if let Some(ns) = parse_schedstat(&text) {
                    sum += ns;
                    runs += parse_schedstat_runs(&text).unwrap_or(0);
                    s.threads += 1;
                }
            }
            if s.threads > 0 {
                s.sched_ns = Some(sum);
                s.sched_runs = Some(runs);
            }
        }
    }
    s
}

/// Per-CPU busy split over a window (percent of that CPU's time).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CpuSplit {
    /// CPU number.
    pub cpu: usize,
    /// user+nice %.
    pub user_pct: f64,
    /// system %.
    pub sys_pct: f64,
    /// softirq %.
    pub softirq_pct: f64,
    /// irq %.
    pub irq_pct: f64,
    /// idle+iowait %.
    pub idle_pct: f64,
}

/// Server CPU per operation over a window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CpuCost {
    /// Process id measured.
    pub pid: Option<u32>,
    /// utime+stime over the window, µs (10 ms resolution at HZ 100 ticks).
    pub utime_stime_us: Option<f64>,
    /// … per operation.
    pub utime_stime_us_per_op: Option<f64>,
    /// Threads' schedstat run time over the window, µs (ns precision).
    pub schedstat_us: Option<f64>,
    /// … per operation. Threads that exited during the window are not counted.
    pub schedstat_us_per_op: Option<f64>,
    /// Times the server's threads were scheduled in over the window (schedstat timeslices):
    /// for a server that sleeps between events, its wake-ups.
    pub runs: Option<u64>,
    /// … per operation.
    pub runs_per_op: Option<f64>,
    /// Server CPU utilisation (schedstat, else utime+stime) over the window, in cores.
    pub cores_busy: Option<f64>,
    /// Operations the figures are divided by.
    pub ops: u64,
    /// Per-CPU split from /proc/stat (tick-sampled: biased at low load).
    pub per_cpu: Vec<CpuSplit>,
}

/// Computes the cost between two snapshots for `ops` operations over `window_s` seconds.
pub fn cost(
    pid: Option<u32>,
    a: &Snapshot,
    b: &Snapshot,
    ops: u64,
    window_s: f64,
    clk_tck: u64,
) -> CpuCost {
    let per = |us: f64| if ops > 0 { Some(us / ops as f64) } else { None };
    let ut = match (a.ticks, b.ticks) {
        (Some(x), Some(y)) => Some(y.saturating_sub(x) as f64 * 1e6 / clk_tck as f64),
        _ => None,
    };
    let ss = match (a.sched_ns, b.sched_ns) {
        (Some(x), Some(y)) => Some(y.saturating_sub(x) as f64 / 1000.0),
        _ => None,
    };
    let runs = match (a.sched_runs, b.sched_runs) {
        (Some(x), Some(y)) => Some(y.saturating_sub(x)),
        _ => None,
    };
    let busy = ss
        .or(ut)
        .filter(|_| window_s > 0.0)
        .map(|us| us / 1e6 / window_s);
    let mut per_cpu = Vec::new();
    for (cpu, t1) in &b.cpus {
        if let Some((_, t0)) = a.cpus.iter().find(|(c, _)| c == cpu) {
            let d = t1.since(t0);
            let tot = d.total().max(1) as f64 / 100.0;
            per_cpu.push(CpuSplit {
                cpu: *cpu,
                user_pct: d.user as f64 / tot,
                sys_pct: d.sys as f64 / tot,
                softirq_pct: d.softirq as f64 / tot,
                irq_pct: d.irq as f64 / tot,
                idle_pct: d.idle as f64 / tot,
            });
        }
    }
    CpuCost {
        pid,
        utime_stime_us: ut,
        utime_stime_us_per_op: ut.and_then(per),
        schedstat_us: ss,
        schedstat_us_per_op: ss.and_then(per),
        runs,
        runs_per_op: runs.and_then(|r| per(r as f64)),
        cores_busy: busy,
        ops,
        per_cpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_math_from_a_fake_proc_tree() {
        let dir = std::env::temp_dir().join(format!("clb-proc-{}", std::process::id()));
        let w = |p: &str, s: &str| {
            let p = dir.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, s).unwrap();
        };
        w("stat", "cpu1 0 0 0 0 0 0 0 0\n");
        w("42/stat", "42 (srv) S 1 1 1 0 0 0 0 0 0 0 100 50 0 0\n");
        w("42/task/42/schedstat", "1000000000 0 10\n");
        w("42/task/43/schedstat", "500000000 0 5\n");
        let a = snapshot_at(&dir, Some(42));
        assert_eq!(
            (a.ticks, a.sched_ns, a.threads),
            (Some(150), Some(1_500_000_000), 2)
        );
        w("stat", "cpu1 50 0 25 0 0 0 25 0\n");
        w("42/stat", "42 (srv) S 1 1 1 0 0 0 0 0 0 0 200 100 0 0\n");
        w("42/task/42/schedstat", "2000000000 0 50015\n");
        w("42/task/43/schedstat", "1000000000 0 5\n");
        let b = snapshot_at(&dir, Some(42));
        let c = cost(Some(42), &a, &b, 100_000, 2.0, 100);
        assert_eq!(c.utime_stime_us, Some(1_500_000.0));
        assert_eq!(c.utime_stime_us_per_op, Some(15.0));
        assert_eq!(c.schedstat_us_per_op, Some(15.0));
        assert_eq!(c.cores_busy, Some(0.75));
        assert_eq!((c.runs, c.runs_per_op), (Some(50_005), Some(0.50005)));
        assert_eq!(c.per_cpu[0].user_pct, 50.0);
        assert_eq!(c.per_cpu[0].softirq_pct, 25.0);
        let _ = std::fs::remove_dir_all(&dir);
        let none = cost(
            None,
            &Snapshot::default(),
            &Snapshot::default(),
            0,
            1.0,
            100,
        );
        assert_eq!(none.utime_stime_us_per_op, None);
    }
}
