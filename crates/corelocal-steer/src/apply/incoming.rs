//! The unprivileged path: SO_INCOMING_CPU on each listener, set, cleared and read back.

use super::{Dups, SteerError};
use crate::plan::GroupPlan;
use corelocal::sys::{pidfd, socket};
use std::os::fd::AsRawFd;

/// Sets (or, `on = false`, clears) SO_INCOMING_CPU on the group's listeners: each to its
/// worker's CPU, -1 where there is none.
pub(super) fn set_incoming(g: &GroupPlan, dups: &Dups, on: bool) -> Result<usize, SteerError> {
    let mut writes = 0;
    for l in &g.listeners {
        let cpu = match (on, l.cpu) {
            (true, Some(cpu)) => cpu as i32,
            _ => -1,
        };
        let Some(fd) = dups.get(l.inode) else {
            continue;
        };
        if socket::incoming_cpu(fd.as_raw_fd()).ok() == Some(cpu) {
            continue;
        }
        pidfd::set_incoming_cpu(fd.as_raw_fd(), cpu)
            .map_err(|e| SteerError(format!("{}: SO_INCOMING_CPU: {e}", g.addr)))?;
        writes += 1;
    }
    Ok(writes)
}

/// Per listener: (inode, SO_INCOMING_CPU now, the CPU steer would set or -1).
pub(super) fn incoming_state(g: &GroupPlan, dups: &Dups) -> Vec<(u64, i32, i32)> {
    g.listeners
        .iter()
        .map(|l| {
            let now = dups
                .get(l.inode)
                .and_then(|fd| socket::incoming_cpu(fd.as_raw_fd()).ok())
                .unwrap_or(-1);
            let want = l.cpu.map_or(-1, |c| c as i32);
            (l.inode, now, want)
        })
        .collect()
}
