//! The balancer for workers that stop serving (a handler that blocks its thread, a starved or
//! dead worker): corelocal's policy ([`corelocal::balance`]) driven from a monitor thread, with
//! the two actions of DESIGN.md "Locality for services we did not write":
//!
//! - **redirect** (eBPF steering): while a worker is busy, the SYNs its CPU processes go to the
//!   closest non-busy workers ([`cpu_targets`], one run of workers), back home as soon as it
//!   drains;
//! - **steal**: non-busy workers accept from a busy worker's listener, so the connections that
//!   queued before the redirect (or all of them, without eBPF) are served within the stall,
//!   not after it.
//!
//! Busy is computed outside the worker from the accept-queue depth, the accepts the worker made,
//! and its liveness from its own runtime's park/unpark hooks. A worker whose runtime is neither
//! parked nor turning for [`StallConfig::stall_after_ns`] (5 ms) is not running: a handler
//! blocks its thread, or the thread is starved or gone.
//!
//! The monitor samples every [`SAMPLE_MIN`] while a worker is busy and another is not (the
//! thieves' wake-ups, the recovery); otherwise the period doubles up to [`SAMPLE_ACTIVE_MAX`],
//! or [`SAMPLE_IDLE_MAX`] while every worker is parked with an empty queue, and a sample is also
//! taken when a stall window would end (a worker seen working without a turn, or holding
//! connections without an accept: 5 ms after the sample that first saw it). Why not every
//! millisecond: a sample costs a timer wake-up and a `getsockopt` per listener, 50–100 µs of CPU
//! on the 2-core VM (whose wake-ups alone cost 25 µs), several per cent of a core at 1 kHz. A
//! block is busy at most `SAMPLE_ACTIVE_MAX` + 5 ms after it starts.

use crate::server::Stats;
use corelocal::balance::redirect::{longest_run, places_of};
use corelocal::balance::{
    cpu_targets, AcceptFrom, Activity, BalanceConfig, Balancer, BusyReason, BusySet, Observation,
    StallConfig, WorkerHealth, WorkerPlace,
};
use corelocal::listen::{ListenerGroup, Mode};
use corelocal::runtime::WorkerStats;
use std::cell::{Cell, RefCell};
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The monitor's sampling period while anything looks wrong.
pub(crate) const SAMPLE_MIN: Duration = Duration::from_millis(1);
/// The longest period while the workers turn and drain their queues: a worker that starts
/// blocking, or a connection that queues behind it, is seen within this, and the worker is
/// busy 5 ms (the stall window, sampled every [`SAMPLE_MIN`]) later.
pub(crate) const SAMPLE_ACTIVE_MAX: Duration = Duration::from_millis(4);
/// The longest period while every worker is parked with an empty queue (an idle server).
pub(crate) const SAMPLE_IDLE_MAX: Duration = Duration::from_millis(8);
/// The shortest sleep before a sample due at a stall window's end (no spinning).
const SAMPLE_DEADLINE_MIN: Duration = Duration::from_micros(500);
/// The most workers one CPU's SYNs are spread over while redirected.
const REDIRECT_TARGETS_MAX: usize = 16;
/// The `activity` value of a worker whose thread has ended.
const EXITED: u64 = u64::MAX;

/// One worker's liveness and counters, shared by the worker, the monitor and the thieves.
/// Two cache lines of its own: the worker writes `activity` at every park and unpark.
#[repr(align(128))]
#[derive(Default)]
struct Slot {
    /// 2 × (park and unpark hooks run) + 1 while parked: even = working, the count = progress.
    /// Written by the worker's runtime only.
    activity: AtomicU64,
    /// Connections the worker accepted from its own listeners (the stall rule's count).
    own_accepts: AtomicU64,
    /// Wakes the worker to steal (a permit is kept when it is not waiting).
    steal: Notify,
    /// Times it became busy (or changed reason while busy), by [`BusyReason::index`];
    /// written by the monitor only.
    busy_by_reason: [AtomicU64; 3],
    /// Times its CPU's SYNs were redirected to other workers; written by the monitor only.
    redirects: AtomicU64,
}

/// What the workers, the monitor and [`Stats`] share.
pub(crate) struct Shared {
    busy: BusySet,
    slots: Box<[Slot]>,
    /// Duplicates of every worker's listeners, non-blocking: what thieves accept from (one set
    /// for all: accepting on a shared listener is safe from any thread).
    listeners: Box<[Vec<TcpListener>]>,
    /// Workers whose thread has not ended yet: the monitor runs while any is alive.
    alive: AtomicUsize,
    /// Whether redirects are possible (eBPF steering).
    redirect: bool,
}

