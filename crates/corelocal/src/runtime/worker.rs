//! The worker loop: one pinned thread owning its listeners, backend, connections and buffers.
//! Generic over the [`Backend`] and the [`Service`], so apps never see which backend runs.

use super::accept::{AcceptPath, DRAIN_POLL, DRAIN_QUIESCE};
use super::backend::{Backend, Completion, ConnId, Op, Origin};
use super::balance::{BalanceShared, WorkerBalance};
use super::handler::{Chunk, CloseReason, ConnInfo, Handler, Next, Output, Service};
use super::stats::{ErrorKind, WorkerStats};
use super::Limits;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Completions handled per loop turn before submitting again.
const REAP_BATCH_MAX: usize = 512;
/// `on_input` calls per received chunk, so one connection cannot starve the others.
const HANDLER_ROUNDS_MAX: usize = 256;
/// Spare send buffers kept for reuse.
const SPARE_BUFS_MAX: usize = 64;
/// Largest send buffer kept for reuse: spares hold at most 64 × 64 KiB = 4 MiB per worker;
/// larger buffers (bulk responses, slow readers' queues) go back to the allocator.
const SPARE_BUF_BYTES_MAX: usize = 64 << 10;
/// While stopping, how long an idle connection whose protocol announces the close (HTTP
/// keep-alive) waits for its next request, which is answered with that announcement; at most
/// half the drain timeout. Longer than typical think times between requests of a session.
const DRAIN_KEEPALIVE_GRACE: Duration = Duration::from_secs(1);
/// After the drain deadline, how long a worker waits at most for the backend's accepts to
/// settle (a cancelled accept's last completion) before exiting anyway.
const ACCEPT_SETTLE_MAX: Duration = Duration::from_secs(1);

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
}

struct Conn<H> {
    handler: H,
    generation: u64,
    input: Vec<u8>,
    output: Output,
    sending: bool,
    /// Bytes of the send in flight (taken out of `output`, not yet completed).
    in_flight: u64,
    recv_paused: bool,
    eof: bool,
    closing: Option<CloseReason>,
    close_sent: bool,
    /// The close went to the backend with the last send (`Op::Send::close_after`): no
    /// `Op::Close` follows, unless the send must be aborted (idle timeout, stop deadline).
    close_with_send: bool,
    last_active: Instant,
    /// Whether a request of this connection completed (or it closed): not waiting any more.
    served: bool,
    /// While stopping: the handler will tell the peer it closes (see `Handler::on_drain`).
    drain_signalled: bool,
}

impl<H> Conn<H> {
    /// Output not yet sent: queued plus in flight. Reading pauses when it reaches the limit.
    fn pending(&self) -> u64 {
        self.output.total_len() + self.in_flight
    }
}

