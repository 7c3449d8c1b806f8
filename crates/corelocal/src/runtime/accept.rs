//! The worker's accept path: how many connections the backend may take from the worker's
//! listeners, when accepting pauses and resumes, the steal in flight, and the accept phase of
//! a graceful stop. The worker loop calls it; it pushes [`Op`]s and never blocks.
//!
//! Allowances: per listener, the connections the backend was allowed to accept that the
//! worker has not seen yet. `open` + allowances + a steal in flight never exceed the
//! connection limit, so the backend stops by itself at the limit and the rest wait in the
//! kernel's accept queue (io_uring: the direct-descriptor table can never overflow). The
//! arithmetic is the accept policy's ([`Refill`]), which the backends follow too.
//!
//! Pacing: without the balancer, the allowance is simply the room below the connection limit.
//! With the balancer, connections must stay in the kernel queue until the worker can take them
//! (there busy detection sees them and idle workers steal them: Affinity-Accept accepts only
//! when it can serve). What says "can take them" is how fast the worker turns its loop: each
//! turn tops the allowance up to [`super::Limits::accept_batch_max`] — a worker that does not
//! run (starved core) or runs slowly (long handlers) takes few, a fast one takes many. What
//! its connections do (silent, idle, slow) plays no part: a worker accepts up to the
//! connection limit whatever they do; silent clients are the idle timeout's business.

use super::backend::accept::Refill;
use super::backend::{Backend, Op, Origin};
use super::Limits;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// How long accepting pauses after accept() fails (EMFILE and friends).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// On stop, how long a connection with nothing received yet is kept: time for a request already
/// on its way to land. (The accept phase's own quiesce is [`Limits::accept_quiesce`].)
pub(super) const DRAIN_QUIESCE: Duration = Duration::from_millis(100);
/// While draining the accept queue, how often it is checked for emptiness.
pub(super) const DRAIN_POLL: Duration = Duration::from_millis(5);

/// The accept phase of a graceful stop: keep accepting until the queues are empty (after
/// [`Limits::accept_quiesce`]) or `until` (half the drain timeout), whichever comes first.
#[derive(Debug, Clone, Copy)]
struct AcceptDrain {
    quiet_at: Instant,
    until: Instant,
    next_check: Instant,
}

/// One worker's accept state. See the module docs.
#[derive(Debug)]
pub(super) struct AcceptPath {
    listeners: Vec<RawFd>,
    /// The listeners are shared with other workers (`stock`): one waiter per event.
    shared: bool,
    /// Balancer on: allowances are topped up once per loop turn, to `batch_max` at most.
    paced: bool,
    limits: Limits,
    /// Per listener: allowed and not seen yet.
    allowance: Vec<usize>,
    accepting: bool,
    resume_at: Option<Instant>,
    drain: Option<AcceptDrain>,
    /// Stopping and the queues are drained: never accept again.
    done: bool,
    steal_pending: bool,
}

impl AcceptPath {
    /// The accept path over `listeners`; `paced` with the balancer on.
    pub(super) fn new(listeners: Vec<RawFd>, shared: bool, paced: bool, limits: Limits) -> Self {
        AcceptPath {
            allowance: vec![0; listeners.len()],
            listeners,
            shared,
            paced,
            limits,
            accepting: false,
            resume_at: None,
            drain: None,
            done: false,
            steal_pending: false,
        }
    }

    /// Whether the backend is accepting (not paused, not stopped).
    pub(super) fn is_accepting(&self) -> bool {
        self.accepting
    }

    /// Whether a steal is in flight.
    pub(super) fn steal_pending(&self) -> bool {
        self.steal_pending
    }

    /// Whether the stop's accept phase is over.
    pub(super) fn is_done(&self) -> bool {
        self.done
    }

    /// Deadlines the loop must wake for: the end of an accept backoff, the next drain check.
    pub(super) fn deadlines(&self) -> [Option<Instant>; 2] {
        [self.resume_at, self.drain.map(|d| d.next_check)]
    }

    /// Room to steal one more connection below the limit. The own listeners' allowance is not
    /// counted: with pacing it is a standing reservation (topped up to `accept_batch_max` every
    /// turn, used only if connections arrive), and counting it would keep a worker with room
    /// from ever taking a full neighbour's queue. So a steal can meet a local accept of the
    /// last allowed connection and go one over the limit, at most (one steal in flight; the
    /// next top-up sees no room); the ring's descriptor table has headroom for that.
    pub(super) fn has_room(&self, open: usize) -> bool {
        open + usize::from(self.steal_pending) < self.limits.conns_per_worker_max
    }

    /// Starts or pauses accepting on every listener.
    pub(super) fn set_accepting<B: Backend>(&mut self, backend: &mut B, open: usize, on: bool) {
        if self.accepting == on {
            return;
        }
        self.accepting = on;
        if on {
            self.refill(backend, open, true);
            return;
        }
        for (i, &fd) in self.listeners.iter().enumerate() {
            backend.push(Op::AcceptPause {
                listener: i as u32,
                fd,
            });
        }
    }

