//! The Affinity-Accept balancer wired into the worker loop (the policy itself is the pure
//! [`crate::balance`] module; this is the part that samples queues, wakes, steals and migrates).
//!
//! Per loop turn of a worker (never per connection):
//! - at most every [`SAMPLE_INTERVAL`], read its own accept-queue depth (TCP_INFO) and feed
//!   its [`WorkerHealth`]: the paper's watermarks, plus the stall rule — a queue that held
//!   connections at every observation for [`STALL_AFTER`] while its owner accepted none is
//!   busy however short it is (a worker starved of CPU holding 5 of 8 is not serving them, and
//!   below the 75% watermark nobody would steal them); on becoming busy, or while still busy above the
//!   high watermark,
//!   wake the non-busy workers so they steal before the kernel drops SYNs (it never spills a
//!   full listener's SYNs to a sibling);
//! - if not busy, watch the others: any worker whose queue nobody observed for
//!   [`STALE_AFTER`] — its owner is not turning its loop: asleep, or starved of CPU — is
//!   observed by this worker instead. Busy state thus never depends on the busy worker
//!   running (in the paper it is computed on the packet path, which runs whatever the
//!   scheduler does). The trackers are shared (one lock each, touched per observation, never
//!   per connection); an observation is claimed with a compare-and-swap on its timestamp, so
//!   each queue is read at most once per interval whoever reads it;
//! - a non-busy worker with nothing to do still wakes to watch: after [`WATCH_INTERVAL_MIN`],
//!   doubling up to [`WATCH_INTERVAL_MAX`] while every queue it watched was empty;
//! - if not busy and some other worker is, let the [`Balancer`] choose a victim (5:1 share,
//!   round-robin) and queue one non-blocking accept on the victim's listener (one in flight);
//! - run the migration tick: every 100 ms a non-busy worker moves one flow group from its top
//!   victim to itself: at packet level when XDP steering is attached (the group → CPU table of
//!   the XDP + CPUMAP program, so the group's softirq work moves too), else at socket level
//!   (the eBPF override table of the SK_REUSEPORT program).
//!
//! Waiting loses no wake-ups: a waker writes the sleeper's eventfd, which stays readable until
//! the sleeper consumes it, so a wake between "checked the busy bits" and "went to sleep" makes
//! the sleep return at once. No timeouts are used for this.

use super::backend::Wake;
use super::stats::WorkerStats;
use crate::balance::{
    AcceptFrom, Activity, BalanceConfig, Balancer, BusySet, ConfigError, FlowGroupTable,
    Observation, StallConfig, WorkerHealth,
};
use crate::listen::ListenerGroup;
use crate::steer::XdpSteering;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How often a worker samples its own accept queue.
pub const SAMPLE_INTERVAL: Duration = Duration::from_micros(200);
/// A queue nobody observed for this long is observed by the next non-busy worker that looks.
pub const STALE_AFTER: Duration = Duration::from_millis(1);
/// The runtime's stall window: a queue that held connections this long while its owner
/// accepted none is busy. `steer` and `corelocal-tokio` use 5 ms because they also read the
/// worker thread's state; the runtime reads only its queues, so a worker merely waiting its
/// turn for a busy but fair CPU (several workers per CPU, clients beside them: a few scheduler
/// slices, ~10 ms) must not count — stealing it gains nothing and costs locality. 50 ms is the
/// shared rules' threshold for a starved thread (`StallConfig::starved_after_ns`): a worker
/// reniced behind a busy loop, or blocked in its handler, waits hundreds of ms and is still
/// caught.
pub const STALL_AFTER: Duration = Duration::from_millis(50);
/// An idle non-busy worker wakes this soon to watch the others' queues …
pub const WATCH_INTERVAL_MIN: Duration = Duration::from_millis(1);
/// … and at least this often while every queue it watched stayed empty.
pub const WATCH_INTERVAL_MAX: Duration = Duration::from_millis(32);

