//! Per-worker stealing choice (5:1 share, round-robin victims) and the migration tick.

use super::{BalanceConfig, BusySet};

/// Where a worker should take its next connection from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptFrom {
    /// From its own accept queue.
    Local,
    /// From busy worker `victim`'s accept queue.
    Steal(usize),
    /// Nothing to take: no local connection and no busy victim (or this worker is busy).
    Nothing,
}

/// A non-busy worker's request to move one flow group from `from` (its top victim) to `to`
/// (itself); [`super::FlowGroupTable::migrate`] picks the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrationRequest {
    /// The victim the worker stole the most connections from in the last interval.
    pub from: usize,
    /// The requesting worker.
    pub to: usize,
}

/// Counters of one worker's [`Balancer`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BalancerStats {
    /// Connections accepted from the worker's own queue.
    pub accepted_local: u64,
    /// Connections stolen from other workers.
    pub accepted_stolen: u64,
    /// Migration requests made.
    pub migrations_requested: u64,
}

/// One worker's stealing and migration policy (seed 000 §3.3.1, §3.3.2).
///
/// The worker's own busy status is read from the shared [`BusySet`], so whoever samples the
/// queue (the worker itself or a sampler) keeps it current through a
/// [`super::BusyTracker`].
#[derive(Debug, Clone)]
pub struct Balancer {
    worker: usize,
    workers: usize,
    share_local: u32,
    share_remote: u32,
    steal_enabled: bool,
    migrate_enabled: bool,
    interval_ns: u64,
    /// Proportional-share credit: +share_remote per local accept, −share_local per steal.
    credit: u32,
    /// The last victim chosen; the round-robin search starts one past it.
    last_victim: usize,
    /// Steals per victim since the last migration tick.
    stolen_interval: Box<[u32]>,
    /// Steals per victim since creation.
    stolen_total: Box<[u64]>,
    next_tick_ns: Option<u64>,
    stats: BalancerStats,
}

impl Balancer {
    /// The balancer of `worker` (< `cfg.workers`). Allocates its per-victim counters here, once.
    pub fn new(worker: usize, cfg: &BalanceConfig) -> Self {
        if let Err(e) = cfg.validate() {
            panic!("{e}");
        }
        assert!(worker < cfg.workers, "worker out of range");
        Balancer {
            worker,
            workers: cfg.workers,
            share_local: cfg.share_local,
            share_remote: cfg.share_remote,
            steal_enabled: cfg.steal_enabled,
            migrate_enabled: cfg.migrate_enabled,
            interval_ns: cfg.migrate_interval_ns,
            credit: 0,
            last_victim: worker,
            stolen_interval: vec![0; cfg.workers].into_boxed_slice(),
            stolen_total: vec![0; cfg.workers].into_boxed_slice(),
            next_tick_ns: None,
            stats: BalancerStats::default(),
        }
    }

    /// The worker this balancer belongs to.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// Chooses where to accept the next connection. `local_ready`: whether the worker's own
    /// queue has a connection (or may have: a multishot accept is armed). A busy worker never
    /// steals; a non-busy one steals from a busy victim when its local:remote credit allows it
    /// or when nothing local is ready. Victims are searched round-robin one past the last one.
    /// Never allocates.
    pub fn choose_accept(&mut self, busy: &BusySet, local_ready: bool) -> AcceptFrom {
        assert_eq!(busy.workers(), self.workers, "busy set of another group");
        let may_steal = self.steal_enabled
            && !busy.is_busy(self.worker)
            && (!local_ready || self.credit >= self.share_local);
        if may_steal {
            let start = (self.last_victim + 1) % self.workers;
            if let Some(victim) = busy.next_busy_from(start, self.worker) {
                debug_assert_ne!(victim, self.worker);
                self.last_victim = victim;
                return AcceptFrom::Steal(victim);
            }
        }
        if local_ready {
            AcceptFrom::Local
        } else {
            AcceptFrom::Nothing
        }
    }

    /// Records a connection accepted from the worker's own queue.
    pub fn record_local(&mut self) {
        self.stats.accepted_local += 1;
        // Cap the credit: a long run of local accepts (no busy victim meanwhile) buys one
        // steal, not a burst of them.
        let cap = self.share_local + self.share_remote - 1;
        self.credit = (self.credit + self.share_remote).min(cap);
    }

    /// Records a connection stolen from `victim`. `local_ready` is what was passed to the
    /// [`Balancer::choose_accept`] that chose the steal: a steal made while nothing local was
    /// ready costs no credit.
    pub fn record_steal(&mut self, victim: usize, local_ready: bool) {
        assert!(victim < self.workers && victim != self.worker, "bad victim");
        self.stats.accepted_stolen += 1;
        if local_ready {
            self.credit = self.credit.saturating_sub(self.share_local);
        }
        self.stolen_interval[victim] = self.stolen_interval[victim].saturating_add(1);
        self.stolen_total[victim] += 1;
    }

    /// Called at any frequency with the current time; once every `migrate_interval_ns` it
    /// closes an interval: a non-busy worker that stole during it asks to move one flow group
    /// from its top victim to itself. Steal counts restart each interval.
    pub fn migration_tick(&mut self, busy: &BusySet, now_ns: u64) -> Option<MigrationRequest> {
        let next = *self
            .next_tick_ns
            .get_or_insert(now_ns.saturating_add(self.interval_ns));
        if now_ns < next {
            return None;
        }
        // Next deadline on the interval grid after now (skips intervals missed while stalled).
        let missed = (now_ns - next) / self.interval_ns;
        self.next_tick_ns = Some(next + (missed + 1) * self.interval_ns);
        let victim = self.top_victim();
        self.stolen_interval.fill(0);
        if !self.migrate_enabled || busy.is_busy(self.worker) {
            return None;
        }
        let from = victim?;
        self.stats.migrations_requested += 1;
        Some(MigrationRequest {
            from,
            to: self.worker,
        })
    }

    /// The victim with the most steals this interval (ties: first after this worker,
    /// cyclically), or `None` if there were no steals.
    fn top_victim(&self) -> Option<usize> {
        let mut best: Option<(usize, u32)> = None;
        for step in 1..self.workers {
            let v = (self.worker + step) % self.workers;
            let n = self.stolen_interval[v];
            let better = match best {
                None => n > 0,
                Some((_, b)) => n > b,
            };
            if better {
                best = Some((v, n));
            }
        }
        best.map(|(v, _)| v)
    }

    /// Connections stolen from `victim` since creation.
    pub fn stolen_from(&self, victim: usize) -> u64 {
        self.stolen_total[victim]
    }

    /// Connections stolen from `victim` in the current migration interval.
    pub fn stolen_this_interval(&self, victim: usize) -> u32 {
        self.stolen_interval[victim]
    }

    /// Counters.
    pub fn stats(&self) -> BalancerStats {
        self.stats
    }
}
