//! The graceful stop: accepting until the queues are empty (or handing them over), telling
//! handlers the server stops, closing idle and silent connections, and deciding when the
//! worker may exit.

use super::{Closing, Worker};
use crate::runtime::accept::{DRAIN_POLL, DRAIN_QUIESCE};
use crate::runtime::backend::{Backend, ConnId};
use crate::runtime::handler::{CloseReason, Handler, Service};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// While stopping, how long an idle connection whose protocol announces the close (HTTP
/// keep-alive) waits for its next request, which is answered with that announcement; at most
/// half the drain timeout. Longer than typical think times between requests of a session.
const DRAIN_KEEPALIVE_GRACE: Duration = Duration::from_secs(1);
/// After the drain deadline, how long a worker waits at most for the backend's accepts to
/// settle (a cancelled accept's last completion) before exiting anyway.
const ACCEPT_SETTLE_MAX: Duration = Duration::from_secs(1);

impl<S: Service, B: Backend> Worker<S, B> {
    /// Handles the stop flag; returns true when the worker may exit. A stop never drops a
    /// queued connection on purpose: the worker keeps accepting until its listeners' queues
    /// are empty (new SYNs are refused by the listener group meanwhile, or go to a successor),
    /// or — when the listeners were handed over (`released`) — stops accepting at once; it
    /// serves what it accepted, closes keep-alive connections between requests, and exits when
    /// nothing is open and no accept can still complete (or at the drain deadline).
    pub(super) fn stop_requested(&mut self, now: Instant) -> bool {
        if !self.setup.stop.load(Ordering::Acquire) {
            return false;
        }
        if self.drain_deadline.is_none() {
            self.begin_drain(now);
        }
        self.accept.drain_step(&mut self.backend, self.open, now);
        if self.moving() {
            self.detach_quiet(now);
        } else {
            self.sweep_silent(now);
        }
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
        // Stopping: the worker switches deferring no more.
        let deferring = self.defer.take().is_some_and(|d| d.is_on());
        if self.setup.released.load(Ordering::Acquire) {
            // The listeners belong to a successor now, which accepts from the same queues:
            // stop accepting at once and leave what is queued to it (nothing needs to migrate).
            self.accept.finish(&mut self.backend, self.open);
        } else {
            // The stop turned deferring off on every listener (`ListenerGroup::begin_stop`);
            // a switch made by this worker just before it must not outlive that.
            if deferring {
                self.set_defer_accept(0);
            }
            self.accept.begin_drain(&mut self.backend, self.open, now);
        }
        if self.moving() {
            return; // Connections move to the successor between requests (`detach_quiet`).
        }
        for id in self.live_conn_ids() {
            self.signal_drain(id);
        }
        let idle: Vec<ConnId> = self.idle_conn_ids();
        for id in idle {
            if !self.conns.occupant(id).is_some_and(|c| c.drain_signalled) {
                self.begin_close(id, CloseReason::Done);
            }
        }
    }

    /// Tells the handler the server is stopping (it may announce the close to its peer).
    pub(super) fn signal_drain(&mut self, id: ConnId) {
        if let Some(conn) = self.conns.occupant_mut(id) {
            if conn.closing == Closing::Open && !conn.drain_signalled {
                conn.drain_signalled = conn.handler.on_drain();
            }
        }
    }

    /// While stopping, connections that never sent a request and stayed silent for
    /// [`DRAIN_QUIESCE`] are closed (a request already on its way gets that long to land) — or
    /// for the accept phase's quiesce when it is longer: with `TCP_DEFER_ACCEPT` configured, a
    /// silent connection the worker accepted while not deferring is kept as long as the
    /// deferral would have held it in the kernel — and so are idle connections told of the
    /// close that stayed silent for the keep-alive grace ([`DRAIN_KEEPALIVE_GRACE`], at most
    /// half the drain timeout).
    fn sweep_silent(&mut self, now: Instant) {
        if self.sweep_at.is_some_and(|t| now < t) {
            return;
        }
        self.sweep_at = Some(now + DRAIN_POLL * 4);
        let grace = DRAIN_KEEPALIVE_GRACE.min(self.setup.limits.drain_timeout / 2);
        let unspoken = DRAIN_QUIESCE.max(
            self.setup
                .limits
                .accept_quiesce
                .min(self.setup.limits.drain_timeout / 2),
        );
        let silent: Vec<ConnId> = self
            .conns
            .occupants()
            .filter(|(_, c)| {
                let quiet = now.saturating_duration_since(c.last_active);
                let waited = if c.served && c.drain_signalled {
                    grace
                } else {
                    unspoken
                };
                (!c.served || c.drain_signalled)
                    && c.closing == Closing::Open
                    && c.input.is_empty()
                    && c.output.is_empty()
                    && !c.sending
                    && quiet >= waited
            })
            .map(|(key, _)| key.slot())
            .collect();
        for id in silent {
            self.begin_close(id, CloseReason::Done);
        }
    }

    fn live_conn_ids(&self) -> Vec<ConnId> {
        self.conns
            .occupants()
            .filter(|(_, c)| c.closing != Closing::CloseQueued)
            .map(|(key, _)| key.slot())
            .collect()
    }

    /// Connections with no request in progress (nothing buffered either way).
    fn idle_conn_ids(&self) -> Vec<ConnId> {
        self.conns
            .occupants()
            .filter(|(_, c)| {
                c.served
                    && c.input.is_empty()
                    && c.output.is_empty()
                    && !c.sending
                    && c.closing == Closing::Open
            })
            .map(|(key, _)| key.slot())
            .collect()
    }
}
