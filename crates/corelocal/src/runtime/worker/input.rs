//! Input: received bytes and EOF go to the handler, which runs over the buffered input until
//! it needs more, asks to close, or its output reaches the limit (back-pressure pauses
//! reading; reading resumes once the output drained).

use super::{Closing, Conn, Worker, WorkerSetup};
use crate::runtime::backend::{Backend, ConnId, Op};
use crate::runtime::handler::{CloseReason, Handler, Next, Service};
use crate::runtime::stats::ErrorKind;
use crate::runtime::Limits;
use std::time::Instant;

/// `on_input` calls for one connection in one go, so it cannot starve the others; input left
/// after them runs at the worker's next turn, as a yield's does (`Step::yielded`).
const HANDLER_ROUNDS_MAX: usize = 256;

impl<S: Service, B: Backend> Worker<S, B> {
    pub(super) fn on_recv(&mut self, id: ConnId, buf: u32, len: usize, now: Instant) {
        self.setup.stats.bytes_in(len as u64);
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        match conn.closing {
            Closing::Open => {}
            Closing::Lingering { .. } => return self.discard(id, len, now),
            Closing::Detaching => {
                // Read before the receive stopped: the successor handles it.
                conn.input
                    .extend_from_slice(self.backend.recv_data(buf, len));
                return;
            }
            _ => {
                // More input after the close began: the close must linger.
                conn.unread = true;
                return;
            }
        }
        conn.last_active = now;
        if conn.input.capacity() == 0 {
            // The first input (or the first after a large buffer was given back): a spare
            // buffer for it and for the answer, rather than two allocations.
            conn.input = self.spare.take();
            if conn.output.has_no_buffer() {
                conn.output.set_buffer(self.spare.take());
            }
        }
        conn.input
            .extend_from_slice(self.backend.recv_data(buf, len));
        self.process_buffered(id, now);
    }

    /// Runs the handler over what the connection has buffered, then closes, flushes or
    /// applies back-pressure as it asks.
    pub(super) fn process_buffered(&mut self, id: ConnId, now: Instant) {
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        let verdict = process(conn, &self.setup, now);
        // A yield is progress: the rest runs next turn.
        let yielded = conn.yielded;
        let stuck = verdict.is_none() && !yielded && is_stuck(conn, &self.setup.limits);
        if yielded {
            self.queue_yielded(id);
        }
        if stuck {
            return self.input_limit_reached(id, now);
        }
        self.after_process(id, verdict);
    }

    /// The input buffer is full and the handler still cannot make progress: it may answer
    /// (`Handler::on_input_limit`), then the connection closes as too large (lingering: the
    /// input is unread).
    fn input_limit_reached(&mut self, id: ConnId, now: Instant) {
        if let Some(conn) = self.conns.occupant_mut(id) {
            let limit = self.setup.limits.output_bytes_max as u64;
            conn.output.set_limit(limit.saturating_sub(conn.in_flight));
            conn.handler
                .on_input_limit(&conn.input, &mut conn.output, now);
        }
        self.setup.stats.error(ErrorKind::TooLarge);
        self.begin_close(id, CloseReason::TooLarge);
    }

    pub(super) fn after_process(&mut self, id: ConnId, verdict: Option<CloseReason>) {
        if let Some(reason) = verdict {
            match reason {
                CloseReason::BadRequest => self.setup.stats.error(ErrorKind::BadRequest),
                CloseReason::TooLarge => self.setup.stats.error(ErrorKind::TooLarge),
                CloseReason::TimedOut => self.setup.stats.error(ErrorKind::IdleTimeout),
                CloseReason::Done => {}
            }
            self.begin_close(id, reason);
            return;
        }
        if self.moving() {
            // Moved to the successor at a request boundary (once the answer is out).
            self.apply_backpressure(id);
            self.flush(id);
            self.try_detach(id);
            return;
        }
        if self.drain_deadline.is_some() {
            // Close at a request boundary, unless the handler announces the close itself.
            let idle = self
                .conns
                .occupant(id)
                .is_some_and(|c| c.input.is_empty() && !c.drain_signalled);
            if idle {
                self.begin_close(id, CloseReason::Done);
                return;
            }
        }
        self.apply_backpressure(id);
        self.flush(id);
    }

    pub(super) fn on_eof(&mut self, id: ConnId, now: Instant) {
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        match conn.closing {
            Closing::Open => {}
            Closing::Lingering { .. } => {
                conn.eof = true;
                return self.force_close(id);
            }
            // The end stays with the socket: the successor reads it again.
            Closing::Detaching => return,
            _ => {
                conn.eof = true;
                return;
            }
        }
        conn.eof = true;
        if conn.ready {
            // Yielded input comes first: the end is handed over after it (`run_ready`).
            return;
        }
        self.eof_to_handler(id, now);
    }

