//! Queuing submission entries (one at a time, or as a link chain kept in one submit),
//! cancellations, and the raw SQE field edits the io_uring crate has no builder for.

use super::state::{user_data, KIND_CANCEL};
use super::UringBackend;
use io_uring::{opcode, squeue, types};

/// `SOCKET_URING_OP_GETSOCKOPT`.
const SOCKET_URING_OP_GETSOCKOPT: u32 = 2;

impl UringBackend {
    /// Queues an SQE, submitting first if the submission queue is full.
    pub(super) fn sqe(&mut self, entry: squeue::Entry) {
        loop {
            // SAFETY: every buffer or pointer an entry refers to is owned by this backend and
            // outlives the request (send buffers in `slots`/`graveyard`, `wake_buf`, `cpu_vals`).
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                self.queued_sqes += 1;
                return;
            }
            // Full: hand the batch over and retry.
            let _ = self.ring.submit();
        }
    }

    /// Pushes `entries` as one link chain: room for all of them is made first, so the chain is
    /// never split across two submits (a split chain would run its tail unlinked).
    pub(super) fn sqe_chain(&mut self, entries: &[squeue::Entry]) {
        assert!(
            !entries.is_empty() && entries.len() <= 8,
            "short chains only"
        );
        let room = {
            let sq = self.ring.submission();
            sq.capacity() - sq.len()
        };
        if room < entries.len() {
            let _ = self.ring.submit();
        }
        let last = entries.len() - 1;
        for (i, entry) in entries.iter().enumerate() {
            let entry = if i < last {
                entry.clone().flags(squeue::Flags::IO_LINK)
            } else {
                entry.clone()
            };
            self.sqe(entry);
        }
    }

    /// Cancels every request with user_data `target` (IORING_ASYNC_CANCEL_ALL).
    pub(super) fn cancel_all(&mut self, target: u64) {
        let entry = opcode::AsyncCancel2::new(types::CancelBuilder::user_data(target).all())
            .build()
            .user_data(user_data(KIND_CANCEL, 0, 0));
        self.sqe(entry);
    }

    pub(super) fn cancel(&mut self, target: u64) {
        let entry = opcode::AsyncCancel::new(target)
            .build()
            .user_data(user_data(KIND_CANCEL, 0, 0));
        self.sqe(entry);
    }
}

/// Turns a socket SETSOCKOPT uring_cmd entry into GETSOCKOPT (the crate has no builder for it).
pub(super) fn as_getsockopt(entry: squeue::Entry) -> squeue::Entry {
    // SAFETY: squeue::Entry is #[repr(C)] around the 64-byte kernel io_uring_sqe; `cmd_op`
    // (u32) sits at byte offset 8 in the kernel ABI. Only that field changes.
    unsafe {
        let mut raw: [u8; 64] = std::mem::transmute(entry);
        raw[8..12].copy_from_slice(&SOCKET_URING_OP_GETSOCKOPT.to_ne_bytes());
        std::mem::transmute::<[u8; 64], squeue::Entry>(raw)
    }
}

/// Sets an accept SQE's `ioprio` flags (the crate's one-shot Accept builder has no setter).
pub(super) fn with_ioprio(entry: squeue::Entry, ioprio: u16) -> squeue::Entry {
    // SAFETY: squeue::Entry is #[repr(C)] around the 64-byte kernel io_uring_sqe; `ioprio`
    // (u16) sits at byte offset 2 in the kernel ABI. Only that field changes.
    unsafe {
        let mut raw: [u8; 64] = std::mem::transmute(entry);
        raw[2..4].copy_from_slice(&ioprio.to_ne_bytes());
        std::mem::transmute::<[u8; 64], squeue::Entry>(raw)
    }
}
