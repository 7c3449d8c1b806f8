//! Finding the server: discovery and planning, and duplicates of its listeners
//! (`pidfd_getfd`) with their facts (SO_REUSEPORT, socket cookie).

use super::SteerError;
use crate::discover::{self, Snapshot};
use crate::plan::{self, Plan, SockFacts};
use corelocal::sys::{pidfd, socket};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

/// Times a discovery is retried while a multi-threaded server's threads are running (their
/// listener is known only while they wait).
const THREAD_SAMPLES_MAX: u32 = 50;
/// Pause between those retries.
const THREAD_SAMPLE_PAUSE_MS: u64 = 10;

/// Open duplicates of the group listeners, by inode. Dropped as soon as an operation is done:
/// a held duplicate keeps a socket listening after its owner closed it.
pub struct Dups {
    fds: BTreeMap<u64, OwnedFd>,
}

impl Dups {
    pub(super) fn get(&self, inode: u64) -> Option<&OwnedFd> {
        self.fds.get(&inode)
    }
}

pub(super) fn no_ptrace(pid: u32, e: &std::io::Error) -> SteerError {
    SteerError(format!(
        "no ptrace access to pid {pid} ({e}): pidfd_getfd needs it to reach the listening \
         sockets; what would work: run as root or with CAP_SYS_PTRACE, or as the server's user \
         with kernel.yama.ptrace_scope = 0"
    ))
}

/// Some of the tree's descriptors could not be read.
fn unreadable(snap: &Snapshot) -> SteerError {
    let who: Vec<String> = snap
        .unreadable
        .iter()
        .take(8)
        .map(|pid| {
            let comm = snap
                .procs
                .iter()
                .find(|p| p.pid == *pid)
                .map_or("?", |p| p.comm.as_str());
            format!("{pid} ({comm})")
        })
        .collect();
    SteerError(format!(
        "no ptrace access to the descriptors of pid {} (Permission denied): reading another \
         user's /proc/PID/fd needs CAP_DAC_READ_SEARCH (to list it) and CAP_SYS_PTRACE (to read \
         it, and for pidfd_getfd); what would work: run as root, or with both capabilities",
        who.join(", ")
    ))
}

/// Takes duplicates of every listener the tree holds (those matching `filters`) and reads
/// their facts.
fn dup_listeners(
    snap: &Snapshot,
    filters: &[String],
) -> Result<(Dups, BTreeMap<u64, SockFacts>), SteerError> {
    let addr_of: BTreeMap<u64, std::net::SocketAddr> =
        snap.listeners.iter().map(|l| (l.inode, l.addr)).collect();
    let mut fds = BTreeMap::new();
    let mut facts = BTreeMap::new();
    let mut pidfds: BTreeMap<u32, OwnedFd> = BTreeMap::new();
    for p in &snap.procs {
        for &(fd, inode) in &p.sockets {
            let Some(addr) = addr_of.get(&inode) else {
                continue;
            };
            if fds.contains_key(&inode) || !plan::matches_filter(addr, filters) {
                continue;
            }
            if let std::collections::btree_map::Entry::Vacant(slot) = pidfds.entry(p.pid) {
                match pidfd::pidfd_open(p.pid) {
                    Ok(pfd) => {
                        slot.insert(pfd);
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
                    Err(e) => return Err(no_ptrace(p.pid, &e)),
                }
            }
            let dup = match pidfd::pidfd_getfd(&pidfds[&p.pid], fd) {
                Ok(d) => d,
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                    return Err(no_ptrace(p.pid, &e))
                }
                // Closed or exited since we looked: another holder may still have it.
                Err(_) => continue,
            };
            // The descriptor number may have been reused since /proc was read: check.
            let file = std::fs::File::from(dup);
            if file.metadata().map(|m| m.ino()).ok() != Some(inode) {
                continue;
            }
            let dup = OwnedFd::from(file);
            let Ok((_, reuseport)) = socket::tcp_listener_info(dup.as_raw_fd()) else {
                continue;
            };
            let Ok(cookie) = pidfd::socket_cookie(dup.as_raw_fd()) else {
                continue;
            };
            facts.insert(inode, SockFacts { reuseport, cookie });
            fds.insert(inode, dup);
        }
    }
    Ok((Dups { fds }, facts))
}

/// Discovers the server and plans. Retries while a threaded server's threads cannot be
/// placed yet.
pub fn discover(pid: u32, filters: &[String]) -> Result<(Plan, Dups), SteerError> {
    discover_cached(pid, filters, &mut discover::ParentCache::default())
}

/// [`discover()`] with a parent cache kept across calls (`watch`).
pub fn discover_cached(
    pid: u32,
    filters: &[String],
    cache: &mut discover::ParentCache,
) -> Result<(Plan, Dups), SteerError> {
    let online = discover::online_cpus();
    let mut tries = 0;
    loop {
        let snap = discover::snapshot_cached(pid, cache).map_err(|e| SteerError(e.to_string()))?;
        let (dups, facts) = dup_listeners(&snap, filters)?;
        let plan = plan::plan(&snap, &facts, &online, filters);
        if !snap.unreadable.is_empty() {
            // A process of the tree whose descriptors cannot be read may be a worker: a
            // plan without it would be wrong.
            return Err(unreadable(&snap));
        }
        let unresolved = plan.groups.iter().any(|g| {
            g.refusal
                .as_deref()
                .is_some_and(|r| r.contains("cannot be known (threads running"))
        });
        tries += 1;
        if !unresolved || tries >= THREAD_SAMPLES_MAX {
            return Ok((plan, dups));
        }
        drop(dups);
        std::thread::sleep(std::time::Duration::from_millis(THREAD_SAMPLE_PAUSE_MS));
    }
}
