//! Busy seen from outside the worker: the paper's watermarks plus two rules that react within
//! milliseconds to a worker that stopped serving — for servers whose queues we cannot steal
//! from (`corelocal steer`), for runtimes whose workers can block (`corelocal-tokio`), and for
//! corelocal's own runtime, whose workers can be starved of CPU (the queue rules only: it does
//! not read the threads' state).
//!
//! The paper's busy bit ([`BusyTracker`]) only fires once the accept queue is 75% full: 384
//! connections with nginx's default backlog of 511, each waiting for a worker that may never
//! come back. A stopped, starved or blocked worker must be routed around long before that:
//!
//! - **not running** ([`Liveness`]): the worker's thread is stopped (SIGSTOP, a debugger), or it
//!   is neither waiting for events nor making progress for [`StallConfig::stall_after_ns`]
//!   (runnable but starved of CPU; blocked in a sleep, a disk read, a lock). A worker waiting
//!   for events is running: it serves as soon as one comes.
//! - **stalled**: its accept queue has held connections at every observation for
//!   `stall_after_ns` while its owner accepted none (where accepts cannot be counted: while
//!   the queue never got shorter): a worker that runs but does not serve (a long regex or Lua
//!   job, a busy loop).
//! - **starved**: a thread that just waited at least `starved_after_ns` (50 ms) for a CPU
//!   ([`WorkerHealth::note_run_wait`]) counts as not running for as long again (at most
//!   500 ms): one slice that drained its queue does not make it available.
//!
//! A worker busy for either rule becomes non-busy the moment it drains (queue empty, running
//! again) the first time. A worker that stalls again soon after recovering — a starved worker
//! gets a slice, drains, and is starved again — must look healthy for a hold time first, from
//! [`StallConfig::recover_hold_min_ns`] doubling per repeat up to `recover_hold_max_ns`
//! (forgotten after `flap_memory_ns` without a stall): each return costs the connections of one
//! stall window, so returns are made rare.
//!
//! Pure: every call takes the time (`now_ns`, any monotonic clock) and the observation; no
//! clock, no I/O, no allocation.

use super::{BalanceConfig, BusySet, BusyTracker};

/// Why a worker is busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BusyReason {
    /// The paper's rule: the accept queue is above the high watermark (EWMA not yet low).
    Queue,
    /// The accept queue held connections for the stall window and nothing was accepted.
    Stalled,
    /// The worker's thread is stopped, or neither idle nor progressing (starved, blocked).
    NotRunning,
}

impl BusyReason {
    /// A short lower-case name (`queue`, `stalled`, `not_running`) for reports and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            BusyReason::Queue => "queue",
            BusyReason::Stalled => "stalled",
            BusyReason::NotRunning => "not_running",
        }
    }

    /// Every reason, in a fixed order (for per-reason counters).
    pub const ALL: [BusyReason; 3] = [
        BusyReason::Queue,
        BusyReason::Stalled,
        BusyReason::NotRunning,
    ];

    /// Position in [`Self::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The stall rules' parameters. [`StallConfig::default`] is what `steer` and
/// `corelocal-tokio` use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallConfig {
    /// How long a queue may hold connections unaccepted, or a worker make no progress while
    /// not idle, before it is busy (default 5 ms).
    pub stall_after_ns: u64,
    /// Hold time before a worker that stalled again within `flap_memory_ns` of its last
    /// recovery becomes non-busy; doubles per repeat (default 50 ms).
    pub recover_hold_min_ns: u64,
    /// Longest hold (default 5 s).
    pub recover_hold_max_ns: u64,
    /// A stall more than this long after the last recovery starts the count afresh (30 s).
    pub flap_memory_ns: u64,
    /// A single wait for a CPU this long means the thread is starved (50 ms: far beyond a
    /// scheduler slice, so a busy but fair machine does not count).
    pub starved_after_ns: u64,
    /// Longest a starved thread stays busy after one long runqueue wait (500 ms): long enough
    /// to outlast a slice, short enough that a worker whose CPU is free again is back soon.
    pub starved_hold_max_ns: u64,
}

impl Default for StallConfig {
    fn default() -> Self {
        StallConfig {
            stall_after_ns: 5_000_000,
            recover_hold_min_ns: 50_000_000,
            recover_hold_max_ns: 5_000_000_000,
            flap_memory_ns: 30_000_000_000,
            starved_after_ns: 50_000_000,
            starved_hold_max_ns: 500_000_000,
        }
    }
}

impl StallConfig {
    /// Checks the ranges: a positive stall window of at most 10 s, holds in order.
    pub fn validate(&self) -> Result<(), super::ConfigError> {
        let err = |s: &str| Err(super::ConfigError(s.to_string()));
        if self.stall_after_ns == 0 || self.stall_after_ns > 10_000_000_000 {
            return err("stall_after_ns must be 1 ns ..= 10 s");
        }
        if self.recover_hold_min_ns > self.recover_hold_max_ns {
            return err("recover_hold_min_ns must not exceed recover_hold_max_ns");
        }
        if self.recover_hold_max_ns > 600_000_000_000 {
            return err("recover_hold_max_ns must be at most 10 minutes");
        }
        Ok(())
    }
}

