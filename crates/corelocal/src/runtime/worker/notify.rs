//! Output without input: the connections notified since the last turn get their handler's
//! [`Handler::on_notify`], then their output is flushed (see [`crate::runtime::notify`]).

use super::{Closing, Worker};
use crate::runtime::backend::{Backend, ConnId};
use crate::runtime::handler::{ConnInfo, Handler, Next, Service};
use crate::runtime::notify::NotifyRef;
use std::net::SocketAddr;
use std::time::Instant;

impl<S: Service, B: Backend> Worker<S, B> {
    /// What a new connection's handler is made from: the generation `insert_conn` gives it
    /// next, so that its notifier matches only this connection.
    pub(super) fn conn_info(
        &self,
        id: ConnId,
        peer: Option<SocketAddr>,
        now: Instant,
    ) -> ConnInfo<'_> {
        let generation = self.next_generation + 1;
        ConnInfo {
            worker: self.setup.index,
            peer,
            now,
            notify: Some(NotifyRef::new(
                &self.notify,
                self.setup.index,
                id,
                generation,
            )),
        }
    }

    /// Once per turn: the connections notified since the last one (one relaxed load when
    /// none were).
    #[inline]
    pub(super) fn run_notified(&mut self, now: Instant) {
        if self.notify.pending() {
            self.take_notified(now);
        }
    }

    /// Out of line: the loop's one-shot path stays as short as without notifiers.
    #[inline(never)]
    fn take_notified(&mut self, now: Instant) {
        let mut notified = std::mem::take(&mut self.notified);
        if self.notify.take(&mut notified) {
            if notified.all {
                let ids = self.conns.iter().enumerate();
                let open: Vec<(ConnId, u64)> = ids
                    .filter_map(|(i, c)| c.as_ref().map(|c| (i as ConnId, c.generation)))
                    .collect();
                notified.conns = open;
            }
            for &(id, generation) in &notified.conns {
                self.notify_conn(id, generation, now);
            }
        }
        self.notified = notified;
    }

    /// Calls the handler of connection `id` if it is still the one notified and open.
    pub(super) fn notify_conn(&mut self, id: ConnId, generation: u64, now: Instant) {
        let limit = self.setup.limits.output_bytes_max as u64;
        let Some(conn) = self.conns.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        if conn.generation != generation || conn.closing != Closing::Open {
            return;
        }
        conn.output.set_limit(limit.saturating_sub(conn.in_flight));
        let next = conn.handler.on_notify(&mut conn.output, now);
        conn.notify_again = conn.output.room() == 0;
        let verdict = match next {
            Next::Read => None,
            Next::Close(reason) => Some(reason),
        };
        self.after_process(id, verdict);
    }
}
