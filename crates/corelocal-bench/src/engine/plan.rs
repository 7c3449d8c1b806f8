//! One thread's [`Plan`]: slots, unit of work, quota, open-loop arrivals, times and sources.

use crate::workload::Script;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Instant;

/// What counts as one unit of work for `--requests` and for open-loop arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A request/response transaction (rpc, kv).
    Txn,
    /// A session (a connection for crr, an httperf session for http).
    Session,
}

/// Open-loop arrivals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpenLoop {
    /// Units per second (this thread's share).
    pub rate: f64,
    /// Poisson arrivals instead of evenly spaced.
    pub exponential: bool,
}

/// One thread's plan.
pub struct Plan {
    /// Connection slots (maximum concurrency).
    pub slots: usize,
    /// Unit of work.
    pub unit: Unit,
    /// Units to start in total (None: until the end time).
    pub quota: Option<u64>,
    /// Open loop, or closed loop when None.
    pub open_loop: Option<OpenLoop>,
    /// Clock origin shared by all threads.
    pub origin: Instant,
    /// Measurement starts (ns since origin).
    pub warmup_end_ns: u64,
    /// Stop at (ns since origin).
    pub end_ns: u64,
    /// A session without progress for this long fails with a timeout.
    pub timeout_ns: u64,
    /// Seed of this thread's randomness.
    pub seed: u64,
    /// Makes one script per slot.
    pub script: Box<dyn Fn() -> Box<dyn Script> + Send>,
    /// Source addresses (round-robin).
    pub src: Arc<[Ipv4Addr]>,
    /// Use `src` only once the kernel's ephemeral ports run out (`--src auto`): binding a
    /// source address costs two more operations per connection, which a run that leaves no
    /// TIME_WAIT behind on the client (the server closes first) never needs.
    pub src_on_demand: bool,
    /// Index of the first source address this thread uses.
    pub src_offset: usize,
    /// Units completed (for the progress display).
    pub progress: Arc<AtomicU64>,
    /// Set to stop early.
    pub stop: Arc<AtomicBool>,
}
