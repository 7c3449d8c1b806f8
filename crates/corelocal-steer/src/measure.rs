//! `steer measure`: what steering saves on the live server, from the traffic it already has
//! (it never generates any). Windows alternate steering on and off in ABBA order (on, off,
//! off, on, …, so a drift in load cancels out within each pair); each window reads:
//! - the server's CPU time: the sum over its processes' threads of
//!   `/proc/PID/task/TID/schedstat` (ns on CPU, exact — unlike tick-sampled utime);
//! - connections accepted: `PassiveOpens` from `/proc/PID/net/snmp` (the server's network
//!   namespace: every listener in it counts, so on a shared host other servers' connections
//!   count too — the report says so);
//! - host IPIs: the `RES` (rescheduling) and `CAL` (function call) rows of
//!   `/proc/interrupts`, all CPUs;
//! - the steered share, from the program's counters (eBPF).
//!
//! It reports CPU per connection and IPIs per connection for each window, their medians on
//! and off, and the on ÷ off ratio with its spread over the pairs; then it restores what it
//! found (attached with the same method, or not attached). A `steer watch` running on the
//! same server would re-attach during off windows: that is detected and stops the run.

use crate::apply::{self, Method, SteerError};
use crate::discover;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Fewer accepted connections than this in a window make its figure unreliable (said).
pub const CONNS_MIN: u64 = 100;

/// What `measure` does.
#[derive(Debug, Clone)]
pub struct MeasureConfig {
    /// Length of each window.
    pub window: Duration,
    /// Number of windows (rounded up to even: each pair holds one on, one off).
    pub windows: usize,
    /// Pause after switching, before a window starts (connections accepted under the
    /// previous state finish).
    pub settle: Duration,
    /// Method for the on windows when nothing was attached (else the one found).
    pub method: Method,
    /// `--listen` filters.
    pub filters: Vec<String>,
}

/// Counters read at a window's edges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    /// ns on CPU per thread id of the server.
    pub cpu_ns: BTreeMap<u32, u64>,
    /// `PassiveOpens` of its network namespace.
    pub passive_opens: u64,
    /// RES + CAL interrupts, all CPUs.
    pub res: u64,
    /// CAL interrupts, all CPUs.
    pub cal: u64,
}

/// One window.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    /// Its position.
    pub index: usize,
    /// Steering on or off.
    pub steered: bool,
    /// Its length in seconds.
    pub seconds: f64,
    /// Connections accepted (PassiveOpens delta).
    pub accepted: u64,
    /// Server CPU time in the window, ns (threads present at both edges).
    pub cpu_ns: u64,
    /// Server CPU per accepted connection, ns.
    pub ns_per_conn: Option<f64>,
    /// Rescheduling IPIs, all CPUs.
    pub ipi_res: u64,
    /// Function-call IPIs, all CPUs.
    pub ipi_cal: u64,
    /// (RES + CAL) per accepted connection.
    pub ipis_per_conn: Option<f64>,
    /// Steered share of the SYNs in the window (eBPF counters; on windows).
    pub steered_share: Option<f64>,
    /// Threads that exited during the window (their time is missing).
    pub threads_lost: usize,
}

/// Medians over one side's windows.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// Windows.
    pub windows: usize,
    /// Connections accepted in them.
    pub accepted: u64,
    /// Median server CPU per connection, ns.
    pub median_ns_per_conn: Option<f64>,
    /// Median IPIs per connection.
    pub median_ipis_per_conn: Option<f64>,
}

/// A ratio with its spread over the pairs.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// Median of the per-pair on ÷ off ratios.
    pub median: f64,
    /// Smallest pair ratio.
    pub min: f64,
    /// Largest pair ratio.
    pub max: f64,
    /// Pairs that had a figure on both sides.
    pub pairs: usize,
}

/// The run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The server.
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// What was attached when the run started (`ebpf`, `incoming-cpu`, `hash`).
    pub found: String,
    /// What was left at the end (the same, unless restoring failed).
    pub restored: String,
    /// Every window.
    pub windows: Vec<Window>,
    /// Steering on.
    pub on: Side,
    /// Steering off.
    pub off: Side,
    /// CPU per connection, on ÷ off.
    pub cpu_ratio: Option<Ratio>,
    /// IPIs per connection, on ÷ off.
    pub ipi_ratio: Option<Ratio>,
    /// `/proc/loadavg` at the start and the end.
    pub loadavg: [String; 2],
    /// Caveats.
    pub notes: Vec<String>,
}

