//! Accept locality of the live server: how many of each pinned worker's connections have
//! their packets processed on its CPU.

use super::dups::no_ptrace;
use super::SteerError;
use crate::plan::Plan;
use corelocal::sys::{pidfd, socket};
use serde::Serialize;
use std::collections::BTreeMap;
use std::os::fd::AsRawFd;

/// Most connections inspected by one [`connection_locality`] call.
pub const CONNS_INSPECTED_MAX: usize = 20_000;

/// Locality of one worker's established connections.
#[derive(Debug, Clone, Serialize)]
pub struct ConnLocality {
    /// Worker process.
    pub pid: u32,
    /// The CPU it is pinned to.
    pub cpu: usize,
    /// Its established TCP connections inspected.
    pub conns: u64,
    /// Of those, processed on its CPU (`SO_INCOMING_CPU` of the connection = the worker's CPU).
    pub local: u64,
}

/// For each pinned process-level worker of the plan: how many of its open TCP connections
/// have their packets processed on the worker's CPU (`SO_INCOMING_CPU` of a duplicate). With
/// loopback or RPS the CPU that processed a connection's packets is the one that processed
/// its SYN, so this is the locality of accept, measured on the live server. Bounded by
/// [`CONNS_INSPECTED_MAX`].
pub fn connection_locality(plan: &Plan) -> Result<Vec<ConnLocality>, SteerError> {
    let listeners: std::collections::BTreeSet<u64> = plan
        .groups
        .iter()
        .flat_map(|g| g.listeners.iter().map(|l| l.inode))
        .collect();
    let mut workers: BTreeMap<u32, usize> = BTreeMap::new();
    for g in &plan.groups {
        for l in &g.listeners {
            for w in &l.workers {
                if let (None, Some(cpu)) = (w.tid, w.cpu) {
                    workers.insert(w.pid, cpu);
                }
            }
        }
    }
    let mut budget = CONNS_INSPECTED_MAX;
    let mut out = Vec::new();
    for (pid, cpu) in workers {
        let Ok(pfd) = pidfd::pidfd_open(pid) else {
            continue;
        };
        let mut row = ConnLocality {
            pid,
            cpu,
            conns: 0,
            local: 0,
        };
        let dir = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
            Ok(d) => d,
            Err(_) => continue,
        };
        for entry in dir.flatten() {
            if budget == 0 {
                break;
            }
            let Some(fd) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(link) = std::fs::read_link(entry.path()) else {
                continue;
            };
            let crate::procscan::FdKind::Socket(inode) =
                crate::procscan::parse_fd_link(&link.to_string_lossy())
            else {
                continue;
            };
            if listeners.contains(&inode) {
                continue;
            }
            let dup = match pidfd::pidfd_getfd(&pfd, fd) {
                Ok(d) => d,
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => return Err(no_ptrace(pid, &e)),
                Err(_) => continue,
            };
            budget -= 1;
            // Only TCP connections (not listeners, not unix sockets).
            if pidfd::is_tcp_connection(dup.as_raw_fd()) {
                if let Ok(c) = socket::incoming_cpu(dup.as_raw_fd()) {
                    row.conns += 1;
                    row.local += u64::from(c >= 0 && c as usize == cpu);
                }
            }
        }
        out.push(row);
    }
    Ok(out)
}
