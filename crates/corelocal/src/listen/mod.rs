//! [`ListenerGroup`]: one SO_REUSEPORT listener per worker (Affinity-Accept §3.1–3.2,
//! MegaPipe §3.4.1), steered by the kernel.
//!
//! Modes, selectable so the paper's comparison can be rerun on any host:
//! - [`Mode::Stock`]: one listener per address shared by every worker (the baseline).
//! - [`Mode::Fine`]: one listener per worker; the kernel's 4-tuple hash picks (no locality).
//! - [`Mode::Local`]: one listener per worker; the CPU that processes the SYN picks its
//!   worker's listener, by the best available [`Steering`]: eBPF SK_REUSEPORT (O(1), robust to a
//!   listener closing, flow-group overrides; needs CAP_BPF), then `SO_INCOMING_CPU` (kernel
//!   ≥ 6.2, unprivileged, O(listeners) per SYN), then classic BPF returning the CPU (index =
//!   join order; the group's program is rebuilt when a member closes).
//!
//! Each address (IPv4 and IPv6 may be mixed) is its own reuseport group; worker `w` owns one
//! listener per address. The total backlog is split evenly across a group's listeners.
//!
//! Binary upgrade by socket passing: [`handover`] (the protocol and the [`handover::Layout`]
//! header, sans-IO), [`transfer`] (the unix-socket side: offer, receive, the upgrade socket) and
//! [`ListenerGroup::adopt`], which rebuilds a group from received sockets.

mod adopt;
pub mod handover;
pub mod transfer;

use crate::bpf::{programs, BpfError, ReuseportSelect};
use crate::sys::socket::{self, ListenOptions};
use serde::Serialize;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// How connections are spread over workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One shared listener; every worker accepts from it.
    Stock,
    /// One listener per worker; kernel hash.
    Fine,
    /// One listener per worker; the SYN's CPU picks.
    Local,
}

/// How `local` mode steers a SYN to its CPU's listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Steering {
    /// eBPF SK_REUSEPORT program with a CPU table and flow-group overrides.
    Ebpf,
    /// `SO_INCOMING_CPU` on each listener.
    IncomingCpu,
    /// Classic BPF returning the listener index of the current CPU.
    Cbpf,
}

/// The steering actually in force, reported by [`ListenerGroup::steering`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActiveSteering {
    /// `stock`: one shared socket.
    Shared,
    /// `fine`: the kernel's reuseport hash.
    KernelHash,
    /// `local` with the given method.
    Local(Steering),
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Stock => "stock",
            Mode::Fine => "fine",
            Mode::Local => "local",
        })
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "stock" => Ok(Mode::Stock),
            "fine" => Ok(Mode::Fine),
            "local" => Ok(Mode::Local),
            _ => Err(format!(
                "unknown mode {s:?} (expected stock, fine or local)"
            )),
        }
    }
}

impl fmt::Display for Steering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Steering::Ebpf => "ebpf",
            Steering::IncomingCpu => "incoming-cpu",
            Steering::Cbpf => "cbpf",
        })
    }
}

impl FromStr for Steering {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ebpf" => Ok(Steering::Ebpf),
            "incoming-cpu" => Ok(Steering::IncomingCpu),
            "cbpf" => Ok(Steering::Cbpf),
            _ => Err(format!(
                "unknown steering {s:?} (expected ebpf, incoming-cpu or cbpf)"
            )),
        }
    }
}

impl fmt::Display for ActiveSteering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ActiveSteering::Shared => f.write_str("shared"),
            ActiveSteering::KernelHash => f.write_str("kernel-hash"),
            ActiveSteering::Local(s) => write!(f, "{s}"),
        }
    }
}

/// How the queued connections of a closing listener survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Migration {
    /// The group's eBPF program is SELECT_OR_MIGRATE: children move to a live sibling.
    Ebpf,
    /// `net.ipv4.tcp_migrate_req=1` in this network namespace: the kernel picks a live sibling.
    Sysctl,
    /// Queued children of a closing listener are reset.
    None,
}