/// Sum of the `RES` and `CAL` rows of `/proc/interrupts` text: (res, cal).
pub fn parse_ipis(text: &str) -> (u64, u64) {
    let mut lines = text.lines();
    let cpus = lines.next().map_or(0, |h| h.split_whitespace().count());
    let mut res = 0;
    let mut cal = 0;
    for l in lines {
        let mut f = l.split_whitespace();
        let Some(name) = f.next() else { continue };
        let total: u64 = f.take(cpus).filter_map(|v| v.parse::<u64>().ok()).sum();
        match name {
            "RES:" => res = total,
            "CAL:" => cal = total,
            _ => {}
        }
    }
    (res, cal)
}

/// `PassiveOpens` from `/proc/net/snmp` text.
pub fn parse_passive_opens(text: &str) -> Option<u64> {
    let mut tcp = text.lines().filter(|l| l.starts_with("Tcp:"));
    let names: Vec<&str> = tcp.next()?.split_whitespace().collect();
    let values: Vec<&str> = tcp.next()?.split_whitespace().collect();
    let i = names.iter().position(|n| *n == "PassiveOpens")?;
    values.get(i)?.parse().ok()
}

/// First field of `/proc/…/schedstat`: ns on CPU.
pub fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// Reads the counters for the server's processes `pids` (their threads now).
pub fn sample(root: u32, pids: &[u32]) -> Result<Sample, SteerError> {
    let mut cpu_ns = BTreeMap::new();
    for &pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in tasks.flatten().take(discover::TASKS_MAX) {
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(ns) = std::fs::read_to_string(t.path().join("schedstat"))
                .ok()
                .and_then(|s| parse_schedstat(&s))
            {
                cpu_ns.insert(tid, ns);
            }
        }
    }
    let snmp = std::fs::read_to_string(format!("/proc/{root}/net/snmp"))
        .map_err(|e| SteerError(format!("/proc/{root}/net/snmp: {e}")))?;
    let passive_opens = parse_passive_opens(&snmp)
        .ok_or_else(|| SteerError(format!("/proc/{root}/net/snmp: no Tcp PassiveOpens")))?;
    let (res, cal) = std::fs::read_to_string("/proc/interrupts")
        .map(|t| parse_ipis(&t))
        .unwrap_or((0, 0));
    Ok(Sample {
        cpu_ns,
        passive_opens,
        res,
        cal,
    })
}