    /// The peer's end, to the handler (after all the input it will be given).
    fn eof_to_handler(&mut self, id: ConnId, now: Instant) {
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        let next = conn.handler.on_eof(&conn.input, &mut conn.output, now);
        match next {
            Next::Close(reason) => self.begin_close(id, reason),
            // Half-closed: nothing more will arrive; close once the output is flushed.
            Next::Read => self.begin_close(id, CloseReason::Done),
        }
    }

    /// Output drained below half the limit: finish the requests already buffered first, and
    /// read more only if they left room (else reading stays paused until the next drain).
    pub(super) fn resume_reading(&mut self, id: ConnId, now: Instant) {
        let limits = self.setup.limits;
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        let has_input = !conn.input.is_empty() || conn.handler.holds_input();
        let mut verdict = if conn.closing == Closing::Open && has_input {
            process(conn, &self.setup, now)
        } else {
            None
        };
        let yielded = conn.yielded;
        let stuck = verdict.is_none() && !yielded && is_stuck(conn, &limits);
        if stuck {
            verdict = Some(CloseReason::TooLarge);
        }
        // A closing connection stays paused: its lingering close resumes reading, to discard.
        let open = conn.closing == Closing::Open;
        if verdict.is_none() && open && conn.pending() < limits.output_bytes_max as u64 {
            conn.recv_paused = false;
            conn.input_paused = false;
            if !conn.eof {
                self.backend.push(Op::Recv { conn: id });
            }
        }
        if yielded {
            self.queue_yielded(id);
        }
        if stuck {
            return self.input_limit_reached(id, now);
        }
        self.after_process(id, verdict);
    }

    fn apply_backpressure(&mut self, id: ConnId) {
        let Some(conn) = self.conns.occupant_mut(id) else {
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
    let mut rounds = 0;
    loop {
        // A handler holding input of its own runs once more on none (`Handler::holds_input`).
        let held = offset == conn.input.len() && rounds == 0 && conn.handler.holds_input();
        if offset == conn.input.len() && !held {
            break;
        }
        if rounds == HANDLER_ROUNDS_MAX {
            // Out of rounds with input left: it runs at the next turn, as after a yield.
            // Nothing else would run it: no more input may come (pipelined requests, all sent).
            conn.yielded = true;
            break;
        }
        rounds += 1;
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
        if step.yielded {
            // The rest waits for the next turn (`Worker::run_ready`).
            conn.yielded = true;
            break;
        }
        if step.consumed == 0 || conn.pending() >= limit {
            break;
        }
    }
    conn.input.drain(..offset);
    verdict
}

impl<S: Service, B: Backend> Worker<S, B> {
    /// A connection whose handler yielded goes on the ready list, once.
    fn queue_yielded(&mut self, id: ConnId) {
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        if !std::mem::take(&mut conn.yielded) {
            return;
        }
        // Input arriving faster than the yields let it run: stop receiving until it is down.
        let input_max = self.setup.limits.input_bytes_max;
        if conn.input.len() >= input_max / 2 && !conn.recv_paused && !conn.eof {
            conn.recv_paused = true;
            conn.input_paused = true;
            self.backend.push(Op::RecvPause { conn: id });
        }
        if !conn.ready {
            conn.ready = true;
            let key = self.conns.key(id);
            self.ready.push_back(key);
        }
    }

    /// Receiving paused for yielded input (`queue_yielded`) resumes once it is down.
    fn resume_input(&mut self, id: ConnId) {
        let input_max = self.setup.limits.input_bytes_max;
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        let low = conn.input.len() < input_max / 2;
        let open = conn.closing == Closing::Open;
        if conn.input_paused && conn.recv_paused && low && open {
            conn.input_paused = false;
            conn.recv_paused = false;
            if !conn.eof {
                self.backend.push(Op::Recv { conn: id });
            }
        }
    }

    /// At the start of a turn: the connections that yielded last turn go on with their
    /// buffered input (those that yield again wait for the next turn). Out of line: the loop
    /// calls it only when a connection yielded, and keeps the one-shot path short.
    #[inline(never)]
    pub(super) fn run_ready(&mut self, now: Instant) {
        for _ in 0..self.ready.len() {
            let Some(key) = self.ready.pop_front() else {
                break;
            };
            let Some(conn) = self.conns.live_mut(key) else {
                continue;
            };
            let id = key.slot();
            conn.ready = false;
            let output_max = self.setup.limits.output_bytes_max as u64;
            // Not while back-pressured: the output's drain resumes it (`resume_reading`).
            if conn.closing == Closing::Open && conn.pending() < output_max {
                self.process_buffered(id, now);
                self.resume_input(id);
            }
            let ended = self
                .conns
                .occupant(id)
                .is_some_and(|c| c.eof && !c.ready && c.closing == Closing::Open);
            if ended {
                self.eof_to_handler(id, now);
            }
        }
    }
}
