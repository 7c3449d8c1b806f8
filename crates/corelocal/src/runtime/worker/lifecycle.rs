//! Connection lifecycle: a new connection's state and first receive, the idle timeout,
//! closing (after the pending output, with the last answer or lingering, or at once) and the
//! close's completion.

use super::{Closing, Worker};
use crate::runtime::backend::{Backend, ConnId, Op, Origin};
use crate::runtime::handler::{CloseReason, Handler, Next, Service};
use crate::runtime::stats::ErrorKind;
use std::time::Instant;

impl<S: Service, B: Backend> Worker<S, B> {
    pub(super) fn on_accepted(
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
        if let Some(d) = self.defer.as_mut() {
            d.accepted();
        }
        if let Some(b) = self.balance.as_mut() {
            match origin {
                Origin::Local(_) => b.accepted_local(),
                Origin::Stolen(victim) => b.stole(victim as usize),
            }
        }
        // Stealing takes from the victim's first listener (`Balance::steal_order`).
        let listener = match origin {
            Origin::Local(i) => i as usize,
            Origin::Stolen(_) => 0,
        };
        let info = self.conn_info(conn, listener, peer, now);
        let handler = self.setup.service.connect(&info);
        self.insert_conn(conn, handler, now);
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
            if !self.moving() {
                self.signal_drain(conn);
            }
        }
        self.greet(conn, now);
    }

    /// The handler's first words ([`Handler::on_connect`]): sent now, or sent and closed.
    fn greet(&mut self, id: ConnId, now: Instant) {
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        match conn.handler.on_connect(&mut conn.output, now) {
            Next::Close(reason) => self.begin_close(id, reason),
            Next::Read if !conn.output.is_empty() => self.flush(id),
            Next::Read => {}
        }
    }

    pub(super) fn on_closed(&mut self, id: ConnId) {
        if let Some(conn) = self.conns.occupant_mut(id) {
            // Its buffers serve the next connection (see `SpareBufs`).
            self.spare.give(std::mem::take(&mut conn.input));
            self.spare.give(conn.output.take_buffer());
        }
        if !self.conns.vacate(id) {
            return;
        }
        self.open -= 1;
        self.setup.stats.closed();
        self.accept.closed(&mut self.backend, self.open);
    }

    /// Closes after the pending output is flushed: with the last answer when the input is
    /// known to be finished, else lingering (see [`Closing::Lingering`]).
    pub(super) fn begin_close(&mut self, id: ConnId, reason: CloseReason) {
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        if conn.closing == Closing::Open {
            conn.closing = Closing::Flushing(reason);
            conn.unread |= reason != CloseReason::Done
                || !conn.input.is_empty()
                || conn.handler.expects_input();
            self.spare.give(std::mem::take(&mut conn.input));
            // A client that broke the protocol is not read while its answer goes out (what it
            // sends waits in the kernel; lingering reads it afterwards). After a normal end
            // input is dropped on arrival (and makes the close linger): not worth an extra
            // epoll_ctl / cancel per connection.
            let hostile = reason != CloseReason::Done;
            if hostile && !conn.recv_paused && !conn.eof {
                conn.recv_paused = true;
                self.backend.push(Op::RecvPause { conn: id });
            }
        }
        self.flush(id);
    }

    /// The output is flushed: close now if the input is finished (or lingering is off), else
    /// shut down the sending side and linger.
    pub(super) fn finish_close(&mut self, id: ConnId) {
        let linger_time = self.setup.limits.linger_time;
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        debug_assert!(matches!(conn.closing, Closing::Flushing(_)) && !conn.sending);
        if conn.closes_with_answer(&self.setup.limits) {
            conn.closing = Closing::CloseQueued;
            self.backend.push(Op::Close { conn: id });
            return;
        }
        let now = Instant::now();
        conn.closing = Closing::Lingering {
            until: now + linger_time,
            discarded: 0,
        };
        conn.last_active = now;
        self.backend.push(Op::Shutdown { conn: id });
        if conn.recv_hold == super::RecvHold::UntilOptions {
            // Its options will not be set now: the lingering reads, to discard. (A stop
            // still under way is released when it completes: `on_recv_stopped`.)
            conn.recv_hold = super::RecvHold::Free;
            self.backend.push(Op::RecvRelease { conn: id });
            conn.recv_paused = true;
        }
        if conn.recv_paused {
            conn.recv_paused = false;
            self.backend.push(Op::Recv { conn: id });
        }
        let timeout = self.setup.limits.linger_timeout.min(linger_time);
        let key = self.conns.key(id);
        self.linger.push_back((now + timeout, key));
        self.setup.stats.lingered();
    }

    /// While lingering: input is counted and dropped; past the byte bound the connection
    /// closes at once.
    pub(super) fn discard(&mut self, id: ConnId, len: usize, now: Instant) {
        let limit = self.setup.limits.linger_bytes_max;
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        let Closing::Lingering { discarded, .. } = &mut conn.closing else {
            return;
        };
        *discarded += len as u64;
        conn.last_active = now;
        if *discarded > limit {
            self.force_close(id);
        }
    }

    /// Closes now, dropping pending output. A last send that carries the close is aborted
    /// instead (never a second close: the backend may already have freed the id).
    pub(super) fn force_close(&mut self, id: ConnId) {
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        match conn.closing {
            // Its socket is on its way to the successor.
            Closing::CloseQueued | Closing::Detaching => {}
            // Sent already: its close is done or on its way.
            Closing::LastSend if !conn.sending => {}
            Closing::LastSend => {
                conn.closing = Closing::CloseQueued;
                self.backend.push(Op::AbortSend { conn: id });
            }
            Closing::Open | Closing::Flushing(_) | Closing::Lingering { .. } => {
                conn.output.clear();
                conn.closing = Closing::CloseQueued;
                self.backend.push(Op::Close { conn: id });
            }
        }
    }

    /// Lingering connections whose peer stayed silent for `linger_timeout`, or that lingered
    /// `linger_time` in all, close.
    pub(super) fn expire_linger(&mut self, now: Instant) {
        let timeout = self.setup.limits.linger_timeout;
        while let Some(&(deadline, key)) = self.linger.front() {
            if deadline > now {
                break;
            }
            self.linger.pop_front();
            let Some(conn) = self.conns.live(key) else {
                continue;
            };
            let Closing::Lingering { until, .. } = conn.closing else {
                continue;
            };
            let real_deadline = (conn.last_active + timeout).min(until);
            if real_deadline > now {
                self.linger.push_back((real_deadline, key));
            } else {
                self.force_close(key.slot());
            }
        }
    }

    /// Connections silent for their handler's own shorter idle timeout close
    /// (`Handler::idle_timeout`); an entry whose handler no longer has one goes.
    pub(super) fn expire_short_idle(&mut self, now: Instant) {
        while let Some(&(deadline, key)) = self.short_idle.front() {
            if deadline > now {
                break;
            }
            self.short_idle.pop_front();
            let Some(conn) = self.conns.live(key) else {
                continue;
            };
            let Some(timeout) = conn.handler.idle_timeout() else {
                continue;
            };
            if conn.closing != Closing::Open {
                continue;
            }
            let real_deadline = conn.last_active + timeout;
            if real_deadline > now {
                self.short_idle.push_back((real_deadline, key));
            } else {
                self.setup.stats.error(ErrorKind::IdleTimeout);
                self.force_close(key.slot());
            }
        }
    }

    pub(super) fn expire_idle(&mut self, now: Instant) {
        let timeout = self.setup.limits.idle_timeout;
        while let Some(&(deadline, key)) = self.idle.front() {
            if deadline > now {
                break;
            }
            self.idle.pop_front();
            let Some(conn) = self.conns.live(key) else {
                continue;
            };
            if conn.closing == Closing::CloseQueued {
                continue;
            }
            let real_deadline = conn.last_active + timeout;
            if real_deadline > now {
                self.idle.push_back((real_deadline, key));
            } else {
                self.setup.stats.error(ErrorKind::IdleTimeout);
                self.close_idle(key.slot());
            }
        }
    }

    /// An idle connection closes: at once, or after its handler's last word
    /// (`Handler::on_idle_close`) when nothing else is pending.
    fn close_idle(&mut self, id: ConnId) {
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        let quiet = conn.closing == Closing::Open
            && conn.output.is_empty()
            && conn.input.is_empty()
            && !conn.sending;
        if quiet {
            conn.handler.on_idle_close(&mut conn.output);
            if !conn.output.is_empty() {
                return self.begin_close(id, CloseReason::Done);
            }
        }
        self.force_close(id);
    }
}