/// One worker's busy tracking, shared: whoever observes the worker's queue updates it.
#[derive(Debug)]
pub struct WorkerWatch {
    health: Mutex<WorkerHealth>,
    /// When the queue was last observed, in ns since [`BalanceShared::epoch`] (by anyone).
    observed_ns: AtomicU64,
    /// The worker cannot accept (at its connection limit, or paused after accept failed):
    /// whatever waits in its queue waits for nothing, as with a starved worker, so a
    /// non-empty queue counts as full and the others steal it.
    blocked: AtomicBool,
}

/// State every worker of a server shares for balancing.
pub struct BalanceShared {
    /// The parameters.
    pub config: BalanceConfig,
    /// One busy bit per worker.
    pub busy: BusySet,
    /// Flow group → worker, for migration.
    pub table: Mutex<FlowGroupTable>,
    /// The listeners (victims' sockets, the eBPF override table).
    pub group: Arc<ListenerGroup>,
    /// Each worker's waker, set once every worker has started.
    pub wakers: OnceLock<Vec<Arc<dyn Wake>>>,
    /// Flow groups moved so far.
    pub migrations: AtomicU64,
    /// Time zero for the policy's nanosecond clock.
    pub epoch: Instant,
    /// Packet-level steering (XDP + CPUMAP): when present, flow groups move there.
    pub xdp: Option<Arc<XdpSteering>>,
    /// Every worker's counters (a migration counts out at the victim).
    pub stats: Vec<Arc<WorkerStats>>,
    /// Every worker's busy tracking.
    pub watches: Vec<WorkerWatch>,
}

impl std::fmt::Debug for BalanceShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BalanceShared")
            .field("config", &self.config)
            .finish()
    }
}

/// Why the balancer cannot run over a server's listeners (a balancer error, not a listen
/// error: the listeners are fine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BalanceError {
    /// XDP steering moves a flow group's packets by CPU: it needs one worker per CPU, in CPU
    /// order.
    XdpNeedsOneWorkerPerCpu,
    /// The balancer's configuration was refused.
    Config(ConfigError),
}

