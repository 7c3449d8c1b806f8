//! The Affinity-Accept balancer (seed 000 §3.3): pure, deterministic policy code with time
//! passed in, and the many-core simulator that drives it ([`sim`]).
//!
//! Nothing here makes a syscall, starts a thread or reads a clock: the caller passes queue
//! lengths, the current time (`now_ns`, nanoseconds on any monotonic clock) and what it
//! accepted. The per-connection calls ([`BusyTracker::observe`], [`Balancer::choose_accept`],
//! [`Balancer::record_local`], [`Balancer::record_steal`]) never allocate.
//!
//! # The pieces and who owns them
//!
//! | type | one per | shared? | what it does |
//! |---|---|---|---|
//! | [`BalanceConfig`] | listener group | read-only | the paper's parameters, all configurable |
//! | [`BusySet`] | listener group | yes (`&BusySet` / `Arc`) | one busy bit per worker in `AtomicU64` words: a reader learns the busy status of 64 workers with one load |
//! | [`BusyTracker`] | worker | owned by whoever samples that worker's queue | high watermark + EWMA low watermark; writes the worker's bit |
//! | [`Balancer`] | worker | owned by the worker | local:remote share, round-robin victim choice, steal counts, the 100 ms migration tick |
//! | [`FlowGroupTable`] | listener group | behind a lock (touched once per 100 ms per worker) | flow group → worker; applies a [`MigrationRequest`] as a [`Move`] |
//!
//! # The rules (defaults from the paper)
//!
//! - **Busy** ([`BusyTracker::observe`]): a worker becomes busy when its accept-queue length
//!   exceeds `busy_high_pct` = 75% of the max local queue (`queue_cap`). Every observation
//!   updates an EWMA of the length with α = 1/(2·`queue_cap`) (or 1/`ewma_alpha_inv`); a busy
//!   worker whose length is at or below the high watermark becomes non-busy once the EWMA drops
//!   below `busy_low_pct` = 10%. (The high-watermark test is made first, so a queue that stays
//!   above it keeps the worker busy even while a slow EWMA still reads low.)
//! - **Stealing** ([`Balancer::choose_accept`]): a non-busy worker with both a local connection
//!   and a busy victim available accepts `share_local`:`share_remote` = 5:1 local:remote
//!   (a credit counter: each local accept earns `share_remote`, a steal costs `share_local`).
//!   With no local connection ready it steals whenever some other worker is busy. Victims are
//!   busy workers only, found round-robin starting one past the last victim. Busy workers
//!   never steal.
//! - **Migration** ([`Balancer::migration_tick`]): every `migrate_interval_ns` = 100 ms each
//!   non-busy worker asks to move one flow group from the victim it stole the most connections
//!   from during the last interval (ties: the first such victim after itself, cyclically) to
//!   itself; steal counts restart each interval. Busy workers ask for nothing.
//!   [`FlowGroupTable::migrate`] carries the request out and says which group moved.
//!
//! # Integrating it (runtime side)
//!
//! ```text
//! shared:  cfg: BalanceConfig, busy: BusySet, table: Mutex<FlowGroupTable> (+ eBPF map mirror)
//! worker w:
//!   tracker.observe(&busy, queue_len, queue_cap)   // TCP_INFO tcpi_unacked / tcpi_sacked
//!       -> Some(BusyChange::BecameBusy): wake the non-busy workers (they may steal)
//!   match balancer.choose_accept(&busy, local_ready) {
//!       AcceptFrom::Local => accept on own listener, then balancer.record_local()
//!       AcceptFrom::Steal(v) => non-blocking accept on v's listener; on success
//!                               balancer.record_steal(v); on EAGAIN fall back to local
//!       AcceptFrom::Nothing => register for wakeups, re-check, sleep
//!   }
//!   every loop turn: if let Some(req) = balancer.migration_tick(&busy, now_ns) {
//!       if let Some(mv) = table.lock().migrate(req) { write override[mv.group] = mv.to }
//!   }
//! ```
//!
//! The simulator ([`sim`]) drives exactly these calls on simulated cores.
//!
//! # Busy from outside the worker, and redirecting SYNs
//!
//! Where we cannot steal from a queue (another process's listeners, `corelocal steer`) or a
//! worker's thread can block (`corelocal-tokio`), [`WorkerHealth`] adds two rules to the
//! watermarks that react within milliseconds: a worker that is not running (stopped, starved,
//! blocked: [`Liveness`]) or whose queue stays non-empty with nothing accepted is busy
//! ([`health`]). [`cpu_targets`] then says where a busy worker's CPU sends its SYNs: the
//! closest non-busy workers, spread, back home as soon as it drains ([`redirect`]).

