//! `steer watch`: keep the CPU → listener mapping right while the server changes — reloads,
//! respawned workers, affinity changes, binary upgrades (a new master) and full restarts (a
//! new process found again by PID file or systemd unit) — and say what happened, one
//! [`Event`] per change.

use crate::apply::{self, Method, SteerError};
use crate::discover::{self, ParentCache};
use crate::plan;
use crate::target::{alive, PidSource};
use corelocal_proto::http::date::civil_from_days;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A full discovery runs at least this often, even when no process changed (catches new
/// listeners opened by a running process, workers that stopped or started polling one, and
/// our program replaced or detached by someone else).
pub const FULL_SCAN_EVERY: Duration = Duration::from_secs(2);
/// After the processes changed, every tick runs a full discovery for this long.
pub const SETTLE: Duration = Duration::from_secs(1);

/// Wall-clock time of day (UTC) with milliseconds, for text log lines.
pub fn clock() -> String {
    let (_, h, m, s, ms) = now_parts();
    format!("{h:02}:{m:02}:{s:02}.{ms:03}")
}

/// RFC 3339 UTC timestamp with milliseconds, for JSON log lines.
pub fn timestamp() -> String {
    let ((y, mo, d), h, m, s, ms) = now_parts();
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}.{ms:03}Z")
}

type Parts = ((i64, u32, u32), u64, u64, u64, u64);

fn now_parts() -> Parts {
    let ms_total = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let secs = ms_total / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    (
        civil_from_days(days),
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        ms_total % 1000,
    )
}

/// One thing `watch` did or saw. `--json` prints each as one line.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// RFC 3339 UTC time.
    pub ts: String,
    /// What: `target` (a server process found or changed), `attached`, `resynced`,
    /// `refused`, `failed`, `foreign` (someone else's program is on the group), `gone`
    /// (the server exited), `waiting`, `note`, `warning`, `detached`, `stopping`.
    pub event: &'static str,
    /// The server's PID followed (its master), when known.
    pub pid: Option<u32>,
    /// The group, for group events.
    pub group: Option<String>,
    /// The human-readable line.
    pub message: String,
}

impl Event {
    /// An event of the balancer (`busy`, `recovered`, `redirect`, `home`).
    pub(crate) fn for_balance(
        event: &'static str,
        pid: u32,
        group: SocketAddr,
        msg: String,
    ) -> Self {
        Event::new(event, Some(pid), Some(group), msg)
    }

    fn new(event: &'static str, pid: Option<u32>, group: Option<SocketAddr>, msg: String) -> Self {
        Event {
            ts: timestamp(),
            event,
            pid,
            group: group.map(|g| g.to_string()),
            message: msg,
        }
    }
}

/// Why `watch` returned without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// Asked to (a signal, `--duration-s`).
    Asked,
    /// The server exited and the PID source cannot name another (`--pid`, no new master).
    TargetExited,
}

/// What `watch` does.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    /// Where the server's PID comes from.
    pub source: PidSource,
    /// `--listen` filters.
    pub filters: Vec<String>,
    /// How to steer.
    pub method: Method,
    /// Re-scan period.
    pub interval: Duration,
    /// Replace a reuseport program steer did not attach.
    pub force: bool,
    /// How long to wait for the server to appear at start (PID file or unit) before giving up.
    pub start_timeout: Duration,
    /// Detach on a requested stop (the unit's `ExecStop` semantics: stopping the service
    /// restores the kernel's hash).
    pub detach_on_exit: bool,
    /// Route a busy worker's SYNs to other workers ([`crate::balance`]); eBPF groups only.
    pub balance: bool,
}

impl WatchConfig {
    /// Defaults: every group, `auto`, 100 ms, no force, 30 s start timeout, leave in place.
    pub fn new(source: PidSource) -> Self {
        WatchConfig {
            source,
            filters: Vec::new(),
            method: Method::Auto,
            interval: Duration::from_millis(100),
            force: false,
            start_timeout: Duration::from_secs(30),
            detach_on_exit: false,
            balance: true,
        }
    }
}

/// One group as `watch` last left it, for `--metrics`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GroupState {
    /// `ebpf`, `incoming-cpu`, `refused`, `foreign`.
    pub method: String,
    /// Our program's id (eBPF).
    pub prog_id: Option<u32>,
    /// Listeners in the group.
    pub listeners: usize,
    /// CPUs with a worker pinned there.
    pub cpus_mapped: usize,
}

