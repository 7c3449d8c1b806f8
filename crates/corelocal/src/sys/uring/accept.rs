//! Accepting: each listener's multishot or budgeted one-shot accepts (the accept policy,
//! [`ListenerAccept`], decides which and when; this file submits and completes them), steals
//! from other workers' listeners, and a new direct descriptor's setup (its SO_INCOMING_CPU
//! query and first receive) up to its `Accepted` report.

use super::sqe::{as_getsockopt, with_ioprio};
use super::state::{
    request, user_data, RecvState, KIND_ACCEPT, KIND_ACCEPT_ONE, KIND_RECV, KIND_SOCKOPT,
    KIND_STEAL,
};
use super::{UringBackend, BUF_GROUP};
use crate::backend::accept::ListenerAccept;
use crate::backend::{Completion, ConnId, Origin};
use io_uring::{cqueue, opcode, squeue, types};
use std::io;
use std::os::fd::RawFd;

/// `IORING_ACCEPT_DONTWAIT`: fail with EAGAIN instead of waiting for a connection.
const IORING_ACCEPT_DONTWAIT: u16 = 2;

/// A listener's accept: its socket and the policy's state ([`ListenerAccept`] decides
/// multishot or budgeted one-shot accepts, and when to arm and cancel them).
#[derive(Debug, Clone, Copy)]
pub(super) struct ListenerState {
    fd: RawFd,
    pub(super) policy: ListenerAccept,
}

impl UringBackend {
    fn arm_accept(&mut self, listener: u32, fd: RawFd) {
        let entry = opcode::AcceptMulti::new(types::Fd(fd))
            .allocate_file_index(true)
            .build()
            .user_data(request(KIND_ACCEPT, listener));
        self.sqe(entry);
    }

    pub(super) fn start_accepting(&mut self, listener: u32, fd: RawFd, budget: Option<u32>) {
        let slot = listener as usize;
        if self.listeners.len() <= slot {
            self.listeners.resize(slot + 1, None);
        }
        let state = self.listeners[slot].get_or_insert_with(|| ListenerState {
            fd,
            policy: ListenerAccept::new(ListenerAccept::multishot_min(
                crate::sys::socket::listen_queue(fd).ok().map(|q| q.cap),
            )),
        });
        state.policy.allow(budget);
        self.arrange_accepts(listener);
    }

    /// Submits what the policy decides for the listener (see [`ListenerAccept::arrange`]);
    /// returns whether a multishot accept was armed.
    fn arrange_accepts(&mut self, listener: u32) -> bool {
        let Some(Some(state)) = self.listeners.get_mut(listener as usize) else {
            return false;
        };
        let fd = state.fd;
        let arrange = state.policy.arrange();
        if arrange.arm_multishot {
            self.arm_accept(listener, fd);
        }
        if arrange.cancel_multishot {
            self.cancel(request(KIND_ACCEPT, listener));
        }
        for _ in 0..arrange.oneshots {
            let entry =
                opcode::Accept::new(types::Fd(fd), std::ptr::null_mut(), std::ptr::null_mut())
                    .file_index(Some(types::DestinationSlot::auto_target()))
                    .build()
                    .user_data(request(KIND_ACCEPT_ONE, listener));
            self.sqe(entry);
        }
        arrange.arm_multishot
    }

    pub(super) fn stop_accepting(&mut self, listener: u32) {
        let Some(Some(state)) = self.listeners.get_mut(listener as usize) else {
            return;
        };
        let pause = state.policy.pause();
        if pause.cancel_multishot {
            self.cancel(request(KIND_ACCEPT, listener));
        }
        if pause.cancel_oneshots {
            // One cancel per request would not do: the one-shot accepts share a user_data, and
            // a cancel only marks the request it finds (it leaves the hash in task work), so
            // every cancel of a batch finds the same one and the others keep accepting.
            self.cancel_all(request(KIND_ACCEPT_ONE, listener));
        }
    }

    /// One accept on another worker's listener into our table; EAGAIN if nothing waits.
    pub(super) fn steal(&mut self, victim: u32, fd: RawFd) {
        let entry = opcode::Accept::new(types::Fd(fd), std::ptr::null_mut(), std::ptr::null_mut())
            .file_index(Some(types::DestinationSlot::auto_target()))
            .build()
            .user_data(request(KIND_STEAL, victim));
        self.steals_inflight += 1;
        self.sqe(with_ioprio(entry, IORING_ACCEPT_DONTWAIT));
    }

