//! The worker loop: one pinned thread owning its listeners, backend, connections and buffers.
//! Generic over the [`Backend`] and the [`Service`], so apps never see which backend runs.
//!
//! Layout: this file holds the worker's setup and state, the loop and its turn (timeout,
//! dispatch of completions, balancing); `lifecycle` opens and closes connections (accept,
//! idle timeout, close); `input` feeds received bytes to the handler; `output` sends its
//! output; `drain` runs the graceful stop; `handoff` moves connections to a successor process
//! (and takes them over from a predecessor) at a binary upgrade.

mod drain;
mod handoff;
mod input;
mod lifecycle;
mod notify;
mod output;
mod recv_hold;

use super::accept::AcceptPath;
use super::backend::key::Slots;
use super::backend::{Backend, Completion, ConnKey};
use super::balance::{BalanceShared, WorkerBalance};
use super::defer::DeferSwitch;
use super::handler::{CloseReason, Output, Service};
use super::handoff::{Gate, Outbox};
use super::notify::{Notified, NotifyHub};
use super::stats::{ErrorKind, WorkerStats};
use super::Limits;
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Completions handled per loop turn before submitting again.
const REAP_BATCH_MAX: usize = 512;
/// Batches [`Worker::handle_queued`] reaps at most: more than a completion queue holds.
const QUEUED_ROUNDS_MAX: usize = 64;
/// How often a worker checks that it still runs on its own CPU only. Taking a CPU offline makes
/// the kernel widen the affinity of the threads pinned there to every CPU, and bringing it back
/// online does not narrow it again (seen in the lab, bench/lab: `corelocal-w7` allowed 0-15
/// after CPU 7 went offline and back): without the check such a worker runs anywhere, away from
/// the SYNs its listener receives and from its cache, for the rest of its life. One
/// `sched_getaffinity` a second per worker.
const PIN_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// What a worker is given.
pub struct WorkerSetup<S: Service> {
    /// Worker index.
    pub index: usize,
    /// The CPU it is pinned to.
    pub cpu: usize,
    /// Its listeners.
    pub listeners: Vec<std::os::fd::RawFd>,
    /// Whether the listeners are shared with other workers (`stock`).
    pub shared_listeners: bool,
    /// The application.
    pub service: Arc<S>,
    /// Its counters.
    pub stats: Arc<WorkerStats>,
    /// Set to ask for a graceful stop.
    pub stop: Arc<AtomicBool>,
    /// Set (before `stop`) when the listeners were handed to a successor process that accepts
    /// from the same queues: the stop then leaves the queues alone (see `begin_drain`).
    pub released: Arc<AtomicBool>,
    /// Limits.
    pub limits: Limits,
    /// Balancing state shared by the server's workers (`None`: no balancer).
    pub balance: Option<Arc<BalanceShared>>,
    /// Where a stop moves connections when the server hands over to a successor.
    pub outbox: Option<Arc<Outbox>>,
    /// Set when the server starts on a predecessor's connections: the worker registers them
    /// and accepts nothing until the gate opens.
    pub gate: Option<Arc<Gate>>,
    /// The worker switches `TCP_DEFER_ACCEPT` (this many seconds when on) on its own listeners
    /// with its load (see [`crate::runtime::defer`]); `None`: as the listeners were set up.
    pub defer_switch_s: Option<u32>,
}

/// Where a connection is on its way out: one state instead of flags (monoio's
/// `uring/lifecycle.rs`). A send in flight is tracked apart (`Conn::sending`): open connections
/// send too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closing {
    /// Reading and answering.
    Open,
    /// Asked to close (by the handler, the peer's EOF, a limit, the stop): the pending output
    /// goes first.
    Flushing(CloseReason),
    /// The last output is with the backend with the close fused behind it
    /// (`Op::Send::close_after`): the input was known to be finished. No `Op::Close` follows,
    /// unless the send must be aborted (idle timeout, stop deadline: `Op::AbortSend`).
    LastSend,
    /// The answer is out and the sending side shut down; what the peer still sends is read and
    /// discarded until its FIN or the lingering bounds, then the connection closes (nginx's
    /// lingering close, RFC 9112 §9.6). A close with input left unread would make the kernel
    /// reset the connection and drop the answer from the peer's receive queue.
    Lingering {
        /// The lingering ends here at the latest (`Limits::linger_time`).
        until: Instant,
        /// Bytes read and discarded so far (`Limits::linger_bytes_max`).
        discarded: u64,
    },
    /// `Op::Close` or `Op::AbortSend` is with the backend: `Completion::Closed` follows.
    CloseQueued,
    /// `Op::Detach` is with the backend (a successor takes the connection over): what
    /// arrives meanwhile is kept unhandled, and `Completion::Detached` follows.
    Detaching,
}