impl std::fmt::Display for BalanceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BalanceError::XdpNeedsOneWorkerPerCpu => {
                f.write_str("XDP steering needs one worker per CPU, in CPU order")
            }
            BalanceError::Config(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for BalanceError {}

impl BalanceShared {
    /// Shared state for `group`'s workers. Migration needs eBPF steering (the override table);
    /// without it, migration is switched off and stealing still works.
    /// With `xdp`, migration moves a group's packets (and so its SYNs' CPU, hence its
    /// listener) by rewriting the XDP group → CPU table; that needs one worker per CPU.
    pub fn new(
        mut config: BalanceConfig,
        group: Arc<ListenerGroup>,
        xdp: Option<Arc<XdpSteering>>,
        stats: Vec<Arc<WorkerStats>>,
    ) -> Result<Self, BalanceError> {
        config.workers = group.workers();
        config.flow_groups = group.flow_groups();
        if xdp.is_some() {
            let cpus: std::collections::BTreeSet<usize> =
                (0..group.workers()).map(|w| group.worker_cpu(w)).collect();
            let ascending =
                (1..group.workers()).all(|w| group.worker_cpu(w - 1) < group.worker_cpu(w));
            if cpus.len() != group.workers() || !ascending {
                return Err(BalanceError::XdpNeedsOneWorkerPerCpu);
            }
        } else if !group.supports_flow_groups() {
            config.migrate_enabled = false;
        }
        config.validate().map_err(BalanceError::Config)?;
        let watches = (0..config.workers)
            .map(|w| WorkerWatch {
                health: Mutex::new(WorkerHealth::new(w, &config, runtime_stall_config())),
                observed_ns: AtomicU64::new(0),
                blocked: AtomicBool::new(false),
            })
            .collect();
        Ok(BalanceShared {
            watches,
            busy: BusySet::new(config.workers),
            table: Mutex::new(FlowGroupTable::new(config.flow_groups, config.workers)),
            config,
            group,
            wakers: OnceLock::new(),
            migrations: AtomicU64::new(0),
            epoch: Instant::now(),
            xdp,
            stats,
        })
    }

    fn now_ns(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Observes `worker`'s queue if nobody did for `interval`: feeds its tracker and wakes
    /// the non-busy workers when it is (still) busy. `None`: not due, claimed by another
    /// observer, or the queue could not be read.
    fn observe(&self, worker: usize, now: Instant, interval: Duration) -> Option<QueueGauge> {
        let watch = &self.watches[worker];
        let now_ns = self.now_ns(now);
        let last = watch.observed_ns.load(Ordering::Relaxed);
        let due = last == 0 || now_ns.saturating_sub(last) >= interval.as_nanos() as u64;
        if !due {
            return None;
        }
        watch
            .observed_ns
            .compare_exchange(last, now_ns.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        let depth = self.group.queue_depth(worker).ok()?;
        let blocked = watch.blocked.load(Ordering::Relaxed) && depth.len > 0;
        let seen_len = if blocked { depth.cap } else { depth.len };
        let stats = self.stats.get(worker);
        let observation = Observation {
            queue_len: seen_len,
            queue_cap: depth.cap,
            accepted: stats.map(|s| s.accepted_total()),
            // The thread's state is not read here: the queue rules decide.
            activity: Activity::Unknown,
        };
        let (change, busy) = {
            let mut health = watch.health.lock().unwrap_or_else(|p| p.into_inner());
            let change = health.observe(&self.busy, observation, now_ns);
            (change, health.busy().is_some())
        };
        let became_busy = change.is_some_and(|c| c.busy);
        if became_busy {
            if let Some(stats) = stats {
                stats.busy_transition();
            }
        }
        let high = depth.cap as u64 * self.config.busy_high_pct as u64 / 100;
        let still_over = busy && seen_len as u64 > high;
        if became_busy || still_over {
            self.wake_non_busy(worker);
        }
        Some(QueueGauge {
            len: depth.len,
            cap: depth.cap,
            busy,
        })
    }

    fn wake_non_busy(&self, except: usize) {
        let Some(wakers) = self.wakers.get() else {
            return;
        };
        for (w, waker) in wakers.iter().enumerate() {
            if w != except && !self.busy.is_busy(w) {
                waker.wake();
            }
        }
    }
}

/// The shared stall rules with the runtime's window ([`STALL_AFTER`]).
fn runtime_stall_config() -> StallConfig {
    StallConfig {
        stall_after_ns: STALL_AFTER.as_nanos() as u64,
        ..StallConfig::default()
    }
}

/// What the worker should do after a balancing turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StealOrder {
    /// The victim worker.
    pub victim: usize,
    /// Its listener to accept from.
    pub fd: RawFd,
}

/// Queue depth and busy state, for the stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueGauge {
    /// Connections waiting in this worker's listeners.
    pub len: u32,
    /// Their backlog caps.
    pub cap: u32,
    /// Whether the worker is busy.
    pub busy: bool,
}

/// One worker's balancing state.
pub struct WorkerBalance {
    shared: Arc<BalanceShared>,
    worker: usize,
    balancer: Balancer,
    last_sample: Option<Instant>,
    /// When this worker last watched the others, and how long it may sleep before the next.
    last_watch: Option<Instant>,
    watch_interval: Duration,
    local_len: u32,
    steal_in_flight: bool,
    /// A victim whose queue was found empty: not retried until it is seen non-empty again.
    drained_victim: Option<usize>,
}

impl WorkerBalance {
    /// The balancing state of `worker`.
    pub fn new(shared: Arc<BalanceShared>, worker: usize) -> Self {
        WorkerBalance {
            balancer: Balancer::new(worker, &shared.config),
            shared,
            worker,
            last_sample: None,
            last_watch: None,
            watch_interval: WATCH_INTERVAL_MIN,
            local_len: 0,
            steal_in_flight: false,
            drained_victim: None,
        }
    }

    /// Says whether this worker can accept now: at its connection limit, or paused after
    /// accept() failed, a worker with a non-empty queue counts as busy for the others.
    pub fn set_blocked(&self, blocked: bool) {
        let flag = &self.shared.watches[self.worker].blocked;
        if flag.load(Ordering::Relaxed) != blocked {
            flag.store(blocked, Ordering::Relaxed);
        }
    }

    /// Samples the own queue if due, then (when not busy) watches the others; returns the own
    /// gauge when it sampled.
    pub fn sample(&mut self, now: Instant) -> Option<QueueGauge> {
        if self.last_sample.is_some_and(|t| now - t < SAMPLE_INTERVAL) {
            return None;
        }
        self.last_sample = Some(now);
        let gauge = self.shared.observe(self.worker, now, SAMPLE_INTERVAL);
        if let Some(g) = gauge {
            self.local_len = g.len;
        }
        if !self.shared.busy.is_busy(self.worker) {
            self.watch_others(now);
        }
        gauge
    }

    /// Observes every other worker whose queue went unobserved for [`STALE_AFTER`], and
    /// adapts how long this worker may sleep before watching again.
    fn watch_others(&mut self, now: Instant) {
        let workers = self.shared.watches.len();
        let mut queued = false;
        for w in (0..workers).filter(|&w| w != self.worker) {
            if let Some(g) = self.shared.observe(w, now, STALE_AFTER) {
                queued |= g.len > 0;
            }
            queued |= self.shared.busy.is_busy(w);
        }
        self.last_watch = Some(now);
        self.watch_interval = if queued {
            WATCH_INTERVAL_MIN
        } else {
            (self.watch_interval * 2).min(WATCH_INTERVAL_MAX)
        };
    }

    /// When this worker must wake to watch the others even with nothing else to do: only
    /// while it is not busy and has others to watch.
    pub fn watch_at(&self) -> Option<Instant> {
        if self.shared.watches.len() < 2 || self.shared.busy.is_busy(self.worker) {
            return None;
        }
        // Never watched yet: due at once.
        Some(
            self.last_watch
                .map_or(self.shared.epoch, |t| t + self.watch_interval),
        )
    }

    /// A steal to queue now, if the policy wants one and none is in flight.
    pub fn steal_order(&mut self) -> Option<StealOrder> {
        if self.steal_in_flight || !self.shared.busy.any_other(self.worker) {
            return None;
        }
        let AcceptFrom::Steal(victim) = self
            .balancer
            .choose_accept(&self.shared.busy, self.local_len > 0)
        else {
            return None;
        };
        if self.drained_victim == Some(victim) && !self.victim_has_queue(victim) {
            return None;
        }
        let fd = *self.shared.group.listeners(victim).first()?;
        self.steal_in_flight = true;
        Some(StealOrder { victim, fd })
    }

    fn victim_has_queue(&mut self, victim: usize) -> bool {
        let ready = self
            .shared
            .group
            .queue_depth(victim)
            .is_ok_and(|d| d.len > 0);
        if ready {
            self.drained_victim = None;
        }
        ready
    }

    fn own_stats(&self) -> &WorkerStats {
        &self.shared.stats[self.worker]
    }

    /// A connection came from the own listener.
    pub fn accepted_local(&mut self) {
        self.balancer.record_local();
    }

    /// A steal from `victim` succeeded.
    pub fn stole(&mut self, victim: usize) {
        self.steal_in_flight = false;
        self.own_stats().stole_from(victim);
        self.balancer.record_steal(victim, self.local_len > 0);
    }

    /// A steal from `victim` found nothing (or failed).
    pub fn steal_missed(&mut self, victim: usize) {
        self.steal_in_flight = false;
        self.drained_victim = Some(victim);
    }

    /// Runs the migration tick; moves a flow group when the policy asks. Returns the group.
    pub fn migrate(&mut self, now: Instant) -> Option<u32> {
        let now_ns = (now - self.shared.epoch).as_nanos() as u64;
        let request = self.balancer.migration_tick(&self.shared.busy, now_ns)?;
        let mv = self
            .shared
            .table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .migrate(request)?;
        let moved = match &self.shared.xdp {
            // Packet level: the group's packets, hence its SYNs, now go to the new CPU, and
            // CPU steering hands them to that CPU's worker.
            Some(xdp) => xdp
                .set_group_cpu(mv.group, self.shared.group.worker_cpu(mv.to))
                .is_ok(),
            None => self
                .shared
                .group
                .set_flow_group(mv.group, Some(mv.to))
                .is_ok(),
        };
        if moved {
            self.shared.migrations.fetch_add(1, Ordering::Relaxed);
            if let Some(victim) = self.shared.stats.get(mv.from) {
                victim.migrated_out();
            }
        }
        Some(mv.group)
    }
}
