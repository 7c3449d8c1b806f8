//! The balancer `steer watch` runs beside the steering: Affinity-Accept's busy bit for the
//! workers of a server we did not write, seen from outside them, and the kernel routing
//! around a busy one.
//!
//! We cannot steal from another process's accept queue, so the balancer acts on new SYNs: every
//! 2 ms or so it reads each listener's accept queue (`TCP_INFO` through a `pidfd_getfd`
//! duplicate taken and closed at once, so that we never hold a listener the server closed; a
//! sock_diag dump walks the whole listening hash, ~100 µs, too much at this rate) and each
//! worker thread's state, CPU time and runqueue wait
//! (`/proc/PID/task/TID/stat`, `schedstat`), feeds them to the library's [`WorkerHealth`] (watermarks, stopped / starved /
//! blocked, a queue not drained), and when all of a CPU's workers are busy rewrites that CPU's
//! row of the `cl_cpu_pick` program: its SYNs go to the closest non-busy workers
//! ([`corelocal::balance::cpu_targets`]: same LLC, NUMA node, any; spread by hash), counted per
//! CPU as `redirected`. The row goes back the moment its worker drains. When every worker is
//! busy, a CPU whose worker is not running leans on those only busy, and one whose worker is
//! stopped on those only starved ([`cpu_targets_tiered`]); otherwise the row stays home:
//! nothing is refused.
//!
//! The loop: 2 ms while any queue holds a connection or any worker is busy, 10 ms otherwise;
//! an idle worker's thread state is read every 4th turn (a stopped worker is seen within 40 ms
//! while idle, at the next turn once a connection waits for it). Measured on the 2-core VM:
//! ~100 µs of CPU a turn for two workers by a hand reading of its threads' schedstat (mostly
//! syscalls: `pidfd_getfd`, `TCP_INFO`, the `/proc` reads); `bench/steer-balance.sh cpu`
//! reports its CPU under load (results/steer/balance-cpu.md).

use crate::watch::Event;
use corelocal::balance::{
    cpu_targets_tiered, Activity, BalanceConfig, BusyReason, BusySet, Observation, StallConfig,
    WorkerHealth, WorkerPlace,
};
use corelocal::bpf::cpu_pick::{CpuPick, WORKERS_PER_CPU_MAX};
use corelocal::cpu::Topology;
use corelocal::sys::{pidfd, socket};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Sampling period while something is queued or busy.
pub const PERIOD_ACTIVE: Duration = Duration::from_millis(2);
/// Sampling period while every queue is empty and nobody is busy.
pub const PERIOD_QUIET: Duration = Duration::from_millis(10);
/// While a worker's queue is empty and it is not busy, its thread's state (`/proc/…/stat`,
/// the costly read) is looked at every this many turns; its CPU time and wait every turn.
pub const STATE_EVERY_TURNS: u32 = 4;
/// The duplicate's socket cookie is checked against the listener's every this many turns (a
/// descriptor number the server reused for another socket is also caught by `watch`'s
/// re-scan, which republishes the group).
pub const COOKIE_EVERY_TURNS: u32 = 32;
/// The stall window for another process's workers: 10 ms of a non-empty queue that never
/// shrinks, or of a runnable thread that gets no CPU. Twice the library's default: what we
/// see of a foreign worker is coarser (its CPU time advances per tick; no accept count), and a
/// busy host must not cost a healthy worker its locality.
pub const STALL_AFTER: Duration = Duration::from_millis(10);
/// How often the state `watch` reports is refreshed when nothing changed.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(50);
/// Most workers balanced per group (the sockarray's size bounds it anyway).
pub const MEMBERS_MAX: usize = 4096;

/// One worker of a steered group: its listener and the thread that accepts on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The listener's cookie (how the program's sockarray names it).
    pub cookie: u64,
    /// A process holding the listener, and its descriptor there (to read its queue).
    pub holder: (u32, i32),
    /// The CPU its worker is pinned to.
    pub cpu: usize,
    /// The worker's process.
    pub pid: u32,
    /// The thread that accepts (the process itself for a single-threaded worker).
    pub tid: u32,
}

