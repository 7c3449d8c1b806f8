//! The io_uring [`Backend`]: MegaPipe's per-core channel on today's kernels.
//!
//! - One ring per worker with SINGLE_ISSUER | DEFER_TASKRUN | COOP_TASKRUN | TASKRUN_FLAG: the
//!   worker thread alone submits, and completions are produced only when it asks for them.
//! - Multishot accept into *direct descriptors* (a sparse registered file table): MegaPipe's
//!   lightweight sockets: no process fd table, no VFS file descriptor, and the limit is per ring.
//! - Multishot receive with a provided-buffer ring; buffers go back to the ring on `release`
//!   and the tail is published once per `submit`.
//! - One `io_uring_enter` per loop turn submits the batch and waits.
//!
//! Multishot requests that end without `IORING_CQE_F_MORE` are re-armed; a receive starved of
//! buffers (ENOBUFS) is re-armed once buffers come back; completions of a closed connection's
//! requests are recognised by their connection's key in `user_data` ([`ConnKey`]: the slot and
//! its generation, checked by the slot table) and dropped.
//!
//! Layout: this file holds the backend, its config, the dispatch of operations and completions
//! and the [`Backend`] impl; `accept`, `recv`, `send` and `close` submit and complete each
//! operation; `options` sets socket options a handler asks for; `sqe` queues entries; `state` holds the `user_data` encoding and the slot state;
//! `buf_ring` the provided-buffer ring.

mod accept;
mod buf_ring;
mod close;
mod handoff;
mod options;
mod recv;
mod send;
mod sqe;
mod state;

use crate::backend::key::{Slots, PACKED_SLOTS};
use crate::backend::{
    Backend, BackendEvents, BufId, Completion, ConnId, ConnKey, Op, Origin, Wake,
};
use crate::sys::eventfd::EventFdWaker;
use accept::ListenerState;
use buf_ring::BufRing;
use io_uring::{opcode, types, IoUring};
use state::{
    request, split, user_data, RecvState, Slot, KIND_ACCEPT, KIND_ACCEPT_ONE, KIND_ADOPT,
    KIND_CANCEL, KIND_CLOSE, KIND_DRAIN, KIND_FILE_READ, KIND_INSTALL, KIND_OPTIONS, KIND_RECV,
    KIND_SEND, KIND_SHUTDOWN, KIND_SOCKOPT, KIND_STEAL, KIND_WAKE,
};
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// The provided-buffer group id used for receives.
const BUF_GROUP: u16 = 0;
/// Completions taken from the CQ per reap call before returning to the worker.
const CQE_BATCH_MAX: usize = 1024;
/// `IORING_ENTER_GETEVENTS` (the crate keeps its `sys` constants private).
const IORING_ENTER_GETEVENTS: u32 = 1;

/// Sizes of one worker's ring.
#[derive(Debug, Clone, Copy)]
pub struct UringConfig {
    /// Submission queue entries (completion queue: 4×).
    pub sq_entries: u32,
    /// Direct-descriptor table size (connections this ring can hold).
    pub files: u32,
    /// Provided buffers (power of two, ≤ 32768).
    pub bufs: u16,
    /// Bytes per provided buffer.
    pub buf_bytes: usize,
}