struct Conn<H> {
    handler: H,
    input: Vec<u8>,
    output: Output,
    sending: bool,
    /// Bytes of the send in flight (taken out of `output`, not yet completed).
    in_flight: u64,
    recv_paused: bool,
    eof: bool,
    closing: Closing,
    /// The peer sent input this connection will not read, or may still be sending: its close
    /// must linger. Set when the close begins (a protocol error, unconsumed input, an unread
    /// body: [`super::handler::Handler::expects_input`]) and when input arrives during it.
    unread: bool,
    last_active: Instant,
    /// Whether a request of this connection completed (or it closed): not waiting any more.
    served: bool,
    /// While stopping: the handler will tell the peer it closes (see `Handler::on_drain`).
    drain_signalled: bool,
    /// `Handler::on_notify` left no room: call it again once the output drained to half.
    notify_again: bool,
    /// The handler yielded with input left (`Step::yielded`), or used its rounds for one go
    /// with input left: to be queued on `ready`.
    yielded: bool,
    /// On the worker's `ready` list (once at most, so the list is bounded by the connections).
    ready: bool,
    /// Receiving is paused because yielded input piled up (not for output back-pressure).
    input_paused: bool,
    /// Where a receive stop the handler asked for (`Output::stop_receiving`) stands.
    recv_hold: RecvHold,
}

/// A handler's receive stop (`Output::stop_receiving`, `Handler::on_recv_stopped`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecvHold {
    /// None: receiving follows back-pressure and pauses only.
    Free,
    /// `Op::RecvStop` is with the backend.
    Stopping,
    /// Stopped; held until the socket options the handler queued then are set.
    UntilOptions,
}

impl<H> Conn<H> {
    /// Output not yet sent: queued plus in flight. Reading pauses when it reaches the limit.
    fn pending(&self) -> u64 {
        self.output.total_len() + self.in_flight
    }

    /// Whether the close may go with the last answer rather than linger: the input is known
    /// to be finished (the peer's FIN was read, or the requests were read to their end and
    /// nothing else came), the client timed out (never worth lingering for), or lingering is
    /// off.
    fn closes_with_answer(&self, limits: &Limits) -> bool {
        self.eof
            || !self.unread
            || self.closing == Closing::Flushing(CloseReason::TimedOut)
            || limits.linger_time.is_zero()
    }
}

/// One worker's state.
pub struct Worker<S: Service, B: Backend> {
    setup: WorkerSetup<S>,
    backend: B,
    /// By the backend's ids (slots); what is queued for a connection holds its key, so that
    /// it never reaches the slot's next connection.
    conns: Slots<Option<Conn<S::Conn>>>,
    open: usize,
    /// Idle-timeout queue: (deadline, conn). Lazily corrected: an entry whose connection was
    /// active since is re-queued at its real deadline when it comes up.
    idle: VecDeque<(Instant, ConnKey)>,
    /// Lingering closes: (deadline, conn), lazily corrected like `idle`.
    linger: VecDeque<(Instant, ConnKey)>,
    /// Handlers' own shorter idle timeouts (`Handler::idle_timeout`: a TLS handshake), lazily
    /// corrected like `idle`; an entry goes once its handler has none.
    short_idle: VecDeque<(Instant, ConnKey)>,
    /// Byte buffers for reuse (send buffers, connections' input and output).
    spare: output::SpareBufs,
    /// Allowances, pacing, pauses, the steal in flight and the stop's accept phase.
    accept: AcceptPath,
    drain_deadline: Option<Instant>,
    /// While stopping: when to close connections that stayed silent (see `sweep_silent`).
    sweep_at: Option<Instant>,
    /// While moving connections to a successor: when to look for quiet ones next.
    detach_at: Option<Instant>,
    balance: Option<WorkerBalance>,
    /// Where the connections' notifiers queue them (see [`super::notify`]).
    notify: Arc<NotifyHub>,
    /// What the last turn took from `notify` (its allocation kept).
    notified: Notified,
    /// Connections whose handler yielded with input left, run at the start of the next turn,
    /// before its completions.
    ready: VecDeque<ConnKey>,
    /// `TCP_DEFER_ACCEPT` switched with the load (`WorkerSetup::defer_switch_s`).
    defer: Option<DeferSwitch>,
    /// When to check the worker's CPU affinity next (see [`PIN_CHECK_INTERVAL`]).
    pin_check_at: Instant,
}

