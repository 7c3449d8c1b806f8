//! One cell, end to end: fresh namespaces (or the NIC), placement, transfer, measurement.
//!
//! Measured over the window after the warm-up: throughput from the receivers' byte counts;
//! the /proc/stat split of the flow and application CPUs (tick-sampled, fine at full load);
//! the receiver and sender threads' exact run time (schedstat); softnet packets per CPU (which
//! CPU really did the protocol work); retransmits and drops from each namespace's counters.

use crate::netns::{self, VethPair};
use crate::place;
use crate::placement::Cell;
use crate::sys;
use crate::transfer::{self, RecvSpec, SendSpec, Side};
use corelocal::cpu::CpuSet;
use corelocal::procfs::{self, CpuPercent, CpuTimes};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counters kept from the namespaces' snmp/netstat (sender and receiver).
pub const COUNTERS: [&str; 11] = [
    "Tcp:RetransSegs",
    "TcpExt:TCPLossProbes",
    "TcpExt:TCPTimeouts",
    "TcpExt:TCPSpuriousRTOs",
    "TcpExt:TCPDSACKRecv",
    "TcpExt:TCPLostRetransmit",
    "TcpExt:TCPBacklogDrop",
    "TcpExt:TCPRcvQDrop",
    "TcpExt:PruneCalled",
    "TcpExt:TCPOFOQueue",
    "TcpExt:TCPRcvCoalesce",
];

/// How each cell's transfer runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CellConfig {
    /// Measured window, ms.
    pub duration_ms: u64,
    /// Excluded ramp-up before the window, ms.
    pub warmup_ms: u64,
    /// Parallel TCP flows.
    pub flows: usize,
    /// Bytes per send.
    pub write_size: usize,
    /// Bytes per recv.
    pub read_size: usize,
    /// Sender CPU (`None`: scheduler).
    pub sender_cpu: Option<usize>,
    /// First port.
    pub port: u16,
}

impl CellConfig {
    /// The measured window.
    pub fn duration(&self) -> Duration {
        Duration::from_millis(self.duration_ms)
    }

    /// The warm-up.
    pub fn warmup(&self) -> Duration {
        Duration::from_millis(self.warmup_ms)
    }
}

/// One CPU's split over the window.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CpuSplit {
    /// The CPU.
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
    /// Packets processed by this CPU's NET_RX softirq per second (softnet_stat).
    pub softnet_pps: f64,
    /// Packets dropped at this CPU's backlog (netdev_max_backlog full) over the window.
    pub softnet_drops: u64,
}

/// One measured transfer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    /// Round (0-based).
    pub round: usize,
    /// Gbit/s over the window.
    pub gbps: f64,
    /// Bytes over the window.
    pub bytes: u64,
    /// Window length, s.
    pub secs: f64,
    /// Flow and application CPUs' split.
    pub cpus: Vec<CpuSplit>,
    /// Receiver threads' run time ÷ window, percent (100 = one CPU busy).
    pub receiver_busy_pct: f64,
    /// Sender threads' run time ÷ window, percent.
    pub sender_busy_pct: f64,
    /// Counter deltas over the whole transfer ([`COUNTERS`]; sender `s:`, receiver `r:`).
    pub counters: BTreeMap<String, u64>,
    /// Retransmitted segments (sender's Tcp:RetransSegs).
    pub retrans_segs: u64,
}

struct Point {
    at: Instant,
    bytes: u64,
    stat: Vec<(usize, CpuTimes)>,
    softnet: Vec<procfs::Softnet>,
    recv_ns: u64,
    send_ns: u64,
}

fn schedstat_sum(tids: &[u32]) -> u64 {
    tids.iter()
        .filter_map(|t| {
            let p = format!("/proc/self/task/{t}/schedstat");
            procfs::parse_schedstat(&procfs::read_text(std::path::Path::new(&p)).ok()?)
        })
        .sum()
}

fn point(recv: &transfer::Receivers, send_tids: &[u32]) -> Point {
    let read = |p: &str| procfs::read_text(std::path::Path::new(p)).unwrap_or_default();
    Point {
        at: Instant::now(),
        bytes: recv.total(),
        stat: procfs::parse_stat(&read("/proc/stat")),
        softnet: procfs::parse_softnet(&read("/proc/net/softnet_stat")),
        recv_ns: schedstat_sum(&recv.tids),
        send_ns: schedstat_sum(send_tids),
    }
}