    /// The allowance arithmetic (see [`Refill`]).
    fn refill_policy(&self) -> Refill {
        Refill {
            conns_max: self.limits.conns_per_worker_max,
            batch_max: self.limits.accept_batch_max,
            paced: self.paced,
        }
    }

    /// Tops the allowances up to the target once they ran below a quarter of it (half, when
    /// paced: a turn's batch), or at once on `resume` (which also re-arms every listener after
    /// a pause). See [`Refill`].
    fn refill<B: Backend>(&mut self, backend: &mut B, open: usize, resume: bool) {
        if !self.accepting {
            return;
        }
        let policy = self.refill_policy();
        let target = policy.target(open + usize::from(self.steal_pending));
        let n = self.allowance.len();
        for (i, &fd) in self.listeners.iter().enumerate() {
            let share = policy.listener_extra(target, n, i, self.allowance[i], resume);
            if share == 0 && !resume {
                continue;
            }
            self.allowance[i] += share as usize;
            backend.push(Op::Accept {
                listener: i as u32,
                fd,
                exclusive: self.shared,
                budget: Some(share),
            });
        }
    }

    /// Once per loop turn: with pacing, this is where the allowance grows (a turn's batch).
    pub(super) fn turn<B: Backend>(&mut self, backend: &mut B, open: usize) {
        if self.paced {
            self.refill(backend, open, false);
        }
    }

    /// A connection arrived from `origin`. Without pacing, the allowance is topped up at once.
    pub(super) fn accepted<B: Backend>(&mut self, backend: &mut B, origin: Origin, open: usize) {
        match origin {
            Origin::Local(l) => {
                if let Some(a) = self.allowance.get_mut(l as usize) {
                    *a = a.saturating_sub(1);
                }
            }
            Origin::Stolen(_) => self.steal_pending = false,
        }
        if open < self.limits.conns_per_worker_max && !self.paced {
            self.refill(backend, open, false);
        }
    }

    /// A connection closed: resume accepting if the limit had paused it, else top up.
    pub(super) fn closed<B: Backend>(&mut self, backend: &mut B, open: usize) {
        if !self.accepting
            && !self.done
            && self.resume_at.is_none()
            && open < self.limits.conns_per_worker_max
        {
            self.set_accepting(backend, open, true);
        } else if !self.paced {
            self.refill(backend, open, false);
        }
    }

    /// accept() failed (EMFILE and friends): pause, and try again after a backoff.
    pub(super) fn failed<B: Backend>(&mut self, backend: &mut B, open: usize, now: Instant) {
        self.set_accepting(backend, open, false);
        self.resume_at = Some(now + ACCEPT_BACKOFF);
    }

    /// Resumes after a backoff once it is over.
    pub(super) fn maybe_resume<B: Backend>(&mut self, backend: &mut B, open: usize, now: Instant) {
        if self.resume_at.is_some_and(|t| now >= t) {
            self.resume_at = None;
            if !self.done && open < self.limits.conns_per_worker_max {
                self.set_accepting(backend, open, true);
            }
        }
    }

    /// Queues a steal from `victim`'s listener `fd` if accepting and there is room.
    pub(super) fn try_steal<B: Backend>(
        &mut self,
        backend: &mut B,
        open: usize,
        victim: usize,
        fd: RawFd,
    ) -> bool {
        if !self.accepting || self.steal_pending || !self.has_room(open) {
            return false;
        }
        self.steal_pending = true;
        backend.push(Op::Steal {
            victim: victim as u32,
            fd,
        });
        true
    }

    /// A steal found nothing or failed.
    pub(super) fn steal_failed(&mut self) {
        self.steal_pending = false;
    }

    /// The stop began and the queues are to be drained (not handed over): keep accepting
    /// until they are empty, or half the drain timeout.
    pub(super) fn begin_drain<B: Backend>(&mut self, backend: &mut B, open: usize, now: Instant) {
        let timeout = self.limits.drain_timeout;
        self.drain = Some(AcceptDrain {
            quiet_at: now + self.limits.accept_quiesce.min(timeout / 2),
            until: now + timeout / 2,
            next_check: now,
        });
        if !self.accepting && self.resume_at.is_none() {
            self.set_accepting(backend, open, true);
        }
    }

    /// The accept phase of a stop: once the quiesce time passed, stop at an empty queue.
    pub(super) fn drain_step<B: Backend>(&mut self, backend: &mut B, open: usize, now: Instant) {
        let Some(mut d) = self.drain else {
            return;
        };
        if now < d.next_check {
            return;
        }
        d.next_check = now + DRAIN_POLL;
        self.drain = Some(d);
        if now >= d.until || (now >= d.quiet_at && self.queues_empty()) {
            self.finish(backend, open);
        }
    }

    fn queues_empty(&self) -> bool {
        self.listeners
            .iter()
            .all(|&fd| crate::sys::socket::listen_queue(fd).map_or(true, |q| q.len == 0))
    }

    /// Never accept again (the stop's accept phase is over, or the listeners were handed on).
    pub(super) fn finish<B: Backend>(&mut self, backend: &mut B, open: usize) {
        if self.done {
            return;
        }
        self.drain = None;
        self.done = true;
        self.resume_at = None;
        self.set_accepting(backend, open, false);
    }
}