/// What a worker's thread was doing at one observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// Waiting for events (in `epoll_wait`, parked): it serves as soon as one comes.
    Idle,
    /// Not idle (running, runnable, or asleep in something else): `progress` is any counter
    /// that grows while it works (CPU time, loop turns).
    Working {
        /// Monotonic work counter.
        progress: u64,
    },
    /// Stopped (SIGSTOP, traced).
    Stopped,
    /// Not known (the thread could not be read): the queue rules alone decide.
    Unknown,
}

/// Whether a worker runs, from its [`Activity`] over time (one per worker).
#[derive(Debug, Clone, Default)]
pub struct Liveness {
    /// Last `Working` progress value seen, and since when it has not changed.
    progress: Option<(u64, u64)>,
}

impl Liveness {
    /// Feeds one observation; `Some(false)`: not running (stopped, or working without progress
    /// for `stall_after_ns`), `Some(true)`: running or idle, `None`: unknown.
    pub fn observe(&mut self, activity: Activity, now_ns: u64, cfg: &StallConfig) -> Option<bool> {
        match activity {
            Activity::Idle => {
                self.progress = None;
                Some(true)
            }
            Activity::Stopped => {
                self.progress = None;
                Some(false)
            }
            Activity::Unknown => None,
            Activity::Working { progress } => {
                let since = match self.progress {
                    Some((last, since)) if last == progress => since,
                    _ => now_ns,
                };
                self.progress = Some((progress, since));
                Some(now_ns.saturating_sub(since) < cfg.stall_after_ns)
            }
        }
    }
}

/// One observation of a worker, as [`WorkerHealth::observe`] takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Connections waiting in its accept queue.
    pub queue_len: u32,
    /// The queue's room (the max local queue), at least 1.
    pub queue_cap: u32,
    /// Connections its owner accepted so far (monotonic), where that can be counted.
    pub accepted: Option<u64>,
    /// What its thread was doing.
    pub activity: Activity,
}

/// A change of a worker's busy bit, with the rule that decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthChange {
    /// The new value of the bit.
    pub busy: bool,
    /// Why it is busy now (`busy`), or why it was (`!busy`).
    pub reason: BusyReason,
}

/// One worker's busy state seen from outside: watermarks, stall rules, flap damping.
#[derive(Debug, Clone)]
pub struct WorkerHealth {
    cfg: StallConfig,
    tracker: BusyTracker,
    liveness: Liveness,
    /// Since when the queue has held connections at every observation, with the accept count
    /// then.
    nonempty_since: Option<(u64, Option<u64>)>,
    /// The stall rules' verdict: busy for this reason.
    stalled: Option<BusyReason>,
    /// Since when a stalled worker has looked drained and running.
    healthy_since_ns: Option<u64>,
    /// Stalls in a row within `flap_memory_ns` of the previous recovery.
    repeats: u32,
    last_recovery_ns: Option<u64>,
    /// The bit as last written, with its reason.
    busy: Option<BusyReason>,
    transitions: [u64; 3],
    /// Cumulative runqueue wait last seen ([`Self::note_run_wait`]).
    run_wait_ns: Option<u64>,
    /// Not running until then: it just waited this long for a CPU, and likely will again.
    starved_until_ns: u64,
    /// Queue length at the last observation (a drop means its owner accepted).
    last_queue_len: u32,
}

impl WorkerHealth {
    /// A non-busy worker `worker` of a group balanced by `balance` (watermarks) and `stall`.
    pub fn new(worker: usize, balance: &BalanceConfig, stall: StallConfig) -> Self {
        WorkerHealth {
            cfg: stall,
            tracker: BusyTracker::new(worker, balance),
            liveness: Liveness::default(),
            nonempty_since: None,
            stalled: None,
            healthy_since_ns: None,
            repeats: 0,
            last_recovery_ns: None,
            busy: None,
            transitions: [0; 3],
            run_wait_ns: None,
            starved_until_ns: 0,
            last_queue_len: 0,
        }
    }

    /// Records the worker thread's cumulative time spent runnable but waiting for a CPU
    /// (`/proc/PID/task/TID/schedstat`, second field; the kernel adds a wait when it ends). A
    /// wait of at least `starved_after_ns` means the thread is starved: it counts as not running
    /// for as long again (at most `starved_hold_max_ns`), since the next wait is likely as
    /// long — a starved worker that got one slice and drained its queue is not back.
    pub fn note_run_wait(&mut self, run_wait_ns: u64, now_ns: u64) {
        if let Some(last) = self.run_wait_ns {
            let waited = run_wait_ns.saturating_sub(last);
            if waited >= self.cfg.starved_after_ns {
                let until = now_ns.saturating_add(waited.min(self.cfg.starved_hold_max_ns));
                self.starved_until_ns = self.starved_until_ns.max(until);
            }
        }
        self.run_wait_ns = Some(run_wait_ns);
    }