impl fmt::Display for Migration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Migration::Ebpf => "ebpf",
            Migration::Sysctl => "sysctl",
            Migration::None => "none",
        })
    }
}

/// What to bind.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// Addresses to listen on; port 0 binds an ephemeral port shared by all workers.
    pub addrs: Vec<SocketAddr>,
    /// The CPU of each worker (worker `w` runs on `worker_cpus[w]`).
    pub worker_cpus: Vec<usize>,
    /// Spreading mode.
    pub mode: Mode,
    /// Force a steering method in `local` mode (`None`: best available).
    pub steering: Option<Steering>,
    /// Total backlog per address, split evenly across that address's listeners.
    pub backlog_total: u32,
    /// Flow groups for eBPF overrides (power of two).
    pub flow_groups: u32,
    /// `TCP_DEFER_ACCEPT` on every listener, seconds (`None`: off). For protocols where the
    /// client speaks first: accept completes with the request already queued.
    pub defer_accept_s: Option<u32>,
}

impl GroupConfig {
    /// A config with defaults: backlog 4096 per address, 4096 flow groups.
    pub fn new(addrs: Vec<SocketAddr>, worker_cpus: Vec<usize>, mode: Mode) -> GroupConfig {
        GroupConfig {
            addrs,
            worker_cpus,
            mode,
            steering: None,
            backlog_total: 4096,
            flow_groups: crate::bpf::FLOW_GROUPS_DEFAULT,
            defer_accept_s: None,
        }
    }
}

/// Why a group could not be bound or changed.
#[derive(Debug)]
pub enum ListenError {
    /// The configuration is unusable.
    Config(String),
    /// A socket call failed.
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: io::Error,
    },
    /// Loading or updating the eBPF program failed.
    Bpf(BpfError),
}

impl fmt::Display for ListenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenError::Config(m) => f.write_str(m),
            ListenError::Io { context, source } => write!(f, "{context}: {source}"),
            ListenError::Bpf(e) => write!(f, "eBPF steering: {e}"),
        }
    }
}

impl std::error::Error for ListenError {}

impl From<BpfError> for ListenError {
    fn from(e: BpfError) -> Self {
        ListenError::Bpf(e)
    }
}

fn io_context(context: impl Into<String>) -> impl FnOnce(io::Error) -> ListenError {
    let context = context.into();
    move |source| ListenError::Io { context, source }
}

/// One address's reuseport group.
#[derive(Debug)]
struct AddrGroup {
    local_addr: SocketAddr,
    /// Listener of each worker (all the same socket in `stock` mode); `None` once closed.
    listeners: Vec<Option<Arc<OwnedFd>>>,
    /// Worker ids in the kernel's `socks[]` order (cBPF steering needs it).
    kernel_order: Vec<usize>,
    ebpf: Option<ReuseportSelect>,
}

/// The listening sockets of all workers. See the module docs.
#[derive(Debug)]
pub struct ListenerGroup {
    config: GroupConfig,
    steering: ActiveSteering,
    groups: Vec<AddrGroup>,
    /// Built from sockets received from a running server ([`ListenerGroup::adopt`]).
    adopted: bool,
}

/// The minimum kernel for `SO_INCOMING_CPU` steering inside a reuseport group.
pub const INCOMING_CPU_MIN_KERNEL: (u32, u32) = (6, 2);

