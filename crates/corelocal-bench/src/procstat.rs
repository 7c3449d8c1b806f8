//! Server CPU cost from /proc: a process's utime+stime (exact totals, clock ticks), its
//! threads' schedstat run time (ns), and the per-CPU user/sys/softirq split of /proc/stat.
//! Parsers are pure; `snapshot` reads the files.

use serde::Serialize;
use std::path::Path;

/// utime+stime of /proc/PID/stat, in clock ticks.
pub fn parse_pid_stat(text: &str) -> Option<(u64, u64)> {
    // Field 2 (comm) may contain spaces and ')': fields resume after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime field 15.
    Some((f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?))
}

/// Run time (ns) from a /proc/.../schedstat line.
pub fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// One CPU's /proc/stat counters (USER_HZ ticks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CpuTimes {
    /// user + nice
    pub user: u64,
    /// system
    pub sys: u64,
    /// irq
    pub irq: u64,
    /// softirq
    pub softirq: u64,
    /// idle + iowait
    pub idle: u64,
    /// steal
    pub steal: u64,
}

impl CpuTimes {
    fn total(&self) -> u64 {
        self.user + self.sys + self.irq + self.softirq + self.idle + self.steal
    }
}

/// Per-CPU lines of /proc/stat, indexed by CPU number.
pub fn parse_proc_stat(text: &str) -> Vec<(usize, CpuTimes)> {
    let mut v = Vec::new();
    for line in text.lines() {
        let Some(rest) = line
            .strip_prefix("cpu")
            .filter(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let Some(Ok(cpu)) = f.next().map(|c| c.parse::<usize>()) else {
            continue;
        };
        let n: Vec<u64> = f.map(|x| x.parse().unwrap_or(0)).collect();
        let g = |i: usize| n.get(i).copied().unwrap_or(0);
        v.push((
            cpu,
            CpuTimes {
                user: g(0) + g(1),
                sys: g(2),
                idle: g(3) + g(4),
                irq: g(5),
                softirq: g(6),
                steal: g(7),
            },
        ));
    }
    v
}

/// A point-in-time reading.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// utime+stime ticks of the process (None: not readable).
    pub ticks: Option<u64>,
    /// Sum of the threads' schedstat run ns.
    pub sched_ns: Option<u64>,
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
            .map(|t| parse_proc_stat(&t))
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
            let mut sum = 0;
            for e in rd.flatten() {
                if let Some(ns) = std::fs::read_to_string(e.path().join("schedstat"))
                    .ok()
                    .and_then(|t| parse_schedstat(&t))
                {
                    sum += ns;
                    s.threads += 1;
                }
            }
            if s.threads > 0 {
                s.sched_ns = Some(sum);
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
    let busy = ss
        .or(ut)
        .filter(|_| window_s > 0.0)
        .map(|us| us / 1e6 / window_s);
    let mut per_cpu = Vec::new();
    for (cpu, t1) in &b.cpus {
        if let Some((_, t0)) = a.cpus.iter().find(|(c, _)| c == cpu) {
            let d = CpuTimes {
                user: t1.user.saturating_sub(t0.user),
                sys: t1.sys.saturating_sub(t0.sys),
                irq: t1.irq.saturating_sub(t0.irq),
                softirq: t1.softirq.saturating_sub(t0.softirq),
                idle: t1.idle.saturating_sub(t0.idle),
                steal: t1.steal.saturating_sub(t0.steal),
            };
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
        cores_busy: busy,
        ops,
        per_cpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_stat_with_odd_comm() {
        let t = "1234 (a b) c)) S 1 2 3 4 5 6 7 8 9 10 250 37 0 0 20 0 1 0 5 6 7";
        assert_eq!(parse_pid_stat(t), Some((250, 37)));
        assert_eq!(parse_pid_stat("garbage"), None);
        assert_eq!(parse_schedstat("123456 789 10\n"), Some(123456));
    }

    #[test]
    fn proc_stat_lines() {
        let t = "cpu  10 0 10 100 0 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\ncpu1 10 0 20 70 0 0 0 0 0 0\nintr 5\n";
        let v = parse_proc_stat(t);
        assert_eq!(v.len(), 2);
        assert_eq!(
            v[0],
            (
                0,
                CpuTimes {
                    user: 3,
                    sys: 3,
                    idle: 9,
                    irq: 6,
                    softirq: 7,
                    steal: 8
                }
            )
        );
    }

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
        w("42/task/42/schedstat", "1000000000 0 0\n");
        w("42/task/43/schedstat", "500000000 0 0\n");
        let a = snapshot_at(&dir, Some(42));
        assert_eq!(
            (a.ticks, a.sched_ns, a.threads),
            (Some(150), Some(1_500_000_000), 2)
        );
        w("stat", "cpu1 50 0 25 0 0 0 25 0\n");
        w("42/stat", "42 (srv) S 1 1 1 0 0 0 0 0 0 0 200 100 0 0\n");
        w("42/task/42/schedstat", "2000000000 0 0\n");
        w("42/task/43/schedstat", "1000000000 0 0\n");
        let b = snapshot_at(&dir, Some(42));
        let c = cost(Some(42), &a, &b, 100_000, 2.0, 100);
        assert_eq!(c.utime_stime_us, Some(1_500_000.0));
        assert_eq!(c.utime_stime_us_per_op, Some(15.0));
        assert_eq!(c.schedstat_us_per_op, Some(15.0));
        assert_eq!(c.cores_busy, Some(0.75));
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