    /// Feeds one observation at `now_ns`, writes the worker's bit in `set` when it changes and
    /// says so. Never allocates.
    pub fn observe(
        &mut self,
        set: &BusySet,
        obs: Observation,
        now_ns: u64,
    ) -> Option<HealthChange> {
        self.tracker.update(obs.queue_len, obs.queue_cap.max(1));
        let mut running = self.liveness.observe(obs.activity, now_ns, &self.cfg);
        if now_ns < self.starved_until_ns {
            running = Some(false);
        }
        let queue_stalled = self.queue_stalled(&obs, now_ns);
        match self.stalled {
            None => {
                let reason = if running == Some(false) {
                    Some(BusyReason::NotRunning)
                } else if queue_stalled {
                    Some(BusyReason::Stalled)
                } else {
                    None
                };
                if let Some(reason) = reason {
                    self.enter_stall(reason, now_ns);
                }
            }
            Some(_) => self.maybe_recover(&obs, running, queue_stalled, now_ns),
        }
        let now = match self.stalled {
            Some(reason) => Some(reason),
            None if self.tracker.is_busy() => Some(BusyReason::Queue),
            None => None,
        };
        self.publish(set, now)
    }

    /// Tracks how long the queue has held connections with nothing accepted.
    fn queue_stalled(&mut self, obs: &Observation, now_ns: u64) -> bool {
        let shrank = obs.queue_len < self.last_queue_len;
        self.last_queue_len = obs.queue_len;
        if obs.queue_len == 0 {
            self.nonempty_since = None;
            return false;
        }
        match self.nonempty_since {
            // Where accepts cannot be counted, a shorter queue than at the last look says
            // its owner took some (arrivals only lengthen it).
            Some(_) if obs.accepted.is_none() && shrank => {
                self.nonempty_since = Some((now_ns, None));
                false
            }
            Some((_, accepted)) if accepted.is_some() && accepted != obs.accepted => {
                // The owner accepted since: it drains, the wait starts again.
                self.nonempty_since = Some((now_ns, obs.accepted));
                false
            }
            Some((since, _)) => now_ns.saturating_sub(since) >= self.cfg.stall_after_ns,
            None => {
                self.nonempty_since = Some((now_ns, obs.accepted));
                false
            }
        }
    }

    fn enter_stall(&mut self, reason: BusyReason, now_ns: u64) {
        let recent = self
            .last_recovery_ns
            .is_some_and(|t| now_ns.saturating_sub(t) < self.cfg.flap_memory_ns);
        self.repeats = if recent {
            self.repeats.saturating_add(1)
        } else {
            0
        };
        self.stalled = Some(reason);
        self.healthy_since_ns = None;
    }

    /// The hold before recovery: none the first time, then `recover_hold_min_ns` doubling.
    fn hold_ns(&self) -> u64 {
        match self.repeats {
            0 => 0,
            n => self
                .cfg
                .recover_hold_min_ns
                .saturating_mul(1u64 << (n - 1).min(40))
                .min(self.cfg.recover_hold_max_ns),
        }
    }

    fn maybe_recover(
        &mut self,
        obs: &Observation,
        running: Option<bool>,
        queue_stalled: bool,
        now_ns: u64,
    ) {
        // Still stalled: keep the more telling reason.
        if running == Some(false) {
            self.stalled = Some(BusyReason::NotRunning);
        } else if queue_stalled && self.stalled == Some(BusyReason::NotRunning) && running.is_none()
        {
            self.stalled = Some(BusyReason::Stalled);
        }
        let healthy = obs.queue_len == 0 && running != Some(false);
        if !healthy {
            self.healthy_since_ns = None;
            return;
        }
        let since = *self.healthy_since_ns.get_or_insert(now_ns);
        if now_ns.saturating_sub(since) >= self.hold_ns() {
            self.stalled = None;
            self.healthy_since_ns = None;
            self.last_recovery_ns = Some(now_ns);
        }
    }

    fn publish(&mut self, set: &BusySet, now: Option<BusyReason>) -> Option<HealthChange> {
        let before = self.busy;
        self.busy = now;
        let change = match (before, now) {
            (None, Some(reason)) => HealthChange { busy: true, reason },
            (Some(reason), None) => HealthChange {
                busy: false,
                reason,
            },
            (Some(a), Some(b)) if a != b => HealthChange {
                busy: true,
                reason: b,
            },
            _ => return None,
        };
        if before.is_none() != now.is_none() {
            set.set(self.tracker.worker(), now.is_some());
        }
        if change.busy {
            self.transitions[change.reason.index()] += 1;
        }
        Some(change)
    }

    /// Whether the worker is busy, and why.
    pub fn busy(&self) -> Option<BusyReason> {
        self.busy
    }

    /// The worker.
    pub fn worker(&self) -> usize {
        self.tracker.worker()
    }

    /// How many times the worker became busy (or changed reason while busy) for each reason,
    /// indexed by [`BusyReason::index`].
    pub fn busy_counts(&self) -> [u64; 3] {
        self.transitions
    }
}