mod busy;
mod groups;
pub mod health;
pub mod redirect;
pub mod sim;
mod steal;

pub use busy::{BusyChange, BusySet, BusyTracker};
pub use groups::{FlowGroupTable, Move};
pub use health::{
    Activity, BusyReason, HealthChange, Liveness, Observation, StallConfig, WorkerHealth,
};
pub use redirect::{cpu_targets, cpu_targets_tiered, CpuTargets, WorkerPlace};
pub use steal::{AcceptFrom, Balancer, BalancerStats, MigrationRequest};

/// The most workers a [`BusySet`], [`Balancer`] or [`FlowGroupTable`] supports.
pub const WORKERS_MAX: usize = 4096;
/// The most flow groups a [`FlowGroupTable`] supports (a power of two).
pub const FLOW_GROUPS_MAX: u32 = 1 << 20;
/// The largest accept-queue cap [`BusyTracker::observe`] accepts.
pub const QUEUE_CAP_MAX: u32 = 1 << 20;

/// The balancer's parameters. [`BalanceConfig::new`] gives the paper's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalanceConfig {
    /// Number of workers (1..=[`WORKERS_MAX`]).
    pub workers: usize,
    /// Busy when the accept-queue length exceeds this percentage of the max local queue
    /// (paper: 75).
    pub busy_high_pct: u32,
    /// A busy worker becomes non-busy when the EWMA of its queue length drops below this
    /// percentage of the max local queue (paper: 10).
    pub busy_low_pct: u32,
    /// The EWMA's α is 1/`ewma_alpha_inv`; 0 means the paper's 1/(2·max local queue).
    pub ewma_alpha_inv: u32,
    /// Local part of the local:remote accept share (paper: 5).
    pub share_local: u32,
    /// Remote (stolen) part of the local:remote accept share (paper: 1).
    pub share_remote: u32,
    /// Whether non-busy workers steal from busy ones.
    pub steal_enabled: bool,
    /// Whether non-busy workers migrate flow groups to themselves.
    pub migrate_enabled: bool,
    /// Period of the migration tick, in nanoseconds (paper: 100 ms).
    pub migrate_interval_ns: u64,
    /// Number of flow groups, a power of two (paper: 4096).
    pub flow_groups: u32,
}

/// Why a [`BalanceConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid balancer config: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

impl BalanceConfig {
    /// The paper's defaults for `workers` workers: 75% / 10% watermarks, α = 1/(2·cap), 5:1,
    /// stealing and migration on, 100 ms, 4096 flow groups.
    pub fn new(workers: usize) -> Self {
        BalanceConfig {
            workers,
            busy_high_pct: 75,
            busy_low_pct: 10,
            ewma_alpha_inv: 0,
            share_local: 5,
            share_remote: 1,
            steal_enabled: true,
            migrate_enabled: true,
            migrate_interval_ns: 100_000_000,
            flow_groups: 4096,
        }
    }

    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |s: &str| Err(ConfigError(s.to_string()));
        if self.workers == 0 || self.workers > WORKERS_MAX {
            return err(&format!("workers must be 1..={WORKERS_MAX}"));
        }
        if self.busy_high_pct == 0 || self.busy_high_pct > 100 {
            return err("busy_high_pct must be 1..=100");
        }
        if self.busy_low_pct > self.busy_high_pct {
            return err("busy_low_pct must not exceed busy_high_pct");
        }
        if self.ewma_alpha_inv > 2 * QUEUE_CAP_MAX {
            return err("ewma_alpha_inv too large");
        }
        if self.share_local == 0 || self.share_remote == 0 {
            return err("share_local and share_remote must be at least 1");
        }
        if self.share_local > 1000 || self.share_remote > 1000 {
            return err("share_local and share_remote must be at most 1000");
        }
        if self.migrate_interval_ns == 0 {
            return err("migrate_interval_ns must be positive");
        }
        if !self.flow_groups.is_power_of_two() || self.flow_groups > FLOW_GROUPS_MAX {
            return err(&format!(
                "flow_groups must be a power of two up to {FLOW_GROUPS_MAX}"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
