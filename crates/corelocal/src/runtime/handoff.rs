//! What moves to a successor process at a binary upgrade besides the listening sockets: the
//! established connections (each with the bytes read but not yet handled and its handler's
//! state between requests) and the service's own state (kv's cache), as a byte stream.
//!
//! The service side is two traits, implemented by services with state worth keeping:
//! [`StateExport`] produces the stream in bounded chunks once the old process's workers have
//! stopped (nothing writes any more), [`StateImport`] consumes it in the new process before its
//! workers start. The runtime carries the chunks without looking inside them; the format, its
//! version and what a mismatch means belong to the service.

/// The old process's side of a service's state stream (see the module docs).
pub trait StateExport: Send {
    /// Appends the next part of the stream to `out`, about `bytes_max` bytes (a record larger
    /// than that may be cut anywhere: the stream is a byte stream, chunk boundaries carry no
    /// meaning). Returns `Ok(false)` once everything was produced (`out` may still have
    /// received a last part).
    fn next_chunk(&mut self, out: &mut Vec<u8>, bytes_max: usize) -> Result<bool, StateError>;

    /// What was exported, for the takeover report ("412,331 items, 1.0 GiB").
    fn summary(&self) -> String;
}

/// The new process's side of a service's state stream (see the module docs).
pub trait StateImport: Send {
    /// Consumes the next part of the stream, in the order [`StateExport::next_chunk`] made
    /// them. An error stops the import: the service must be left as if nothing had been
    /// imported, or with what was imported so far whole (never a half-written record).
    fn chunk(&mut self, data: &[u8]) -> Result<(), StateError>;

    /// The stream ended: finish (e.g. check that it was complete). Returns what was imported,
    /// for the takeover report, or why nothing was kept (a format version or `--memory-mb`
    /// mismatch: the service starts clean and says so here).
    fn finish(self: Box<Self>) -> Result<String, StateError>;
}

/// Why a service's state did not move ([`StateExport`], [`StateImport`]); each says why in
/// words for the takeover report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateError {
    /// The stream is of another format version, or for other limits: the new process starts
    /// clean.
    Incompatible(String),
    /// The stream broke off or is damaged: the import keeps what it read whole, or nothing.
    Broken(String),
    /// The export cannot go on.
    Export(String),
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::Incompatible(why) | StateError::Broken(why) | StateError::Export(why) => {
                f.write_str(why)
            }
        }
    }
}

impl std::error::Error for StateError {}

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Connections detached (or being detached) by the workers and not yet taken by the handoff
/// thread; a worker that finds the outbox full keeps the connection and tries again later
/// (descriptors are bounded).
pub const OUTBOX_LEN_MAX: usize = 4096;
/// Connections received and not yet registered by their worker; the receiving thread waits
/// while this many are pending (descriptors are bounded).
pub const GATE_PENDING_MAX: usize = 4096;

/// An established connection on its way to the successor process.
#[derive(Debug)]
pub struct MovedConn {
    /// The socket.
    pub fd: OwnedFd,
    /// Bytes read from it and not yet handled (the start of the next request, if any).
    pub input: Vec<u8>,
    /// Its handler's state between requests ([`super::Handler::handoff`]).
    pub state: Vec<u8>,
    /// The CPU of the worker that served it (the successor's pick when `SO_INCOMING_CPU`
    /// has nothing better).
    pub cpu: u16,
}

type Exporter = Box<dyn Fn() -> Option<Box<dyn StateExport>> + Send + Sync>;

/// The old process's side: where stopping workers put the connections they detach between
/// requests, for the thread that sends them to the successor (see [`Outbox::take`]).
pub struct Outbox {
    enabled: AtomicBool,
    keeps_sent: bool,
    inner: Mutex<OutboxInner>,
    changed: Condvar,
    export: Exporter,
}

struct OutboxInner {
    conns: VecDeque<MovedConn>,
    /// Room taken by detaches in flight ([`Outbox::reserve`]).
    reserved: usize,
    workers_running: usize,
    detached_total: u64,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("enabled", &self.is_enabled())
            .finish()
    }
}

impl Outbox {
    /// An outbox for `workers` workers; `export` gives the service's state stream;
    /// `keeps_sent`: see [`Outbox::keeps_sent`].
    pub(crate) fn new(workers: usize, export: Exporter, keeps_sent: bool) -> Outbox {
        Outbox {
            enabled: AtomicBool::new(false),
            keeps_sent,
            inner: Mutex::new(OutboxInner {
                conns: VecDeque::new(),
                reserved: 0,
                workers_running: workers,
                detached_total: 0,
            }),
            changed: Condvar::new(),
            export,
        }
    }