/// What `watch` is doing, shared with the metrics endpoint.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WatchState {
    /// The server PID followed now.
    pub pid: Option<u32>,
    /// Groups by address.
    pub groups: BTreeMap<String, GroupState>,
    /// Attachments made (a new program or SO_INCOMING_CPU set on a fresh group).
    pub attaches: u64,
    /// Re-syncs of an attached group after the server changed.
    pub resyncs: u64,
    /// Times the followed process changed (upgrade, restart).
    pub target_changes: u64,
    /// Failed attempts (refusals after start, errors).
    pub failures: u64,
    /// The balancer's view per group (busy workers, redirected CPUs), when it runs.
    pub balance: BTreeMap<String, crate::balance::GroupState>,
}

/// What `watch` remembers across ticks and across the processes it follows: per group, the
/// CPU → cookie map last installed, and the refusal or failure last logged (each is logged
/// once); the listeners of the last full scan (to find the process that holds them next).
#[derive(Default)]
struct Memory {
    /// What the balancer balances, per group, as last known with every worker's thread
    /// (kept while a re-scan cannot tell a busy thread's listener: exactly when it matters).
    balanced: BTreeMap<SocketAddr, crate::balance::Group>,
    applied: BTreeMap<SocketAddr, BTreeMap<usize, Vec<u64>>>,
    refused: BTreeMap<SocketAddr, String>,
    listeners: BTreeSet<u64>,
}

/// Per-followed-process scanning state.
struct Session {
    root: u32,
    cache: ParentCache,
    last_print: Option<discover::Fingerprint>,
    last_full: Instant,
    settle_until: Instant,
}

impl Session {
    fn new(root: u32) -> Self {
        Session {
            root,
            cache: ParentCache::default(),
            // The first tick's fingerprint differs from `None`: it runs a full discovery.
            last_print: None,
            last_full: Instant::now(),
            settle_until: Instant::now() + SETTLE,
        }
    }
}

/// The process that carries on after `root` exited: of the processes last seen in its tree,
/// the alive ones that still have children of that tree (a new master after an nginx binary
/// upgrade, whose parent was the old master), when there is exactly one such topmost one;
/// failing that (the upgrade went faster than a tick), the topmost of the processes that
/// now hold the listeners last seen ([`holders`]).
fn heir(last: &discover::Fingerprint, root: u32, listeners: &BTreeSet<u64>) -> Option<u32> {
    heir_in_tree(last, root).or_else(|| {
        let held = holders(listeners);
        let top: Vec<u32> = held
            .iter()
            .filter(|(_, ppid)| !held.contains_key(ppid))
            .map(|(&pid, _)| pid)
            .collect();
        (top.len() == 1).then(|| top[0])
    })
}

/// Live processes holding a descriptor of one of `inodes` (sockets), with their parents: a
/// walk over every process's `/proc/PID/fd` (bounded by [`discover::HOST_PROCS_MAX`] and
/// [`discover::FDS_MAX`]), done only when the followed server exited.
fn holders(inodes: &BTreeSet<u64>) -> BTreeMap<u32, u32> {
    let mut out = BTreeMap::new();
    if inodes.is_empty() {
        return out;
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten().take(discover::HOST_PROCS_MAX) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().take(discover::FDS_MAX).any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|l| {
                matches!(
                    crate::procscan::parse_fd_link(&l.to_string_lossy()),
                    crate::procscan::FdKind::Socket(i) if inodes.contains(&i)
                )
            })
        });
        if holds && alive(pid) {
            let ppid = std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .and_then(|t| crate::procscan::parse_stat_parent(&t))
                .map_or(0, |(pp, _)| pp);
            out.insert(pid, ppid);
        }
    }
    out
}

fn heir_in_tree(last: &discover::Fingerprint, root: u32) -> Option<u32> {
    let pids: BTreeSet<u32> = last.iter().map(|(p, _, _)| *p).collect();
    let parent = |pid: u32| -> Option<u32> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        crate::procscan::parse_stat_parent(&text).map(|(pp, _)| pp)
    };
    let masters: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|&p| p != root && alive(p))
        .filter(|&p| {
            pids.iter()
                .any(|&c| c != p && alive(c) && parent(c) == Some(p))
        })
        .collect();
    let top: Vec<u32> = masters
        .iter()
        .copied()
        .filter(|&m| !parent(m).is_some_and(|pp| masters.contains(&pp)))
        .collect();
    (top.len() == 1).then(|| top[0])
}

