//! Per-worker counters, each worker's on its own cache lines and written only by its owner;
//! anyone may take a [`Snapshot`].

use super::netstat::NetCounters;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// Kinds of errors counted per worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Input that does not parse.
    BadRequest,
    /// A request over a size limit (or the input buffer filled without progress).
    TooLarge,
    /// A connection idle past the idle timeout.
    IdleTimeout,
    /// A receive or send failed (reset, broken pipe).
    Io,
    /// accept() failed (EMFILE, ENFILE, ENOBUFS, …).
    Accept,
}

/// One worker's counters. Aligned to two cache lines so that no two workers' counters share a
/// line (adjacent-line prefetch pulls pairs of 64-byte lines).
#[repr(align(128))]
#[derive(Debug, Default)]
pub struct WorkerStats {
    accepted: AtomicU64,
    accepted_local: AtomicU64,
    stolen: AtomicU64,
    requests: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    bad_request: AtomicU64,
    too_large: AtomicU64,
    idle_timeout: AtomicU64,
    io: AtomicU64,
    accept: AtomicU64,
    open: AtomicU64,
    /// Operations per submit that handed any over, log2 buckets.
    submit_sizes: [AtomicU64; HIST_BUCKETS],
    /// Completions per reap that returned any, log2 buckets.
    reap_sizes: [AtomicU64; HIST_BUCKETS],
    ops_submitted: AtomicU64,
    completions_reaped: AtomicU64,
    rearms: AtomicU64,
    recv_starved: AtomicU64,
    queue_len: AtomicU64,
    queue_cap: AtomicU64,
    busy: AtomicU64,
    migrated_in: AtomicU64,
    drain_accepted: AtomicU64,
    conn_limit: AtomicU64,
    backpressure: AtomicU64,
    lingered: AtomicU64,
    adopted: AtomicU64,
    moved: AtomicU64,
    /// Written by the workers that take groups from this one (atomic add, rare).
    migrated_out: AtomicU64,
    busy_transitions: AtomicU64,
    queue_samples: AtomicU64,
    queue_len_sum: AtomicU64,
    /// Connections this worker stole, by victim.
    stolen_from: Box<[AtomicU64]>,
}

/// Buckets of the batching histograms: 1, 2–3, 4–7, …, ≥ 2^(HIST_BUCKETS-1).
pub const HIST_BUCKETS: usize = 12;

fn log2_bucket(n: usize) -> usize {
    ((usize::BITS - 1 - n.leading_zeros()) as usize).min(HIST_BUCKETS - 1)
}

