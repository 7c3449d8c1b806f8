//! Receiving: arming multishot receives, their completions, and re-arming them after the
//! first receive or once a receive starved of buffers can go on.

use super::state::{user_data, RecvState, KIND_RECV};
use super::{UringBackend, BUF_GROUP};
use crate::backend::{BufId, Completion, ConnId};
use io_uring::{cqueue, opcode, types};
use std::io;

impl UringBackend {
    pub(super) fn arm_recv(&mut self, conn: ConnId) {
        let key = self.slots.key(conn);
        self.slots[conn].recv = RecvState::Armed;
        let entry = opcode::RecvMulti::new(types::Fixed(conn), BUF_GROUP)
            .build()
            .user_data(user_data(KIND_RECV, key));
        self.sqe(entry);
    }

    /// `Op::RecvStop`: cancels the receive in flight (its last CQE completes the stop) or,
    /// with none, stops at once.
    pub(super) fn stop_recv(&mut self, conn: ConnId) {
        let state = self.slots[conn].recv;
        match state {
            RecvState::Stopping | RecvState::Held => {}
            s if s.in_flight() => {
                self.cancel(user_data(KIND_RECV, self.slots.key(conn)));
                self.slots[conn].recv = RecvState::Stopping;
            }
            // Off, Starved (fed only while Starved), ArmAtSubmit (armed only while so).
            _ => {
                self.slots[conn].recv = RecvState::Held;
                self.ready.push_back(Completion::RecvStopped { conn });
            }
        }
    }

    /// The stop's receive ended (its CQE without `F_MORE`): held from now on.
    fn recv_stopped(&mut self, conn: ConnId) {
        self.slots[conn].recv = RecvState::Held;
        self.ready.push_back(Completion::RecvStopped { conn });
    }

    pub(super) fn on_recv(&mut self, conn: ConnId, res: i32, flags: u32) {
        let more = cqueue::more(flags);
        if res > 0 {
            let bid = cqueue::buffer_select(flags).expect("multishot recv without a buffer");
            self.ready.push_back(Completion::Recv {
                conn,
                buf: bid as BufId,
                len: res as usize,
            });
            let state = self.slots[conn].recv;
            if !more && state == RecvState::Stopping && self.slots[conn].detaching.is_none() {
                self.recv_stopped(conn);
                return;
            }
            if !more && state == RecvState::Armed {
                self.events.rearms += 1;
                self.arm_recv(conn);
            } else if state == RecvState::First {
                self.slots[conn].recv = RecvState::ArmAtSubmit;
                self.arm_at_submit.push(self.slots.key(conn));
            }
            if !more && self.slots[conn].detaching.is_some() {
                self.on_detach_recv_over(conn);
            }
            return;
        }
        let slot = &mut self.slots[conn];
        let was_armed = matches!(slot.recv, RecvState::Armed | RecvState::First);
        let stopping = slot.recv == RecvState::Stopping;
        if !more {
            slot.recv = RecvState::Off;
            if slot.detaching.is_some() {
                // Its end (or error) stays with the socket: the successor reads it again.
                self.on_detach_recv_over(conn);
                return;
            }
        }
        match res {
            0 => self.ready.push_back(Completion::Eof { conn }),
            e if e == -libc::ENOBUFS => {
                if was_armed {
                    slot.recv = RecvState::Starved;
                    self.starved.push(conn);
                    self.events.recv_starved += 1;
                }
            }
            e if e == -libc::ECANCELED => {}
            e => self.ready.push_back(Completion::RecvFailed {
                conn,
                error: io::Error::from_raw_os_error(-e),
            }),
        }
        if stopping && !more {
            self.recv_stopped(conn);
        }
    }

    /// Arms multishot receives on connections whose first receive completed and that are
    /// still open and not paused (see `RecvState::ArmAtSubmit`). While the answer to the
    /// first request is being sent, arming waits: a one-shot connection closes right after it.
    pub(super) fn arm_after_first_recv(&mut self) {
        if self.arm_at_submit.is_empty() {
            return;
        }
        // Taken out while `arm_recv` borrows the backend, and put back with its allocation
        // (one `malloc`/`free` per connection otherwise).
        let mut pending = std::mem::take(&mut self.arm_at_submit);
        pending.retain(|&key| {
            // Closed since (and maybe the slot reused): nothing to arm.
            let Some(slot) = self.slots.get(key) else {
                return false;
            };
            if slot.recv != RecvState::ArmAtSubmit || slot.closing {
                return false;
            }
            if slot.send.is_some() {
                return true; // Armed once its send is done.
            }
            self.arm_recv(key.slot());
            false
        });
        debug_assert!(
            self.arm_at_submit.is_empty(),
            "arm_recv queues nothing here"
        );
        self.arm_at_submit = pending;
    }

    /// Re-arms receives that ran out of buffers, once buffers came back.
    pub(super) fn feed_starved(&mut self) {
        let starved = std::mem::take(&mut self.starved);
        for conn in starved {
            if self.slots[conn].recv == RecvState::Starved && !self.slots[conn].closing {
                self.events.rearms += 1;
                self.arm_recv(conn);
            }
        }
    }
}