/// One worker's state.
pub struct Worker<S: Service, B: Backend> {
    setup: WorkerSetup<S>,
    backend: B,
    conns: Vec<Option<Conn<S::Conn>>>,
    open: usize,
    next_generation: u64,
    /// Idle-timeout queue: (deadline, conn, generation). Lazily corrected: an entry whose
    /// connection was active since is re-queued at its real deadline when it comes up.
    idle: VecDeque<(Instant, ConnId, u64)>,
    spare_bufs: Vec<Vec<u8>>,
    /// Allowances, pacing, pauses, the steal in flight and the stop's accept phase.
    accept: AcceptPath,
    drain_deadline: Option<Instant>,
    /// While stopping: when to close connections that stayed silent (see `sweep_silent`).
    sweep_at: Option<Instant>,
    balance: Option<WorkerBalance>,
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
        Worker {
            balance,
            accept,
            setup,
            backend,
            conns: Vec::new(),
            open: 0,
            next_generation: 0,
            idle: VecDeque::new(),
            spare_bufs: Vec::new(),
            drain_deadline: None,
            sweep_at: None,
        }
    }

    /// Runs until a graceful stop completes.
    pub fn run(mut self) -> std::io::Result<()> {
        self.accept.set_accepting(&mut self.backend, 0, true);
        let mut completions = Vec::with_capacity(REAP_BATCH_MAX);
        loop {
            let now = Instant::now();
            if self.stop_requested(now) {
                break;
            }
            let submitted = self.backend.submit()?;
            self.setup.stats.submitted(submitted);
            self.backend.wait(self.next_timeout(now))?;
            let now = Instant::now();
            self.backend.reap(&mut completions, REAP_BATCH_MAX);
            self.setup.stats.reaped(completions.len());
            self.setup.stats.backend_events(self.backend.take_events());
            for c in completions.drain(..) {
                self.handle(c, now);
            }
            self.expire_idle(now);
            self.accept.maybe_resume(&mut self.backend, self.open, now);
            self.balance_turn(now);
            self.accept.turn(&mut self.backend, self.open);
        }
        self.backend.submit().map(|_| ())
    }

    /// Handles the stop flag; returns true when the worker may exit. A stop never drops a
    /// queued connection on purpose: the worker keeps accepting until its listeners' queues
    /// are empty (new SYNs are refused by the listener group meanwhile, or go to a successor),
    /// or — when the listeners were handed over (`released`) — stops accepting at once; it
    /// serves what it accepted, closes keep-alive connections between requests, and exits when
    /// nothing is open and no accept can still complete (or at the drain deadline).
    fn stop_requested(&mut self, now: Instant) -> bool {
        if !self.setup.stop.load(Ordering::Acquire) {
            return false;
        }
        if self.drain_deadline.is_none() {
            self.begin_drain(now);
        }
        self.accept.drain_step(&mut self.backend, self.open, now);
        self.sweep_silent(now);
        if self.drain_deadline.is_some_and(|d| now >= d) {
            self.accept.finish(&mut self.backend, self.open);
            let all: Vec<ConnId> = self.live_conn_ids();
            for id in all {
                self.force_close(id);
            }
        }
        let settled = self.backend.accepts_settled()
            || self
                .drain_deadline
                .is_some_and(|d| now >= d + ACCEPT_SETTLE_MAX);
        self.accept.is_done() && self.open == 0 && settled
    }

    fn begin_drain(&mut self, now: Instant) {
        let timeout = self.setup.limits.drain_timeout;
        self.drain_deadline = Some(now + timeout);
        if self.setup.released.load(Ordering::Acquire) {
            // The listeners belong to a successor now, which accepts from the same queues:
            // stop accepting at once and leave what is queued to it (nothing needs to migrate).
            self.accept.finish(&mut self.backend, self.open);
        } else {
            self.accept.begin_drain(&mut self.backend, self.open, now);
        }
        for id in self.live_conn_ids() {
            self.signal_drain(id);
        }
        let idle: Vec<ConnId> = self.idle_conn_ids();
        for id in idle {
            if !self.conns[id as usize]
                .as_ref()
                .is_some_and(|c| c.drain_signalled)
            {
                self.begin_close(id, CloseReason::Done);
            }
        }
    }

    /// Tells the handler the server is stopping (it may announce the close to its peer).
    fn signal_drain(&mut self, id: ConnId) {
        if let Some(conn) = self.conns.get_mut(id as usize).and_then(Option::as_mut) {
            if conn.closing.is_none() && !conn.drain_signalled {
                conn.drain_signalled = conn.handler.on_drain();
            }
        }
    }

    /// While stopping, connections that never sent a request and stayed silent for
    /// [`DRAIN_QUIESCE`] are closed (a request already on its way gets that long to land),
    /// and so are idle connections told of the close that stayed silent for the keep-alive
    /// grace ([`DRAIN_KEEPALIVE_GRACE`], at most half the drain timeout).
    fn sweep_silent(&mut self, now: Instant) {
        if self.sweep_at.is_some_and(|t| now < t) {
            return;
        }
        self.sweep_at = Some(now + DRAIN_POLL * 4);
        let grace = DRAIN_KEEPALIVE_GRACE.min(self.setup.limits.drain_timeout / 2);
        let silent: Vec<ConnId> = (0..self.conns.len())
            .filter(|&i| {
                self.conns[i].as_ref().is_some_and(|c| {
                    let quiet = now.saturating_duration_since(c.last_active);
                    let waited = if c.served && c.drain_signalled {
                        grace
                    } else {
                        DRAIN_QUIESCE
                    };
                    (!c.served || c.drain_signalled)
                        && c.closing.is_none()
                        && c.input.is_empty()
                        && c.output.is_empty()
                        && !c.sending
                        && quiet >= waited
                })
            })
            .map(|i| i as ConnId)
            .collect();
        for id in silent {
            self.begin_close(id, CloseReason::Done);
        }
    }

    fn live_conn_ids(&self) -> Vec<ConnId> {
        (0..self.conns.len())
            .filter(|&i| self.conns[i].as_ref().is_some_and(|c| !c.close_sent))
            .map(|i| i as ConnId)
            .collect()
    }

    /// Connections with no request in progress (nothing buffered either way).
    fn idle_conn_ids(&self) -> Vec<ConnId> {
        (0..self.conns.len())
            .filter(|&i| {
                self.conns[i].as_ref().is_some_and(|c| {
                    c.served
                        && c.input.is_empty()
                        && c.output.is_empty()
                        && !c.sending
                        && !c.close_sent
                })
            })
            .map(|i| i as ConnId)
            .collect()
    }

    fn next_timeout(&self, now: Instant) -> Option<Duration> {
        let mut deadline = self.idle.front().map(|e| e.0);
        let [resume, drain_check] = self.accept.deadlines();
        let watch = self.balance.as_ref().and_then(|b| b.watch_at());
        for d in [
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
        deadline.map(|d| d.saturating_duration_since(now))
    }

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
            Completion::RecvFailed { conn, .. } => {
                self.setup.stats.error(ErrorKind::Io);
                self.force_close(conn);
            }
            Completion::Sent { conn, buf, result } => {
                self.recycle(buf);
                self.on_sent(conn, result.map(|n| n as u64), now);
            }
            Completion::SentFile { conn, result } => self.on_sent(conn, result, now),
            Completion::Closed { conn } => self.on_closed(conn),
        }
    }

    fn on_accepted(
        &mut self,
        origin: Origin,
        conn: ConnId,
        peer: Option<std::net::SocketAddr>,
        incoming_cpu: Option<usize>,
        now: Instant,
    ) {
        let local = incoming_cpu == Some(self.setup.cpu);
        let stolen = matches!(origin, Origin::Stolen(_));
        self.setup.stats.accepted(local, stolen);
        if let Some(b) = self.balance.as_mut() {
            match origin {
                Origin::Local(_) => b.accepted_local(),
                Origin::Stolen(victim) => b.stole(victim as usize),
            }
        }
        let info = ConnInfo {
            worker: self.setup.index,
            peer,
            now,
        };
        let handler = self.setup.service.connect(&info);
        let slot = conn as usize;
        if self.conns.len() <= slot {
            self.conns.resize_with(slot + 1, || None);
        }
        assert!(
            self.conns[slot].is_none(),
            "connection id reused while open"
        );
        self.next_generation += 1;
        self.conns[slot] = Some(Conn {
            handler,
            generation: self.next_generation,
            input: Vec::new(),
            output: Output::new(),
            sending: false,
            in_flight: 0,
            recv_paused: false,
            eof: false,
            closing: None,
            close_sent: false,
            close_with_send: false,
            last_active: now,
            served: false,
            drain_signalled: false,
        });
        self.open += 1;
        self.idle.push_back((
            now + self.setup.limits.idle_timeout,
            conn,
            self.next_generation,
        ));
        self.backend.push(Op::Recv { conn });
        self.accept.accepted(&mut self.backend, origin, self.open);
        if self.open == self.setup.limits.conns_per_worker_max {
            // The allowances are spent: the rest wait in the kernel's accept queue until a
            // connection closes.
            self.setup.stats.conn_limit();
        }
        if self.drain_deadline.is_some() {
            // Taken from the queue while stopping: served once, then closed (after_process).
            self.setup.stats.drain_accepted();
            self.signal_drain(conn);
        }
    }

    fn on_recv(&mut self, id: ConnId, buf: u32, len: usize, now: Instant) {
        self.setup.stats.bytes_in(len as u64);
        let Some(conn) = self.conns.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        if conn.closing.is_some() {
            return;
        }
        conn.last_active = now;
        conn.input
            .extend_from_slice(self.backend.recv_data(buf, len));
        let verdict = process(conn, &self.setup, now);
        let stuck = verdict.is_none() && is_stuck(conn, &self.setup.limits);
        if stuck {
            // The buffer is full and the handler still cannot make progress.
            self.setup.stats.error(ErrorKind::TooLarge);
            self.begin_close(id, CloseReason::TooLarge);
            return;
        }
        self.after_process(id, verdict);
    }

    fn after_process(&mut self, id: ConnId, verdict: Option<CloseReason>) {
        if let Some(reason) = verdict {
            match reason {
                CloseReason::BadRequest => self.setup.stats.error(ErrorKind::BadRequest),
                CloseReason::TooLarge => self.setup.stats.error(ErrorKind::TooLarge),
                CloseReason::Done => {}
            }
            self.begin_close(id, reason);
            return;
        }
        if self.drain_deadline.is_some() {
            // Close at a request boundary, unless the handler announces the close itself.
            let idle = self.conns[id as usize]
                .as_ref()
                .is_some_and(|c| c.input.is_empty() && !c.drain_signalled);
            if idle {
                self.begin_close(id, CloseReason::Done);
                return;
            }
        }
        self.apply_backpressure(id);
        self.flush(id);
    }

    fn on_eof(&mut self, id: ConnId, now: Instant) {
        let Some(conn) = self.conns.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        conn.eof = true;
        if conn.closing.is_some() {
            return;
        }
        let next = conn.handler.on_eof(&conn.input, &mut conn.output, now);
        match next {
            Next::Close(reason) => self.begin_close(id, reason),
            // Half-closed: nothing more will arrive; close once the output is flushed.
            Next::Read => self.begin_close(id, CloseReason::Done),
        }
    }

    fn on_sent(&mut self, id: ConnId, result: std::io::Result<u64>, now: Instant) {
        let Some(conn) = self.conns.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        conn.sending = false;
        conn.in_flight = 0;
        match result {
            Ok(n) => {
                self.setup.stats.bytes_out(n);
                conn.last_active = now;
            }
            Err(_) => {
                self.setup.stats.error(ErrorKind::Io);
                self.force_close(id);
                return;
            }
        }
        if conn.recv_paused && conn.pending() <= self.setup.limits.output_bytes_max as u64 / 2 {
            self.resume_reading(id, now);
            return;
        }
        self.flush(id);
    }

    /// Output drained below half the limit: finish the requests already buffered first, and
    /// read more only if they left room (else reading stays paused until the next drain).
    fn resume_reading(&mut self, id: ConnId, now: Instant) {
        let limits = self.setup.limits;
        let Some(conn) = self.conns.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        let mut verdict = if conn.closing.is_none() && !conn.input.is_empty() {
            process(conn, &self.setup, now)
        } else {
            None
        };
        if verdict.is_none() && is_stuck(conn, &limits) {
            verdict = Some(CloseReason::TooLarge);
        }
        if verdict.is_none() && conn.pending() < limits.output_bytes_max as u64 {
            conn.recv_paused = false;
            if !conn.eof && conn.closing.is_none() {
                self.backend.push(Op::Recv { conn: id });
            }
        }
        self.after_process(id, verdict);
    }

    fn on_closed(&mut self, id: ConnId) {
        if self
            .conns
            .get_mut(id as usize)
            .and_then(Option::take)
            .is_none()
        {
            return;
        }
        self.open -= 1;
        self.setup.stats.closed();
        self.accept.closed(&mut self.backend, self.open);
    }

    fn apply_backpressure(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        if !conn.recv_paused
            && !conn.eof
            && conn.pending() >= self.setup.limits.output_bytes_max as u64
        {
            conn.recv_paused = true;
            self.setup.stats.backpressure();
            self.backend.push(Op::RecvPause { conn: id });
        }
    }

    /// Starts the next send if none is in flight; closes when output is done and asked to.
    fn flush(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        if conn.sending || conn.close_sent || conn.close_with_send {
            return;
        }
        let spare = self.spare_bufs.pop().unwrap_or_default();
        match conn.output.take_front(spare) {
            Some(Chunk::Bytes(buf)) => {
                conn.sending = true;
                conn.in_flight = buf.len() as u64;
                // The last output of a closing connection: the backend closes after it (one
                // turn and, on loopback, one packet fewer than send, then close).
                let close_after = conn.closing.is_some() && conn.output.is_empty();
                conn.close_with_send = close_after;
                self.backend.push(Op::Send {
                    conn: id,
                    buf,
                    close_after,
                });
            }
            Some(Chunk::File(region)) => {
                conn.sending = true;
                conn.in_flight = region.len;
                self.backend.push(Op::SendFile { conn: id, region });
            }
            None => {
                if conn.closing.is_some() {
                    conn.close_sent = true;
                    self.backend.push(Op::Close { conn: id });
                }
            }
        }
    }

    /// Closes after the pending output is flushed.
    fn begin_close(&mut self, id: ConnId, reason: CloseReason) {
        let Some(conn) = self.conns.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        if conn.closing.is_none() {
            conn.closing = Some(reason);
            // A client that broke the protocol stops being read at once. After a normal end
            // (one-shot answer, `Connection: close`) input is dropped on arrival until the close
            // (a few µs later): not worth an extra epoll_ctl / cancel per connection.
            let hostile = reason != CloseReason::Done;
            if hostile && !conn.recv_paused && !conn.eof {
                conn.recv_paused = true;
                self.backend.push(Op::RecvPause { conn: id });
            }
        }
        self.flush(id);
    }

    /// Closes now, dropping pending output. A last send that carries the close is aborted
    /// instead (never a second close: the backend may already have freed the id).
    fn force_close(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        if conn.close_sent || (conn.close_with_send && !conn.sending) {
            return;
        }
        if conn.close_with_send {
            conn.close_sent = true;
            self.backend.push(Op::AbortSend { conn: id });
            return;
        }
        conn.closing = Some(CloseReason::Done);
        conn.output.clear();
        conn.close_sent = true;
        self.backend.push(Op::Close { conn: id });
    }

    fn expire_idle(&mut self, now: Instant) {
        let timeout = self.setup.limits.idle_timeout;
        while let Some(&(deadline, id, generation)) = self.idle.front() {
            if deadline > now {
                break;
            }
            self.idle.pop_front();
            let Some(conn) = self.conns.get(id as usize).and_then(Option::as_ref) else {
                continue;
            };
            if conn.generation != generation || conn.close_sent {
                continue;
            }
            let real_deadline = conn.last_active + timeout;
            if real_deadline > now {
                self.idle.push_back((real_deadline, id, generation));
            } else {
                self.setup.stats.error(ErrorKind::IdleTimeout);
                self.force_close(id);
            }
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

    fn recycle(&mut self, mut buf: Vec<u8>) {
        if self.spare_bufs.len() < SPARE_BUFS_MAX && buf.capacity() <= SPARE_BUF_BYTES_MAX {
            buf.clear();
            self.spare_bufs.push(buf);
        }
    }
}

/// Whether the input buffer is full and the handler, with room to answer, still made no
/// progress (a request larger than the input limit). Not while back-pressured: then the
/// unconsumed input is requests waiting for the output to drain.
fn is_stuck<H>(conn: &Conn<H>, limits: &Limits) -> bool {
    conn.input.len() >= limits.input_bytes_max && conn.pending() < limits.output_bytes_max as u64
}

/// Runs the handler over the connection's buffered input; returns a close reason if it asked
/// to close. Stops early when the pending output reaches the limit (back-pressure).
fn process<S: Service>(
    conn: &mut Conn<S::Conn>,
    setup: &WorkerSetup<S>,
    now: Instant,
) -> Option<CloseReason> {
    let mut offset = 0;
    let mut verdict = None;
    let limit = setup.limits.output_bytes_max as u64;
    conn.output.set_limit(limit.saturating_sub(conn.in_flight));
    for _ in 0..HANDLER_ROUNDS_MAX {
        if offset == conn.input.len() {
            break;
        }
        let step = conn
            .handler
            .on_input(&conn.input[offset..], &mut conn.output, now);
        assert!(
            step.consumed <= conn.input.len() - offset,
            "handler consumed more than it was given"
        );
        offset += step.consumed;
        setup.stats.requests(step.requests as u64);
        if step.requests > 0 {
            conn.served = true;
        }
        if let Next::Close(reason) = step.next {
            verdict = Some(reason);
            break;
        }
        if step.consumed == 0 || conn.pending() >= limit {
            break;
        }
    }
    conn.input.drain(..offset);
    verdict
}