/// Sleeps `d` unless a stop is requested; false when stopped.
fn nap(d: Duration, stop: &AtomicBool) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if sys::stop_requested() || stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(50)));
    }
    true
}

fn split(cpu: usize, a: &Point, b: &Point, secs: f64) -> CpuSplit {
    let find = |p: &Point| {
        p.stat
            .iter()
            .find(|(c, _)| *c == cpu)
            .map(|x| x.1)
            .unwrap_or_default()
    };
    let p: CpuPercent = find(b).since(&find(a)).percent();
    let sn = |p: &Point| {
        p.softnet
            .iter()
            .find(|s| s.cpu == cpu)
            .copied()
            .unwrap_or_default()
    };
    CpuSplit {
        cpu,
        user: p.user,
        sys: p.sys,
        irq: p.irq,
        softirq: p.softirq,
        idle: p.idle,
        softnet_pps: sn(b).processed.wrapping_sub(sn(a).processed) as f64 / secs,
        softnet_drops: sn(b).dropped.saturating_sub(sn(a).dropped),
    }
}

fn window(cell: Cell, a: &Point, b: &Point, round: usize) -> Sample {
    let secs = (b.at - a.at).as_secs_f64().max(1e-6);
    let bytes = b.bytes - a.bytes;
    let cpus: CpuSet = [cell.flow, cell.app].into_iter().collect();
    Sample {
        round,
        gbps: bytes as f64 * 8.0 / secs / 1e9,
        bytes,
        secs,
        cpus: cpus.iter().map(|c| split(c, a, b, secs)).collect(),
        receiver_busy_pct: b.recv_ns.saturating_sub(a.recv_ns) as f64 / 1e7 / secs,
        sender_busy_pct: b.send_ns.saturating_sub(a.send_ns) as f64 / 1e7 / secs,
        counters: BTreeMap::new(),
        retrans_segs: 0,
    }
}

/// Measures warm-up + window; `None` when a stop was requested.
fn measure(
    cell: Cell,
    cfg: &CellConfig,
    recv: &transfer::Receivers,
    send_tids: &[u32],
    stop: &AtomicBool,
    round: usize,
) -> Option<Sample> {
    if !nap(cfg.warmup(), stop) {
        return None;
    }
    let a = point(recv, send_tids);
    if !nap(cfg.duration(), stop) {
        return None;
    }
    let b = point(recv, send_tids);
    Some(window(cell, &a, &b, round))
}

fn keep(prefix: &str, m: &BTreeMap<String, u64>, out: &mut BTreeMap<String, u64>) {
    for k in COUNTERS {
        out.insert(format!("{prefix}{k}"), m.get(k).copied().unwrap_or(0));
    }
}

/// Runs one cell between fresh namespaces: RPS on the receiving veth → `cell.flow`,
/// receivers pinned to `cell.app`.
pub fn run_netns(cell: Cell, cfg: &CellConfig, round: usize) -> Result<Sample, String> {
    let pair = VethPair::create(cfg.flows)?;
    place::set_rps_in_netns(
        pair.receiver.name(),
        netns::RECV_IF,
        &CpuSet::single(cell.flow),
    )?;
    let stop = Arc::new(AtomicBool::new(false));
    let hard_end = Instant::now() + cfg.warmup() + cfg.duration() + Duration::from_secs(15);
    let rspec = RecvSpec {
        side: Side {
            netns: Some(pair.receiver.name().into()),
            cpu: Some(cell.app),
        },
        ip: Ipv4Addr::from(netns::RECV_ADDR),
        port: cfg.port,
        flows: cfg.flows,
        read_size: cfg.read_size,
        accept_timeout: transfer::ACCEPT_TIMEOUT,
    };
    let mut recv = transfer::start_receivers(&rspec, &stop, hard_end)?;
    let sspec = SendSpec {
        side: Side {
            netns: Some(pair.sender.name().into()),
            cpu: cfg.sender_cpu,
        },
        dst: SocketAddrV4::new(Ipv4Addr::from(netns::RECV_ADDR), cfg.port),
        flows: cfg.flows,
        write_size: cfg.write_size,
    };
    let sent = transfer::start_senders(&sspec, &stop, hard_end);
    let mut send = match sent {
        Ok(s) => s,
        Err(e) => {
            stop.store(true, Ordering::Relaxed);
            let _ = recv.join(hard_end);
            return Err(e);
        }
    };
    let sample = measure(cell, cfg, &recv, &send.tids, &stop, round);
    let whole = recv.all_running();
    stop.store(true, Ordering::Relaxed);
    let joined = send.join(hard_end).and(recv.join(hard_end));
    let mut sample = sample.ok_or("stopped")?;
    joined?;
    if !whole {
        return Err("a flow ended before the measured window closed".into());
    }
    let mut counters = BTreeMap::new();
    keep(
        "s:",
        &place::counters_in_netns(pair.sender.name())?,
        &mut counters,
    );
    keep(
        "r:",
        &place::counters_in_netns(pair.receiver.name())?,
        &mut counters,
    );
    sample.retrans_segs = counters["s:Tcp:RetransSegs"];
    sample.counters = counters;
    drop(pair);
    Ok(sample)
}

