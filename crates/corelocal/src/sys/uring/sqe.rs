//! Queuing submission entries (one at a time, or as a link chain kept in one submit),
//! cancellations, and the raw SQE field edits the io_uring crate has no builder for.
//!
//! A full submission queue is handed to the kernel once; if the kernel cannot take it then
//! (EBUSY: its completion queue is full until the worker reaps), entries wait on the
//! `unqueued` list, in order, and go first at the next `submit` (TigerBeetle's habit). Nothing
//! spins, and any other error is kept and returned by that `submit` (monoio's habit).

use super::state::{request, KIND_CANCEL};
use super::UringBackend;
use io_uring::{opcode, squeue, types};

/// The longest link chain queued as one group.
const CHAIN_LEN_MAX: usize = 8;
/// Groups that may wait for room in the submission queue: past this the kernel has taken
/// nothing for a very long time, which is a bug, not load.
const UNQUEUED_GROUPS_MAX: usize = 1 << 20;

/// `SOCKET_URING_OP_GETSOCKOPT`.
const SOCKET_URING_OP_GETSOCKOPT: u32 = 2;

impl UringBackend {
    /// Queues an SQE (see the module docs for a full queue). The common case — nothing waits
    /// and the queue has room — allocates nothing.
    #[inline]
    pub(super) fn sqe(&mut self, entry: squeue::Entry) {
        if self.unqueued.is_empty() {
            // One look at the queue's head (`submission()` loads it) and one push: `push`
            // checks the room itself.
            // Every buffer or pointer an entry refers to is owned by this backend and
            // outlives the request (send buffers in `slots`/`graveyard`, `wake_buf`, `cpu_vals`).
            // SAFETY: the conditions above hold.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                self.queued_sqes += 1;
                return;
            }
        }
        self.queue_slow(vec![entry]);
    }

    /// Pushes `entries` as one link chain, never split across two submits (a split chain would
    /// run its tail unlinked).
    pub(super) fn sqe_chain(&mut self, entries: &[squeue::Entry]) {
        assert!(
            !entries.is_empty() && entries.len() <= CHAIN_LEN_MAX,
            "short chains only"
        );
        let last = entries.len() - 1;
        let linked = |(i, e): (usize, &squeue::Entry)| {
            if i < last {
                e.clone().flags(squeue::Flags::IO_LINK)
            } else {
                e.clone()
            }
        };
        if self.unqueued.is_empty() && self.has_room(entries.len()) {
            for entry in entries.iter().enumerate().map(linked) {
                let pushed = self.push_group(std::slice::from_ref(&entry));
                debug_assert!(pushed, "room checked above");
            }
            return;
        }
        self.queue_slow(entries.iter().enumerate().map(linked).collect());
    }

    /// The queue is full or entries already wait: hand the queue over once, then push `group`
    /// or keep it waiting, behind any that wait already.
    #[cold]
    #[inline(never)]
    fn queue_slow(&mut self, group: Vec<squeue::Entry>) {
        if self.unqueued.is_empty() {
            self.hand_over_full_queue();
            if self.push_group(&group) {
                return;
            }
        }
        assert!(
            self.unqueued.len() < UNQUEUED_GROUPS_MAX,
            "the kernel took no submission for {UNQUEUED_GROUPS_MAX} entries"
        );
        self.unqueued.push_back(group);
    }

    /// Whether `n` more entries fit in the submission queue now.
    fn has_room(&mut self, n: usize) -> bool {
        let sq = self.ring.submission();
        sq.capacity() - sq.len() >= n
    }

    /// Pushes `group` into the submission queue if it all fits.
    fn push_group(&mut self, group: &[squeue::Entry]) -> bool {
        if !self.has_room(group.len()) {
            return false;
        }
        let mut sq = self.ring.submission();
        for entry in group {
            // Every buffer or pointer an entry refers to is owned by this backend and
            // outlives the request (send buffers in `slots`/`graveyard`, `wake_buf`, `cpu_vals`).
            // SAFETY: the conditions above hold.
            unsafe { sq.push(entry) }.expect("room checked above");
        }
        drop(sq);
        self.queued_sqes += group.len() as u64;
        true
    }

    /// The submission queue is full: hand it to the kernel once. EBUSY (the completion queue is
    /// full until the worker reaps) leaves the entries waiting; another error is kept for the
    /// next `submit`.
    fn hand_over_full_queue(&mut self) {
        match self.ring.submit() {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EINTR)) => {}
            Err(e) => {
                self.submit_error.get_or_insert(e);
            }
        }
    }

    /// Moves waiting entries into the submission queue, in order, while whole groups fit.
    pub(super) fn flush_unqueued(&mut self) {
        while let Some(group) = self.unqueued.pop_front() {
            if !self.push_group(&group) {
                self.unqueued.push_front(group);
                return;
            }
        }
    }

    /// Cancels every request with user_data `target` (IORING_ASYNC_CANCEL_ALL).
    pub(super) fn cancel_all(&mut self, target: u64) {
        let entry = opcode::AsyncCancel2::new(types::CancelBuilder::user_data(target).all())
            .build()
            .user_data(request(KIND_CANCEL, 0));
        self.sqe(entry);
    }

    pub(super) fn cancel(&mut self, target: u64) {
        let entry = opcode::AsyncCancel::new(target)
            .build()
            .user_data(request(KIND_CANCEL, 0));
        self.sqe(entry);
    }
}

/// Turns a socket SETSOCKOPT uring_cmd entry into GETSOCKOPT (the crate has no builder for it).
pub(super) fn as_getsockopt(entry: squeue::Entry) -> squeue::Entry {
    // `squeue::Entry` is #[repr(C)] around the 64-byte kernel io_uring_sqe; `cmd_op`
    // (u32) sits at byte offset 8 in the kernel ABI. Only that field changes.
    // SAFETY: the conditions above hold.
    unsafe {
        let mut raw: [u8; 64] = std::mem::transmute(entry);
        raw[8..12].copy_from_slice(&SOCKET_URING_OP_GETSOCKOPT.to_ne_bytes());
        std::mem::transmute::<[u8; 64], squeue::Entry>(raw)
    }
}

/// Sets an accept SQE's `ioprio` flags (the crate's one-shot Accept builder has no setter).
pub(super) fn with_ioprio(entry: squeue::Entry, ioprio: u16) -> squeue::Entry {
    // `squeue::Entry` is #[repr(C)] around the 64-byte kernel io_uring_sqe; `ioprio`
    // (u16) sits at byte offset 2 in the kernel ABI. Only that field changes.
    // SAFETY: the conditions above hold.
    unsafe {
        let mut raw: [u8; 64] = std::mem::transmute(entry);
        raw[2..4].copy_from_slice(&ioprio.to_ne_bytes());
        std::mem::transmute::<[u8; 64], squeue::Entry>(raw)
    }
}