/// A steered group as `watch` last attached it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The bound address.
    pub addr: SocketAddr,
    /// Our program on it.
    pub prog_id: u32,
    /// Its pinned workers, one per listener.
    pub members: Vec<Member>,
}

/// What `watch` hands the balancer: the server and its steered groups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    /// The server's master (for its network namespace).
    pub server_pid: u32,
    /// The groups.
    pub groups: Vec<Group>,
}

/// One worker's balance state, for metrics and `--json`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MemberState {
    /// Its CPU.
    pub cpu: usize,
    /// Its process and thread.
    pub pid: u32,
    /// The thread watched.
    pub tid: u32,
    /// Busy now, and why (`queue`, `stalled`, `not_running`).
    pub busy: Option<&'static str>,
    /// Times it became busy, per reason.
    pub busy_total: BTreeMap<&'static str, u64>,
    /// Accept-queue length at the last look.
    pub queue_len: u32,
}

/// The balancer's view of one group.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GroupState {
    /// Per worker (listener), in plan order.
    pub members: Vec<MemberState>,
    /// CPUs whose SYNs go elsewhere now, with the CPUs of the workers they go to.
    pub redirected: BTreeMap<usize, Vec<usize>>,
    /// Times a CPU's SYNs were sent elsewhere.
    pub redirects_total: u64,
}

/// Shared between `watch` (publishes targets, reads state) and the balancer thread.
pub struct Handle {
    target: Mutex<(u64, Target)>,
    /// Per group address.
    pub state: Mutex<BTreeMap<String, GroupState>>,
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Handle {
    /// Starts the balancer thread; `emit` prints its events.
    pub fn start(emit: Box<dyn Fn(&Event) + Send>) -> std::io::Result<Arc<Handle>> {
        let h = Arc::new(Handle {
            target: Mutex::new((0, Target::default())),
            state: Mutex::new(BTreeMap::new()),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let me = h.clone();
        let thread = std::thread::Builder::new()
            .name("steer-balance".into())
            .spawn(move || run(&me, &*emit))?;
        *h.thread.lock().expect("balance thread") = Some(thread);
        Ok(h)
    }

    /// Hands over the groups to balance (a new value only when it changed).
    pub fn publish(&self, target: Target) {
        let mut t = self.target.lock().expect("balance target");
        if t.1 != target {
            t.0 += 1;
            t.1 = target;
        }
    }

    /// Stops the thread and waits for it: every redirected row is home again.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.lock().expect("balance thread").take() {
            let _ = t.join();
        }
    }

    /// The balancer's view now, per group address.
    pub fn snapshot(&self) -> BTreeMap<String, GroupState> {
        self.state.lock().expect("balance state").clone()
    }
}

/// A thread's `/proc` files, kept open and re-read from offset 0.
struct ThreadFiles {
    stat: Option<File>,
    schedstat: Option<File>,
}

impl ThreadFiles {
    fn open(pid: u32, tid: u32) -> ThreadFiles {
        let path = |f: &str| format!("/proc/{pid}/task/{tid}/{f}");
        ThreadFiles {
            stat: File::open(path("stat")).ok(),
            schedstat: File::open(path("schedstat")).ok(),
        }
    }

