//! Binary upgrades that lose nothing: a stopping worker whose server hands over to a successor
//! moves each connection between two requests (its socket, the bytes read and not handled, its
//! handler's state) to the [`Outbox`] instead of closing it; a starting worker behind a
//! [`Gate`] registers the connections its predecessor moved, then serves them first.
//!
//! [`Outbox`]: crate::runtime::handoff::Outbox
//! [`Gate`]: crate::runtime::handoff::Gate

use super::{Closing, Conn, Worker};
use crate::runtime::backend::{Backend, ConnId, Op};
use crate::runtime::handler::{Handler, Output, Service};
use crate::runtime::handoff::MovedConn;
use crate::runtime::stats::ErrorKind;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a gated worker waits for connections between looks at its stop flag.
const GATE_POLL: Duration = Duration::from_millis(20);

/// A moved connection registered with the backend, waiting for the gate to open.
pub(super) struct Adopted {
    id: ConnId,
    input: Vec<u8>,
    state: Vec<u8>,
    peer: Option<std::net::SocketAddr>,
    /// Which of this worker's listeners has its local address (see `listener_of`).
    listener: usize,
}

impl<S: Service, B: Backend> Worker<S, B> {
    /// Whether a stopping worker moves connections to a successor instead of closing them.
    pub(super) fn moving(&self) -> bool {
        self.drain_deadline.is_some() && self.setup.outbox.as_ref().is_some_and(|o| o.is_enabled())
    }

    /// Before accepting: registers the connections the predecessor hands over as they come
    /// (their descriptors close once registered), until the gate opens or a stop is asked.
    pub(super) fn wait_at_gate(&mut self) -> Vec<Adopted> {
        let mut adopted = Vec::new();
        let Some(gate) = self.setup.gate.clone() else {
            return adopted;
        };
        loop {
            let (conns, open) = gate.wait(self.setup.index, GATE_POLL);
            adopted.extend(conns.into_iter().filter_map(|m| self.register(m)));
            if open || self.setup.stop.load(Ordering::Acquire) {
                return adopted;
            }
        }
    }

    /// After the gate opened early (a service with no state): connections still arriving from
    /// the predecessor are taken each turn, then the gate is dropped once the move is over.
    pub(super) fn take_late(&mut self, now: Instant) {
        let Some(gate) = self.setup.gate.clone() else {
            return;
        };
        if gate.ready_for(self.setup.index) {
            let (conns, _) = gate.wait(self.setup.index, Duration::ZERO);
            let adopted: Vec<Adopted> =
                conns.into_iter().filter_map(|m| self.register(m)).collect();
            if !adopted.is_empty() {
                // An adopted connection may have the id of one whose close is still queued
                // (see `Backend::adopt`): that close is handled before the id is claimed.
                self.handle_queued(now);
            }
            for a in adopted {
                self.on_adopted(a, now);
            }
        }
        if gate.is_done_for(self.setup.index) {
            self.setup.gate = None;
        }
    }

    /// Registers a moved connection with the backend (its descriptor closes here).
    fn register(&mut self, moved: MovedConn) -> Option<Adopted> {
        let peer = crate::sys::socket::peer_addr(moved.fd.as_raw_fd()).ok();
        let listener = self.listener_of(moved.fd.as_raw_fd());
        match self.backend.adopt(moved.fd) {
            Ok(id) => Some(Adopted {
                id,
                input: moved.input,
                state: moved.state,
                peer,
                listener,
            }),
            Err(e) => {
                self.setup.stats.error(ErrorKind::Accept);
                crate::log_line!("corelocal: taking over a connection failed: {e}");
                None
            }
        }
    }

    /// Which of this worker's listeners a moved connection came on (the predecessor does not
    /// say): the one bound to the connection's local address, else one bound to the
    /// wildcard address on its port; 0 when none is (a plain and a TLS port tell their
    /// connections apart by it).
    fn listener_of(&self, fd: std::os::fd::RawFd) -> usize {
        let Ok(local) = crate::sys::socket::local_addr(fd) else {
            return 0;
        };
        let bound: Vec<Option<std::net::SocketAddr>> = self
            .setup
            .listeners
            .iter()
            .map(|&l| crate::sys::socket::local_addr(l).ok())
            .collect();
        let exact = bound.iter().position(|b| *b == Some(local));
        let wildcard = || {
            bound.iter().position(|b| {
                b.is_some_and(|b| b.port() == local.port() && b.ip().is_unspecified())
            })
        };
        exact.or_else(wildcard).unwrap_or(0)
    }