/// The io_uring backend of one worker.
pub struct UringBackend {
    // Field order matters for Drop: the ring (and its registrations) goes before the buffers.
    ring: IoUring,
    bufs: BufRing,
    waker: Arc<EventFdWaker>,
    wake_buf: Box<u64>,
    /// A wake-up was reaped since `wait` last returned: the next `wait` returns at once, so
    /// that the worker's turn sees what the waker announced. A wake reaped by `wait`'s first
    /// drain (posted by the previous submit's task work) was otherwise followed by a sleep:
    /// a notify made then waited for the next unrelated completion.
    woken: bool,
    /// SO_INCOMING_CPU results, one per slot (stable addresses for in-flight getsockopt).
    cpu_vals: Box<[i32]>,
    /// The direct-descriptor table's slots, with the generation of each one's connection.
    slots: Slots<Slot>,
    listeners: Vec<Option<ListenerState>>,
    ready: VecDeque<Completion>,
    /// Send buffers of closed connections, kept until the kernel is done with them.
    graveyard: Vec<(u64, state::SendState)>,
    starved: Vec<ConnId>,
    /// Connections whose first receive completed, see `ArmAtSubmit`.
    arm_at_submit: Vec<ConnKey>,
    queued_sqes: u64,
    /// Entry groups waiting for room in the submission queue (see `sqe`).
    unqueued: VecDeque<Vec<io_uring::squeue::Entry>>,
    /// An error from handing a full submission queue over, returned by the next `submit`.
    submit_error: Option<io::Error>,
    /// SQEs queued while reaping inside `wait` and handed over by its enter: the next
    /// `submit` reports them with its own.
    submitted_by_wait: u64,
    events: BackendEvents,
    /// Steals (one-shot accepts on other workers' listeners) submitted, not completed.
    steals_inflight: u32,
    /// Accepted direct descriptors whose SO_INCOMING_CPU query (hence `Accepted`) is pending.
    unreported: u32,
    /// The result of the adoption in progress (see `handoff`).
    adopted: Option<i32>,
    /// Completions taken from the CQ by `drain_cq` (kept between drains, empty).
    cqe_scratch: Vec<(u64, i32, u32)>,
}

impl std::fmt::Debug for UringBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringBackend")
            .field("slots", &self.slots.len())
            .finish()
    }
}

