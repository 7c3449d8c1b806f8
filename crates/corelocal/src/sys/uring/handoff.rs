//! Connections moving between processes at a binary upgrade: detaching one (its receive
//! cancelled, an ordinary descriptor installed from the direct one with
//! `IORING_OP_FIXED_FD_INSTALL`, then the slot closed) and adopting one (registered into a
//! free slot with `IORING_OP_FILES_UPDATE` and `IORING_FILE_INDEX_ALLOC`).

use super::state::{
    request, user_data, Detaching, RecvState, KIND_ADOPT, KIND_CLOSE, KIND_INSTALL, KIND_RECV,
};
use super::UringBackend;
use crate::backend::{Backend, Completion, ConnId, Origin};
use io_uring::{opcode, types};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `IORING_FILE_INDEX_ALLOC` as the files-update offset: the kernel picks free slots.
const FILE_INDEX_ALLOC: i32 = -1;
/// Enters waited for one adoption's completion before giving up (each waits for a CQE; only
/// the waker's read can complete meanwhile, since nothing else is armed before accepting).
const ADOPT_ENTERS_MAX: usize = 64;

impl UringBackend {
    /// Starts detaching: the receive (if one can still complete) is cancelled and the
    /// descriptor installed; `Detached` follows once both are over (see `detach_progress`).
    pub(super) fn detach(&mut self, conn: ConnId) {
        let key = self.slots.key(conn);
        let slot = &mut self.slots[conn];
        debug_assert!(slot.send.is_none(), "detached with a send in flight");
        let recv_live = slot.recv.in_flight();
        slot.recv = RecvState::Off;
        slot.closing = true;
        slot.detaching = Some(Detaching {
            recv_live,
            fd: None,
        });
        if recv_live {
            self.cancel(user_data(KIND_RECV, key));
        }
        let entry = opcode::FixedFdInstall::new(types::Fixed(conn), 0)
            .build()
            .user_data(user_data(KIND_INSTALL, key));
        self.sqe(entry);
    }

    /// The install completed: a descriptor (O_CLOEXEC) or an error.
    pub(super) fn on_install(&mut self, conn: ConnId, res: i32) {
        let fd = if res >= 0 {
            // SAFETY: the kernel installed a new descriptor for us alone.
            Ok(unsafe { OwnedFd::from_raw_fd(res) })
        } else {
            Err(io::Error::from_raw_os_error(-res))
        };
        if let Some(d) = self.slots[conn].detaching.as_mut() {
            d.fd = Some(fd);
        }
        self.detach_progress(conn);
    }

    /// A detaching connection's receive gave its last completion.
    pub(super) fn on_detach_recv_over(&mut self, conn: ConnId) {
        if let Some(d) = self.slots[conn].detaching.as_mut() {
            d.recv_live = false;
        }
        self.detach_progress(conn);
    }

    /// Once the receive is over and the descriptor installed: `Detached` (after every `Recv`
    /// of the connection), and the slot closes (its completion is not reported).
    fn detach_progress(&mut self, conn: ConnId) {
        let key = self.slots.key(conn);
        let slot = &mut self.slots[conn];
        let done = slot
            .detaching
            .as_ref()
            .is_some_and(|d| !d.recv_live && d.fd.is_some());
        if !done {
            return;
        }
        let fd = slot.detaching.take().and_then(|d| d.fd).expect("checked");
        slot.detach_closing = true;
        let entry = opcode::Close::new(types::Fixed(conn))
            .build()
            .user_data(user_data(KIND_CLOSE, key));
        self.sqe(entry);
        self.ready.push_back(Completion::Detached { conn, fd });
    }

    /// Registers `fd` in a free slot of the table and waits for it (see `Backend::adopt`).
    pub(super) fn adopt_fd(&mut self, fd: OwnedFd) -> io::Result<ConnId> {
        let mut fds = [fd.as_raw_fd()];
        // A mutable pointer: the kernel writes the slot it picked back into `fds`.
        self.adopted = None;
        let entry = opcode::FilesUpdate::new(fds.as_mut_ptr().cast_const(), 1)
            .offset(FILE_INDEX_ALLOC)
            .build()
            .user_data(request(KIND_ADOPT, 0));
        self.sqe(entry);
        for _ in 0..ADOPT_ENTERS_MAX {
            self.submit()?;
            self.ring.submit_and_wait(1)?;
            self.drain_cq();
            if let Some(res) = self.adopted.take() {
                if res < 0 {
                    return Err(io::Error::from_raw_os_error(-res));
                }
                // The kernel wrote the slot it picked over the descriptor (the table holds its
                // own reference: `fd` closes when dropped here).
                let conn = fds[0] as ConnId;
                assert!((conn as usize) < self.slots.len(), "slot out of the table");
                self.reset_slot(conn, Origin::Local(0));
                return Ok(conn);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "io_uring: registering a handed-over connection did not complete",
        ))
    }
}