    /// A connection moved from the predecessor: its handler from the state it gave, the bytes
    /// the predecessor read handled first, then receiving.
    pub(super) fn on_adopted(&mut self, adopted: Adopted, now: Instant) {
        let id = adopted.id;
        let info = self.conn_info(id, adopted.listener, adopted.peer, now);
        let handler = self.setup.service.resume(&info, &adopted.state);
        self.insert_conn(id, handler, now);
        self.setup.stats.adopted();
        if let Some(conn) = self.conns.occupant_mut(id) {
            conn.served = true;
            conn.input = adopted.input;
        }
        self.backend.push(Op::Recv { conn: id });
        self.process_buffered(id, now);
    }

    /// While moving: every connection between two requests goes (see [`Self::try_detach`]).
    pub(super) fn detach_quiet(&mut self, now: Instant) {
        if self.detach_at.is_some_and(|t| now < t) {
            return;
        }
        self.detach_at = Some(now + crate::runtime::accept::DRAIN_POLL);
        for id in 0..self.conns.len() {
            self.try_detach(id as ConnId);
        }
    }

    /// Detaches the connection if it is between two requests: open, nothing to send or in
    /// flight, reading (not paused), and its handler not in the middle of a request.
    pub(super) fn try_detach(&mut self, id: ConnId) {
        if !self.moving() {
            return;
        }
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        let quiet = conn.closing == Closing::Open
            && !conn.sending
            && conn.output.is_empty()
            && !conn.recv_paused
            && conn.recv_hold == super::RecvHold::Free
            && !conn.eof;
        if !quiet || conn.handler.handoff().is_none() {
            return;
        }
        if !self.setup.outbox.as_ref().is_some_and(|o| o.reserve()) {
            return; // The outbox is full: tried again at the next sweep.
        }
        conn.closing = Closing::Detaching;
        self.backend.push(Op::Detach { conn: id });
    }

    /// The backend gave the socket up: it goes to the outbox with what was read and not
    /// handled, and the handler's state (or closes, if the outbox is full or it failed).
    pub(super) fn on_detached(&mut self, id: ConnId, fd: std::io::Result<std::os::fd::OwnedFd>) {
        let Some(conn) = self.conns.remove(id) else {
            return;
        };
        self.open -= 1;
        let outbox = self.setup.outbox.clone().expect("moving without an outbox");
        let fd = match fd {
            Ok(fd) => fd,
            Err(e) => {
                outbox.unreserve();
                self.setup.stats.error(ErrorKind::Io);
                crate::log_line!("corelocal: moving a connection failed, closed: {e}");
                self.setup.stats.closed();
                return;
            }
        };
        let moved = MovedConn {
            fd,
            state: conn.handler.handoff().unwrap_or_default(),
            input: conn.input,
            cpu: u16::try_from(self.setup.cpu).unwrap_or(u16::MAX),
        };
        outbox.push(moved);
        self.setup.stats.moved();
        self.accept.closed(&mut self.backend, self.open);
    }

    /// A new connection's state, in its slot, under the key `conn_info` gave its notifier.
    pub(super) fn insert_conn(&mut self, id: ConnId, handler: S::Conn, now: Instant) {
        let short_idle = handler.idle_timeout();
        let (key, place) = self.conns.claim(id);
        *place = Some(Conn {
            handler,
            input: Vec::new(),
            output: Output::new(),
            sending: false,
            in_flight: 0,
            recv_paused: false,
            eof: false,
            closing: Closing::Open,
            unread: false,
            last_active: now,
            served: false,
            drain_signalled: false,
            notify_again: false,
            yielded: false,
            ready: false,
            input_paused: false,
            recv_hold: super::RecvHold::Free,
        });
        self.open += 1;
        self.idle
            .push_back((now + self.setup.limits.idle_timeout, key));
        if let Some(t) = short_idle {
            self.short_idle.push_back((now + t, key));
        }
    }
}