/// Adds `n` with a plain load + store: only the owning worker writes, so no locked RMW.
fn bump(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

impl WorkerStats {
    /// Counters for one worker of `workers` (sizes the per-victim steal counters).
    pub fn new(workers: usize) -> WorkerStats {
        WorkerStats {
            stolen_from: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            ..WorkerStats::default()
        }
    }

    /// Counts an accepted connection, local when its SYN was processed on the worker's CPU.
    pub fn accepted(&self, local: bool, stolen: bool) {
        bump(&self.accepted, 1);
        bump(&self.accepted_local, local as u64);
        bump(&self.stolen, stolen as u64);
        bump(&self.open, 1);
    }

    /// Counts a closed connection.
    pub fn closed(&self) {
        self.open.store(
            self.open.load(Ordering::Relaxed).saturating_sub(1),
            Ordering::Relaxed,
        );
    }

    /// Counts completed requests.
    pub fn requests(&self, n: u64) {
        if n > 0 {
            bump(&self.requests, n);
        }
    }

    /// Records a submit that handed `ops` operations to the kernel (0: nothing recorded).
    pub fn submitted(&self, ops: usize) {
        if ops > 0 {
            bump(&self.submit_sizes[log2_bucket(ops)], 1);
            bump(&self.ops_submitted, ops as u64);
        }
    }

    /// Records a reap that returned `completions` (0: nothing recorded).
    pub fn reaped(&self, completions: usize) {
        if completions > 0 {
            bump(&self.reap_sizes[log2_bucket(completions)], 1);
            bump(&self.completions_reaped, completions as u64);
        }
    }

    /// Counts backend events (multishot re-arms, buffer starvation).
    pub fn backend_events(&self, events: super::backend::BackendEvents) {
        if events.rearms > 0 {
            bump(&self.rearms, events.rearms);
        }
        if events.recv_starved > 0 {
            bump(&self.recv_starved, events.recv_starved);
        }
    }

    /// Records an accept-queue sample: the gauges, and the running count and sum.
    pub fn queue(&self, len: u32, cap: u32, busy: bool) {
        bump(&self.queue_samples, 1);
        bump(&self.queue_len_sum, len as u64);
        self.queue_len.store(len as u64, Ordering::Relaxed);
        self.queue_cap.store(cap as u64, Ordering::Relaxed);
        self.busy.store(busy as u64, Ordering::Relaxed);
    }

    /// Counts a change to busy (by whichever worker observed it: an atomic add).
    pub fn busy_transition(&self) {
        self.busy_transitions.fetch_add(1, Ordering::Relaxed);
    }

    /// Connections this worker accepted so far (monotonic), for the balancer's stall rule.
    pub fn accepted_total(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Counts a connection stolen from `victim`.
    pub fn stole_from(&self, victim: usize) {
        if let Some(c) = self.stolen_from.get(victim) {
            bump(c, 1);
        }
    }

    /// Counts a flow group taken from this worker (called by the taker: atomic add).
    pub fn migrated_out(&self) {
        self.migrated_out.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a flow group migrated to this worker.
    pub fn migrated_in(&self) {
        bump(&self.migrated_in, 1);
    }

    /// Counts a connection taken from the accept queue after the stop began (it would have
    /// been reset had the listener just closed).
    pub fn drain_accepted(&self) {
        bump(&self.drain_accepted, 1);
    }

    /// Counts a pause of accepting because the worker holds its connection limit
    /// (`Limits::conns_per_worker_max`); further connections wait in the kernel's queue.
    pub fn conn_limit(&self) {
        bump(&self.conn_limit, 1);
    }

    /// Counts a pause of reading on a connection whose pending output reached the output
    /// limit (a slow reader, or a client pipelining faster than it reads).
    pub fn backpressure(&self) {
        bump(&self.backpressure, 1);
    }

    /// Counts a lingering close (the peer may still have been sending when the answer was
    /// out: the sending side was shut down and its input read and discarded until the close).
    pub fn lingered(&self) {
        bump(&self.lingered, 1);
    }

    /// Counts a connection taken over from the predecessor process at a binary upgrade.
    pub fn adopted(&self) {
        bump(&self.adopted, 1);
        bump(&self.open, 1);
    }

    /// Counts a connection moved to the successor process at a binary upgrade.
    pub fn moved(&self) {
        bump(&self.moved, 1);
        self.closed();
    }

    /// Counts received bytes.
    pub fn bytes_in(&self, n: u64) {
        bump(&self.bytes_in, n);
    }

    /// Counts sent bytes.
    pub fn bytes_out(&self, n: u64) {
        bump(&self.bytes_out, n);
    }

    /// Counts an error.
    pub fn error(&self, kind: ErrorKind) {
        bump(
            match kind {
                ErrorKind::BadRequest => &self.bad_request,
                ErrorKind::TooLarge => &self.too_large,
                ErrorKind::IdleTimeout => &self.idle_timeout,
                ErrorKind::Io => &self.io,
                ErrorKind::Accept => &self.accept,
            },
            1,
        );
    }

    /// Reads the counters.
    pub fn snapshot(&self, worker: usize, cpu: usize) -> WorkerSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WorkerSnapshot {
            worker,
            cpu,
            accepted: get(&self.accepted),
            accepted_local: get(&self.accepted_local),
            stolen: get(&self.stolen),
            requests: get(&self.requests),
            bytes_in: get(&self.bytes_in),
            bytes_out: get(&self.bytes_out),
            open: get(&self.open),
            queue_len: get(&self.queue_len),
            queue_cap: get(&self.queue_cap),
            busy: get(&self.busy) != 0,
            migrated_in: get(&self.migrated_in),
            drain_accepted: get(&self.drain_accepted),
            conn_limit_pauses: get(&self.conn_limit),
            backpressure_pauses: get(&self.backpressure),
            lingered: get(&self.lingered),
            adopted: get(&self.adopted),
            moved: get(&self.moved),
            migrated_out: get(&self.migrated_out),
            busy_transitions: get(&self.busy_transitions),
            queue_samples: get(&self.queue_samples),
            queue_len_sum: get(&self.queue_len_sum),
            stolen_from: self.stolen_from.iter().map(get).collect(),
            errors: ErrorCounts {
                bad_request: get(&self.bad_request),
                too_large: get(&self.too_large),
                idle_timeout: get(&self.idle_timeout),
                io: get(&self.io),
                accept: get(&self.accept),
            },
            batching: Batching {
                ops: get(&self.ops_submitted),
                submits: self.submit_sizes.iter().map(get).sum(),
                submit_hist: self.submit_sizes.iter().map(get).collect(),
                completions: get(&self.completions_reaped),
                reaps: self.reap_sizes.iter().map(get).sum(),
                reap_hist: self.reap_sizes.iter().map(get).collect(),
                rearms: get(&self.rearms),
                recv_starved: get(&self.recv_starved),
            },
        }
    }
}

/// How much work each kernel crossing carried (MegaPipe's batching, made visible).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Batching {
    /// Operations submitted in total.
    pub ops: u64,
    /// Submits that handed over at least one operation.
    pub submits: u64,
    /// Submits by operations handed over: bucket k counts sizes in [2^k, 2^(k+1)).
    pub submit_hist: Vec<u64>,
    /// Completions reaped in total.
    pub completions: u64,
    /// Reaps that returned at least one completion.
    pub reaps: u64,
    /// Reaps by completions returned, log2 buckets as `submit_hist`.
    pub reap_hist: Vec<u64>,
    /// Multishot requests re-armed after ending without `IORING_CQE_F_MORE`.
    pub rearms: u64,
    /// Receives that ran out of provided buffers (ENOBUFS) and waited for some.
    pub recv_starved: u64,
}

impl Batching {
    /// Mean operations per submit.
    pub fn ops_per_submit(&self) -> f64 {
        self.ops as f64 / self.submits.max(1) as f64
    }

    /// Mean completions per reap.
    pub fn completions_per_reap(&self) -> f64 {
        self.completions as f64 / self.reaps.max(1) as f64
    }

    fn add(&mut self, o: &Batching) {
        self.ops += o.ops;
        self.submits += o.submits;
        self.completions += o.completions;
        self.reaps += o.reaps;
        self.rearms += o.rearms;
        self.recv_starved += o.recv_starved;
        for (hist, other) in [
            (&mut self.submit_hist, &o.submit_hist),
            (&mut self.reap_hist, &o.reap_hist),
        ] {
            hist.resize(other.len().max(hist.len()), 0);
            for (a, b) in hist.iter_mut().zip(other) {
                *a += b;
            }
        }
    }
}

/// Error counters by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ErrorCounts {
    /// Unparseable input.
    pub bad_request: u64,
    /// Over a size limit.
    pub too_large: u64,
    /// Idle past the timeout.
    pub idle_timeout: u64,
    /// Receive/send failures.
    pub io: u64,
    /// accept() failures.
    pub accept: u64,
}

