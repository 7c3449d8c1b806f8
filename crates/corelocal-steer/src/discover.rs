//! Reads a server's process tree from `/proc` into a [`Snapshot`]: its processes and threads
//! (with CPU affinity and, for multi-threaded processes, what each thread is blocked in), the
//! sockets and epoll instances each holds, and the listening TCP sockets of its network
//! namespace. Bounded: at most [`PROCS_MAX`] processes, [`FDS_MAX`] descriptors and
//! [`TASKS_MAX`] threads per process.

use crate::procscan::{self, EpollTarget, FdKind, ListenEntry, Waits};
use corelocal::cpu::CpuSet;
use corelocal::procfs::read_text;
use corelocal::sys::pidfd;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// Most processes in one server tree.
pub const PROCS_MAX: usize = 4096;
/// Most descriptors read per process.
pub const FDS_MAX: usize = 65_536;
/// Most threads read per process.
pub const TASKS_MAX: usize = 1024;
/// Most processes on the host scanned to find children.
pub const HOST_PROCS_MAX: usize = 1 << 20;

/// One thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// Thread id.
    pub tid: u32,
    /// CPUs it may run on.
    pub affinity: CpuSet,
    /// What it was blocked in when sampled (multi-threaded processes only).
    pub waits: Option<Waits>,
}

/// One process of the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    /// Process id.
    pub pid: u32,
    /// Parent process id.
    pub ppid: u32,
    /// Command name.
    pub comm: String,
    /// Start time (clock ticks since boot): tells a respawned process from the old one.
    pub start_ticks: u64,
    /// Its threads (the main thread first).
    pub tasks: Vec<Task>,
    /// Socket descriptors: (fd, inode).
    pub sockets: Vec<(i32, u64)>,
    /// Epoll descriptors and their interest lists.
    pub epolls: Vec<(i32, Vec<EpollTarget>)>,
    /// BPF program descriptors it holds: (fd, `prog_type`, `prog_id`) from their fdinfo.
    pub bpf_progs: Vec<(i32, u32, u32)>,
}

impl Proc {
    /// Affinity of the main thread (or, if it is gone, the union of all threads').
    pub fn affinity(&self) -> CpuSet {
        self.tasks
            .iter()
            .find(|t| t.tid == self.pid)
            .map(|t| t.affinity.clone())
            .unwrap_or_else(|| {
                self.tasks
                    .iter()
                    .fold(CpuSet::new(), |a, t| a.union(&t.affinity))
            })
    }
}

/// A server's process tree and the listeners of its network namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The PID given on the command line.
    pub root: u32,
    /// The root and its descendants, root first.
    pub procs: Vec<Proc>,
    /// Listening TCP sockets (v4 and v6) of the root's network namespace.
    pub listeners: Vec<ListenEntry>,
    /// Processes whose descriptors could not be read (no ptrace access).
    pub unreadable: Vec<u32>,
}

/// Discovery failed.
#[derive(Debug)]
pub struct DiscoverError(pub String);

impl fmt::Display for DiscoverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DiscoverError {}

/// Parents of the host's processes, kept between scans (`watch`): each scan lists `/proc` and
/// reads `stat` only for processes it has not seen, so a re-scan costs a directory listing
/// plus the server's own processes.
#[derive(Debug, Default)]
pub struct ParentCache {
    ppid: BTreeMap<u32, u32>,
}

/// Reads the tree rooted at `root` from `/proc`.
pub fn snapshot(root: u32) -> Result<Snapshot, DiscoverError> {
    snapshot_cached(root, &mut ParentCache::default())
}