impl<S: Service, B: Backend> Worker<S, B> {
    /// A worker over `backend`.
    pub fn new(setup: WorkerSetup<S>, backend: B) -> Self {
        let balance = setup
            .balance
            .clone()
            .map(|shared| WorkerBalance::new(shared, setup.index));
        let accept = AcceptPath::new(
            setup.listeners.clone(),
            setup.shared_listeners,
            balance.is_some(),
            setup.limits,
        );
        let notify = Arc::new(NotifyHub::new(backend.waker()));
        // A worker starts idle: not deferring until it batches.
        let defer = setup
            .defer_switch_s
            .map(|_| DeferSwitch::new(false, Instant::now()));
        let worker = Worker {
            pin_check_at: Instant::now() + PIN_CHECK_INTERVAL,
            defer,
            notify,
            notified: Notified::default(),
            ready: VecDeque::new(),
            balance,
            accept,
            setup,
            backend,
            conns: Slots::new(),
            open: 0,
            idle: VecDeque::new(),
            linger: VecDeque::new(),
            short_idle: VecDeque::new(),
            spare: output::SpareBufs::default(),
            drain_deadline: None,
            sweep_at: None,
            detach_at: None,
        };
        if worker.defer.is_some() {
            worker.set_defer_accept(0); // it starts idle (see `defer`)
        }
        worker
    }

    /// Runs until a graceful stop completes.
    pub fn run(mut self) -> std::io::Result<()> {
        let adopted = self.wait_at_gate();
        let now = Instant::now();
        for conn in adopted {
            self.on_adopted(conn, now);
        }
        self.accept.set_accepting(&mut self.backend, 0, true);
        let mut completions = Vec::with_capacity(REAP_BATCH_MAX);
        loop {
            let now = Instant::now();
            if self.stop_requested(now) {
                break;
            }
            let submitted = self.backend.submit()?;
            self.setup.stats.submitted(submitted);
            let wait_start = self.defer.is_some().then(Instant::now);
            self.backend.wait(self.next_timeout(now))?;
            let now = Instant::now();
            if let (Some(d), Some(start)) = (self.defer.as_mut(), wait_start) {
                d.waited(now - start);
            }
            if !self.ready.is_empty() {
                self.run_ready(now);
            }
            self.backend.reap(&mut completions, REAP_BATCH_MAX);
            self.setup.stats.reaped(completions.len());
            self.setup.stats.backend_events(self.backend.take_events());
            for c in completions.drain(..) {
                self.handle(c, now);
            }
            self.run_notified(now);
            self.take_late(now);
            self.expire_idle(now);
            if !self.short_idle.is_empty() {
                self.expire_short_idle(now);
            }
            self.expire_linger(now);
            self.accept.maybe_resume(&mut self.backend, self.open, now);
            self.balance_turn(now);
            self.defer_turn(now);
            self.pin_turn(now);
            self.accept.turn(&mut self.backend, self.open);
        }
        self.backend.submit().map(|_| ())
    }

    /// Pins the worker back to its CPU when something widened its affinity (the kernel does,
    /// when the CPU goes offline). While the CPU is still offline the pin fails: the worker runs
    /// where the kernel put it and tries again at the next check.
    fn pin_turn(&mut self, now: Instant) {
        if now < self.pin_check_at {
            return;
        }
        self.pin_check_at = now + PIN_CHECK_INTERVAL;
        if crate::sys::affinity::current_is_only(self.setup.cpu).unwrap_or(true) {
            return;
        }
        let own = crate::cpu::CpuSet::single(self.setup.cpu);
        match crate::cpu::current_affinity() {
            Ok(set) if set == own => {}
            Ok(set) => {
                if crate::cpu::pin_current_thread(&own).is_ok() {
                    crate::log_line!(
                        "corelocal: worker {} pinned back to CPU {} (its affinity had become {set}: CPU hotplug?)",
                        self.setup.index,
                        self.setup.cpu
                    );
                }
            }
            Err(_) => {}
        }
    }

    /// Switches `TCP_DEFER_ACCEPT` on the worker's listeners when its load says so.
    fn defer_turn(&mut self, now: Instant) {
        let (Some(d), Some(secs)) = (self.defer.as_mut(), self.setup.defer_switch_s) else {
            return;
        };
        if let Some(on) = d.decide(now) {
            self.set_defer_accept(if on { secs } else { 0 });
        }
    }

    /// Sets `TCP_DEFER_ACCEPT` on the worker's own listeners (a failure leaves it as it was:
    /// counted, not fatal).
    fn set_defer_accept(&self, secs: u32) {
        for &fd in &self.setup.listeners {
            if crate::sys::socket::set_defer_accept(fd, secs).is_err() {
                self.setup.stats.error(ErrorKind::Accept);
            }
        }
    }

