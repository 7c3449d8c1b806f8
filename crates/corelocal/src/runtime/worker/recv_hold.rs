//! A handler's receive stop (`Output::stop_receiving`): the backend stops reading and holds
//! the socket unread (`Op::RecvStop`, `Completion::RecvStopped`), the handler is told with
//! everything read so far already offered to it (`Handler::on_recv_stopped`), and reading
//! resumes only once the socket options it queued then are set. What is in the socket
//! during the hold is exactly what was never read: kTLS RX is set at a record boundary.

use super::{Closing, RecvHold, Worker};
use crate::runtime::backend::{Backend, ConnId, Op};
use crate::runtime::handler::{Handler, Service};
use std::time::Instant;

impl<S: Service, B: Backend> Worker<S, B> {
    /// The handler asked for a stop (seen when its output is flushed): starts one, unless
    /// one is under way or the connection is past reading.
    pub(super) fn start_recv_stop(&mut self, id: ConnId) {
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        if conn.recv_hold != RecvHold::Free || conn.closing != Closing::Open || conn.eof {
            return;
        }
        conn.recv_hold = RecvHold::Stopping;
        self.backend.push(Op::RecvStop { conn: id });
    }

    /// The backend stopped reading: the handler's turn, then hold or release.
    pub(super) fn on_recv_stopped(&mut self, id: ConnId, now: Instant) {
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        if conn.recv_hold != RecvHold::Stopping || conn.closing != Closing::Open || conn.eof {
            // Closing (or its end came) since the stop was asked: released, not told; a
            // lingering close reads on, to discard.
            conn.recv_hold = RecvHold::Free;
            self.backend.push(Op::RecvRelease { conn: id });
            if matches!(conn.closing, Closing::Lingering { .. }) && !conn.eof {
                self.backend.push(Op::Recv { conn: id });
            }
            return;
        }
        conn.handler
            .on_recv_stopped(&conn.input, &mut conn.output, now);
        if conn.output.has_socket_options() {
            conn.recv_hold = RecvHold::UntilOptions;
        } else {
            self.release_recv(id);
        }
        self.flush(id);
    }

    /// Socket options were set: the hold ends once none of the handler's is left.
    pub(super) fn release_recv_after_options(&mut self, id: ConnId) {
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        if conn.recv_hold == RecvHold::UntilOptions && !conn.output.has_socket_options() {
            self.release_recv(id);
        }
    }

    /// Ends the hold; reading resumes unless paused or over.
    fn release_recv(&mut self, id: ConnId) {
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        conn.recv_hold = RecvHold::Free;
        self.backend.push(Op::RecvRelease { conn: id });
        if !conn.recv_paused && !conn.eof && conn.closing == Closing::Open {
            self.backend.push(Op::Recv { conn: id });
        }
    }
}
