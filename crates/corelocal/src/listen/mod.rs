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

// Layout: this file holds the group's state (`ListenerGroup`, one `AddrGroup` per address)
// and the re-exports; `config` has the modes, steering methods and `GroupConfig`; `error` the
// `ListenError`; `group` binds a group and says what it holds; `steering` attaches the
// reuseport programs, finds each CPU's workers and moves flow groups; `stop` closes a worker's
// listeners and stops the group; taking a connection is `sys::socket::accept_conn` (re-exported
// as `accept`); `adopt` (with `handover` and
// `transfer`) is the binary upgrade.

mod adopt;
mod config;
mod error;
mod group;
pub mod handover;
mod steering;
mod stop;
pub mod transfer;

pub use crate::sys::socket::QueueDepth;
pub use crate::sys::socket::{accept_conn as accept, Accepted};
pub use config::{ActiveSteering, GroupConfig, Migration, Mode, Steering};
pub use error::{BadSocket, LayoutMismatch, ListenError, Mismatch, SocketProblem};
pub use steering::{cpu_worker_runs, CpuWorkers};

use crate::bpf::ReuseportSelect;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;

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

#[cfg(test)]
mod tests;