    /// Handles every completion the backend holds now, outside the loop's turn (bounded:
    /// handling one only queues operations, which the next `submit` hands over).
    fn handle_queued(&mut self, now: Instant) {
        let mut completions = Vec::with_capacity(REAP_BATCH_MAX);
        for _ in 0..QUEUED_ROUNDS_MAX {
            self.backend.reap(&mut completions, REAP_BATCH_MAX);
            if completions.is_empty() {
                return;
            }
            self.setup.stats.reaped(completions.len());
            for c in completions.drain(..) {
                self.handle(c, now);
            }
        }
    }

    fn next_timeout(&self, now: Instant) -> Option<Duration> {
        let mut deadline = self.idle.front().map(|e| e.0);
        let linger = self.linger.front().map(|e| e.0);
        let short_idle = self.short_idle.front().map(|e| e.0);
        let [resume, drain_check] = self.accept.deadlines();
        let watch = self.balance.as_ref().and_then(|b| b.watch_at());
        for d in [
            linger,
            short_idle,
            resume,
            self.drain_deadline,
            drain_check,
            self.sweep_at,
            watch,
        ]
        .into_iter()
        .flatten()
        {
            deadline = Some(deadline.map_or(d, |x: Instant| x.min(d)));
        }
        if !self.ready.is_empty() {
            // Yielded input waits: look for completions, do not sleep.
            return Some(Duration::ZERO);
        }
        deadline.map(|d| d.saturating_duration_since(now))
    }

    // Inlined into the loop: called from `handle_queued` too, it was no longer, which cost
    // ~160 instructions per one-get connection (callgrind guard, uring/kv +2.7%).
    #[inline(always)]
    fn handle(&mut self, completion: Completion, now: Instant) {
        match completion {
            Completion::Accepted {
                origin,
                conn,
                peer,
                incoming_cpu,
            } => self.on_accepted(origin, conn, peer, incoming_cpu, now),
            Completion::StealFailed { victim, error } => {
                self.accept.steal_failed();
                if error.kind() != std::io::ErrorKind::WouldBlock {
                    self.setup.stats.error(ErrorKind::Accept);
                }
                if let Some(b) = self.balance.as_mut() {
                    b.steal_missed(victim as usize);
                }
            }
            Completion::AcceptFailed { .. } => {
                self.setup.stats.error(ErrorKind::Accept);
                self.accept.failed(&mut self.backend, self.open, now);
            }
            Completion::Recv { conn, buf, len } => {
                self.on_recv(conn, buf, len, now);
                self.backend.release(buf);
            }
            Completion::Eof { conn } => self.on_eof(conn, now),
            // EIO is no TCP error: a kTLS RX socket says so of a record that is not data (the
            // peer's close_notify, an alert, a KeyUpdate): the peer's stream ends there.
            Completion::RecvFailed { conn, error } if error.raw_os_error() == Some(libc::EIO) => {
                self.on_eof(conn, now)
            }
            Completion::RecvFailed { conn, .. } => {
                self.setup.stats.error(ErrorKind::Io);
                self.force_close(conn);
            }
            Completion::RecvStopped { conn } => self.on_recv_stopped(conn, now),
            Completion::Sent { conn, buf, result } => {
                self.spare.give(buf);
                self.on_sent(conn, result.map(|n| n as u64), now);
            }
            Completion::SentFile { conn, result } => self.on_sent(conn, result, now),
            Completion::OptionsSet { conn, result } => {
                if result.is_ok() {
                    self.release_recv_after_options(conn);
                }
                self.on_sent(conn, result.map(|()| 0), now)
            }
            Completion::Closed { conn } => self.on_closed(conn),
            Completion::Detached { conn, fd } => self.on_detached(conn, fd),
        }
    }

    /// Samples the queue, steals and migrates (see [`super::balance`]). Not while draining.
    fn balance_turn(&mut self, now: Instant) {
        if self.drain_deadline.is_some() {
            return;
        }
        let Some(b) = self.balance.as_mut() else {
            return;
        };
        // At the connection limit, or paused after accept failed: the queue is the others'.
        let at_limit = self.open >= self.setup.limits.conns_per_worker_max;
        b.set_blocked(at_limit || !self.accept.is_accepting());
        if let Some(gauge) = b.sample(now) {
            self.setup.stats.queue(gauge.len, gauge.cap, gauge.busy);
        }
        let can_steal = self.accept.is_accepting()
            && !self.accept.steal_pending()
            && self.accept.has_room(self.open);
        if can_steal {
            if let Some(order) = b.steal_order() {
                let queued =
                    self.accept
                        .try_steal(&mut self.backend, self.open, order.victim, order.fd);
                debug_assert!(queued, "checked above");
            }
        }
        if b.migrate(now).is_some() {
            self.setup.stats.migrated_in();
        }
    }
}