    /// What the thread is doing: stopped (`T`, `t`), idle (`S`, `I`: asleep, as in
    /// `epoll_wait`; a worker asleep in something else is caught by the queue rule),
    /// working (`R`, `D`) with its CPU time as progress.
    /// `exec_ns`: its CPU time from `schedstat`, read once per turn by the caller.
    fn activity(&self, exec_ns: Option<u64>) -> Activity {
        let mut buf = [0u8; 512];
        let Some(n) = self.stat.as_ref().and_then(|f| f.read_at(&mut buf, 0).ok()) else {
            return Activity::Unknown;
        };
        let text = &buf[..n];
        let Some(close) = text.iter().rposition(|&b| b == b')') else {
            return Activity::Unknown;
        };
        match text.get(close + 2) {
            Some(b'T' | b't') => Activity::Stopped,
            Some(b'S' | b'I') => Activity::Idle,
            Some(b'R' | b'D') => {
                exec_ns.map_or(Activity::Unknown, |progress| Activity::Working { progress })
            }
            _ => Activity::Unknown,
        }
    }

    /// `(time on a CPU, time runnable but waiting for one)`, in ns.
    fn schedstat(&self) -> Option<(u64, u64)> {
        let mut buf = [0u8; 128];
        let n = self.schedstat.as_ref()?.read_at(&mut buf, 0).ok()?;
        let mut fields = std::str::from_utf8(&buf[..n]).ok()?.split_whitespace();
        let exec = fields.next()?.parse().ok()?;
        let wait = fields.next()?.parse().ok()?;
        Some((exec, wait))
    }
}

/// One group being balanced.
struct Balanced {
    group: Group,
    pick: CpuPick,
    slots: Vec<Option<u32>>,
    places: Vec<WorkerPlace>,
    busy: BusySet,
    /// The workers busy because they are not running (stopped, starved, blocked).
    down: BusySet,
    /// The workers whose thread is stopped: certain not to serve, unlike a starved one.
    stopped: BusySet,
    health: Vec<WorkerHealth>,
    files: Vec<ThreadFiles>,
    /// Per member: a pidfd of the listener's holder (shared by its listeners).
    holders: Vec<Option<Arc<OwnedFd>>>,
    /// Per member: its thread's activity at the last state read.
    last_activity: Vec<Activity>,
    turns: u32,
    /// CPU → the row written while redirected.
    applied: BTreeMap<usize, Vec<u32>>,
    state: GroupState,
    /// A busy bit changed since the state was last published.
    dirty: bool,
}

impl Balanced {
    fn new(group: Group, topology: &Topology) -> Option<Balanced> {
        let n = group.members.len();
        if n == 0 || n > MEMBERS_MAX {
            return None;
        }
        let pick = CpuPick::open(group.prog_id).ok()?;
        let slot_of: BTreeMap<u64, u32> = (0..pick.slots())
            .filter_map(|s| Some((pick.listener_cookie(s).ok()??, s)))
            .collect();
        let slots = group
            .members
            .iter()
            .map(|m| slot_of.get(&m.cookie).copied())
            .collect();
        let cfg = BalanceConfig::new(n);
        let stall = StallConfig {
            stall_after_ns: STALL_AFTER.as_nanos() as u64,
            ..StallConfig::default()
        };
        let health = (0..n).map(|w| WorkerHealth::new(w, &cfg, stall)).collect();
        let places = group
            .members
            .iter()
            .map(|m| WorkerPlace::of_cpu(topology, m.cpu))
            .collect();
        let files = group
            .members
            .iter()
            .map(|m| ThreadFiles::open(m.pid, m.tid))
            .collect();
        let mut pidfds: BTreeMap<u32, Arc<OwnedFd>> = BTreeMap::new();
        let holders = group
            .members
            .iter()
            .map(|m| {
                let pid = m.holder.0;
                if let std::collections::btree_map::Entry::Vacant(slot) = pidfds.entry(pid) {
                    slot.insert(Arc::new(pidfd::pidfd_open(pid).ok()?));
                }
                pidfds.get(&pid).cloned()
            })
            .collect();
        let state = GroupState {
            members: group
                .members
                .iter()
                .map(|m| MemberState {
                    cpu: m.cpu,
                    pid: m.pid,
                    tid: m.tid,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        Some(Balanced {
            group,
            pick,
            slots,
            places,
            busy: BusySet::new(n),
            down: BusySet::new(n),
            stopped: BusySet::new(n),
            health,
            files,
            holders,
            last_activity: vec![Activity::Unknown; n],
            turns: 0,
            applied: BTreeMap::new(),
            state,
            dirty: true,
        })
    }

    /// Worker `w`'s listener queue, through a duplicate closed at once (`None`: the holder
    /// no longer has that socket there).
    fn queue(&self, w: usize) -> Option<socket::QueueDepth> {
        let m = &self.group.members[w];
        let dup = pidfd::pidfd_getfd(self.holders[w].as_ref()?, m.holder.1).ok()?;
        if self.turns % COOKIE_EVERY_TURNS == 1
            && pidfd::socket_cookie(dup.as_raw_fd()).ok()? != m.cookie
        {
            return None;
        }
        socket::listen_queue(dup.as_raw_fd()).ok()
    }

    /// One look at every worker; returns whether anything is queued or busy.
    fn turn(&mut self, now_ns: u64, server: u32, emit: &dyn Fn(&Event)) -> bool {
        self.turns = self.turns.wrapping_add(1);
        let mut changed = false;
        let mut active = false;
        for w in 0..self.group.members.len() {
            let Some(q) = self.queue(w) else {
                continue;
            };
            let sched = self.files[w].schedstat();
            if let Some((_, wait)) = sched {
                self.health[w].note_run_wait(wait, now_ns);
            }
            let exec_ns = sched.map(|(exec, _)| exec);
            let look =
                q.len > 0 || self.health[w].busy().is_some() || self.turns % STATE_EVERY_TURNS == 0;
            let activity = if look {
                let a = self.files[w].activity(exec_ns);
                self.last_activity[w] = a;
                a
            } else {
                match self.last_activity[w] {
                    // Progress must be fresh, or a stale value would read as no progress.
                    Activity::Working { .. } => {
                        exec_ns.map_or(Activity::Unknown, |progress| Activity::Working { progress })
                    }
                    other => other,
                }
            };
            let was_stopped = self.stopped.is_busy(w);
            if was_stopped != (activity == Activity::Stopped) {
                self.stopped.set(w, !was_stopped);
                changed = true;
            }
            let obs = Observation {
                queue_len: q.len,
                queue_cap: q.cap.max(1),
                accepted: None,
                activity,
            };
            self.state.members[w].queue_len = q.len;
            active |= q.len > 0;
            if let Some(c) = self.health[w].observe(&self.busy, obs, now_ns) {
                changed = true;
                self.down
                    .set(w, self.health[w].busy() == Some(BusyReason::NotRunning));
                self.note_change(w, c.busy, c.reason, server, emit);
            }
            active |= self.health[w].busy().is_some();
        }
        if changed {
            self.dirty = true;
            self.route(server, emit);
        }
        active
    }

    fn note_change(
        &mut self,
        w: usize,
        busy: bool,
        reason: BusyReason,
        server: u32,
        emit: &dyn Fn(&Event),
    ) {
        let m = &self.group.members[w];
        let st = &mut self.state.members[w];
        st.busy = busy.then_some(reason.as_str());
        if busy {
            *st.busy_total.entry(reason.as_str()).or_default() += 1;
        }
        let what = if busy {
            format!("busy ({})", reason.as_str())
        } else {
            format!("serving again (was {})", reason.as_str())
        };
        emit(&Event::for_balance(
            if busy { "busy" } else { "recovered" },
            server,
            self.group.addr,
            format!(
                "{}: worker pid {} tid {} on cpu {}: {what}, queue {}",
                self.group.addr, m.pid, m.tid, m.cpu, st.queue_len
            ),
        ));
    }

    /// Rewrites the rows of CPUs whose targets changed.
    fn route(&mut self, server: u32, emit: &dyn Fn(&Event)) {
        let cpus: Vec<usize> = {
            let mut c: Vec<usize> = self.group.members.iter().map(|m| m.cpu).collect();
            c.dedup();
            c
        };
        for cpu in cpus {
            let t = cpu_targets_tiered(
                &self.places,
                &[&self.busy, &self.down, &self.stopped],
                cpu,
                WORKERS_PER_CPU_MAX as usize,
            );
            let slots: Vec<u32> = t.workers.iter().filter_map(|&w| self.slots[w]).collect();
            if t.redirected {
                if self.applied.get(&cpu) == Some(&slots) || slots.is_empty() {
                    continue;
                }
                if self.pick.route_cpu(cpu as u32, &slots, true).is_ok() {
                    self.applied.insert(cpu, slots);
                    let to: Vec<usize> = t.workers.iter().map(|&w| self.places[w].cpu).collect();
                    self.state.redirects_total += 1;
                    emit(&Event::for_balance(
                        "redirect",
                        server,
                        self.group.addr,
                        format!(
                            "{}: cpu {cpu}'s workers are busy: its SYNs go to cpu {:?}",
                            self.group.addr, to
                        ),
                    ));
                    self.state.redirected.insert(cpu, to);
                }
            } else if self.applied.remove(&cpu).is_some() {
                // Home: the CPU's own non-busy workers (all of them when none is busy).
                let home = self.home_slots(cpu);
                let _ = self.pick.route_cpu(cpu as u32, &home, false);
                self.state.redirected.remove(&cpu);
                emit(&Event::for_balance(
                    "home",
                    server,
                    self.group.addr,
                    format!(
                        "{}: cpu {cpu}'s SYNs go to its own worker again",
                        self.group.addr
                    ),
                ));
            }
        }
    }

    fn home_slots(&self, cpu: usize) -> Vec<u32> {
        (0..self.group.members.len())
            .filter(|&w| self.group.members[w].cpu == cpu)
            .filter_map(|w| self.slots[w])
            .take(WORKERS_PER_CPU_MAX as usize)
            .collect()
    }

    /// Puts every redirected row back home (the balancer stops or the group changed).
    fn restore(&mut self) {
        let cpus: Vec<usize> = self.applied.keys().copied().collect();
        for cpu in cpus {
            let home = self.home_slots(cpu);
            let _ = self.pick.route_cpu(cpu as u32, &home, false);
        }
        self.applied.clear();
    }
}

fn run(h: &Handle, emit: &dyn Fn(&Event)) {
    let epoch = Instant::now();
    let topology = Topology::host().ok();
    let mut seen_gen = 0;
    let mut server = 0;
    let mut groups: Vec<Balanced> = Vec::new();
    let mut last_publish = Instant::now();
    while !h.stop.load(Ordering::Relaxed) {
        let (gen, target) = {
            let t = h.target.lock().expect("balance target");
            (t.0, (t.0 != seen_gen).then(|| t.1.clone()))
        };
        if let Some(target) = target {
            seen_gen = gen;
            for g in &mut groups {
                g.restore();
            }
            server = target.server_pid;
            groups = match &topology {
                Some(topo) => target
                    .groups
                    .into_iter()
                    .filter_map(|g| Balanced::new(g, topo))
                    .collect(),
                None => Vec::new(),
            };
        }
        let mut active = false;
        let now_ns = epoch.elapsed().as_nanos() as u64;
        for g in &mut groups {
            active |= g.turn(now_ns, server, emit);
        }
        if last_publish.elapsed() >= PUBLISH_EVERY || groups.iter().any(|g| g.dirty) {
            publish_state(h, &mut groups);
            last_publish = Instant::now();
        }
        std::thread::sleep(if active { PERIOD_ACTIVE } else { PERIOD_QUIET });
    }
    for g in &mut groups {
        g.restore();
    }
}

fn publish_state(h: &Handle, groups: &mut [Balanced]) {
    let mut st = h.state.lock().expect("balance state");
    st.clear();
    for g in groups {
        st.insert(g.group.addr.to_string(), g.state.clone());
        g.dirty = false;
    }
}