impl ErrorCounts {
    /// Sum of all kinds.
    pub fn total(&self) -> u64 {
        self.bad_request + self.too_large + self.idle_timeout + self.io + self.accept
    }

    fn add(&mut self, o: &ErrorCounts) {
        self.bad_request += o.bad_request;
        self.too_large += o.too_large;
        self.idle_timeout += o.idle_timeout;
        self.io += o.io;
        self.accept += o.accept;
    }
}

/// One worker's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WorkerSnapshot {
    /// Worker index.
    pub worker: usize,
    /// The worker's CPU.
    pub cpu: usize,
    /// Connections accepted.
    pub accepted: u64,
    /// Of those, processed on this worker's CPU at SYN time (`SO_INCOMING_CPU` = worker CPU).
    pub accepted_local: u64,
    /// Of those, taken from another worker's listener.
    pub stolen: u64,
    /// Requests completed.
    pub requests: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Bytes sent.
    pub bytes_out: u64,
    /// Connections open now.
    pub open: u64,
    /// Accept-queue length at the last sample (balancer on; else 0).
    pub queue_len: u64,
    /// Accept-queue cap at the last sample.
    pub queue_cap: u64,
    /// Busy at the last sample.
    pub busy: bool,
    /// Flow groups migrated to this worker.
    pub migrated_in: u64,
    /// Connections accepted from the queue after a graceful stop began.
    pub drain_accepted: u64,
    /// Times accepting paused at the connection limit (the rest waited in the kernel queue).
    pub conn_limit_pauses: u64,
    /// Times reading paused on a connection because its pending output hit the output limit.
    pub backpressure_pauses: u64,
    /// Closes that lingered (answer out, sending side shut down, the peer's input discarded).
    pub lingered: u64,
    /// Connections taken over from the predecessor process (binary upgrade).
    pub adopted: u64,
    /// Connections moved to the successor process (binary upgrade).
    pub moved: u64,
    /// Flow groups migrated away from this worker.
    pub migrated_out: u64,
    /// Busy ↔ not-busy changes.
    pub busy_transitions: u64,
    /// Accept-queue samples taken (balancer on).
    pub queue_samples: u64,
    /// Sum of the sampled queue lengths (mean = sum / samples).
    pub queue_len_sum: u64,
    /// Connections stolen, by victim worker.
    pub stolen_from: Vec<u64>,
    /// Errors by kind.
    pub errors: ErrorCounts,
    /// Operations per submit and completions per reap.
    pub batching: Batching,
}