impl ListenerGroup {
    /// Binds every worker's listeners. In `local` mode without a forced method, tries eBPF,
    /// then SO_INCOMING_CPU (kernel ≥ 6.2), then cBPF.
    pub fn bind(config: GroupConfig) -> Result<ListenerGroup, ListenError> {
        validate(&config)?;
        let candidates: Vec<Option<Steering>> = match (config.mode, config.steering) {
            (Mode::Local, Some(forced)) => vec![Some(forced)],
            (Mode::Local, None) => {
                let mut c = vec![Some(Steering::Ebpf)];
                if socket::kernel_version().is_some_and(|v| v >= INCOMING_CPU_MIN_KERNEL) {
                    c.push(Some(Steering::IncomingCpu));
                }
                c.push(Some(Steering::Cbpf));
                c
            }
            (_, _) => vec![None],
        };
        let mut last_error = None;
        for method in &candidates {
            match Self::bind_with(&config, *method) {
                Ok(group) => return Ok(group),
                Err(ListenError::Bpf(e)) if e.is_permission() && candidates.len() > 1 => {
                    last_error = Some(ListenError::Bpf(e));
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| ListenError::Config("no steering method".into())))
    }

    fn bind_with(config: &GroupConfig, method: Option<Steering>) -> Result<Self, ListenError> {
        let steering = match (config.mode, method) {
            (Mode::Stock, _) => ActiveSteering::Shared,
            (Mode::Fine, _) => ActiveSteering::KernelHash,
            (Mode::Local, Some(m)) => ActiveSteering::Local(m),
            (Mode::Local, None) => unreachable!("local mode always has a method"),
        };
        let mut groups = Vec::with_capacity(config.addrs.len());
        for &addr in &config.addrs {
            groups.push(bind_addr(config, addr, steering)?);
        }
        Ok(ListenerGroup {
            config: config.clone(),
            steering,
            groups,
            adopted: false,
        })
    }

    /// The steering in force.
    pub fn steering(&self) -> ActiveSteering {
        self.steering
    }

    /// Whether the sockets were received from a running server ([`ListenerGroup::adopt`]):
    /// until that server confirmed the handover, they are shared with it.
    pub fn is_adopted(&self) -> bool {
        self.adopted
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.config.mode
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.config.worker_cpus.len()
    }

    /// The CPU of `worker`.
    pub fn worker_cpu(&self, worker: usize) -> usize {
        self.config.worker_cpus[worker]
    }

    /// The bound addresses (ports resolved).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.groups.iter().map(|g| g.local_addr).collect()
    }

    /// The open listeners of `worker`, one per address (the shared ones in `stock` mode).
    pub fn listeners(&self, worker: usize) -> Vec<RawFd> {
        self.groups
            .iter()
            .filter_map(|g| g.listeners[worker].as_ref().map(|fd| fd.as_raw_fd()))
            .collect()
    }

    /// Duplicates (`F_DUPFD_CLOEXEC`) the open listeners of `worker`, one per address, in the
    /// order of [`ListenerGroup::listeners`]: for a runtime that wants to own its listener
    /// (e.g. a tokio `TcpListener`). A duplicate refers to the same socket, so it stays in the
    /// reuseport group and the steering still picks it; closing the duplicate leaves the
    /// socket open as long as the group (or another duplicate) holds it.
    pub fn try_clone_listeners(&self, worker: usize) -> io::Result<Vec<OwnedFd>> {
        self.groups
            .iter()
            .filter_map(|g| g.listeners[worker].as_ref())
            .map(|fd| fd.try_clone())
            .collect()
    }

    /// Accept-queue depth of `worker`'s listeners, summed over addresses.
    pub fn queue_depth(&self, worker: usize) -> io::Result<QueueDepth> {
        let mut total = QueueDepth { len: 0, cap: 0 };
        for fd in self.listeners(worker) {
            let d = socket::listen_queue(fd)?;
            total.len += d.len;
            total.cap += d.cap;
        }
        Ok(total)
    }