/// The window between two samples (`a` at its start, `b` at its end).
pub fn window(index: usize, steered: bool, secs: f64, a: &Sample, b: &Sample) -> Window {
    let mut cpu = 0u64;
    let mut lost = 0;
    for (tid, ns0) in &a.cpu_ns {
        match b.cpu_ns.get(tid) {
            Some(ns1) => cpu += ns1.saturating_sub(*ns0),
            None => lost += 1,
        }
    }
    // Threads born in the window: all their time is in it.
    for (tid, ns1) in &b.cpu_ns {
        if !a.cpu_ns.contains_key(tid) {
            cpu += ns1;
        }
    }
    let accepted = b.passive_opens.saturating_sub(a.passive_opens);
    let ipi_res = b.res.saturating_sub(a.res);
    let ipi_cal = b.cal.saturating_sub(a.cal);
    let per = |x: f64| (accepted > 0).then(|| x / accepted as f64);
    Window {
        index,
        steered,
        seconds: secs,
        accepted,
        cpu_ns: cpu,
        ns_per_conn: per(cpu as f64),
        ipi_res,
        ipi_cal,
        ipis_per_conn: per((ipi_res + ipi_cal) as f64),
        steered_share: None,
        threads_lost: lost,
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Steering on for window `i` of an ABBA sequence: on, off, off, on, on, off, …
pub fn abba_on(i: usize) -> bool {
    matches!(i % 4, 0 | 3)
}

/// Medians per side and per-pair ratios (pairs are windows 2k and 2k+1).
pub fn summarise(windows: &[Window]) -> (Side, Side, Option<Ratio>, Option<Ratio>) {
    let side = |on: bool| {
        let ws: Vec<&Window> = windows.iter().filter(|w| w.steered == on).collect();
        Side {
            windows: ws.len(),
            accepted: ws.iter().map(|w| w.accepted).sum(),
            median_ns_per_conn: median(ws.iter().filter_map(|w| w.ns_per_conn).collect()),
            median_ipis_per_conn: median(ws.iter().filter_map(|w| w.ipis_per_conn).collect()),
        }
    };
    let ratio = |f: &dyn Fn(&Window) -> Option<f64>| {
        let rs: Vec<f64> = windows
            .chunks(2)
            .filter(|p| p.len() == 2)
            .filter_map(|p| {
                let (on, off) = if p[0].steered {
                    (&p[0], &p[1])
                } else {
                    (&p[1], &p[0])
                };
                match (f(on), f(off)) {
                    (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                    _ => None,
                }
            })
            .collect();
        let pairs = rs.len();
        Some(Ratio {
            median: median(rs.clone())?,
            min: rs.iter().copied().fold(f64::INFINITY, f64::min),
            max: rs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            pairs,
        })
    };
    (
        side(true),
        side(false),
        ratio(&|w| w.ns_per_conn),
        ratio(&|w| w.ipis_per_conn),
    )
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// What is attached to the server's groups now: `ebpf`, `incoming-cpu`, `hash` or `foreign`
/// (the first group's, and whether all groups agree).
fn state_of(pid: u32, filters: &[String]) -> Result<(String, Vec<apply::GroupStatus>), SteerError> {
    let (plan, dups) = apply::discover(pid, filters)?;
    let st = apply::status(&plan, &dups)?;
    let first = st.first().map_or("hash", |s| s.method).to_string();
    Ok((first, st))
}

fn set(pid: u32, on: bool, method: Method, filters: &[String]) -> Result<(), SteerError> {
    let (plan, dups) = apply::discover(pid, filters)?;
    if on {
        apply::attach(&plan, &dups, method, false, &mut |_| {})?;
    } else {
        apply::detach(&plan, &dups)?;
    }
    Ok(())
}

/// Runs the windows on server `pid` and restores what it found. `pause(d)` sleeps up to `d`
/// and returns true to stop early (a signal): the run stops, restores and reports what it
/// has. `progress` sees each window as it ends.
pub fn measure(
    pid: u32,
    cfg: &MeasureConfig,
    pause: &mut dyn FnMut(Duration) -> bool,
    progress: &mut dyn FnMut(&Window),
) -> Result<Report, SteerError> {
    let (found, st) = state_of(pid, &cfg.filters)?;
    if st.is_empty() {
        return Err(SteerError(format!(
            "pid {pid}: no listening TCP socket (matching --listen) in its process tree"
        )));
    }
    if let Some(f) = st.iter().find(|s| s.method == "foreign") {
        return Err(SteerError(format!(
            "refused, nothing changed:\n  {}; measuring would replace it",
            apply::foreign::summary(&f.group, &f.foreign)
        )));
    }
    let on_method = match found.as_str() {
        "incoming-cpu" => Method::IncomingCpu,
        "ebpf" => Method::Ebpf,
        _ => cfg.method,
    };
    let snap = discover::snapshot(pid).map_err(|e| SteerError(e.to_string()))?;
    let comm = snap.procs.first().map_or(String::new(), |p| p.comm.clone());
    let load0 = loadavg();
    let mut windows = Vec::new();
    let mut notes = Vec::new();
    let mut failure = None;
    let n = cfg.windows.div_ceil(2) * 2;
    for i in 0..n {
        let on = abba_on(i);
        if let Err(e) = set(pid, on, on_method, &cfg.filters) {
            failure = Some(e);
            break;
        }
        if pause(cfg.settle) {
            notes.push("stopped early by a signal".into());
            break;
        }
        let pids: Vec<u32> = discover::snapshot(pid)
            .map_err(|e| SteerError(e.to_string()))?
            .procs
            .iter()
            .map(|p| p.pid)
            .collect();
        let counts0 = if on {
            state_of(pid, &cfg.filters)?.1
        } else {
            Vec::new()
        };
        let a = sample(pid, &pids)?;
        let t0 = Instant::now();
        let stop = pause(cfg.window);
        let b = sample(pid, &pids)?;
        let secs = t0.elapsed().as_secs_f64();
        let (now, counts1) = state_of(pid, &cfg.filters)?;
        let mut w = window(i, on, secs, &a, &b);
        if on {
            let (s0, f0) = counts0.first().map_or((0, 0), |g| g.totals());
            let (s1, f1) = counts1.first().map_or((0, 0), |g| g.totals());
            w.steered_share = apply::share(s1.saturating_sub(s0), f1.saturating_sub(f0));
        } else if now != "hash" {
            failure = Some(SteerError(format!(
                "steering came back during an off window ({now}): another process re-attached \
                 it (a running `corelocal steer watch`?); stop it and measure again"
            )));
        }
        progress(&w);
        windows.push(w);
        if failure.is_some() {
            break;
        }
        if stop {
            notes.push("stopped early by a signal".into());
            break;
        }
    }
    // Restore what was found, whatever happened.
    let restore = match found.as_str() {
        "ebpf" | "incoming-cpu" => set(pid, true, on_method, &cfg.filters),
        _ => set(pid, false, on_method, &cfg.filters),
    };
    let restored = match (&restore, state_of(pid, &cfg.filters)) {
        (Ok(()), Ok((s, _))) => s,
        (Err(e), _) => format!("restore failed: {e}"),
        (_, Err(e)) => format!("unknown: {e}"),
    };
    if let Some(e) = failure {
        return Err(SteerError(format!("{e} (restored: {restored})")));
    }
    let few = windows.iter().filter(|w| w.accepted < CONNS_MIN).count();
    if few > 0 {
        notes.push(format!(
            "{few} windows had fewer than {CONNS_MIN} connections: their figures are noisy \
             (longer windows, or measure under load)"
        ));
    }
    let lost: usize = windows.iter().map(|w| w.threads_lost).sum();
    if lost > 0 {
        notes.push(format!(
            "{lost} server threads exited during windows; their time in them is missing"
        ));
    }
    notes.push(
        "connections = PassiveOpens of the server's network namespace: other servers in it \
         count too"
            .into(),
    );
    let (on_side, off_side, cpu_ratio, ipi_ratio) = summarise(&windows);
    Ok(Report {
        pid,
        comm,
        found,
        restored,
        windows,
        on: on_side,
        off: off_side,
        cpu_ratio,
        ipi_ratio,
        loadavg: [load0, loadavg()],
        notes,
    })
}

/// Parses `10s`, `500ms`, `2m`, `1.5s` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: not a duration (e.g. 10s, 500ms, 2m)"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" | "min" => v * 60.0,
        _ => return Err(format!("{s:?}: unit must be ms, s or m")),
    };
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("{s:?}: must be > 0 and at most a day"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The report as text.
pub fn render(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let us = |x: Option<f64>| x.map_or("—".to_string(), |v| format!("{:.2}", v / 1000.0));
    let f3 = |x: Option<f64>| x.map_or("—".to_string(), |v| format!("{v:.3}"));
    let _ = writeln!(
        o,
        "corelocal steer measure: pid {} ({}), {} windows, steering on/off in ABBA order; \
         found: {}; restored: {}",
        r.pid,
        r.comm,
        r.windows.len(),
        r.found,
        r.restored
    );
    let _ = writeln!(
        o,
        "{:>3}  {:<8} {:>8} {:>9} {:>12} {:>10} {:>8}",
        "win", "steering", "conns", "conns/s", "CPU µs/conn", "IPIs/conn", "steered"
    );
    for w in &r.windows {
        let _ = writeln!(
            o,
            "{:>3}  {:<8} {:>8} {:>9.0} {:>12} {:>10} {:>8}",
            w.index,
            if w.steered { "on" } else { "off" },
            w.accepted,
            w.accepted as f64 / w.seconds.max(1e-9),
            us(w.ns_per_conn),
            f3(w.ipis_per_conn),
            w.steered_share
                .map_or("—".to_string(), |s| format!("{:.1}%", 100.0 * s))
        );
    }
    for (name, s) in [("on", &r.on), ("off", &r.off)] {
        let _ = writeln!(
            o,
            "{name:>3}: median {} µs server CPU per connection, {} IPIs per connection ({} \
             windows, {} connections)",
            us(s.median_ns_per_conn),
            f3(s.median_ipis_per_conn),
            s.windows,
            s.accepted
        );
    }
    for (name, rt) in [
        ("CPU per connection", &r.cpu_ratio),
        ("IPIs per connection", &r.ipi_ratio),
    ] {
        match rt {
            Some(x) => {
                let _ = writeln!(
                    o,
                    "{name}, on ÷ off: {:.3}× (median of {} pairs; spread {:.3}–{:.3})",
                    x.median, x.pairs, x.min, x.max
                );
            }
            None => {
                let _ = writeln!(o, "{name}, on ÷ off: no figure (no connections)");
            }
        }
    }
    let _ = writeln!(
        o,
        "load average: {} at the start, {} at the end",
        r.loadavg[0], r.loadavg[1]
    );
    for n in &r.notes {
        let _ = writeln!(o, "note: {n}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERRUPTS: &str = "           CPU0       CPU1       \n  0:         44          0   IO-APIC   2-edge      timer\n\
        NMI:          0          0   Non-maskable interrupts\n\
        RES:       1200        345   Rescheduling interrupts\n\
        CAL:         17         40   Function call interrupts\n\
        TLB:          3          4   TLB shootdowns\n";
    const SNMP: &str = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
        Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails\n\
        Tcp: 1 200 120000 -1 10 4321 0\nUdp: InDatagrams\nUdp: 5\n";

    #[test]
    fn parsers() {
        assert_eq!(parse_ipis(INTERRUPTS), (1545, 57));
        assert_eq!(parse_passive_opens(SNMP), Some(4321));
        assert_eq!(parse_passive_opens("Ip: a\nIp: 1\n"), None);
        assert_eq!(parse_schedstat("123456 789 10\n"), Some(123_456));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("0s").is_err() && parse_duration("5h").is_err());
    }

    fn s(cpu: &[(u32, u64)], opens: u64, res: u64, cal: u64) -> Sample {
        Sample {
            cpu_ns: cpu.iter().copied().collect(),
            passive_opens: opens,
            res,
            cal,
        }
    }

    #[test]
    fn windows_and_ratios() {
        // Thread 2 exits, thread 3 is born.
        let a = s(&[(1, 1000), (2, 500)], 100, 10, 5);
        let b = s(&[(1, 21_000), (3, 4000)], 1100, 110, 5);
        let w = window(0, true, 1.0, &a, &b);
        assert_eq!(w.accepted, 1000);
        assert_eq!(w.cpu_ns, 24_000);
        assert_eq!(w.threads_lost, 1);
        assert_eq!(w.ns_per_conn, Some(24.0));
        assert_eq!(w.ipis_per_conn, Some(0.1));
        let order: Vec<bool> = (0..6).map(abba_on).collect();
        assert_eq!(order, [true, false, false, true, true, false]);
        let mk = |i: usize, ns: f64| Window {
            index: i,
            steered: abba_on(i),
            seconds: 1.0,
            accepted: 1000,
            cpu_ns: (ns * 1000.0) as u64,
            ns_per_conn: Some(ns),
            ipi_res: 0,
            ipi_cal: 0,
            ipis_per_conn: Some(if abba_on(i) { 0.5 } else { 1.0 }),
            steered_share: None,
            threads_lost: 0,
        };
        // on: 90, 95; off: 100, 100 → pairs 0.9 and 0.95.
        let ws = vec![mk(0, 90.0), mk(1, 100.0), mk(2, 100.0), mk(3, 95.0)];
        let (on, off, cpu, ipi) = summarise(&ws);
        assert_eq!(on.median_ns_per_conn, Some(92.5));
        assert_eq!(off.median_ns_per_conn, Some(100.0));
        let cpu = cpu.unwrap();
        assert_eq!(cpu.pairs, 2);
        assert!((cpu.median - 0.925).abs() < 1e-9 && cpu.min == 0.9 && cpu.max == 0.95);
        assert_eq!(ipi.unwrap().median, 0.5);
        let text = render(&Report {
            pid: 1,
            comm: "nginx".into(),
            found: "hash".into(),
            restored: "hash".into(),
            windows: ws,
            on,
            off,
            cpu_ratio: Some(cpu),
            ipi_ratio: None,
            loadavg: ["0.1".into(), "0.2".into()],
            notes: vec![],
        });
        assert!(text.contains("on ÷ off: 0.925×"), "{text}");
    }
}
