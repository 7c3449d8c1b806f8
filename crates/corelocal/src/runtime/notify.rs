//! Output without input: another thread asks a connection's handler to write.
//!
//! At connect a handler may take a [`Notifier`] ([`super::handler::ConnInfo::notifier`]): the
//! worker's [`NotifyHub`] plus the connection's [`ConnKey`]. [`Notifier::notify`] from
//! any thread queues the connection on its worker's hub and wakes the worker (the backend's
//! [`Wake`]); once per loop turn the worker takes the queue and calls
//! [`super::handler::Handler::on_notify`] for each connection that still holds its slot under
//! that key and is open, so a handle kept past its connection's close never reaches the slot's
//! next connection (see [`crate::backend::key`], also for the generation's wrapping). Unused,
//! the hook costs the worker one relaxed load per turn.
//!
//! Bounded: a connection already queued is not queued twice, and the queue holds at most
//! [`NOTIFY_QUEUE_MAX`] connections; past that the hub only remembers that it overflowed and
//! the worker calls every open connection's hook once (spurious calls are allowed).

use super::backend::{ConnKey, Wake};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Connections queued per worker before the hub overflows into a sweep of all of them.
pub const NOTIFY_QUEUE_MAX: usize = 1024;

/// A worker's queue of connections to notify. Shared by its [`Notifier`]s.
pub struct NotifyHub {
    /// Set while something is queued or the queue overflowed: the worker's turn reads only
    /// this when nothing is.
    pending: AtomicBool,
    queue: Mutex<Queue>,
    waker: Arc<dyn Wake>,
}

#[derive(Default)]
struct Queue {
    conns: Vec<ConnKey>,
    /// What `conns` holds, to coalesce repeated notifies.
    queued: HashSet<ConnKey>,
    overflowed: bool,
}

/// What the worker takes from its hub in one turn.
#[derive(Debug, Default)]
pub(crate) struct Notified {
    /// The connections in the order they were first notified.
    pub(crate) conns: Vec<ConnKey>,
    /// The queue was full at some notify: every open connection is to be called.
    pub(crate) all: bool,
}

impl std::fmt::Debug for NotifyHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotifyHub")
            .field("pending", &self.pending.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl NotifyHub {
    /// A hub whose notifies wake the worker through `waker`.
    pub fn new(waker: Arc<dyn Wake>) -> NotifyHub {
        NotifyHub {
            pending: AtomicBool::new(false),
            queue: Mutex::new(Queue::default()),
            waker,
        }
    }

    fn push(&self, key: ConnKey) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.queued.contains(&key) || q.overflowed {
            return;
        }
        if q.conns.len() >= NOTIFY_QUEUE_MAX {
            q.overflowed = true;
        } else {
            q.conns.push(key);
            q.queued.insert(key);
        }
        drop(q);
        // Release: the worker that sees the flag sees the queue (the mutex orders it too).
        if !self.pending.swap(true, Ordering::AcqRel) {
            self.waker.wake();
        }
    }

    /// Whether something was queued since the last [`take`](NotifyHub::take) (one relaxed
    /// load: the worker's turn reads only this when nothing was).
    #[inline]
    pub(crate) fn pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }

    /// Takes what was queued since the last call into `into` (its allocation reused); false
    /// when nothing was.
    pub(crate) fn take(&self, into: &mut Notified) -> bool {
        if !self.pending() {
            return false;
        }
        // Cleared before the queue is read: a notify after this wakes the next turn.
        self.pending.store(false, Ordering::SeqCst);
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        into.conns.clear();
        std::mem::swap(&mut into.conns, &mut q.conns);
        q.queued.clear();
        into.all = std::mem::take(&mut q.overflowed);
        true
    }
}

/// Asks one connection's handler to write ([`super::handler::Handler::on_notify`]), from any
/// thread. Cheap to clone; stale once the connection closed (then it does nothing).
#[derive(Debug, Clone)]
pub struct Notifier {
    hub: Arc<NotifyHub>,
    /// u32: a handler keeps one, kept small.
    worker: u32,
    key: ConnKey,
}

impl Notifier {
    /// Queues the connection on its worker and wakes the worker, unless it is queued already.
    pub fn notify(&self) {
        self.hub.push(self.key);
    }

    /// Index of the worker that owns the connection.
    pub fn worker(&self) -> usize {
        self.worker as usize
    }
}

/// Where a new connection's [`Notifier`] comes from: borrowed from the worker, so that a
/// handler that takes none costs nothing.
#[derive(Debug, Clone, Copy)]
pub struct NotifyRef<'a> {
    hub: &'a Arc<NotifyHub>,
    worker: u32,
    key: ConnKey,
}

impl<'a> NotifyRef<'a> {
    /// The connection `key` on worker `worker`, through `hub`.
    pub fn new(hub: &'a Arc<NotifyHub>, worker: usize, key: ConnKey) -> Self {
        NotifyRef {
            hub,
            worker: u32::try_from(worker).unwrap_or(u32::MAX),
            key,
        }
    }

    /// The connection's notifier.
    pub fn notifier(&self) -> Notifier {
        Notifier {
            hub: Arc::clone(self.hub),
            worker: self.worker,
            key: self.key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[derive(Default)]
    struct CountWake(AtomicUsize);
    impl Wake for CountWake {
        fn wake(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn hub() -> (Arc<NotifyHub>, Arc<CountWake>) {
        let wake = Arc::new(CountWake::default());
        (Arc::new(NotifyHub::new(wake.clone())), wake)
    }

    #[test]
    fn a_connection_is_queued_once_and_wakes_once() {
        let (hub, wake) = hub();
        let n = NotifyRef::new(&hub, 3, ConnKey::new(7, 1)).notifier();
        assert_eq!(n.worker(), 3);
        let mut got = Notified::default();
        assert!(!hub.take(&mut got));
        n.notify();
        n.clone().notify();
        NotifyRef::new(&hub, 3, ConnKey::new(8, 2))
            .notifier()
            .notify();
        assert_eq!(wake.0.load(Ordering::Relaxed), 1);
        assert!(hub.take(&mut got));
        assert_eq!(
            (got.conns.as_slice(), got.all),
            (&[ConnKey::new(7, 1), ConnKey::new(8, 2)][..], false)
        );
        assert!(!hub.take(&mut got), "taken");
        n.notify();
        assert_eq!(
            wake.0.load(Ordering::Relaxed),
            2,
            "queued again after the take"
        );
    }

    #[test]
    fn a_full_queue_overflows_into_a_sweep() {
        let (hub, _) = hub();
        for conn in 0..NOTIFY_QUEUE_MAX as u32 + 5 {
            NotifyRef::new(&hub, 0, ConnKey::new(conn, 1))
                .notifier()
                .notify();
        }
        let mut got = Notified::default();
        assert!(hub.take(&mut got));
        assert_eq!((got.conns.len(), got.all), (NOTIFY_QUEUE_MAX, true));
    }
}
