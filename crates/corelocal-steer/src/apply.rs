//! The I/O side: duplicates of the server's listeners (`pidfd_getfd`), the eBPF attachment
//! (`cl_cpu_pick` + its sockarray), the unprivileged SO_INCOMING_CPU path, and reading both
//! back for `status`, `detach` and `watch`.
//!
//! State lives in the kernel only: the program is held by the reuseport group it is attached
//! to, and another `corelocal` process finds it again by scanning loaded programs for the name
//! `cl_cpu_pick` and matching the socket cookies in its sockarray against the group's
//! listeners ([`CpuPick::find`]). Nothing is pinned in bpffs, so nothing outlives the group:
//! when the server closes its listeners, program and maps go away with them.

use crate::discover::{self, Snapshot};
use crate::plan::{self, GroupPlan, Plan, SockFacts};
use corelocal::bpf::cpu_pick::{CpuPick, PickCounts, WORKERS_PER_CPU_MAX};
use corelocal::sys::{pidfd, socket};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

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

/// Times a discovery is retried while a multi-threaded server's threads are running (their
/// listener is known only while they wait).
const THREAD_SAMPLES_MAX: u32 = 50;
/// Pause between those retries.
const THREAD_SAMPLE_PAUSE_MS: u64 = 10;
/// Sockarray slots: room for listeners created later (reloads) without a new program.
const SLOTS_MIN: u32 = 64;

/// Open duplicates of the group listeners, by inode. Dropped as soon as an operation is done:
/// a held duplicate keeps a socket listening after its owner closed it.
pub struct Dups {
    fds: BTreeMap<u64, OwnedFd>,
}

impl Dups {
    fn get(&self, inode: u64) -> Option<&OwnedFd> {
        self.fds.get(&inode)
    }
}