/// A worker's activity word as the balancer's [`Activity`].
fn activity_of(word: u64) -> Activity {
    match word {
        EXITED => Activity::Stopped,
        v if v % 2 == 1 => Activity::Idle,
        v => Activity::Working { progress: v / 2 },
    }
}

/// Adds 1 with a plain load + store: the counter has a single writer.
fn bump(counter: &AtomicU64) {
    counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

impl Shared {
    /// The balancer of `group`, or `None` where it has nothing to do: one worker, or `stock`
    /// mode (one shared listener: every worker accepts from it anyway).
    pub(crate) fn for_group(group: &ListenerGroup) -> io::Result<Option<Arc<Shared>>> {
        let n = group.workers();
        if n < 2 || group.mode() == Mode::Stock {
            return Ok(None);
        }
        let mut listeners = Vec::with_capacity(n);
        for w in 0..n {
            let fds = group.try_clone_listeners(w)?;
            let l: Vec<TcpListener> = fds.into_iter().map(TcpListener::from).collect();
            for x in &l {
                x.set_nonblocking(true)?;
            }
            listeners.push(l);
        }
        Ok(Some(Arc::new(Shared {
            busy: BusySet::new(n),
            slots: (0..n).map(|_| Slot::default()).collect(),
            listeners: listeners.into_boxed_slice(),
            alive: AtomicUsize::new(0),
            redirect: group.supports_flow_groups(),
        })))
    }

    fn workers(&self) -> usize {
        self.slots.len()
    }

    /// The worker's runtime is about to park (wait for events).
    pub(crate) fn parked(&self, worker: usize) {
        bump(&self.slots[worker].activity);
    }

    /// The worker's runtime woke up and turns its loop.
    pub(crate) fn unparked(&self, worker: usize) {
        bump(&self.slots[worker].activity);
    }

    /// The worker's thread starts (before its runtime).
    pub(crate) fn started(&self) {
        self.alive.fetch_add(1, Ordering::AcqRel);
    }

    /// The worker's thread ends: it is stopped for the balancer from now on.
    pub(crate) fn exited(&self, worker: usize) {
        self.slots[worker].activity.store(EXITED, Ordering::Relaxed);
        self.alive.fetch_sub(1, Ordering::AcqRel);
    }

    /// Counts a connection the worker took from its own listeners.
    pub(crate) fn accepted_own(&self, worker: usize) {
        bump(&self.slots[worker].own_accepts);
    }

    /// Worker `worker`'s busy counts by reason and redirect episodes.
    fn counters(&self, worker: usize) -> ([u64; 3], u64) {
        let s = &self.slots[worker];
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (
            [
                get(&s.busy_by_reason[0]),
                get(&s.busy_by_reason[1]),
                get(&s.busy_by_reason[2]),
            ],
            get(&s.redirects),
        )
    }
}

/// One worker's side of stealing: its [`Balancer`] (5:1 local:remote share, round-robin
/// victims) and whether a wake-up asked it to look at the busy workers' queues.
pub(crate) struct Thief {
    me: usize,
    shared: Arc<Shared>,
    balancer: RefCell<Balancer>,
    wanted: Cell<bool>,
}

/// A connection taken from a busy worker's listener.
pub(crate) struct Stolen {
    pub(crate) stream: std::net::TcpStream,
    pub(crate) peer: SocketAddr,
    pub(crate) victim: usize,
}

impl Thief {
    pub(crate) fn new(me: usize, shared: Arc<Shared>) -> Thief {
        let mut cfg = BalanceConfig::new(shared.workers());
        cfg.migrate_enabled = false;
        Thief {
            me,
            balancer: RefCell::new(Balancer::new(me, &cfg)),
            shared,
            // Look once at start: a worker may already be busy.
            wanted: Cell::new(true),
        }
    }

    /// Resolves when the monitor asks this worker to steal.
    pub(crate) async fn woken(&self) {
        self.shared.slots[self.me].steal.notified().await;
        self.wanted.set(true);
    }

    /// Whether this worker should look at the busy workers' queues now.
    pub(crate) fn should_steal(&self) -> bool {
        if !self.wanted.get() {
            return false;
        }
        let busy = &self.shared.busy;
        if busy.is_busy(self.me) || !busy.any_other(self.me) {
            self.wanted.set(false);
            return false;
        }
        true
    }

    /// The 5:1 share: whether the next connection should be stolen although the worker's own
    /// queue may hold one.
    pub(crate) fn steal_due(&self) -> Option<usize> {
        match self
            .balancer
            .borrow_mut()
            .choose_accept(&self.shared.busy, true)
        {
            AcceptFrom::Steal(v) => Some(v),
            _ => None,
        }
    }

    /// Counts a connection taken from the worker's own queue (earns steal credit).
    pub(crate) fn record_local(&self) {
        self.balancer.borrow_mut().record_local();
        self.shared.accepted_own(self.me);
    }

    /// One connection from `victim`'s queue, counted as a steal. `local_ready`: the 5:1 share
    /// chose it although the own queue may hold one (the steal spends credit).
    pub(crate) fn steal_from(
        &self,
        victim: usize,
        local_ready: bool,
    ) -> io::Result<Option<Stolen>> {
        let Some((stream, peer)) = self.accept_from(victim)? else {
            return Ok(None);
        };
        self.balancer.borrow_mut().record_steal(victim, local_ready);
        Ok(Some(Stolen {
            stream,
            peer,
            victim,
        }))
    }

    /// One connection from the busy workers' queues, round-robin (the own queue is empty).
    /// `Ok(None)`: they are empty too; the worker waits for the monitor's next wake-up.
    pub(crate) fn steal_any(&self) -> io::Result<Option<Stolen>> {
        for _ in 0..self.shared.workers() {
            let choice = self
                .balancer
                .borrow_mut()
                .choose_accept(&self.shared.busy, false);
            let AcceptFrom::Steal(v) = choice else {
                break;
            };
            if let Some(s) = self.steal_from(v, false)? {
                return Ok(Some(s));
            }
        }
        self.wanted.set(false);
        Ok(None)
    }

    /// One non-blocking accept on each of `victim`'s listeners until one gives a connection.
    fn accept_from(&self, victim: usize) -> io::Result<Option<(std::net::TcpStream, SocketAddr)>> {
        for l in &self.shared.listeners[victim] {
            match l.accept() {
                Ok((s, peer)) => return Ok(Some((s, peer))),
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }
}

/// The monitor thread's state.
struct Monitor {
    shared: Arc<Shared>,
    group: Arc<ListenerGroup>,
    stats: Vec<Arc<WorkerStats>>,
    health: Vec<WorkerHealth>,
    places: Vec<WorkerPlace>,
    /// Each worker CPU and the run of workers its SYNs are redirected to now.
    applied: Vec<(usize, Option<(usize, usize)>)>,
    redirect: bool,
    epoch: Instant,
    /// Each worker's activity word and own accepts at the last sample, and since when each
    /// has been the same.
    last: Vec<Unchanged>,
    /// The stall window of the health rules.
    stall_ns: u64,
}

/// What a worker showed at the last samples.
#[derive(Debug, Clone, Copy, Default)]
struct Unchanged {
    activity: u64,
    activity_since_ns: u64,
    accepted: u64,
    /// Since when its queue has held connections with this accept count.
    queue_since_ns: Option<u64>,
}

impl Unchanged {
    /// Records a sample; says when the worker becomes busy for a stall rule if nothing changes
    /// before: the end of the `stall_ns` window of a worker working without a turn, or of a
    /// queue holding connections without an accept, since the sample that first saw it.
    fn update(
        &mut self,
        activity: u64,
        accepted: u64,
        queued: bool,
        now_ns: u64,
        stall_ns: u64,
    ) -> Option<u64> {
        if activity != self.activity {
            (self.activity, self.activity_since_ns) = (activity, now_ns);
        }
        if accepted != self.accepted || !queued {
            self.accepted = accepted;
            self.queue_since_ns = None;
        }
        if queued {
            self.queue_since_ns.get_or_insert(now_ns);
        }
        let working = matches!(activity_of(activity), Activity::Working { .. });
        let by_activity = working.then_some(self.activity_since_ns);
        [by_activity, self.queue_since_ns]
            .into_iter()
            .flatten()
            .min()
            .map(|since| since + stall_ns)
    }
}

/// How a sample looked, for the next period (the worst worker's counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Pace {
    /// Every worker parked, every queue empty, nobody busy.
    Idle,
    /// Nobody busy.
    Active,
    /// A worker is busy: sample every [`SAMPLE_MIN`] (its recovery, the thieves' wake-ups)
    /// unless every worker is.
    Busy,
}

/// What one worker's observation found.
struct Seen {
    pace: Pace,
    /// When it becomes busy if nothing changes (sample then).
    deadline_ns: Option<u64>,
    /// Its busy state or reason changed.
    changed: bool,
    /// It is busy with connections in its queue (the others should steal).
    queued_at_busy: bool,
}

/// Starts the monitor of a started server; it ends once every worker's thread has.
pub(crate) fn spawn_monitor(
    shared: Arc<Shared>,
    group: Arc<ListenerGroup>,
    stats: &Stats,
) -> io::Result<JoinHandle<()>> {
    let n = shared.workers();
    let cfg = BalanceConfig::new(n);
    let stall = StallConfig::default();
    let cpus: Vec<usize> = (0..n).map(|w| group.worker_cpu(w)).collect();
    let places = places_of(&cpus);
    let mut applied: Vec<(usize, Option<(usize, usize)>)> =
        cpus.iter().map(|&c| (c, None)).collect();
    applied.dedup_by_key(|a| a.0);
    let monitor = Monitor {
        redirect: shared.redirect,
        stats: (0..n).map(|w| stats.worker(w)).collect(),
        health: (0..n).map(|w| WorkerHealth::new(w, &cfg, stall)).collect(),
        places,
        applied,
        shared,
        group,
        epoch: Instant::now(),
        last: vec![Unchanged::default(); n],
        stall_ns: stall.stall_after_ns,
    };
    std::thread::Builder::new()
        // Thread names are cut at 15 bytes (comm): short enough to tell it from the workers.
        .name("clt-balance".into())
        .spawn(move || monitor.run())
}

impl Monitor {
    fn run(mut self) {
        let mut period = SAMPLE_MIN;
        // Bounded by the workers' lives: their threads end after a stop.
        while self.shared.alive.load(Ordering::Acquire) > 0 {
            let now_ns = self.epoch.elapsed().as_nanos() as u64;
            let (pace, deadline_ns) = self.tick(now_ns);
            // While every worker is busy nobody can steal or take SYNs: no hurry.
            let helpless = self.shared.busy.count() == self.health.len();
            period = match pace {
                Pace::Busy if !helpless => SAMPLE_MIN,
                Pace::Busy => (period * 2).min(SAMPLE_ACTIVE_MAX),
                Pace::Active => (period * 2).min(SAMPLE_ACTIVE_MAX),
                Pace::Idle => (period * 2).min(SAMPLE_IDLE_MAX),
            };
            // A stall window that ends sooner is sampled at its end: detection on time
            // without sampling every millisecond.
            // (One already past did not make the worker busy: nothing to wait for.)
            let until_deadline = deadline_ns
                .filter(|&d| d > now_ns)
                .map(|d| Duration::from_nanos(d - now_ns));
            let sleep = until_deadline.map_or(period, |d| d.clamp(SAMPLE_DEADLINE_MIN, period));
            std::thread::sleep(sleep);
        }
        self.restore_all();
    }

    /// One observation of every worker; acts on busy changes; says how soon to look again:
    /// the pace, and the earliest end of a stall window.
    fn tick(&mut self, now_ns: u64) -> (Pace, Option<u64>) {
        let mut pace = Pace::Idle;
        let mut deadline_ns: Option<u64> = None;
        let mut changed = false;
        let mut queued_at_busy = false;
        for w in 0..self.health.len() {
            let seen = self.observe(w, now_ns);
            pace = pace.max(seen.pace);
            deadline_ns = deadline_ns.into_iter().chain(seen.deadline_ns).min();
            changed |= seen.changed;
            queued_at_busy |= seen.queued_at_busy;
        }
        if changed && self.redirect {
            self.redirect_all();
        }
        if queued_at_busy {
            self.wake_thieves();
        }
        (pace, deadline_ns)
    }

    /// Observes worker `w`: feeds its health, counts its transitions.
    fn observe(&mut self, w: usize, now_ns: u64) -> Seen {
        // An unreadable listener (closing at a stop) reads as empty.
        let (len, cap) = self.group.queue_depth(w).map_or((0, 1), |d| (d.len, d.cap));
        let raw = self.shared.slots[w].activity.load(Ordering::Relaxed);
        let accepted = self.shared.slots[w].own_accepts.load(Ordering::Relaxed);
        let activity = activity_of(raw);
        let obs = Observation {
            queue_len: len,
            queue_cap: cap.max(1),
            accepted: Some(accepted),
            activity,
        };
        let health = &mut self.health[w];
        let was_busy = health.busy().is_some();
        let change = health.observe(&self.shared.busy, obs, now_ns);
        let busy = health.busy().is_some();
        self.stats[w].queue(len, cap, busy);
        if busy != was_busy {
            self.stats[w].busy_transition();
        }
        if let Some(c) = change.filter(|c| c.busy) {
            bump(&self.shared.slots[w].busy_by_reason[c.reason.index()]);
        }
        let deadline_ns = self.last[w].update(raw, accepted, len > 0, now_ns, self.stall_ns);
        Seen {
            pace: match (busy, len == 0 && activity == Activity::Idle) {
                (true, _) => Pace::Busy,
                (false, true) => Pace::Idle,
                (false, false) => Pace::Active,
            },
            // A busy worker is sampled every SAMPLE_MIN anyway.
            deadline_ns: deadline_ns.filter(|_| !busy),
            changed: change.is_some(),
            queued_at_busy: busy && len > 0,
        }
    }

    /// Wakes every non-busy worker to steal (each keeps the wake-up until it next waits).
    fn wake_thieves(&self) {
        for (w, slot) in self.shared.slots.iter().enumerate() {
            if !self.shared.busy.is_busy(w) {
                slot.steal.notify_one();
            }
        }
    }

    /// Sends every redirected CPU's SYNs home again (the workers have ended).
    fn restore_all(&mut self) {
        for (cpu, run) in self.applied.iter_mut().filter(|a| a.1.is_some()) {
            if self.group.redirect_cpu(*cpu, None).is_ok() {
                *run = None;
            }
        }
    }

    /// Points every CPU's SYNs where the busy bits say now.
    fn redirect_all(&mut self) {
        for i in 0..self.applied.len() {
            let (cpu, before) = self.applied[i];
            let t = cpu_targets(&self.places, &self.shared.busy, cpu, REDIRECT_TARGETS_MAX);
            let want = if t.redirected {
                longest_run(&t.workers)
            } else {
                None
            };
            if want == before {
                continue;
            }
            if let Err(e) = self.group.redirect_cpu(cpu, want) {
                eprintln!(
                    "corelocal-tokio: redirecting CPU {cpu}'s SYNs failed, stealing only: {e}"
                );
                self.redirect = false;
                return;
            }
            self.applied[i].1 = want;
            if before.is_none() {
                if let Some(w) = self.places.iter().position(|p| p.cpu == cpu) {
                    bump(&self.shared.slots[w].redirects);
                }
            }
        }
    }
}

/// The balancer's counters ([`Stats::balance`]); steals are in the
/// [`Snapshot`](corelocal::runtime::Snapshot) (`stolen`, `stolen_from`), busy state and
/// transitions too (`busy`, `busy_transitions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BalanceSnapshot {
    /// Whether the balancer runs ([`Builder::balance`](crate::Builder::balance), at least two
    /// workers, not `stock` mode).
    pub enabled: bool,
    /// Whether a busy worker's CPU has its SYNs redirected (eBPF steering); else stealing only.
    pub redirect: bool,
    /// Per worker (empty when off).
    pub workers: Vec<WorkerBalance>,
}

/// One worker's balancer counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerBalance {
    /// The worker's index.
    pub worker: usize,
    /// Its CPU.
    pub cpu: usize,
    /// Times it became busy (or changed reason while busy), by [`BusyReason`] in
    /// [`BusyReason::ALL`] order: queue above the high watermark, queue held with nothing
    /// accepted (stalled), not running (blocked, starved, exited).
    pub busy: [u64; 3],
    /// Times its CPU's SYNs were redirected to other workers (episodes: the program does not
    /// count SYNs).
    pub redirects: u64,
}

impl BalanceSnapshot {
    /// The counters of `shared` (off: `None`), with each worker's CPU from `cpu_of`.
    pub(crate) fn of(shared: Option<&Shared>, cpu_of: impl Fn(usize) -> usize) -> Self {
        let Some(s) = shared else {
            return BalanceSnapshot::default();
        };
        BalanceSnapshot {
            enabled: true,
            redirect: s.redirect,
            workers: (0..s.workers())
                .map(|w| {
                    let (busy, redirects) = s.counters(w);
                    WorkerBalance {
                        worker: w,
                        cpu: cpu_of(w),
                        busy,
                        redirects,
                    }
                })
                .collect(),
        }
    }

    /// Redirect episodes of every worker.
    pub fn redirects(&self) -> u64 {
        self.workers.iter().map(|w| w.redirects).sum()
    }

    /// Busy transitions of every worker for `reason`.
    pub fn busy(&self, reason: BusyReason) -> u64 {
        self.workers.iter().map(|w| w.busy[reason.index()]).sum()
    }
}
