//! The Affinity-Accept balancer wired into the worker loop (the policy itself is the pure
//! [`crate::balance`] module; this is the part that samples queues, wakes, steals and migrates).
//!
//! Per loop turn of a worker (never per connection):
//! - at most every [`SAMPLE_INTERVAL`], read its own accept-queue depth (TCP_INFO) and feed
//!   the [`BusyTracker`]; on becoming busy, or while still busy above the high watermark,
//!   wake the non-busy workers so they steal before the kernel drops SYNs (it never spills a
//!   full listener's SYNs to a sibling);
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
    AcceptFrom, BalanceConfig, Balancer, BusyChange, BusySet, BusyTracker, FlowGroupTable,
};
use crate::listen::ListenerGroup;
use crate::steer::XdpSteering;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How often a worker samples its own accept queue.
pub const SAMPLE_INTERVAL: Duration = Duration::from_micros(200);

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
}

impl std::fmt::Debug for BalanceShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BalanceShared")
            .field("config", &self.config)
            .finish()
    }
}

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
    ) -> Result<Self, String> {
        config.workers = group.workers();
        config.flow_groups = group.flow_groups();
        if xdp.is_some() {
            let cpus: std::collections::BTreeSet<usize> =
                (0..group.workers()).map(|w| group.worker_cpu(w)).collect();
            let ascending =
                (1..group.workers()).all(|w| group.worker_cpu(w - 1) < group.worker_cpu(w));
            if cpus.len() != group.workers() || !ascending {
                return Err("XDP steering needs one worker per CPU, in CPU order".into());
            }
        } else if !group.supports_flow_groups() {
            config.migrate_enabled = false;
        }
        config.validate().map_err(|e| e.to_string())?;
        Ok(BalanceShared {
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
    tracker: BusyTracker,
    balancer: Balancer,
    last_sample: Option<Instant>,
    local_len: u32,
    steal_in_flight: bool,
    /// A victim whose queue was found empty: not retried until it is seen non-empty again.
    drained_victim: Option<usize>,
}

impl WorkerBalance {
    /// The balancing state of `worker`.
    pub fn new(shared: Arc<BalanceShared>, worker: usize) -> Self {
        WorkerBalance {
            tracker: BusyTracker::new(worker, &shared.config),
            balancer: Balancer::new(worker, &shared.config),
            shared,
            worker,
            last_sample: None,
            local_len: 0,
            steal_in_flight: false,
            drained_victim: None,
        }
    }

    /// Samples the own queue if due; returns the gauge when it did.
    pub fn sample(&mut self, now: Instant) -> Option<QueueGauge> {
        if self.last_sample.is_some_and(|t| now - t < SAMPLE_INTERVAL) {
            return None;
        }
        self.last_sample = Some(now);
        let depth = self.shared.group.queue_depth(self.worker).ok()?;
        self.local_len = depth.len;
        let change = self
            .tracker
            .observe(&self.shared.busy, depth.len, depth.cap);
        let high = depth.cap as u64 * self.shared.config.busy_high_pct as u64 / 100;
        let still_over = self.tracker.is_busy() && depth.len as u64 > high;
        if change == Some(BusyChange::BecameBusy) || still_over {
            self.shared.wake_non_busy(self.worker);
        }
        Some(QueueGauge {
            len: depth.len,
            cap: depth.cap,
            busy: self.tracker.is_busy(),
        })
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