/// Runs until `pause` says stop, or the server exits for good. Each tick (`interval`): the
/// PID source is looked at (a PID file or unit may name a new master), the followed tree's
/// processes and affinities are fingerprinted ([`discover::fingerprint`]), and a full
/// discovery runs only when that changed, while new workers settle, or every
/// [`FULL_SCAN_EVERY`]; a group whose CPU → listener map changed is re-synced with the few
/// writes needed. `pause(d)` sleeps up to `d` and returns true when watch must stop.
///
/// Errors only at start (the first server found): refusals, missing privileges, no
/// listener, or no server within `start_timeout`. Later failures are events, and watch goes
/// on.
pub fn watch(
    cfg: &WatchConfig,
    pause: &mut dyn FnMut(Duration) -> bool,
    log: &mut dyn FnMut(&Event),
    state: &Mutex<WatchState>,
    balancer: Option<&crate::balance::Handle>,
) -> Result<Stopped, SteerError> {
    let started = Instant::now();
    let mut mem = Memory::default();
    let mut session: Option<Session> = None;
    let mut ever_attached = false;
    let mut said_waiting = false;
    let mut last_tree: discover::Fingerprint = Vec::new();
    let mut stopping = false;
    let mut last_failure: Option<String> = None;
    loop {
        if stopping {
            if let Some(b) = balancer {
                // Rows it redirected go home before anything else happens.
                b.stop();
            }
            let pid = session.as_ref().map(|s| s.root);
            if cfg.detach_on_exit {
                if let Some(pid) = pid {
                    match apply::discover(pid, &cfg.filters)
                        .and_then(|(plan, dups)| apply::detach(&plan, &dups))
                    {
                        Ok(done) => {
                            for d in done {
                                log(&Event::new(
                                    "detached",
                                    Some(pid),
                                    d.addr.parse().ok(),
                                    format!("{}: removed {}", d.addr, d.removed),
                                ))
                            }
                        }
                        Err(e) => log(&Event::new(
                            "failed",
                            Some(pid),
                            None,
                            format!("detach on exit: {e}"),
                        )),
                    }
                }
            }
            log(&Event::new(
                "stopping",
                pid,
                None,
                if cfg.detach_on_exit {
                    "watch: stopping".to_string()
                } else {
                    "watch: stopping, leaving the steering in place".to_string()
                },
            ));
            return Ok(Stopped::Asked);
        }
        // Which process is the server now?
        let named = match cfg.source.current() {
            Ok(p) => p,
            Err(e) => {
                if !said_waiting {
                    log(&Event::new("waiting", None, None, format!("watch: {e}")));
                    said_waiting = true;
                }
                None
            }
        };
        let followed = session.as_ref().map(|s| s.root);
        let next = match (followed, named) {
            (Some(r), Some(n)) if r == n => Some(r),
            (Some(r), Some(n)) => {
                log(&Event::new(
                    "target",
                    Some(n),
                    None,
                    format!(
                        "watch: {} now names pid {n} (was {r}): following the new master",
                        cfg.source.describe()
                    ),
                ));
                state.lock().expect("watch state").target_changes += 1;
                Some(n)
            }
            (Some(r), None) if alive(r) => Some(r),
            (Some(r), None) => match heir(&last_tree, r, &mem.listeners) {
                Some(h) => {
                    log(&Event::new(
                        "target",
                        Some(h),
                        None,
                        format!("watch: pid {r} exited; following pid {h}, the master it left"),
                    ));
                    state.lock().expect("watch state").target_changes += 1;
                    Some(h)
                }
                None => {
                    log(&Event::new(
                        "gone",
                        Some(r),
                        None,
                        format!("watch: pid {r} exited"),
                    ));
                    if !cfg.source.follows() {
                        return Ok(Stopped::TargetExited);
                    }
                    said_waiting = false;
                    None
                }
            },
            (None, Some(n)) => {
                log(&Event::new(
                    "target",
                    Some(n),
                    None,
                    format!("watch: {}: pid {n}", cfg.source.describe()),
                ));
                if ever_attached {
                    state.lock().expect("watch state").target_changes += 1;
                }
                Some(n)
            }
            (None, None) => None,
        };
        match next {
            None => {
                if session.take().is_some() {
                    let mut st = state.lock().expect("watch state");
                    st.pid = None;
                    st.groups.clear();
                }
                if !ever_attached && started.elapsed() >= cfg.start_timeout {
                    return Err(SteerError(format!(
                        "no server: {} named no live process within {} s",
                        cfg.source.describe(),
                        cfg.start_timeout.as_secs()
                    )));
                }
                if !said_waiting {
                    log(&Event::new(
                        "waiting",
                        None,
                        None,
                        format!(
                            "watch: waiting for {} to name a running server",
                            cfg.source.describe()
                        ),
                    ));
                    said_waiting = true;
                }
                if pause(cfg.interval) {
                    stopping = true;
                }
                continue;
            }
            Some(r) if followed != Some(r) => {
                session = Some(Session::new(r));
                said_waiting = false;
                state.lock().expect("watch state").pid = Some(r);
            }
            Some(_) => {}
        }
        let s = session.as_mut().expect("a session");
        let first = !ever_attached;
        let ticked = tick(cfg, s, first, &mut mem, log, state, balancer);
        if let Some(b) = balancer {
            state.lock().expect("watch state").balance = b.snapshot();
        }
        match ticked {
            Ok(Some(tree)) => {
                last_tree = tree;
                last_failure = None;
                if !mem.applied.is_empty() {
                    ever_attached = true;
                }
            }
            Ok(None) => {}
            Err(e) if first => return Err(e),
            Err(e) => {
                if last_failure.as_ref() != Some(&e.0) {
                    log(&Event::new("failed", Some(s.root), None, e.0.clone()));
                    last_failure = Some(e.0);
                    state.lock().expect("watch state").failures += 1;
                }
            }
        }
        if pause(cfg.interval) {
            stopping = true;
        }
    }
}