    /// Closes `worker`'s listeners and re-steers so the other workers keep their traffic; the
    /// connections queued in them move to live siblings when [`ListenerGroup::migration`]
    /// allows (eBPF SELECT_OR_MIGRATE or the netns sysctl), else they are reset:
    /// the eBPF sockarray slot empties itself (its CPU falls back to the hash), SO_INCOMING_CPU
    /// needs nothing, and the cBPF program is rebuilt for the kernel's new `socks[]` order.
    pub fn close_worker(&mut self, worker: usize) -> Result<(), ListenError> {
        if worker >= self.workers() {
            return Err(ListenError::Config(format!("no worker {worker}")));
        }
        if self.config.mode == Mode::Stock {
            return Err(ListenError::Config(
                "stock mode shares one listener; close the whole group instead".into(),
            ));
        }
        for g in &mut self.groups {
            if g.listeners[worker].take().is_none() {
                continue;
            }
            if let Some(pos) = g.kernel_order.iter().position(|&w| w == worker) {
                // Mirror __reuseport_detach_sock(): the last member moves into the hole.
                g.kernel_order.swap_remove(pos);
            }
            if let Some(sel) = &g.ebpf {
                // The CPU's SYNs go to its longest run of live workers (the hash without any).
                let cpu = self.config.worker_cpus[worker];
                let live: Vec<bool> = g.listeners.iter().map(Option::is_some).collect();
                let run = cpu_worker_runs(&self.config.worker_cpus, &live)
                    .into_iter()
                    .find(|r| r.cpu == cpu);
                sel.map_cpu(cpu as u32, run.map(|r| (r.first as u32, r.count as u32)))?;
            }
            if self.steering == ActiveSteering::Local(Steering::Cbpf) {
                attach_cbpf(g, &self.config.worker_cpus)?;
            }
        }
        Ok(())
    }

    /// Starts stopping the whole group: with eBPF steering, new SYNs are refused from now on
    /// (`SK_DROP`) while queued children and handshakes in progress are kept, so the queues
    /// only shrink and can be drained by accept. Returns whether new SYNs are now refused
    /// (false without eBPF: the queues keep filling until the listeners close).
    pub fn begin_stop(&self) -> Result<bool, ListenError> {
        let mut refusing = !self.groups.is_empty();
        if self.config.defer_accept_s.is_some() {
            // Connections held for their first data are queued at their next SYN-ACK's ACK
            // rather than after the whole period (see `stop_quiesce`).
            for fd in self
                .groups
                .iter()
                .flat_map(|g| g.listeners.iter().flatten())
            {
                socket::set_defer_accept(fd.as_raw_fd(), 0)
                    .map_err(io_context("TCP_DEFER_ACCEPT off"))?;
            }
        }
        for g in &self.groups {
            match &g.ebpf {
                Some(sel) => sel.set_stopping(true)?,
                None => refusing = false,
            }
        }
        Ok(refusing)
    }

    /// On stop, how long connections whose handshake is done may take to reach the accept
    /// queues: with `TCP_DEFER_ACCEPT`, one held for its first data is queued when that data
    /// comes or when the kernel sends its SYN-ACK again (within the period) and the ACK
    /// returns; `None` without it (the runtime's own short quiesce applies).
    pub fn stop_quiesce(&self) -> Option<Duration> {
        let secs = self.config.defer_accept_s?;
        Some(Duration::from_secs(secs.into()) + Duration::from_millis(500))
    }

    /// How a closing listener's queued connections survive (see [`Migration`]).
    pub fn migration(&self) -> Migration {
        if self.groups.iter().all(|g| g.ebpf.is_some()) {
            return Migration::Ebpf;
        }
        let sysctl = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_migrate_req");
        if sysctl.is_ok_and(|v| v.trim() == "1") {
            return Migration::Sysctl;
        }
        Migration::None
    }

    /// Connections waiting in all open listeners' accept queues (each socket counted once).
    pub fn queued_total(&self) -> u64 {
        let mut seen = Vec::new();
        let mut total = 0u64;
        for g in &self.groups {
            for fd in g.listeners.iter().flatten() {
                let raw = fd.as_raw_fd();
                if seen.contains(&raw) {
                    continue;
                }
                seen.push(raw);
                total += socket::listen_queue(raw).map_or(0, |d| d.len as u64);
            }
        }
        total
    }

    /// Whether flow groups can be moved ([`ListenerGroup::set_flow_group`]): eBPF steering.
    pub fn supports_flow_groups(&self) -> bool {
        self.groups.iter().all(|g| g.ebpf.is_some())
    }

