//! Busy tracking: the shared busy bit vector and the per-worker watermark / EWMA tracker.

use super::{BalanceConfig, QUEUE_CAP_MAX, WORKERS_MAX};
use std::sync::atomic::{AtomicU64, Ordering};

/// One busy bit per worker, in `AtomicU64` words (seed 000 §3.3.1 "Tracking busy cores").
///
/// Each worker's bit is written only by the tracker of that worker; any worker reads 64 bits
/// with one load. Loads and stores are `Relaxed`: the bit is a hint (a stale read costs one
/// failed steal attempt), never a guard for memory.
#[derive(Debug)]
pub struct BusySet {
    words: Box<[AtomicU64]>,
    workers: usize,
}

impl BusySet {
    /// A set for `workers` workers (1..=[`WORKERS_MAX`]), all non-busy.
    pub fn new(workers: usize) -> Self {
        assert!(
            workers > 0 && workers <= WORKERS_MAX,
            "workers out of range"
        );
        let words = workers.div_ceil(64);
        BusySet {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
            workers,
        }
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Number of 64-bit words.
    pub fn word_count(&self) -> usize {
        self.words.len()
    }

    /// Word `index` (bits for workers `64·index ..`): one load.
    pub fn word(&self, index: usize) -> u64 {
        self.words[index].load(Ordering::Relaxed)
    }

    /// Whether `worker` is busy.
    pub fn is_busy(&self, worker: usize) -> bool {
        assert!(worker < self.workers, "worker out of range");
        self.word(worker / 64) & (1u64 << (worker % 64)) != 0
    }

    /// Sets `worker`'s bit to `busy`.
    pub fn set(&self, worker: usize, busy: bool) {
        assert!(worker < self.workers, "worker out of range");
        let bit = 1u64 << (worker % 64);
        if busy {
            self.words[worker / 64].fetch_or(bit, Ordering::Relaxed);
        } else {
            self.words[worker / 64].fetch_and(!bit, Ordering::Relaxed);
        }
    }

    /// Number of busy workers (one load per word).
    pub fn count(&self) -> usize {
        (0..self.words.len())
            .map(|i| self.word(i).count_ones() as usize)
            .sum()
    }

    /// Whether any worker other than `exclude` is busy (one load per word).
    pub fn any_other(&self, exclude: usize) -> bool {
        (0..self.words.len()).any(|i| {
            let mut w = self.word(i);
            if exclude / 64 == i {
                w &= !(1u64 << (exclude % 64));
            }
            w != 0
        })
    }

    /// The first busy worker at or after `start`, cyclically, skipping `exclude`; each word is
    /// loaded at most once (the start word twice when the search wraps).
    pub fn next_busy_from(&self, start: usize, exclude: usize) -> Option<usize> {
        assert!(start < self.workers, "start out of range");
        let words = self.words.len();
        let start_word = start / 64;
        // Visit start_word (bits >= start), the following words, then wrap to start_word's
        // bits < start: words + 1 visits at most.
        for step in 0..=words {
            let i = (start_word + step) % words;
            let mut w = self.word(i);
            if i == exclude / 64 {
                w &= !(1u64 << (exclude % 64));
            }
            if step == 0 {
                w &= u64::MAX << (start % 64);
            } else if step == words {
                w &= !(u64::MAX << (start % 64));
            }
            if w != 0 {
                let found = i * 64 + w.trailing_zeros() as usize;
                debug_assert!(found < self.workers, "bit set beyond the last worker");
                return Some(found);
            }
        }
        None
    }
}

/// A change of a worker's busy status, reported by [`BusyTracker::observe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusyChange {
    /// The queue length exceeded the high watermark: wake non-busy workers so they steal.
    BecameBusy,
    /// The EWMA dropped below the low watermark.
    BecameNonBusy,
}

/// Fixed-point shift of the EWMA (16 fractional bits: deterministic integer arithmetic).
const EWMA_SHIFT: u32 = 16;

/// One worker's busy status: high watermark on the instantaneous accept-queue length, low
/// watermark on an EWMA of it (seed 000 §3.3.1).
#[derive(Debug, Clone)]
pub struct BusyTracker {
    worker: usize,
    high_pct: u64,
    low_pct: u64,
    alpha_inv: u32,
    ewma_q16: u64,
    busy: bool,
    observations: u64,
    transitions: u64,
}

impl BusyTracker {
    /// A non-busy tracker for `worker` with an EWMA of 0.
    pub fn new(worker: usize, cfg: &BalanceConfig) -> Self {
        assert!(worker < cfg.workers, "worker out of range");
        BusyTracker {
            worker,
            high_pct: u64::from(cfg.busy_high_pct),
            low_pct: u64::from(cfg.busy_low_pct),
            alpha_inv: cfg.ewma_alpha_inv,
            ewma_q16: 0,
            busy: false,
            observations: 0,
            transitions: 0,
        }
    }

    /// Records one observation of the accept queue (`queue_len` waiting, room for
    /// `queue_cap`, the max local queue), updates the EWMA and the busy status, and writes the
    /// worker's bit in `set` when the status changes. Never allocates.
    pub fn observe(&mut self, set: &BusySet, queue_len: u32, queue_cap: u32) -> Option<BusyChange> {
        let change = self.update(queue_len, queue_cap);
        if change.is_some() {
            set.set(self.worker, self.busy);
        }
        change
    }

    /// [`Self::observe`] without writing a [`BusySet`]: for a caller that combines this
    /// tracker's verdict with other rules before writing the worker's bit
    /// ([`super::WorkerHealth`]).
    pub fn update(&mut self, queue_len: u32, queue_cap: u32) -> Option<BusyChange> {
        assert!(
            queue_cap > 0 && queue_cap <= QUEUE_CAP_MAX,
            "queue_cap out of range"
        );
        // Linux queues backlog + 1; never let a bad sample push the EWMA off the scale.
        let len = u64::from(queue_len.min(queue_cap.saturating_mul(2)));
        let cap = u64::from(queue_cap);
        let alpha_inv = if self.alpha_inv == 0 {
            2 * cap
        } else {
            u64::from(self.alpha_inv)
        };
        // ewma += (len - ewma) · α, in Q16.
        let target = len << EWMA_SHIFT;
        if target >= self.ewma_q16 {
            self.ewma_q16 += (target - self.ewma_q16) / alpha_inv;
        } else {
            self.ewma_q16 -= (self.ewma_q16 - target) / alpha_inv;
        }
        self.observations += 1;
        let above_high = len * 100 > self.high_pct * cap;
        let below_low = self.ewma_q16 * 100 < (self.low_pct * cap) << EWMA_SHIFT;
        let change = if !self.busy && above_high {
            self.busy = true;
            Some(BusyChange::BecameBusy)
        } else if self.busy && !above_high && below_low {
            self.busy = false;
            Some(BusyChange::BecameNonBusy)
        } else {
            None
        };
        if change.is_some() {
            self.transitions += 1;
        }
        change
    }

    /// The worker this tracker watches.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// Whether the worker is busy.
    pub fn is_busy(&self) -> bool {
        self.busy
    }

    /// The EWMA of the queue length, in connections.
    pub fn ewma(&self) -> f64 {
        self.ewma_q16 as f64 / f64::from(1u32 << EWMA_SHIFT)
    }

    /// Number of observations so far.
    pub fn observations(&self) -> u64 {
        self.observations
    }

    /// Number of busy ↔ non-busy transitions so far.
    pub fn transitions(&self) -> u64 {
        self.transitions
    }
}