impl UringBackend {
    /// Creates the ring, registers the sparse file table and the buffer ring, arms the waker.
    /// Fails with the kernel's error when io_uring is refused (EPERM, ENOSYS, …).
    pub fn new(config: UringConfig) -> io::Result<UringBackend> {
        assert!(
            config.files > 0 && config.buf_bytes > 0,
            "empty ring config"
        );
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .setup_cqsize(config.sq_entries * 4)
            .build(config.sq_entries)?;
        ring.submitter().register_files_sparse(config.files)?;
        if config.files > PACKED_SLOTS {
            // A request's `user_data` packs its connection's slot in 24 bits; the kernel's
            // limit (2^20) refuses larger tables before this.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "io_uring: direct-descriptor table larger than 2^24 slots",
            ));
        }
        let bufs = BufRing::new(config.bufs, config.buf_bytes)?;
        // The ring memory stays allocated and unmoved (heap, owned by `bufs`) until
        // after the io_uring instance is dropped (field order above).
        // SAFETY: the conditions above hold.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                bufs.ring as u64,
                bufs.entries,
                BUF_GROUP,
                0,
            )?
        };
        let waker = Arc::new(EventFdWaker::new()?);
        let mut backend = UringBackend {
            ring,
            bufs,
            waker,
            wake_buf: Box::new(0),
            woken: false,
            cpu_vals: vec![-1; config.files as usize].into_boxed_slice(),
            slots: Slots::with(config.files, || Slot {
                origin: Origin::Local(0),
                recv: RecvState::Off,
                send: None,
                closing: false,
                close_linked: false,
                detaching: None,
                detach_closing: false,
                shutdown_in_flight: false,
                close_after_shutdown: false,
                options: None,
                ulp: false,
            }),
            listeners: Vec::new(),
            ready: VecDeque::new(),
            graveyard: Vec::new(),
            starved: Vec::new(),
            arm_at_submit: Vec::new(),
            queued_sqes: 0,
            unqueued: VecDeque::new(),
            submit_error: None,
            submitted_by_wait: 0,
            events: BackendEvents::default(),
            steals_inflight: 0,
            unreported: 0,
            adopted: None,
            cqe_scratch: Vec::with_capacity(CQE_BATCH_MAX),
        };
        backend.arm_waker();
        Ok(backend)
    }

    fn arm_waker(&mut self) {
        let fd = self.waker.fd();
        let buf = &mut *self.wake_buf as *mut u64 as *mut u8;
        let entry = opcode::Read::new(types::Fd(fd), buf, 8)
            .build()
            .user_data(request(KIND_WAKE, 0));
        self.sqe(entry);
    }

    fn run(&mut self, op: Op) {
        match op {
            Op::Accept {
                listener,
                fd,
                budget,
                ..
            } => self.start_accepting(listener, fd, budget),
            Op::Steal { victim, fd } => self.steal(victim, fd),
            Op::AcceptPause { listener, .. } => self.stop_accepting(listener),
            Op::Recv { conn } => {
                // A fresh connection's first receive is already on its way (`First`,
                // `ArmAtSubmit`); resuming after a pause arms multishot.
                if self.slots[conn].recv == RecvState::Off {
                    self.arm_recv(conn);
                }
            }
            Op::RecvPause { conn } => {
                let state = self.slots[conn].recv;
                // Stopping or held: stopped already, and held.
                if !matches!(state, RecvState::Stopping | RecvState::Held) {
                    if state.in_flight() {
                        self.cancel(user_data(KIND_RECV, self.slots.key(conn)));
                    }
                    self.slots[conn].recv = RecvState::Off;
                }
            }
            Op::RecvStop { conn } => self.stop_recv(conn),
            Op::RecvRelease { conn } => {
                if self.slots[conn].recv == RecvState::Held {
                    self.slots[conn].recv = RecvState::Off;
                }
            }
            Op::Send {
                conn,
                buf,
                close_after,
            } => self.start_send(conn, buf, None, close_after),
            Op::SendControl {
                conn,
                control,
                payload,
            } => {
                let msg = crate::sys::socket::ControlSend::new(&control, payload);
                self.start_control_send(conn, msg);
            }
            Op::SendFile { conn, region } => {
                let total = region.len;
                self.start_send(conn, Vec::new(), Some((region, total)), false);
            }
            Op::SetOptions { conn, options } => self.set_options(conn, options),
            Op::Shutdown { conn } => self.shutdown(conn),
            Op::Close { conn } => self.close(conn),
            Op::Detach { conn } => self.detach(conn),
            Op::AbortSend { conn } => self.abort_last_send(conn),
        }
    }

    fn complete(&mut self, ud: u64, res: i32, flags: u32) {
        let (kind, key) = split(ud);
        let id = key.slot();
        match kind {
            KIND_WAKE => {
                self.woken = true;
                self.arm_waker();
            }
            KIND_ACCEPT => self.on_accept(id, res, flags),
            KIND_ACCEPT_ONE => self.on_accept_one(id, res),
            KIND_STEAL => self.on_steal(id, res),
            // A discarding receive failed (nothing to discard): nothing to do, the last
            // send's close reports.
            KIND_CANCEL | KIND_DRAIN => {}
            KIND_ADOPT => self.adopted = Some(res),
            _ => self.complete_conn(kind, key, ud, res, flags),
        }
    }

    /// A connection's request completed: handled if its connection still holds the slot.
    fn complete_conn(&mut self, kind: u64, key: ConnKey, ud: u64, res: i32, flags: u32) {
        if kind == KIND_SEND || kind == KIND_FILE_READ {
            if let Some(pos) = self.graveyard.iter().position(|(u, _)| *u == ud) {
                self.graveyard.swap_remove(pos);
                return;
            }
        }
        if self.slots.get(key).is_none() {
            return; // A request of a connection closed since (or of no slot of the table).
        }
        let id = key.slot();
        match kind {
            KIND_SOCKOPT => self.on_sockopt(id, res),
            KIND_OPTIONS => self.on_option(id, res),
            KIND_RECV => self.on_recv(id, res, flags),
            KIND_SEND => self.on_send(id, res),
            KIND_FILE_READ => self.on_file_read(id, res),
            KIND_CLOSE => self.on_close(id, res),
            KIND_SHUTDOWN => self.on_shutdown(id),
            KIND_INSTALL => self.on_install(id, res),
            _ => {}
        }
    }

    fn drain_cq(&mut self) {
        let mut batch = 0;
        // One buffer for every drain (taken out while `complete` borrows the backend): a
        // fresh one per drain was an allocation per loop turn.
        let mut taken = std::mem::take(&mut self.cqe_scratch);
        loop {
            let mut cq = self.ring.completion();
            for cqe in cq.by_ref().take(CQE_BATCH_MAX) {
                taken.push((cqe.user_data(), cqe.result(), cqe.flags()));
            }
            drop(cq);
            if taken.is_empty() {
                break;
            }
            batch += taken.len();
            for (ud, res, flags) in taken.drain(..) {
                self.complete(ud, res, flags);
            }
            if batch >= CQE_BATCH_MAX {
                break;
            }
        }
        self.cqe_scratch = taken;
    }
}