    /// Moves flow group `group` (`hash & (G-1)`) to `worker`, or back to CPU steering with
    /// `None`. Only with eBPF steering.
    pub fn set_flow_group(&self, group: u32, worker: Option<usize>) -> Result<(), ListenError> {
        if worker.is_some_and(|w| w >= self.workers()) {
            return Err(ListenError::Config("no such worker".into()));
        }
        for g in &self.groups {
            let Some(sel) = &g.ebpf else {
                return Err(ListenError::Config(
                    "flow-group overrides need eBPF steering".into(),
                ));
            };
            sel.set_group_override(group, worker.map(|w| w as u32))?;
        }
        Ok(())
    }

    /// Number of flow groups.
    pub fn flow_groups(&self) -> u32 {
        self.config.flow_groups
    }
}

fn validate(config: &GroupConfig) -> Result<(), ListenError> {
    let bad = |m: &str| Err(ListenError::Config(m.to_string()));
    if config.addrs.is_empty() {
        return bad("no listen address");
    }
    if config.worker_cpus.is_empty() {
        return bad("no workers (empty CPU set)");
    }
    if !config.flow_groups.is_power_of_two() {
        return bad("flow groups must be a power of two");
    }
    if config.backlog_total == 0 {
        return bad("backlog must be at least 1");
    }
    Ok(())
}

fn bind_addr(
    config: &GroupConfig,
    addr: SocketAddr,
    steering: ActiveSteering,
) -> Result<AddrGroup, ListenError> {
    let workers = config.worker_cpus.len();
    let shared = steering == ActiveSteering::Shared;
    let sockets = if shared { 1 } else { workers };
    let backlog = (config.backlog_total / sockets as u32).max(1);
    let mut bound = addr;
    let mut fds: Vec<Arc<OwnedFd>> = Vec::with_capacity(sockets);
    for w in 0..sockets {
        let incoming_cpu = (steering == ActiveSteering::Local(Steering::IncomingCpu))
            .then(|| config.worker_cpus[w]);
        let opts = ListenOptions {
            reuseport: !shared,
            incoming_cpu,
            backlog,
            defer_accept_s: config.defer_accept_s,
        };
        let fd = socket::listen(bound, opts).map_err(io_context(format!("listen on {bound}")))?;
        if bound.port() == 0 {
            bound = socket::local_addr(fd.as_raw_fd()).map_err(io_context("getsockname"))?;
        }
        fds.push(Arc::new(fd));
    }
    let listeners = (0..workers)
        .map(|w| Some(fds[if shared { 0 } else { w }].clone()))
        .collect();
    let mut group = AddrGroup {
        local_addr: bound,
        listeners,
        kernel_order: (0..sockets).collect(),
        ebpf: None,
    };
    match steering {
        ActiveSteering::Local(Steering::Ebpf) => attach_ebpf(&mut group, config)?,
        ActiveSteering::Local(Steering::Cbpf) => attach_cbpf(&group, &config.worker_cpus)?,
        _ => {}
    }
    Ok(group)
}

fn first_listener(group: &AddrGroup) -> Option<RawFd> {
    group
        .listeners
        .iter()
        .flatten()
        .next()
        .map(|fd| fd.as_raw_fd())
}

fn attach_ebpf(group: &mut AddrGroup, config: &GroupConfig) -> Result<(), ListenError> {
    let workers = config.worker_cpus.len() as u32;
    let cpu_slots = config.worker_cpus.iter().max().map_or(1, |&m| m as u32 + 1);
    let sel = ReuseportSelect::load(workers, cpu_slots.max(256), config.flow_groups)?;
    for (w, fd) in group.listeners.iter().enumerate() {
        let fd = fd.as_ref().expect("fresh group").as_raw_fd();
        adopt::set_listener_patiently(&sel, w as u32, fd)?;
    }
    let live = vec![true; config.worker_cpus.len()];
    for run in cpu_worker_runs(&config.worker_cpus, &live) {
        sel.map_cpu(run.cpu as u32, Some((run.first as u32, run.count as u32)))?;
    }
    let first = first_listener(group).expect("fresh group");
    socket::attach_reuseport_ebpf(first, sel.program_fd())
        .map_err(io_context("SO_ATTACH_REUSEPORT_EBPF"))?;
    group.ebpf = Some(sel);
    Ok(())
}

