//! What a group binds and how it spreads connections: the [`Mode`], the [`Steering`] of
//! `local` mode (and the [`ActiveSteering`] in force), how a closing listener's queued
//! connections survive ([`Migration`]), and the [`GroupConfig`].

use serde::Serialize;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

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

/// The steering actually in force, reported by
/// [`ListenerGroup::steering`](super::ListenerGroup::steering).
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
    /// With `defer_accept_s`: each worker turns deferring off on its own listeners while it is
    /// mostly idle (the request would wait for the worker's wake-up) and on again while it
    /// batches (see [`crate::runtime::defer`]). Not for listeners shared by workers (`stock`).
    pub defer_accept_adaptive: bool,
    /// The group joins a running server's `SO_REUSEPORT` group on purpose (a binary upgrade
    /// by PID: `--takeover PID`). Otherwise an address another socket listens on is refused
    /// ([`ListenError::AddrInUse`](super::ListenError::AddrInUse)): joining a stranger's group
    /// would silently share its connections.
    pub join_existing: bool,
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
            defer_accept_adaptive: false,
            join_existing: false,
        }
    }
}