impl WorkerSnapshot {
    fn add(&mut self, o: &WorkerSnapshot) {
        self.accepted += o.accepted;
        self.accepted_local += o.accepted_local;
        self.stolen += o.stolen;
        self.drain_accepted += o.drain_accepted;
        self.conn_limit_pauses += o.conn_limit_pauses;
        self.backpressure_pauses += o.backpressure_pauses;
        self.lingered += o.lingered;
        self.adopted += o.adopted;
        self.moved += o.moved;
        self.requests += o.requests;
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
        self.open += o.open;
        self.queue_len += o.queue_len;
        self.queue_cap += o.queue_cap;
        self.busy |= o.busy;
        self.migrated_in += o.migrated_in;
        self.migrated_out += o.migrated_out;
        self.busy_transitions += o.busy_transitions;
        self.queue_samples += o.queue_samples;
        self.queue_len_sum += o.queue_len_sum;
        self.stolen_from
            .resize(o.stolen_from.len().max(self.stolen_from.len()), 0);
        for (a, b) in self.stolen_from.iter_mut().zip(&o.stolen_from) {
            *a += b;
        }
        self.errors.add(&o.errors);
        self.batching.add(&o.batching);
    }
}

/// Every worker's counters and their sum, and the listen-path counters of the network
/// namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    /// Per worker.
    pub workers: Vec<WorkerSnapshot>,
    /// The sum (its `worker` and `cpu` fields are meaningless).
    pub total: WorkerSnapshot,
    /// The kernel's listen-path counters (SYN cookies, queue overflows) since the server
    /// started, as last sampled (see [`super::netstat::NetSampler`]); zero when not sampled.
    pub net: NetCounters,
}

impl Snapshot {
    /// Builds a snapshot from per-worker ones.
    pub fn from_workers(workers: Vec<WorkerSnapshot>) -> Snapshot {
        let mut total = WorkerSnapshot::default();
        for w in &workers {
            total.add(w);
        }
        Snapshot {
            workers,
            total,
            net: NetCounters::default(),
        }
    }

    /// One JSON line.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("snapshot serialises")
    }

    /// Share of accepted connections that were local, in [0, 1] (1 when none accepted).
    pub fn locality(&self) -> f64 {
        if self.total.accepted == 0 {
            1.0
        } else {
            self.total.accepted_local as f64 / self.total.accepted as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_sums() {
        let a = WorkerStats::default();
        let b = WorkerStats::default();
        a.accepted(true, false);
        a.accepted(false, false);
        b.accepted(true, true);
        a.requests(3);
        b.error(ErrorKind::BadRequest);
        a.closed();
        a.conn_limit();
        b.backpressure();
        b.backpressure();
        let s = Snapshot::from_workers(vec![a.snapshot(0, 0), b.snapshot(1, 1)]);
        assert_eq!(s.total.accepted, 3);
        assert_eq!(s.total.accepted_local, 2);
        assert_eq!(s.total.stolen, 1);
        assert_eq!(s.total.open, 2);
        assert_eq!(s.total.requests, 3);
        assert_eq!(s.total.errors.total(), 1);
        assert_eq!(
            (s.total.conn_limit_pauses, s.total.backpressure_pauses),
            (1, 2)
        );
        assert!((s.locality() - 2.0 / 3.0).abs() < 1e-9);
        assert!(s.to_json().contains("\"accepted_local\":2"));
    }

    #[test]
    fn batching_histograms_bucket_by_log2() {
        let a = WorkerStats::default();
        a.submitted(0);
        a.submitted(1);
        a.submitted(3);
        a.submitted(100_000);
        a.reaped(8);
        let b = a.snapshot(0, 0).batching;
        assert_eq!(b.submits, 3);
        assert_eq!(b.ops, 100_004);
        assert_eq!(&b.submit_hist[..3], &[1, 1, 0]);
        assert_eq!(b.submit_hist[HIST_BUCKETS - 1], 1);
        assert_eq!(b.reap_hist[3], 1);
        assert!((b.completions_per_reap() - 8.0).abs() < 1e-9);
    }

    #[test]
    fn worker_stats_do_not_share_cache_lines() {
        assert_eq!(std::mem::align_of::<WorkerStats>(), 128);
        assert_eq!(std::mem::size_of::<WorkerStats>() % 128, 0);
    }
}
