//! Closing: a plain close (cancelling the connection's receive and send first), the abort of
//! a last send stuck before its linked close, and close completions.

use super::state::{user_data, RecvState, KIND_CLOSE, KIND_RECV, KIND_SHUTDOWN};
use super::UringBackend;
use crate::backend::{Completion, ConnId, ConnKey};
use io_uring::{opcode, types};

impl UringBackend {
    /// The last send (linked to its close) still waits: cancel it; the broken link then
    /// reissues the close (see `on_close`). A slot whose linked close already ran may hold a new
    /// connection by now (`close_linked` is false there): nothing is done to it.
    pub(super) fn abort_last_send(&mut self, conn: ConnId) {
        let key = self.slots.key(conn);
        let slot = &mut self.slots[conn];
        if !slot.close_linked {
            return;
        }
        if let Some(send) = slot.send.take() {
            let ud = user_data(send.buf_owner(), key);
            self.cancel(ud);
            self.graveyard.push((ud, send));
        }
    }

    pub(super) fn close(&mut self, conn: ConnId) {
        let key = self.slots.key(conn);
        let slot = &mut self.slots[conn];
        assert!(
            !slot.close_linked,
            "a close is already linked behind the last send"
        );
        slot.closing = true;
        let in_flight = slot.recv.in_flight();
        slot.recv = RecvState::Off;
        if in_flight {
            self.cancel(user_data(KIND_RECV, key));
        }
        if let Some(send) = self.slots[conn].send.take() {
            // A send waiting for socket space holds a reference to the socket: cancel it, or
            // closing the slot leaves the socket open (and its buffer here) for as long as the
            // peer does not read. The kernel may still read the buffer until the send's
            // completion: keep it till then.
            let ud = user_data(send.buf_owner(), key);
            self.cancel(ud);
            self.graveyard.push((ud, send));
        }
        if self.slots[conn].shutdown_in_flight {
            self.slots[conn].close_after_shutdown = true;
            return;
        }
        self.submit_close(key);
    }

    fn submit_close(&mut self, key: ConnKey) {
        let entry = opcode::Close::new(types::Fixed(key.slot()))
            .build()
            .user_data(user_data(KIND_CLOSE, key));
        self.sqe(entry);
    }

    /// Shuts the sending side down (a lingering close): the FIN goes out, reading goes on.
    /// Tracked until it completes (see `Slot::shutdown_in_flight`); its result is not needed:
    /// a failure (the peer reset) ends the receive too.
    pub(super) fn shutdown(&mut self, conn: ConnId) {
        let key = self.slots.key(conn);
        let slot = &mut self.slots[conn];
        if slot.shutdown_in_flight || slot.closing {
            return;
        }
        slot.shutdown_in_flight = true;
        let entry = opcode::Shutdown::new(types::Fixed(conn), libc::SHUT_WR)
            .build()
            .user_data(user_data(KIND_SHUTDOWN, key));
        self.sqe(entry);
    }

    /// The shutdown ran: a close that waited for it goes now.
    pub(super) fn on_shutdown(&mut self, conn: ConnId) {
        let slot = &mut self.slots[conn];
        slot.shutdown_in_flight = false;
        if std::mem::take(&mut slot.close_after_shutdown) {
            self.submit_close(self.slots.key(conn));
        }
    }

    /// A close completed — or, linked behind a send whose link broke, was cancelled: then it
    /// is reissued once the send is over (a send cut short is re-sent with its close again).
    pub(super) fn on_close(&mut self, conn: ConnId, res: i32) {
        let slot = &mut self.slots[conn];
        if slot.detach_closing {
            // A detached connection's slot: the worker has its socket, nothing to report.
            slot.detach_closing = false;
            return;
        }
        if res == -libc::ECANCELED && slot.close_linked {
            if slot.send.is_none() {
                slot.close_linked = false;
                self.submit_close(self.slots.key(conn));
            }
            return;
        }
        slot.close_linked = false;
        self.ready.push_back(Completion::Closed { conn });
    }
}