    /// Whether the connections sent to a successor stay open here until the end of the move:
    /// true for a service that imports state, whose successor reads none of them before (its
    /// gate stays closed until the state is in), so they can be taken back if it fails.
    pub fn keeps_sent(&self) -> bool {
        self.keeps_sent
    }

    /// Whether stopping workers move connections here instead of closing them.
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// From now on stopping workers move connections here (set before the stop).
    pub(crate) fn enable(&self) {
        self.enabled.store(true, Ordering::Release);
    }

    /// The successor is gone: stopping workers close connections again, as a stop without a
    /// successor does (those already detached close when taken from here).
    pub fn disable(&self) {
        self.enabled.store(false, Ordering::Release);
    }

    /// Takes room for one connection a worker starts detaching; false when full.
    pub(crate) fn reserve(&self) -> bool {
        let mut inner = self.inner.lock().expect("outbox lock");
        if inner.conns.len() + inner.reserved >= OUTBOX_LEN_MAX {
            return false;
        }
        inner.reserved += 1;
        true
    }

    /// A detach failed: its room is free again.
    pub(crate) fn unreserve(&self) {
        let mut inner = self.inner.lock().expect("outbox lock");
        inner.reserved = inner
            .reserved
            .checked_sub(1)
            .expect("unreserved more than reserved");
    }

    /// A worker detached `conn` (in the room it reserved).
    pub(crate) fn push(&self, conn: MovedConn) {
        let mut inner = self.inner.lock().expect("outbox lock");
        inner.reserved = inner
            .reserved
            .checked_sub(1)
            .expect("pushed without reserving");
        inner.conns.push_back(conn);
        inner.detached_total += 1;
        self.changed.notify_all();
    }

    /// A worker exited (whatever way): nothing more comes from it.
    pub(crate) fn worker_exited(&self) {
        let mut inner = self.inner.lock().expect("outbox lock");
        inner.workers_running = inner.workers_running.saturating_sub(1);
        self.changed.notify_all();
    }

    /// Takes up to `max` connections, waiting up to `wait` for one. Returns them and whether
    /// the stream of connections is over (every worker exited, nothing left).
    pub fn take(&self, max: usize, wait: Duration) -> (Vec<MovedConn>, bool) {
        let deadline = Instant::now() + wait;
        let mut inner = self.inner.lock().expect("outbox lock");
        while inner.conns.is_empty() && inner.workers_running > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            inner = self
                .changed
                .wait_timeout(inner, left)
                .expect("outbox lock")
                .0;
        }
        let n = inner.conns.len().min(max);
        let batch: Vec<MovedConn> = inner.conns.drain(..n).collect();
        let over = inner.conns.is_empty() && inner.workers_running == 0;
        (batch, over)
    }

    /// Connections detached so far.
    pub fn detached_total(&self) -> u64 {
        self.inner.lock().expect("outbox lock").detached_total
    }

    /// The service's state stream (call once every worker exited).
    pub fn export_state(&self) -> Option<Box<dyn StateExport>> {
        (self.export)()
    }
}

/// The new process's side: its workers wait here before they accept anything, registering
/// the connections the predecessor hands over as they arrive, until [`Gate::open`]. A service
/// with no state to import opens the gate at once: its workers serve new connections and take
/// moved ones as they come (see `ready_for`), until [`Gate::finish`].
#[derive(Debug)]
pub struct Gate {
    inner: Mutex<GateInner>,
    changed: Condvar,
    /// Per worker: connections delivered and not taken (read without the lock, each turn).
    ready: Vec<std::sync::atomic::AtomicUsize>,
    /// No more connections come.
    finished: AtomicBool,
}

#[derive(Debug)]
struct GateInner {
    open: bool,
    /// Per worker: connections received, not yet registered.
    queues: Vec<Vec<MovedConn>>,
    pending: usize,
    delivered_total: u64,
}

impl Gate {
    /// A closed gate for `workers` workers.
    pub(crate) fn new(workers: usize) -> Gate {
        Gate {
            inner: Mutex::new(GateInner {
                open: false,
                queues: (0..workers).map(|_| Vec::new()).collect(),
                pending: 0,
                delivered_total: 0,
            }),
            changed: Condvar::new(),
            ready: (0..workers)
                .map(|_| std::sync::atomic::AtomicUsize::new(0))
                .collect(),
            finished: AtomicBool::new(false),
        }
    }

    /// Whether connections wait for `worker` (one relaxed load: a worker asks every turn).
    pub(crate) fn ready_for(&self, worker: usize) -> bool {
        self.ready[worker].load(Ordering::Relaxed) > 0
    }

    /// No more connections come (the move ended, or failed).
    pub fn finish(&self) {
        self.finished.store(true, Ordering::Release);
        self.changed.notify_all();
    }

