//! `detach`: restoring the kernel's hash on each group.

use super::incoming::{incoming_state, set_incoming};
use super::maps::find_attached;
use super::{Dups, SteerError};
use crate::plan::Plan;
use corelocal::sys::socket;
use serde::Serialize;
use std::os::fd::AsRawFd;

/// What detach did to one group.
#[derive(Debug, Clone, Serialize)]
pub struct Detached {
    /// The group.
    pub addr: String,
    /// What was removed: `ebpf`, `incoming-cpu` or `nothing`.
    pub removed: &'static str,
}

/// Restores the kernel's hash: detaches our program (only ours) and clears SO_INCOMING_CPU
/// values that are the ones steer sets (each listener's worker CPU).
pub fn detach(plan: &Plan, dups: &Dups) -> Result<Vec<Detached>, SteerError> {
    let mut out = Vec::new();
    for g in &plan.groups {
        let mut removed = "nothing";
        // Without CAP_SYS_ADMIN our program cannot be found again: then only the
        // unprivileged path can be undone.
        let ours = find_attached(g).unwrap_or(None);
        if let Some(pick) = ours {
            let fd = g
                .listeners
                .iter()
                .find_map(|l| dups.get(l.inode))
                .ok_or_else(|| SteerError(format!("{}: no listener to detach from", g.addr)))?;
            socket::detach_reuseport_bpf(fd.as_raw_fd())
                .map_err(|e| SteerError(format!("{}: SO_DETACH_REUSEPORT_BPF: {e}", g.addr)))?;
            drop(pick);
            removed = "ebpf";
        }
        let incoming = incoming_state(g, dups);
        if incoming
            .iter()
            .any(|&(_, set, want)| set >= 0 && set == want)
        {
            set_incoming(g, dups, false)?;
            removed = if removed == "ebpf" {
                "ebpf+incoming-cpu"
            } else {
                "incoming-cpu"
            };
        }
        out.push(Detached {
            addr: g.addr.to_string(),
            removed,
        });
    }
    Ok(out)
}