/// One tick on the followed tree. Returns the tree's fingerprint when it was read.
fn tick(
    cfg: &WatchConfig,
    s: &mut Session,
    first: bool,
    mem: &mut Memory,
    log: &mut dyn FnMut(&Event),
    state: &Mutex<WatchState>,
    balancer: Option<&crate::balance::Handle>,
) -> Result<Option<discover::Fingerprint>, SteerError> {
    let pid = s.root;
    // Cheap check first: nothing about the processes changed and the last full scan is
    // recent → nothing to do this tick.
    let print = discover::fingerprint(pid, &mut s.cache).ok();
    let changed = print != s.last_print;
    if changed {
        // New workers take a moment to open their epoll and register their listener:
        // keep scanning fully while they settle.
        s.settle_until = Instant::now() + SETTLE;
    }
    let settling = Instant::now() < s.settle_until;
    if !changed && s.last_full.elapsed() < FULL_SCAN_EVERY && !settling {
        return Ok(print);
    }
    s.last_print = print.clone();
    s.last_full = Instant::now();
    let (plan, dups) = apply::discover_cached(pid, &cfg.filters, &mut s.cache)?;
    mem.listeners = plan
        .groups
        .iter()
        .flat_map(|g| g.listeners.iter().map(|l| l.inode))
        .collect();
    if plan.groups.is_empty() {
        if settling {
            return Ok(print);
        }
        return Err(SteerError(format!(
            "pid {pid}: no listening TCP socket (matching --listen) in its process tree"
        )));
    }
    let mut st_groups = BTreeMap::new();
    for g in &plan.groups {
        let mut gs = GroupState {
            listeners: g.listeners.len(),
            cpus_mapped: g.cpu_map.len(),
            ..Default::default()
        };
        if let Some(r) = &g.refusal {
            // While new workers settle (forked, not yet pinned or polling) a refusal is
            // expected and passes: say so only if it outlasts the settle period.
            if first && !settling {
                return Err(SteerError(format!(
                    "refused, nothing changed:\n  {}: {r}",
                    g.addr
                )));
            }
            if mem.refused.get(&g.addr) != Some(r) && !settling {
                log(&Event::new(
                    "refused",
                    Some(pid),
                    Some(g.addr),
                    format!("{}: cannot steer now, leaving it as is: {r}", g.addr),
                ));
                mem.refused.insert(g.addr, r.clone());
                state.lock().expect("watch state").failures += 1;
            }
            gs.method = "refused".into();
            st_groups.insert(g.addr.to_string(), gs);
            continue;
        }
        let want = apply::wanted_map(g);
        let one = plan::Plan {
            pid: plan.pid,
            groups: vec![g.clone()],
            held_progs: plan.held_progs.clone(),
        };
        // Still ours? Someone may have detached it, or put their own program on the group.
        let ours = apply::status(&one, &dups)
            .ok()
            .and_then(|v| v.into_iter().next());
        if let Some(o) = &ours {
            gs.prog_id = o.prog_id;
            if o.method == "foreign" && !cfg.force {
                if first {
                    return Err(SteerError(format!(
                        "refused, nothing changed:\n  {}",
                        apply::foreign::refusal(g, &o.foreign)
                    )));
                }
                let msg = format!(
                    "{}: leaving it alone: {}",
                    g.addr,
                    apply::foreign::summary(g, &o.foreign)
                );
                if mem.refused.get(&g.addr) != Some(&msg) {
                    log(&Event::new("foreign", Some(pid), Some(g.addr), msg.clone()));
                    mem.refused.insert(g.addr, msg);
                }
                mem.applied.remove(&g.addr);
                gs.method = "foreign".into();
                st_groups.insert(g.addr.to_string(), gs);
                continue;
            }
        }
        let in_place = ours
            .as_ref()
            .is_some_and(|o| o.method == "ebpf" || o.method == "incoming-cpu");
        if mem.applied.get(&g.addr) == Some(&want) && in_place {
            gs.method = ours.map_or(String::new(), |o| o.method.to_string());
            st_groups.insert(g.addr.to_string(), gs);
            continue;
        }
        let mut note = |m: String| {
            let kind = if m.starts_with("warning") {
                "warning"
            } else {
                "note"
            };
            log(&Event::new(kind, Some(pid), Some(g.addr), m));
        };
        match apply::attach(&one, &dups, cfg.method, cfg.force, &mut note) {
            Ok(done) => {
                mem.refused.remove(&g.addr);
                let how = match done[0].prog_id {
                    Some(id) if done[0].updated => format!("program {id} updated"),
                    Some(id) => format!("program {id} attached"),
                    None => "SO_INCOMING_CPU set".to_string(),
                };
                let resync = mem.applied.contains_key(&g.addr) && in_place;
                let (kind, why) = if resync {
                    ("resynced", "workers or listeners changed")
                } else {
                    ("attached", "steering")
                };
                log(&Event::new(
                    kind,
                    Some(pid),
                    Some(g.addr),
                    format!(
                        "{}: {why}: {} ({how}, {} writes)",
                        g.addr,
                        crate::describe_map(g),
                        done[0].writes
                    ),
                ));
                for n in &g.notes {
                    log(&Event::new(
                        "note",
                        Some(pid),
                        Some(g.addr),
                        format!("{}: note: {n}", g.addr),
                    ));
                }
                {
                    let mut st = state.lock().expect("watch state");
                    if resync {
                        st.resyncs += 1;
                    } else {
                        st.attaches += 1;
                    }
                }
                mem.applied.insert(g.addr, want);
                gs.method = done[0].method.to_string();
                gs.prog_id = done[0].prog_id;
            }
            Err(e) if first => return Err(e),
            Err(e) => {
                if mem.refused.get(&g.addr) != Some(&e.0) {
                    log(&Event::new(
                        "failed",
                        Some(pid),
                        Some(g.addr),
                        format!("{}: cannot steer: {e}", g.addr),
                    ));
                    mem.refused.insert(g.addr, e.0.clone());
                    state.lock().expect("watch state").failures += 1;
                }
                gs.method = "failed".into();
            }
        }
        st_groups.insert(g.addr.to_string(), gs);
    }
    drop(dups);
    // Groups that went away (listeners closed) leave the map.
    mem.applied
        .retain(|a, _| plan.groups.iter().any(|g| g.addr == *a));
    if let Some(b) = balancer {
        b.publish(balance_target(pid, &plan, &st_groups, &mut mem.balanced));
    }
    state.lock().expect("watch state").groups = st_groups;
    Ok(print)
}