impl Backend for UringBackend {
    fn name(&self) -> &'static str {
        "uring"
    }

    fn push(&mut self, op: Op) {
        self.run(op);
    }

    fn submit(&mut self) -> io::Result<usize> {
        if let Some(e) = self.submit_error.take() {
            return Err(e);
        }
        if self.bufs.publish() && !self.starved.is_empty() {
            self.feed_starved();
        }
        self.arm_after_first_recv();
        self.flush_unqueued();
        let earlier = std::mem::take(&mut self.submitted_by_wait) as usize;
        let count = std::mem::take(&mut self.queued_sqes) as usize;
        if count == 0 {
            return Ok(earlier);
        }
        let to_submit = self.ring.submission().len() as u32;
        // GETEVENTS without waiting: under DEFER_TASKRUN the task work of what was just
        // submitted runs now — e.g. the close linked behind a send that completed inline — so
        // its completion is reaped this turn instead of after the next wait.
        // SAFETY: no argument is passed (null pointer, size of an unused sigset type).
        let entered = unsafe {
            self.ring.submitter().enter::<libc::sigset_t>(
                to_submit,
                0,
                IORING_ENTER_GETEVENTS,
                None,
            )
        };
        match entered {
            Ok(_) => Ok(earlier + count),
            // CQ full: reap first.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(earlier + count),
            Err(e) => Err(e),
        }
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.drain_cq();
        if !self.ready.is_empty() || std::mem::take(&mut self.woken) {
            return Ok(());
        }
        // The enter below hands over whatever reaping queued (a new connection's query and
        // first receive, re-armed requests).
        self.submitted_by_wait += std::mem::take(&mut self.queued_sqes);
        let result = match timeout {
            Some(t) => {
                let ts = types::Timespec::new()
                    .sec(t.as_secs())
                    .nsec(t.subsec_nanos());
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
            None => self.ring.submitter().submit_and_wait(1),
        };
        match result {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME) | Some(libc::EINTR)) => {}
            Err(e) => return Err(e),
        }
        self.drain_cq();
        // The turn that follows handles whatever woke it.
        self.woken = false;
        Ok(())
    }

    fn reap(&mut self, out: &mut Vec<Completion>, max: usize) {
        let n = self.ready.len().min(max);
        out.extend(self.ready.drain(..n));
    }

    fn recv_data(&self, buf: BufId, len: usize) -> &[u8] {
        self.bufs.data(buf as u16, len)
    }

    fn release(&mut self, buf: BufId) {
        self.bufs.push(buf as u16);
    }

    fn waker(&self) -> Arc<dyn Wake> {
        self.waker.clone()
    }

    /// A cancelled multishot accept stays `Cancelling` until its last CQE (ECANCELED, no MORE)
    /// is reaped; every accept CQE before it has been turned into a pending report by then.
    fn accepts_settled(&self) -> bool {
        let armed = self
            .listeners
            .iter()
            .flatten()
            .any(|l| !l.policy.is_settled());
        let unreaped = self
            .ready
            .iter()
            .any(|c| matches!(c, Completion::Accepted { .. }));
        !armed && self.steals_inflight == 0 && self.unreported == 0 && !unreaped
    }

    fn adopt(&mut self, fd: std::os::fd::OwnedFd) -> io::Result<ConnId> {
        self.adopt_fd(fd)
    }

    fn take_events(&mut self) -> BackendEvents {
        std::mem::take(&mut self.events)
    }
}

#[cfg(test)]
mod tests;