/// Runs one cell on a real NIC: its RX IRQs → `cell.flow`, receivers on the host pinned to
/// `cell.app`, data from a remote `corelocal sweep --send-to`.
pub fn run_nic(
    placer: &place::IrqPlacer,
    listen: SocketAddrV4,
    cell: Cell,
    cfg: &CellConfig,
    round: usize,
) -> Result<Sample, String> {
    placer.place(cell.flow)?;
    let before = place::read_counters("/proc/net");
    let stop = Arc::new(AtomicBool::new(false));
    let hard_end = Instant::now() + cfg.warmup() + cfg.duration() + Duration::from_secs(60);
    let rspec = RecvSpec {
        side: Side {
            netns: None,
            cpu: Some(cell.app),
        },
        ip: *listen.ip(),
        port: listen.port(),
        flows: cfg.flows,
        read_size: cfg.read_size,
        accept_timeout: Duration::from_secs(30),
    };
    let mut recv = transfer::start_receivers(&rspec, &stop, hard_end)?;
    // Wait for the remote sender to connect (up to the accept timeout).
    let connected = Instant::now() + rspec.accept_timeout;
    while recv.total() == 0 && Instant::now() < connected && !sys::stop_requested() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let sample = measure(cell, cfg, &recv, &[], &stop, round);
    let whole = recv.all_running();
    stop.store(true, Ordering::Relaxed);
    let joined = recv.join(hard_end);
    let mut sample = sample.ok_or("stopped")?;
    joined?;
    if !whole {
        return Err("a flow ended before the measured window closed".into());
    }
    let after = place::read_counters("/proc/net");
    let delta: BTreeMap<String, u64> = COUNTERS
        .iter()
        .map(|k| {
            let d = after
                .get(*k)
                .unwrap_or(&0)
                .saturating_sub(*before.get(*k).unwrap_or(&0));
            (format!("host:{k}"), d)
        })
        .collect();
    sample.retrans_segs = delta["host:Tcp:RetransSegs"];
    sample.counters = delta;
    Ok(sample)
}

/// The remote half of `--iface`: connects `flows` flows to `dst` and sends until each closes,
/// reconnecting, for at most `total`.
pub fn send_forever(dst: SocketAddrV4, cfg: &CellConfig, total: Duration) -> Result<(), String> {
    let end = Instant::now() + total;
    let mut waiting = false;
    while Instant::now() < end && !sys::stop_requested() {
        let stop = Arc::new(AtomicBool::new(false));
        let spec = SendSpec {
            side: Side {
                netns: None,
                cpu: cfg.sender_cpu,
            },
            dst,
            flows: cfg.flows,
            write_size: cfg.write_size,
        };
        match transfer::start_senders(&spec, &stop, end) {
            Ok(mut s) => {
                waiting = false;
                let _ = s.join(end);
                eprintln!("corelocal sweep: flows closed; reconnecting");
            }
            Err(e) => {
                if !waiting {
                    eprintln!("corelocal sweep: {e}; retrying until the receiver listens");
                }
                waiting = true;
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    Ok(())
}