/// The groups the balancer can act on: steered by our program, each listener's worker pinned.
///
/// A group refused now but attached before (a threaded server whose busy thread is not in its
/// poll call, so its listener cannot be told) keeps its last members: the steering stays as it
/// was, and so does the balancing.
fn balance_target(
    server_pid: u32,
    plan: &plan::Plan,
    states: &BTreeMap<String, GroupState>,
    last: &mut BTreeMap<SocketAddr, crate::balance::Group>,
) -> crate::balance::Target {
    last.retain(|a, _| plan.groups.iter().any(|g| g.addr == *a));
    let groups = plan
        .groups
        .iter()
        .filter_map(|g| {
            let gs = states.get(&g.addr.to_string())?;
            if gs.method == "refused" {
                return last.get(&g.addr).cloned();
            }
            let prog_id = gs.prog_id.filter(|_| gs.method == "ebpf")?;
            let members = g
                .listeners
                .iter()
                .filter_map(|l| {
                    let w = l.workers.first()?;
                    Some(crate::balance::Member {
                        cookie: l.cookie,
                        holder: (l.holder_pid, l.holder_fd),
                        cpu: l.cpu?,
                        pid: w.pid,
                        tid: w.tid.unwrap_or(w.pid),
                    })
                })
                .collect();
            let group = crate::balance::Group {
                addr: g.addr,
                prog_id,
                members,
            };
            last.insert(g.addr, group.clone());
            Some(group)
        })
        .collect();
    crate::balance::Target { server_pid, groups }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        let t = timestamp();
        assert_eq!(t.len(), "2024-01-01T00:00:00.000Z".len(), "{t}");
        assert!(t.ends_with('Z'));
    }
}