    /// The socket uring_cmd that reads `SO_INCOMING_CPU` of a new direct descriptor.
    fn incoming_cpu_query(&mut self, conn: ConnId) -> squeue::Entry {
        let key = self.slots.key(conn);
        let optval = &mut self.cpu_vals[conn as usize] as *mut i32;
        let entry = opcode::SetSockOpt::new(
            types::Fixed(conn),
            libc::SOL_SOCKET as u32,
            crate::sys::socket::SO_INCOMING_CPU as u32,
            optval as *const libc::c_void,
            4,
        )
        .build()
        .user_data(user_data(KIND_SOCKOPT, key));
        as_getsockopt(entry)
    }

    pub(super) fn on_accept_one(&mut self, listener: u32, res: i32) {
        let Some(Some(state)) = self.listeners.get_mut(listener as usize) else {
            return;
        };
        state.policy.on_oneshot(res >= 0);
        self.on_accept_result(listener, res);
        self.arrange_accepts(listener);
    }

    pub(super) fn on_accept(&mut self, listener: u32, res: i32, flags: u32) {
        let more = cqueue::more(flags);
        if let Some(Some(s)) = self.listeners.get_mut(listener as usize) {
            s.policy.on_multishot(res >= 0, more);
        }
        self.on_accept_result(listener, res);
        if !more {
            // Ended: re-armed if the allowance still calls for multishot (counted unless it
            // ended by a cancel).
            if self.arrange_accepts(listener) && res != -libc::ECANCELED {
                self.events.rearms += 1;
            }
        } else if res >= 0 {
            self.arrange_accepts(listener);
        }
    }

    /// A new connection, or the failure to report (a cancelled accept is neither).
    fn on_accept_result(&mut self, listener: u32, res: i32) {
        if res >= 0 {
            self.new_conn(res as u32, Origin::Local(listener));
        } else if res != -libc::ECANCELED {
            self.ready.push_back(Completion::AcceptFailed {
                listener,
                error: io::Error::from_raw_os_error(-res),
            });
        }
    }

    /// A slot taken by a new connection: a new generation (the last connection's requests
    /// still with the kernel become stale), nothing in flight.
    #[inline]
    pub(super) fn reset_slot(&mut self, conn: ConnId, origin: Origin) {
        self.slots.renew(conn);
        let slot = &mut self.slots[conn];
        slot.origin = origin;
        slot.recv = RecvState::Off;
        slot.send = None;
        slot.closing = false;
        slot.close_linked = false;
        slot.detaching = None;
        slot.detach_closing = false;
        if slot.options.is_some() {
            // Options of a connection closed before their CQEs came (a test, not a call to
            // drop glue, on every new connection).
            slot.options = None;
        }
        slot.ulp = false;
        debug_assert!(!slot.shutdown_in_flight && !slot.close_after_shutdown);
    }

    /// A new direct descriptor: reset its slot and ask for its SO_INCOMING_CPU.
    fn new_conn(&mut self, conn: ConnId, origin: Origin) {
        self.reset_slot(conn, origin);
        self.cpu_vals[conn as usize] = -1;
        self.unreported += 1;
        // The SO_INCOMING_CPU query and the first receive in one submit, linked so that their
        // CQEs come in that order (`Accepted` before any `Recv`): a request already queued is
        // read in the same turn the connection is reported.
        let query = self.incoming_cpu_query(conn);
        let key = self.slots.key(conn);
        let first_recv = opcode::Recv::new(types::Fixed(conn), std::ptr::null_mut(), 0)
            .buf_group(BUF_GROUP)
            .build()
            .flags(squeue::Flags::BUFFER_SELECT)
            .user_data(user_data(KIND_RECV, key));
        self.slots[conn].recv = RecvState::First;
        self.sqe_chain(&[query, first_recv]);
    }

    pub(super) fn on_steal(&mut self, victim: u32, res: i32) {
        self.steals_inflight = self.steals_inflight.saturating_sub(1);
        if res >= 0 {
            self.new_conn(res as u32, Origin::Stolen(victim));
        } else {
            self.ready.push_back(Completion::StealFailed {
                victim,
                error: io::Error::from_raw_os_error(-res),
            });
        }
    }

    pub(super) fn on_sockopt(&mut self, conn: ConnId, res: i32) {
        self.unreported = self.unreported.saturating_sub(1);
        let cpu = self.cpu_vals[conn as usize];
        self.ready.push_back(Completion::Accepted {
            origin: self.slots[conn].origin,
            conn,
            peer: None,
            incoming_cpu: (res >= 0 && cpu >= 0).then_some(cpu as usize),
        });
    }
}
