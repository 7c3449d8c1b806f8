//! One reading of the host (counters only) and the [`View`] of rates between two readings.
//! Files are read through corelocal-tune's [`Fs`] under a root, so fixtures work; interface
//! steering (RX queues, RPS, IRQ CPUs) comes from corelocal-tune's state reader.

use crate::server::{self, ServerStats};
use corelocal::cpu::CpuSet;
use corelocal::procfs::{self, parse_net_rx, CpuTimes, IfCounters, Softnet};
use corelocal_tune::fs::{Fs, RootFs};
use corelocal_tune::state;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

/// The most interfaces whose steering is read per sample.
const STEER_IFS_MAX: usize = 64;

/// RX steering of one interface.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Steer {
    /// RX queues.
    pub rx_queues: usize,
    /// Union of the RX queues' `rps_cpus` (empty: RPS off).
    pub rps: String,
    /// Union of the interface's IRQs' effective affinity (empty: none found).
    pub irq_cpus: String,
}

/// Counters read at one instant.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When.
    pub at: Instant,
    /// Per CPU.
    pub stat: Vec<(usize, CpuTimes)>,
    /// Per interface.
    pub ifs: Vec<IfCounters>,
    /// `TcpExt:` counters.
    pub counters: BTreeMap<String, u64>,
    /// Per CPU softnet.
    pub softnet: Vec<Softnet>,
    /// Per CPU NET_RX softirq runs (`/proc/softirqs`).
    pub net_rx: Vec<(usize, u64)>,
    /// The namespace shown (`--netns`), or why it could not be read.
    pub netns: Option<Result<String, String>>,
    /// Load averages.
    pub loadavg: Option<[f64; 3]>,
    /// Steering per interface name.
    pub steer: BTreeMap<String, Steer>,
    /// The server's stats, or why they could not be read (None: not asked).
    pub server: Option<Result<ServerStats, String>>,
}

/// What to read.
#[derive(Debug, Clone)]
pub struct Source {
    /// Root of /proc and /sys.
    pub root: PathBuf,
    /// The server's stats file.
    pub server_stats: Option<PathBuf>,
    /// Interfaces and TCP counters of this network namespace (a name under /run/netns, `*`
    /// matching any characters; the newest match is taken at each refresh) instead of the
    /// root's. CPU and softnet numbers stay host-wide.
    pub netns: Option<String>,
}

/// Whether `name` matches `pattern`, where `*` matches any run of characters.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    true
}

/// The namespace `pattern` names now: itself when it has no `*`, else the most recently
/// created match under /run/netns.
pub fn resolve_netns(pattern: &str) -> Option<String> {
    if !pattern.contains('*') {
        return std::path::Path::new("/run/netns")
            .join(pattern)
            .exists()
            .then(|| pattern.to_string());
    }
    std::fs::read_dir("/run/netns")
        .ok()?
        .flatten()
        .take(4096)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let made = e.metadata().and_then(|m| m.modified()).ok()?;
            glob_match(pattern, &name).then_some((made, name))
        })
        .max()
        .map(|(_, n)| n)
}

/// What is read inside a namespace.
struct NetRead {
    dev: String,
    netstat: String,
    steer: BTreeMap<String, Steer>,
}

/// Reads the namespace's interfaces, counters and steering from a short-lived thread that
/// joins it (and drops it on exit, so its owner can delete it).
fn read_netns(name: &str) -> Result<NetRead, String> {
    let name = name.to_string();
    std::thread::Builder::new()
        .name("top-netns".into())
        .spawn(move || {
            crate::sys::enter_netns_with_sysfs(&name).map_err(|e| format!("netns {name}: {e}"))?;
            let fs = RootFs::new("/");
            let read = |p: &str| procfs::read_text(std::path::Path::new(p)).unwrap_or_default();
            let dev = read("/proc/thread-self/net/dev");
            let lines = state::parse_interrupts(&read("/proc/interrupts"));
            let steer = procfs::parse_net_dev(&dev)
                .iter()
                .take(STEER_IFS_MAX)
                .map(|i| (i.name.clone(), steer_of(&fs, &i.name, &lines)))
                .collect();
            Ok(NetRead {
                netstat: read("/proc/thread-self/net/netstat"),
                dev,
                steer,
            })
        })
        .map_err(|e| e.to_string())?
        .join()
        .map_err(|_| "the netns reader panicked".to_string())?
}

fn steer_of(fs: &RootFs, name: &str, lines: &[state::InterruptLine]) -> Steer {
    let nic = state::read_nic(fs, name, lines, &|_| state::no_probe("top"));
    let rps: CpuSet = nic
        .rx
        .iter()
        .filter_map(|q| q.rps_cpus.clone())
        .fold(CpuSet::new(), |a, b| a.union(&b));
    let irq: CpuSet = nic
        .irqs
        .iter()
        .filter_map(|i| i.effective_affinity.clone().or(i.smp_affinity.clone()))
        .fold(CpuSet::new(), |a, b| a.union(&b));
    Steer {
        rx_queues: nic.rx.len(),
        rps: rps.to_list(),
        irq_cpus: irq.to_list(),
    }
}