/// [`snapshot`] with a [`ParentCache`] kept by the caller.
pub fn snapshot_cached(root: u32, cache: &mut ParentCache) -> Result<Snapshot, DiscoverError> {
    let proc = Path::new("/proc");
    let stat = read_text(&proc.join(root.to_string()).join("stat"))
        .map_err(|e| DiscoverError(format!("process {root}: {e}")))?;
    let Some((_, _)) = procscan::parse_stat_parent(&stat) else {
        return Err(DiscoverError(format!("process {root}: unreadable stat")));
    };
    let pids = tree(root, cache)?;
    let mut procs = Vec::new();
    let mut unreadable = Vec::new();
    for pid in pids {
        // A process can exit while we read it: skip it.
        if let Some((p, readable)) = read_proc(pid) {
            if !readable {
                unreadable.push(pid);
            }
            procs.push(p);
        }
    }
    let listeners = listeners_of(root);
    Ok(Snapshot {
        root,
        procs,
        listeners,
        unreadable,
    })
}

/// Listening TCP sockets of `pid`'s network namespace: by sock_diag when it is ours (cheap),
/// else from `/proc/PID/net/tcp[6]` (which walks the whole established hash).
fn listeners_of(pid: u32) -> Vec<ListenEntry> {
    use std::os::unix::fs::MetadataExt;
    let ns = |p: &str| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
    let same_netns = ns("/proc/self/ns/net").is_some()
        && ns("/proc/self/ns/net") == ns(&format!("/proc/{pid}/ns/net"));
    if same_netns {
        if let Ok(found) = corelocal::sys::sockdiag::tcp_listeners() {
            return found
                .into_iter()
                .map(|d| ListenEntry {
                    inode: d.inode,
                    addr: d.addr,
                })
                .collect();
        }
    }
    let mut listeners = Vec::new();
    for (file, v6) in [("tcp", false), ("tcp6", true)] {
        let path = Path::new("/proc")
            .join(pid.to_string())
            .join("net")
            .join(file);
        if let Ok(text) = read_text(&path) {
            listeners.extend(procscan::parse_net_tcp(&text, v6));
        }
    }
    listeners
}

/// `root` and its descendants (breadth first), from every process's parent.
fn tree(root: u32, cache: &mut ParentCache) -> Result<Vec<u32>, DiscoverError> {
    let dir = std::fs::read_dir("/proc").map_err(|e| DiscoverError(format!("/proc: {e}")))?;
    let mut seen = BTreeMap::new();
    for entry in dir.flatten().take(HOST_PROCS_MAX) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let ppid = match cache.ppid.get(&pid) {
            Some(&p) => p,
            None => {
                let Ok(text) = read_text(&entry.path().join("stat")) else {
                    continue;
                };
                let Some((ppid, _)) = procscan::parse_stat_parent(&text) else {
                    continue;
                };
                ppid
            }
        };
        seen.insert(pid, ppid);
    }
    // Processes that exited leave the cache (a reused PID is read afresh next time it shows
    // up as new; one reused within a single interval is caught by the start-time check in
    // `watch`, which compares whole snapshots).
    cache.ppid = seen;
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (&pid, &ppid) in &cache.ppid {
        children.entry(ppid).or_default().push(pid);
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() && out.len() < PROCS_MAX {
        if let Some(kids) = children.get(&out[i]) {
            out.extend(kids.iter().copied().take(PROCS_MAX - out.len()));
        }
        i += 1;
    }
    Ok(out)
}