fn no_ptrace(pid: u32, e: &std::io::Error) -> SteerError {
    SteerError(format!(
        "no ptrace access to pid {pid} ({e}): pidfd_getfd needs it to reach the listening \
         sockets; what would work: run as root or with CAP_SYS_PTRACE, or as the server's user \
         with kernel.yama.ptrace_scope = 0"
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

/// [`discover`] with a parent cache kept across calls (`watch`).
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
        if plan.groups.is_empty() && !snap.unreadable.is_empty() {
            return Err(no_ptrace(
                snap.unreadable[0],
                &std::io::Error::from_raw_os_error(libc::EACCES),
            ));
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

/// Our program attached to a group, found again by cookie.
fn find_attached(group: &GroupPlan) -> Result<Option<CpuPick>, SteerError> {
    let cookies: Vec<u64> = group.listeners.iter().map(|l| l.cookie).collect();
    let ids = CpuPick::find().map_err(|e| {
        SteerError(format!(
            "cannot list BPF programs ({e}): reading another process's attachment needs \
             CAP_SYS_ADMIN"
        ))
    })?;
    for id in ids {
        let Ok(pick) = CpuPick::open(id) else {
            continue;
        };
        for slot in 0..pick.slots() {
            if let Ok(Some(c)) = pick.listener_cookie(slot) {
                if cookies.contains(&c) {
                    return Ok(Some(pick));
                }
            }
        }
    }
    Ok(None)
}

/// The CPU → listeners map a program holds, as CPU → cookies.
fn installed_map(pick: &CpuPick) -> BTreeMap<usize, Vec<u64>> {
    let mut out = BTreeMap::new();
    for cpu in 0..pick.cpu_slots().min(discover::possible_cpus() as u32) {
        let cookies: Vec<u64> = pick
            .cpu_slots_of(cpu)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|slot| pick.listener_cookie(slot).ok().flatten())
            .collect();
        if !cookies.is_empty() {
            out.insert(cpu as usize, cookies);
        }
    }
    out
}

/// The CPU → cookies map a plan wants.
pub fn wanted_map(group: &GroupPlan) -> BTreeMap<usize, Vec<u64>> {
    group
        .cpu_map
        .iter()
        .map(|(&cpu, ls)| {
            let cookies = ls
                .iter()
                .take(WORKERS_PER_CPU_MAX as usize)
                .map(|&i| group.listeners[i].cookie)
                .collect();
            (cpu, cookies)
        })
        .collect()
}

/// Makes `pick`'s maps match `group`: listener slots (kept where already placed) and the CPU
/// map. Returns the number of entries written.
fn sync_maps(pick: &CpuPick, group: &GroupPlan, dups: &Dups) -> Result<usize, SteerError> {
    let bpf = |e: corelocal::bpf::BpfError| SteerError(format!("{}: {e}", group.addr));
    let mut writes = 0;
    let mut slot_of: BTreeMap<u64, u32> = BTreeMap::new();
    let mut free = Vec::new();
    for slot in 0..pick.slots() {
        match pick.listener_cookie(slot).map_err(bpf)? {
            Some(c) if group.listeners.iter().any(|l| l.cookie == c) => {
                slot_of.insert(c, slot);
            }
            Some(_) => {
                // A socket no longer in the server's tree (held elsewhere): drop it.
                pick.clear_listener(slot).map_err(bpf)?;
                writes += 1;
                free.push(slot);
            }
            None => free.push(slot),
        }
    }
    free.reverse();
    for l in &group.listeners {
        if slot_of.contains_key(&l.cookie) {
            continue;
        }
        let Some(slot) = free.pop() else {
            return err(format!(
                "{}: more listeners than the {} sockarray slots; detach and attach again",
                group.addr,
                pick.slots()
            ));
        };
        let Some(fd) = dups.get(l.inode) else {
            continue;
        };
        pick.set_listener(slot, fd.as_raw_fd()).map_err(|e| {
            SteerError(format!(
                "{}: listener inode {} cannot enter our sockarray ({e}); EBUSY means it \
                 already sits in another program's sockarray",
                group.addr, l.inode
            ))
        })?;
        writes += 1;
        slot_of.insert(l.cookie, slot);
    }
    let cpus = pick.cpu_slots().min(discover::possible_cpus() as u32);
    for cpu in 0..cpus {
        let want: Vec<u32> = group
            .cpu_map
            .get(&(cpu as usize))
            .map(|ls| {
                ls.iter()
                    .take(WORKERS_PER_CPU_MAX as usize)
                    .filter_map(|&i| slot_of.get(&group.listeners[i].cookie).copied())
                    .collect()
            })
            .unwrap_or_default();
        if pick.cpu_slots_of(cpu).map_err(bpf)? != want {
            pick.map_cpu(cpu, &want).map_err(bpf)?;
            writes += 1;
        }
    }
    Ok(writes)
}

/// What attach did to one group.
#[derive(Debug, Clone, Serialize)]
pub struct Attached {
    /// The group.
    pub addr: String,
    /// `ebpf` or `incoming-cpu`.
    pub method: &'static str,
    /// The program id (eBPF).
    pub prog_id: Option<u32>,
    /// Whether an already attached `cl_cpu_pick` was updated instead of a new one attached.
    pub updated: bool,
    /// Map or socket-option writes done.
    pub writes: usize,
}

/// Why eBPF is unavailable, if it is (tries to load the program).
fn load_pick(slots: u32) -> Result<CpuPick, corelocal::bpf::BpfError> {
    CpuPick::load(slots, discover::possible_cpus() as u32)
}

/// Attaches (or updates) steering for every group of the plan. Nothing changes unless every
/// group can be steered.
pub fn attach(
    plan: &Plan,
    dups: &Dups,
    method: Method,
    log: &mut dyn FnMut(String),
) -> Result<Vec<Attached>, SteerError> {
    if plan.groups.is_empty() {
        return err(format!(
            "pid {}: no listening TCP socket (matching --listen) in its process tree",
            plan.pid
        ));
    }
    let refusals = plan.refusals();
    if !refusals.is_empty() {
        return err(format!(
            "refused, nothing changed:\n  {}",
            refusals.join("\n  ")
        ));
    }
    let method = resolve_method(method, log)?;
    let mut out = Vec::new();
    if method == Method::IncomingCpu {
        for g in &plan.groups {
            let writes = set_incoming(g, dups, true)?;
            out.push(Attached {
                addr: g.addr.to_string(),
                method: "incoming-cpu",
                prog_id: None,
                updated: false,
                writes,
            });
        }
        return Ok(out);
    }
    // Load every new program before touching any group, so a failure changes nothing.
    let mut work = Vec::new();
    for g in &plan.groups {
        match find_attached(g)? {
            Some(pick) => work.push((g, pick, true)),
            None => {
                let slots = (4 * g.listeners.len() as u32).max(SLOTS_MIN);
                let pick = load_pick(slots).map_err(|e| SteerError(e.to_string()))?;
                work.push((g, pick, false));
            }
        }
    }
    for (g, pick, updated) in work {
        let writes = sync_maps(&pick, g, dups)?;
        if !updated {
            log(format!(
                "warning: {}: attaching replaces any reuseport program the server attached \
                 itself (the kernel cannot show one; nginx attaches none to TCP listeners)",
                g.addr
            ));
            let first = g
                .listeners
                .iter()
                .find_map(|l| dups.get(l.inode))
                .ok_or_else(|| SteerError(format!("{}: no listener left to attach to", g.addr)))?;
            socket::attach_reuseport_ebpf(first.as_raw_fd(), pick.program_fd())
                .map_err(|e| SteerError(format!("{}: SO_ATTACH_REUSEPORT_EBPF: {e}", g.addr)))?;
        }
        out.push(Attached {
            addr: g.addr.to_string(),
            method: "ebpf",
            prog_id: Some(pick.prog_id()),
            updated,
            writes,
        });
    }
    Ok(out)
}

fn resolve_method(method: Method, log: &mut dyn FnMut(String)) -> Result<Method, SteerError> {
    let incoming_ok = socket::kernel_version().is_none_or(|v| v >= (6, 2));
    match method {
        Method::IncomingCpu if !incoming_ok => err(
            "SO_INCOMING_CPU steering needs Linux ≥ 6.2 (broken in 4.6–6.1); what would work: \
             --method ebpf with CAP_BPF",
        ),
        Method::IncomingCpu => Ok(method),
        Method::Ebpf | Method::Auto => match load_pick(1) {
            Ok(_) => Ok(Method::Ebpf),
            Err(e) if e.is_permission() && method == Method::Auto && incoming_ok => {
                log(format!(
                    "no CAP_BPF ({}): using the unprivileged path, SO_INCOMING_CPU on each \
                     listener (Linux ≥ 6.2; O(listeners) per SYN, no counters)",
                    e.source
                ));
                Ok(Method::IncomingCpu)
            }
            Err(e) if e.is_permission() => err(format!(
                "eBPF steering needs CAP_BPF ({}); what would work: run as root or with \
                 CAP_BPF, or --method incoming-cpu (unprivileged, Linux ≥ 6.2)",
                e.source
            )),
            Err(e) => err(e.to_string()),
        },
    }
}

/// Sets (or, `on = false`, clears) SO_INCOMING_CPU on the group's listeners: each to its
/// worker's CPU, -1 where there is none.
fn set_incoming(g: &GroupPlan, dups: &Dups, on: bool) -> Result<usize, SteerError> {
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

/// Per listener: (inode, SO_INCOMING_CPU now, the CPU steer would set or -1).
fn incoming_state(g: &GroupPlan, dups: &Dups) -> Vec<(u64, i32, i32)> {
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

/// One CPU's counters in `status`.
#[derive(Debug, Clone, Serialize)]
pub struct CpuCounts {
    /// The CPU.
    pub cpu: usize,
    /// SYNs steered to the listener of the worker pinned there.
    pub steered: u64,
    /// SYNs that fell back to the kernel's hash.
    pub fallback: u64,
    /// Of those: no worker mapped to this CPU.
    pub no_worker: u64,
    /// Of those: the mapped listener was closed.
    pub listener_gone: u64,
}

/// `status` of one group.
#[derive(Debug, Clone, Serialize)]
pub struct GroupStatus {
    /// The plan (listeners, workers, CPU map, notes) as discovered now.
    pub group: GroupPlan,
    /// `ebpf`, `incoming-cpu` or `hash` (nothing attached by steer).
    pub method: &'static str,
    /// The program id (eBPF).
    pub prog_id: Option<u32>,
    /// Per-CPU counters (eBPF).
    pub counts: Vec<CpuCounts>,
    /// Whether the installed CPU map differs from what the server looks like now.
    pub stale: bool,
    /// What differs, when stale.
    pub stale_detail: Vec<String>,
    /// Why an eBPF attachment could not be looked for (no CAP_SYS_ADMIN).
    pub ebpf_unreadable: Option<String>,
}

/// Reads back what is attached to each group of the plan.
pub fn status(plan: &Plan, dups: &Dups) -> Result<Vec<GroupStatus>, SteerError> {
    let mut out = Vec::new();
    for g in &plan.groups {
        let want = wanted_map(g);
        let cookie_inode: BTreeMap<u64, u64> =
            g.listeners.iter().map(|l| (l.cookie, l.inode)).collect();
        let describe = |m: &BTreeMap<usize, Vec<u64>>| -> String {
            m.iter()
                .map(|(c, ks)| {
                    let inodes: Vec<String> = ks
                        .iter()
                        .map(|k| {
                            cookie_inode
                                .get(k)
                                .map_or("?".to_string(), |i| i.to_string())
                        })
                        .collect();
                    format!("cpu {c}→inode {}", inodes.join("+"))
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (pick, unreadable) = match find_attached(g) {
            Ok(p) => (p, None),
            Err(e) => (None, Some(e.0)),
        };
        let mut st = GroupStatus {
            group: g.clone(),
            method: "hash",
            prog_id: None,
            counts: Vec::new(),
            stale: false,
            stale_detail: Vec::new(),
            ebpf_unreadable: unreadable,
        };
        if let Some(pick) = pick {
            st.method = "ebpf";
            st.prog_id = Some(pick.prog_id());
            let counts = pick
                .counts(discover::possible_cpus())
                .map_err(|e| SteerError(e.to_string()))?;
            st.counts = counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c != PickCounts::default())
                .map(|(cpu, c)| CpuCounts {
                    cpu,
                    steered: c.steered,
                    fallback: c.fallback(),
                    no_worker: c.no_worker,
                    listener_gone: c.listener_gone,
                })
                .collect();
            let have = installed_map(&pick);
            if have != want {
                st.stale = true;
                st.stale_detail.push(format!(
                    "installed: {}; the server now: {} (run `corelocal steer attach` again, or \
                     keep `corelocal steer watch` running)",
                    describe(&have),
                    describe(&want)
                ));
            }
        } else {
            let inc = incoming_state(g, dups);
            if inc.iter().any(|&(_, now, _)| now >= 0) {
                st.method = "incoming-cpu";
                let bad: Vec<String> = inc
                    .iter()
                    .filter(|&&(_, now, want)| now != want)
                    .map(|(i, now, want)| format!("inode {i}: set {now}, worker cpu {want}"))
                    .collect();
                if !bad.is_empty() {
                    st.stale = true;
                    st.stale_detail = bad;
                }
            }
        }
        out.push(st);
    }
    Ok(out)
}

/// A loaded `cl_cpu_pick` program: (program id, cookies of the listeners in its sockarray,
/// per-CPU counters).
pub type LoadedProgram = (u32, Vec<u64>, Vec<PickCounts>);

/// All `cl_cpu_pick` programs loaded on the host with their counters (for `status` without
/// `--pid`).
pub fn programs() -> Result<Vec<LoadedProgram>, SteerError> {
    let ids = CpuPick::find().map_err(|e| SteerError(format!("listing programs: {e}")))?;
    let mut out = Vec::new();
    for id in ids {
        let Ok(pick) = CpuPick::open(id) else {
            continue;
        };
        let cookies = (0..pick.slots())
            .filter_map(|s| pick.listener_cookie(s).ok().flatten())
            .collect();
        let counts = pick
            .counts(discover::possible_cpus())
            .map_err(|e| SteerError(e.to_string()))?;
        out.push((id, cookies, counts));
    }
    Ok(out)
}

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
