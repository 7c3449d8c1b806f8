//! The I/O side: duplicates of the server's listeners (`pidfd_getfd`), the eBPF attachment
//! (`cl_cpu_pick` + its sockarray), the unprivileged SO_INCOMING_CPU path, and reading both
//! back for `status`, `detach` and `watch`.
//!
//! State lives in the kernel only: the program is held by the reuseport group it is attached
//! to, and another `corelocal` process finds it again by scanning loaded programs for the name
//! `cl_cpu_pick` and matching the socket cookies in its sockarray against the group's
//! listeners ([`CpuPick::find`]). Nothing is pinned in bpffs, so nothing outlives the group:
//! when the server closes its listeners, program and maps go away with them.
//!
//! Layout: this file holds the steering [`Method`] and [`SteerError`]; [`foreign`] finds
//! reuseport programs someone else attached (then `attach` refuses); `dups` discovers the
//! server and takes duplicates of its listeners ([`discover`]); `maps` finds our program again
//! and syncs its sockarray and CPU map with a plan; `incoming` sets and reads
//! SO_INCOMING_CPU; `attach`, `detach` and `status` are the operations on a plan; `locality`
//! measures the live server's accept locality ([`connection_locality`]).

mod attach;
mod detach;
mod dups;
pub mod foreign;
mod incoming;
pub mod iter;
mod locality;
mod maps;
mod status;

pub use attach::{attach, foreign_on, Attached};
pub use detach::{detach, Detached};
pub use dups::{discover, discover_cached, Dups};
pub use locality::{connection_locality, ConnLocality, CONNS_INSPECTED_MAX};
pub use maps::wanted_map;
pub use status::{programs, share, status, CpuCounts, GroupStatus, LoadedProgram};

#[cfg(doc)]
use corelocal::bpf::cpu_pick::CpuPick;
use serde::Serialize;
use std::fmt;

/// How SYNs are steered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// eBPF when the kernel allows it (CAP_BPF), else SO_INCOMING_CPU.
    Auto,
    /// SK_REUSEPORT program + REUSEPORT_SOCKARRAY keyed by CPU (needs CAP_BPF).
    Ebpf,
    /// SO_INCOMING_CPU on each listener (unprivileged, Linux ≥ 6.2).
    IncomingCpu,
}

/// A refusal or failure, with what would work.
#[derive(Debug)]
pub struct SteerError(pub String);

impl fmt::Display for SteerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SteerError {}

fn err<T>(msg: impl Into<String>) -> Result<T, SteerError> {
    Err(SteerError(msg.into()))
}