    /// Whether the move ended and `worker` took everything delivered to it.
    pub(crate) fn is_done_for(&self, worker: usize) -> bool {
        self.finished.load(Ordering::Acquire) && !self.ready_for(worker)
    }

    /// Queues `conn` for `worker` (waiting, at most `wait`, while [`GATE_PENDING_MAX`] are
    /// pending: the workers register them and close the descriptors).
    pub(crate) fn deliver(&self, worker: usize, conn: MovedConn, wait: Duration) {
        let deadline = Instant::now() + wait;
        let mut inner = self.inner.lock().expect("gate lock");
        while inner.pending >= GATE_PENDING_MAX {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            inner = self.changed.wait_timeout(inner, left).expect("gate lock").0;
        }
        assert!(worker < inner.queues.len(), "no worker {worker}");
        inner.queues[worker].push(conn);
        self.ready[worker].fetch_add(1, Ordering::Relaxed);
        inner.pending += 1;
        inner.delivered_total += 1;
        self.changed.notify_all();
    }

    /// Whether the workers serve already.
    pub fn is_open(&self) -> bool {
        self.inner.lock().expect("gate lock").open
    }

    /// Lets the workers start serving (everything was delivered, or the handover gave up; or
    /// at once, for a service with no state to wait for).
    pub fn open(&self) {
        self.inner.lock().expect("gate lock").open = true;
        self.changed.notify_all();
    }

    /// Connections delivered so far.
    pub fn delivered_total(&self) -> u64 {
        self.inner.lock().expect("gate lock").delivered_total
    }

    /// A worker's wait: its connections delivered since the last call (waiting up to `wait`
    /// for some) and whether the gate is open.
    pub(crate) fn wait(&self, worker: usize, wait: Duration) -> (Vec<MovedConn>, bool) {
        let mut inner = self.inner.lock().expect("gate lock");
        if inner.queues[worker].is_empty() && !inner.open {
            inner = self.changed.wait_timeout(inner, wait).expect("gate lock").0;
        }
        let conns = std::mem::take(&mut inner.queues[worker]);
        inner.pending -= conns.len();
        self.ready[worker].fetch_sub(conns.len(), Ordering::Relaxed);
        if !conns.is_empty() {
            self.changed.notify_all();
        }
        (conns, inner.open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(cpu: u16) -> MovedConn {
        MovedConn {
            fd: std::fs::File::open("/dev/null").unwrap().into(),
            input: b"get k".to_vec(),
            state: Vec::new(),
            cpu,
        }
    }

    #[test]
    fn the_outbox_bounds_what_is_detached_and_ends_when_every_worker_exited() {
        let outbox = Outbox::new(2, Box::new(|| None), false);
        let reserved = (0..OUTBOX_LEN_MAX + 10)
            .filter(|_| outbox.reserve())
            .count();
        assert_eq!(
            reserved, OUTBOX_LEN_MAX,
            "room is bounded, detaches in flight included"
        );
        for _ in 0..3 {
            outbox.push(conn(0));
        }
        outbox.unreserve();
        let (batch, over) = outbox.take(2, Duration::ZERO);
        assert_eq!((batch.len(), over), (2, false));
        assert!(outbox.reserve(), "taking frees room");
        outbox.worker_exited();
        outbox.worker_exited();
        let (batch, over) = outbox.take(10, Duration::ZERO);
        assert_eq!(batch.len(), 1);
        // Even with room still reserved (a worker that died mid-detach): no worker, no more.
        assert!(over, "every worker exited and nothing is left");
    }

    #[test]
    fn a_gate_hands_each_worker_its_connections_and_says_when_it_opened() {
        let gate = Gate::new(2);
        gate.deliver(1, conn(1), Duration::ZERO);
        assert!(gate.ready_for(1) && !gate.ready_for(0));
        let (conns, open) = gate.wait(0, Duration::from_millis(1));
        assert!(conns.is_empty() && !open);
        let (conns, open) = gate.wait(1, Duration::ZERO);
        assert_eq!((conns.len(), open), (1, false));
        assert!(!gate.ready_for(1));
        gate.open();
        assert!(
            gate.wait(0, Duration::from_secs(60)).1,
            "an open gate does not wait"
        );
        assert!(!gate.is_done_for(0), "not done before the move ends");
        gate.deliver(0, conn(0), Duration::ZERO);
        gate.finish();
        assert!(
            !gate.is_done_for(0),
            "a connection delivered is still to be taken"
        );
        assert_eq!(gate.wait(0, Duration::ZERO).0.len(), 1);
        assert!(gate.is_done_for(0) && gate.is_done_for(1));
        assert_eq!(gate.delivered_total(), 2);
    }
}