/// The process, and whether its descriptors were readable.
fn read_proc(pid: u32) -> Option<(Proc, bool)> {
    let base = Path::new("/proc").join(pid.to_string());
    let stat = read_text(&base.join("stat")).ok()?;
    let (ppid, comm) = procscan::parse_stat_parent(&stat)?;
    let start_ticks = procscan::parse_stat_start_ticks(&stat).unwrap_or(0);
    let mut tids: Vec<u32> = std::fs::read_dir(base.join("task"))
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .take(TASKS_MAX)
        .collect();
    tids.sort_by_key(|&t| (t != pid, t));
    let threaded = tids.len() > 1;
    let tasks = tids
        .into_iter()
        .filter_map(|tid| {
            let affinity = pidfd::affinity_of(tid).ok()?;
            let waits = if threaded {
                read_text(&base.join("task").join(tid.to_string()).join("syscall"))
                    .ok()
                    .and_then(|t| procscan::parse_syscall(&t))
                    .and_then(procscan::waits_on)
            } else {
                None
            };
            Some(Task {
                tid,
                affinity,
                waits,
            })
        })
        .collect();
    let mut sockets = Vec::new();
    let mut epolls = Vec::new();
    let mut bpf_progs = Vec::new();
    let fd_dir = std::fs::read_dir(base.join("fd"));
    // Listing the directory needs DAC access (another user's process: CAP_DAC_READ_SEARCH),
    // reading each link needs ptrace access (CAP_SYS_PTRACE): either refused → unreadable.
    let mut readable =
        !matches!(&fd_dir, Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied);
    if let Ok(dir) = fd_dir {
        for entry in dir.flatten().take(FDS_MAX) {
            let Some(fd) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let link = match std::fs::read_link(entry.path()) {
                Ok(l) => l,
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    readable = false;
                    break;
                }
                Err(_) => continue,
            };
            match procscan::parse_fd_link(&link.to_string_lossy()) {
                FdKind::Socket(inode) => sockets.push((fd, inode)),
                FdKind::Epoll => {
                    let info =
                        read_text(&base.join("fdinfo").join(fd.to_string())).unwrap_or_default();
                    epolls.push((fd, procscan::parse_epoll_fdinfo(&info)));
                }
                FdKind::BpfProg => {
                    let info =
                        read_text(&base.join("fdinfo").join(fd.to_string())).unwrap_or_default();
                    if let Some((prog_type, prog_id)) = procscan::parse_bpf_prog_fdinfo(&info) {
                        bpf_progs.push((fd, prog_type, prog_id));
                    }
                }
                FdKind::Other => {}
            }
        }
    }
    sockets.sort_unstable();
    epolls.sort_by_key(|e| e.0);
    Some((
        Proc {
            pid,
            ppid,
            comm,
            start_ticks,
            tasks,
            sockets,
            epolls,
            bpf_progs,
        },
        readable,
    ))
}

/// What a server tree looks like cheaply: each process (PID, start time) and each of its
/// threads' affinity. Reloads, respawns and affinity changes all change it; `watch` runs a
/// full discovery only then (and every few seconds regardless).
pub type Fingerprint = Vec<(u32, u64, Vec<(u32, CpuSet)>)>;

/// The tree's [`Fingerprint`]: a `/proc` listing plus `stat` and `sched_getaffinity` of the
/// server's own processes and threads.
pub fn fingerprint(root: u32, cache: &mut ParentCache) -> Result<Fingerprint, DiscoverError> {
    let mut out = Vec::new();
    for pid in tree(root, cache)? {
        let base = Path::new("/proc").join(pid.to_string());
        let Some(start) = read_text(&base.join("stat"))
            .ok()
            .and_then(|t| procscan::parse_stat_start_ticks(&t))
        else {
            continue;
        };
        let mut tasks: Vec<(u32, CpuSet)> = std::fs::read_dir(base.join("task"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                    .take(TASKS_MAX)
                    .filter_map(|tid| Some((tid, pidfd::affinity_of(tid).ok()?)))
                    .collect()
            })
            .unwrap_or_default();
        tasks.sort_by_key(|t| t.0);
        out.push((pid, start, tasks));
    }
    Ok(out)
}

/// The CPUs that are online (`/sys/devices/system/cpu/online`), or the calling thread's
/// affinity if that cannot be read.
pub fn online_cpus() -> CpuSet {
    read_text(Path::new("/sys/devices/system/cpu/online"))
        .ok()
        .and_then(|t| CpuSet::parse_list(t.trim()).ok())
        .or_else(|| corelocal::sys::affinity::get_current().ok())
        .unwrap_or_else(|| CpuSet::single(0))
}

/// Number of possible CPUs (per-CPU map values come in this many copies).
pub fn possible_cpus() -> usize {
    read_text(Path::new("/sys/devices/system/cpu/possible"))
        .ok()
        .and_then(|t| CpuSet::parse_list(t.trim()).ok())
        .and_then(|s| s.max())
        .map_or(1, |m| m + 1)
}
