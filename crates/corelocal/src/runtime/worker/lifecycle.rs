//! Connection lifecycle: a new connection's state and first receive, the idle timeout,
//! closing (after the pending output, or at once) and the close's completion.

use super::{Conn, Worker};
use crate::runtime::backend::{Backend, ConnId, Op, Origin};
use crate::runtime::handler::{CloseReason, ConnInfo, Output, Service};
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

    pub(super) fn on_closed(&mut self, id: ConnId) {
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

    /// Closes after the pending output is flushed.
    pub(super) fn begin_close(&mut self, id: ConnId, reason: CloseReason) {
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
    pub(super) fn force_close(&mut self, id: ConnId) {
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

    pub(super) fn expire_idle(&mut self, now: Instant) {
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
}