impl Sample {
    /// Reads everything `src` names. Missing files give empty sections, never an error.
    pub fn read(src: &Source) -> Sample {
        let fs = RootFs::new(&src.root);
        let read = |rel: &str| fs.read(rel).unwrap_or_default();
        let (ifs, steer, netstat, netns) = match &src.netns {
            None => {
                let ifs = procfs::parse_net_dev(&read("proc/net/dev"));
                let lines = state::parse_interrupts(&read("proc/interrupts"));
                let steer = ifs
                    .iter()
                    .take(STEER_IFS_MAX)
                    .map(|i| (i.name.clone(), steer_of(&fs, &i.name, &lines)))
                    .collect();
                (ifs, steer, read("proc/net/netstat"), None)
            }
            Some(pattern) => match resolve_netns(pattern)
                .ok_or_else(|| format!("no network namespace matches {pattern}"))
                .and_then(|name| read_netns(&name).map(|r| (name, r)))
            {
                Ok((name, r)) => (
                    procfs::parse_net_dev(&r.dev),
                    r.steer,
                    r.netstat,
                    Some(Ok(name)),
                ),
                Err(e) => (Vec::new(), BTreeMap::new(), String::new(), Some(Err(e))),
            },
        };
        let mut counters = procfs::parse_counters(&netstat);
        counters.retain(|k, _| k.starts_with("TcpExt:"));
        Sample {
            at: Instant::now(),
            stat: procfs::parse_stat(&read("proc/stat")),
            ifs,
            counters,
            softnet: procfs::parse_softnet(&read("proc/net/softnet_stat")),
            net_rx: parse_net_rx(&read("proc/softirqs")),
            netns,
            loadavg: procfs::parse_loadavg(&read("proc/loadavg")),
            steer,
            server: src.server_stats.as_ref().map(|p| server::read(p)),
        }
    }
}

/// One CPU's row.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CpuRow {
    /// CPU.
    pub cpu: usize,
    /// Percent user.
    pub user: f64,
    /// Percent system.
    pub sys: f64,
    /// Percent hard IRQ.
    pub irq: f64,
    /// Percent softirq.
    pub softirq: f64,
    /// Percent idle.
    pub idle: f64,
    /// NET_RX packets processed per second.
    pub softnet_pps: f64,
    /// Backlog drops per second.
    pub drops_ps: f64,
    /// time_squeeze per second.
    pub squeeze_ps: f64,
    /// NET_RX softirq runs per second (`/proc/softirqs`).
    pub net_rx_ps: f64,
    /// RPS IPIs received per second (softnet_stat).
    pub rps_ipis_ps: f64,
}

/// One interface's row.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IfRow {
    /// Name.
    pub name: String,
    /// Packets/s received.
    pub rx_pps: f64,
    /// Bits/s received.
    pub rx_bps: f64,
    /// Packets/s sent.
    pub tx_pps: f64,
    /// Bits/s sent.
    pub tx_bps: f64,
    /// Steering.
    pub steer: Steer,
}

/// Listen-queue and softnet trouble, per second and since boot.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Drops {
    /// TcpExt:ListenOverflows per second.
    pub listen_overflows_ps: f64,
    /// TcpExt:ListenDrops per second.
    pub listen_drops_ps: f64,
    /// TcpExt:ListenOverflows total.
    pub listen_overflows: u64,
    /// TcpExt:ListenDrops total.
    pub listen_drops: u64,
    /// softnet drops, all CPUs, total.
    pub softnet_dropped: u64,
    /// softnet time_squeeze, all CPUs, total.
    pub softnet_time_squeeze: u64,
}

/// One corelocal worker's row.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WorkerRow {
    /// Counters as published.
    #[serde(flatten)]
    pub now: server::Worker,
    /// Accepts per second (None on the first reading).
    pub accepted_ps: Option<f64>,
    /// accepted_local ÷ accepted, percent.
    pub local_pct: Option<f64>,
}

/// Rates between two samples: what is shown and what `--json` prints.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct View {
    /// Seconds between the samples.
    pub interval_s: f64,
    /// Load averages.
    pub loadavg: Option<[f64; 3]>,
    /// Per CPU.
    pub cpus: Vec<CpuRow>,
    /// Per interface.
    pub interfaces: Vec<IfRow>,
    /// Listen and softnet drops.
    pub drops: Drops,
    /// Per worker (with --server-stats).
    pub workers: Option<Vec<WorkerRow>>,
    /// Why the server's stats could not be read.
    pub server_error: Option<String>,
    /// The namespace whose interfaces are shown (`--netns`), or why none could be read.
    pub netns: Option<Result<String, String>>,
}