/// A CPU's workers for CPU steering: `count` consecutive live workers from `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuWorkers {
    /// The CPU.
    pub cpu: usize,
    /// Its first worker.
    pub first: usize,
    /// How many consecutive workers from `first` run on it (≥ 1).
    pub count: usize,
}

/// For every CPU with a live worker, its longest run of consecutive live workers (the first
/// such run on ties). Workers of a CPU are consecutive when built by
/// `ServerConfig::workers_per_cpu`; a run is what the steering program can spread over.
pub fn cpu_worker_runs(worker_cpus: &[usize], live: &[bool]) -> Vec<CpuWorkers> {
    assert_eq!(
        worker_cpus.len(),
        live.len(),
        "one liveness flag per worker"
    );
    let mut best: Vec<CpuWorkers> = Vec::new();
    let mut w = 0;
    while w < worker_cpus.len() {
        if !live[w] {
            w += 1;
            continue;
        }
        let cpu = worker_cpus[w];
        let count = (w..worker_cpus.len())
            .take_while(|&i| worker_cpus[i] == cpu && live[i])
            .count();
        let run = CpuWorkers {
            cpu,
            first: w,
            count,
        };
        match best.iter_mut().find(|r| r.cpu == cpu) {
            Some(r) if r.count < count => *r = run,
            Some(_) => {}
            None => best.push(run),
        }
        w += count;
    }
    best
}

fn attach_cbpf(group: &AddrGroup, worker_cpus: &[usize]) -> Result<(), ListenError> {
    let table: Vec<(u32, u32)> = group
        .kernel_order
        .iter()
        .enumerate()
        .map(|(index, &w)| (worker_cpus[w] as u32, index as u32))
        .collect();
    let Some(first) = first_listener(group) else {
        return Ok(());
    };
    socket::attach_reuseport_cbpf(first, &programs::cbpf_cpu_select(&table))
        .map_err(io_context("SO_ATTACH_REUSEPORT_CBPF"))
}

/// Accepts one pending connection from `listener` (non-blocking): the connection, the peer,
/// and the CPU that processed its last packet (`SO_INCOMING_CPU`, `None` if unknown).
pub fn accept(listener: RawFd) -> io::Result<Accepted> {
    let (fd, peer) = socket::accept(listener)?;
    let incoming_cpu = socket::incoming_cpu(fd.as_raw_fd())
        .ok()
        .and_then(|c| usize::try_from(c).ok());
    Ok(Accepted {
        fd,
        peer,
        incoming_cpu,
    })
}

/// A connection taken from a listener.
#[derive(Debug)]
pub struct Accepted {
    /// The connected socket (non-blocking).
    pub fd: OwnedFd,
    /// The client's address.
    pub peer: Option<SocketAddr>,
    /// `SO_INCOMING_CPU` of the connection.
    pub incoming_cpu: Option<usize>,
}

pub use crate::sys::socket::QueueDepth;

#[cfg(test)]
mod tests {
    use super::{cpu_worker_runs, CpuWorkers};

    fn run(cpu: usize, first: usize, count: usize) -> CpuWorkers {
        CpuWorkers { cpu, first, count }
    }

    #[test]
    fn each_cpu_gets_its_consecutive_workers() {
        let cpus = [0, 0, 0, 1, 1, 1];
        let runs = cpu_worker_runs(&cpus, &[true; 6]);
        assert_eq!(runs, vec![run(0, 0, 3), run(1, 3, 3)]);
        let one_each = cpu_worker_runs(&[4, 7], &[true, true]);
        assert_eq!(one_each, vec![run(4, 0, 1), run(7, 1, 1)]);
    }

    #[test]
    fn a_closed_worker_leaves_the_longest_live_run() {
        let cpus = [0, 0, 0, 1, 1, 1];
        let runs = cpu_worker_runs(&cpus, &[true, false, true, true, true, false]);
        assert_eq!(runs, vec![run(0, 0, 1), run(1, 3, 2)]);
        let none_left = cpu_worker_runs(&cpus, &[false, false, false, true, true, true]);
        assert_eq!(none_left, vec![run(1, 3, 3)]);
    }
}