fn rate(now: u64, before: u64, secs: f64) -> f64 {
    now.saturating_sub(before) as f64 / secs
}

fn cpu_rows(a: &Sample, b: &Sample, secs: f64) -> Vec<CpuRow> {
    b.stat
        .iter()
        .map(|(cpu, t)| {
            let before = a.stat.iter().find(|x| x.0 == *cpu).map_or(*t, |x| x.1);
            let p = t.since(&before).percent();
            let sn = |s: &Sample| s.softnet.iter().find(|x| x.cpu == *cpu).copied();
            let (sa, sb) = (sn(a).unwrap_or_default(), sn(b).unwrap_or_default());
            let rx = |s: &Sample| s.net_rx.iter().find(|x| x.0 == *cpu).map_or(0, |x| x.1);
            CpuRow {
                cpu: *cpu,
                user: p.user,
                sys: p.sys,
                irq: p.irq,
                softirq: p.softirq,
                idle: p.idle,
                softnet_pps: rate(sb.processed, sa.processed, secs),
                drops_ps: rate(sb.dropped, sa.dropped, secs),
                squeeze_ps: rate(sb.time_squeeze, sa.time_squeeze, secs),
                net_rx_ps: rate(rx(b), rx(a), secs),
                rps_ipis_ps: rate(sb.received_rps, sa.received_rps, secs),
            }
        })
        .collect()
}

fn if_rows(a: &Sample, b: &Sample, secs: f64) -> Vec<IfRow> {
    b.ifs
        .iter()
        .map(|i| {
            let p = a.ifs.iter().find(|x| x.name == i.name).unwrap_or(i);
            IfRow {
                name: i.name.clone(),
                rx_pps: rate(i.rx_packets, p.rx_packets, secs),
                rx_bps: 8.0 * rate(i.rx_bytes, p.rx_bytes, secs),
                tx_pps: rate(i.tx_packets, p.tx_packets, secs),
                tx_bps: 8.0 * rate(i.tx_bytes, p.tx_bytes, secs),
                steer: b.steer.get(&i.name).cloned().unwrap_or_default(),
            }
        })
        .collect()
}

fn worker_rows(a: &Sample, now: &ServerStats, secs: f64) -> Vec<WorkerRow> {
    let before = match &a.server {
        Some(Ok(s)) => Some(s),
        _ => None,
    };
    now.workers
        .iter()
        .map(|w| {
            let prev = before.and_then(|s| s.workers.iter().find(|x| x.worker == w.worker));
            WorkerRow {
                now: w.clone(),
                accepted_ps: prev.map(|p| rate(w.accepted, p.accepted, secs)),
                local_pct: (w.accepted > 0)
                    .then(|| 100.0 * w.accepted_local as f64 / w.accepted as f64),
            }
        })
        .collect()
}

impl View {
    /// The rates from `a` to `b`.
    pub fn between(a: &Sample, b: &Sample) -> View {
        let secs = b.at.duration_since(a.at).as_secs_f64().max(1e-3);
        let c = |s: &Sample, k: &str| s.counters.get(k).copied().unwrap_or(0);
        let drops = Drops {
            listen_overflows_ps: rate(
                c(b, "TcpExt:ListenOverflows"),
                c(a, "TcpExt:ListenOverflows"),
                secs,
            ),
            listen_drops_ps: rate(c(b, "TcpExt:ListenDrops"), c(a, "TcpExt:ListenDrops"), secs),
            listen_overflows: c(b, "TcpExt:ListenOverflows"),
            listen_drops: c(b, "TcpExt:ListenDrops"),
            softnet_dropped: b.softnet.iter().map(|s| s.dropped).sum(),
            softnet_time_squeeze: b.softnet.iter().map(|s| s.time_squeeze).sum(),
        };
        let (workers, server_error) = match &b.server {
            None => (None, None),
            Some(Ok(s)) => (Some(worker_rows(a, s, secs)), None),
            Some(Err(e)) => (None, Some(e.clone())),
        };
        View {
            interval_s: secs,
            loadavg: b.loadavg,
            cpus: cpu_rows(a, b, secs),
            interfaces: if_rows(a, b, secs),
            drops,
            workers,
            server_error,
            netns: b.netns.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_and_net_rx() {
        assert!(glob_match("clfwd-*-r", "clfwd-123-4-r"));
        assert!(!glob_match("clfwd-*-r", "clfwd-123-4-g"));
        assert!(glob_match("a*b*c", "axxbyyc") && !glob_match("a*b*c", "acb"));
        assert!(glob_match("exact", "exact") && !glob_match("exact", "exactly"));
        assert!(glob_match("*", "anything"));
        assert!(
            !glob_match("ab*ba", "aba"),
            "prefix and suffix may not overlap"
        );
        let t = "       CPU0  CPU1\n HI: 0 0\n NET_RX:  7  9\n";
        assert_eq!(parse_net_rx(t), vec![(0, 7), (1, 9)]);
    }
}
