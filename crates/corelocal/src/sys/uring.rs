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
//! requests are recognised by a per-slot generation in `user_data` and dropped.

use crate::runtime::backend::{
    Backend, BackendEvents, BufId, Completion, ConnId, Op, Origin, Wake,
};
use crate::runtime::handler::FileRegion;
use crate::sys::eventfd::EventFdWaker;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

const KIND_ACCEPT: u64 = 1;
const KIND_RECV: u64 = 2;
const KIND_SEND: u64 = 3;
const KIND_CLOSE: u64 = 4;
const KIND_CANCEL: u64 = 5;
const KIND_WAKE: u64 = 6;
const KIND_SOCKOPT: u64 = 7;
const KIND_STEAL: u64 = 8;
const KIND_ACCEPT_ONE: u64 = 9;
/// One-shot accepts kept in flight per listener when accepting with a budget.
const ONESHOT_INFLIGHT_MAX: u32 = 4;
/// A listener whose backlog cannot be read accepts multishot only with this much allowance.
const MULTISHOT_ALLOWANCE_MIN_DEFAULT: u32 = 8192;
/// `IORING_ACCEPT_DONTWAIT`: fail with EAGAIN instead of waiting for a connection.
const IORING_ACCEPT_DONTWAIT: u16 = 2;
/// The provided-buffer group id used for receives.
const BUF_GROUP: u16 = 0;
/// Bytes of a file region read per send on this backend (no sendfile here; see `SendFile`).
const FILE_CHUNK_BYTES: usize = 256 * 1024;
/// Completions taken from the CQ per reap call before returning to the worker.
const CQE_BATCH_MAX: usize = 1024;
/// `IORING_ENTER_GETEVENTS` (the crate keeps its `sys` constants private).
const IORING_ENTER_GETEVENTS: u32 = 1;
/// `SOCKET_URING_OP_GETSOCKOPT`.
const SOCKET_URING_OP_GETSOCKOPT: u32 = 2;

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

fn user_data(kind: u64, generation: u32, id: u32) -> u64 {
    (kind << 56) | ((generation as u64 & 0x00ff_ffff) << 32) | id as u64
}

fn split(ud: u64) -> (u64, u32, u32) {
    (ud >> 56, ((ud >> 32) & 0x00ff_ffff) as u32, ud as u32)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecvState {
    Off,
    /// A multishot receive is armed.
    Armed,
    /// Ran out of provided buffers: re-armed once buffers come back.
    Starved,
    /// A fresh connection's first receive: single-shot, linked behind its SO_INCOMING_CPU
    /// query (both in one submit, CQEs in that order).
    First,
    /// The first receive completed: a multishot receive is armed at the next submit unless the
    /// connection is closing or paused by then — a one-shot connection, answered and closed
    /// in the same turn, never has a multishot receive to cancel before its close.
    ArmAtSubmit,
}

#[derive(Debug)]
struct SendState {
    buf: Vec<u8>,
    sent: usize,
    /// The connection's last output: its close goes out linked behind the send.
    close_after: bool,
    /// For a file region: what is left to read after the bytes in `buf`, and the total.
    file: Option<(FileRegion, u64)>,
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    origin: Origin,
    recv: RecvState,
    send: Option<SendState>,
    closing: bool,
    /// A close is linked behind the send in flight (see `send_next`): if the link breaks
    /// (the send failed or was cut short), its CQE is ECANCELED and the close is reissued.
    close_linked: bool,
}

/// A listener's multishot accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Multishot {
    Off,
    Armed,
    /// Cancelled; its last completion has not arrived yet.
    Cancelling,
}

/// How a listener is being accepted from: multishot while the allowance is unlimited or large,
/// else up to `remaining` more connections through at most [`ONESHOT_INFLIGHT_MAX`] one-shot
/// accepts (exact: the table never receives more than allowed).
#[derive(Debug, Clone, Copy)]
struct ListenerState {
    fd: RawFd,
    active: bool,
    multishot: Multishot,
    /// Connections still allowed (`None`: no limit); kept across pauses.
    remaining: Option<u32>,
    inflight: u32,
    /// Multishot only with at least this allowance: more than one pass of the kernel's
    /// accept loop can take (twice the backlog, plus margin), so it is cancelled in time.
    multishot_min: u32,
}

/// The page-aligned buffer ring shared with the kernel, plus the buffers themselves.
struct BufRing {
    ring: *mut types::BufRingEntry,
    layout: Layout,
    entries: u16,
    tail: u16,
    published: u16,
    bufs: Vec<u8>,
    buf_bytes: usize,
}

impl BufRing {
    fn new(entries: u16, buf_bytes: usize) -> io::Result<BufRing> {
        assert!(entries.is_power_of_two(), "buffer ring size: power of two");
        let layout = Layout::from_size_align(entries as usize * 16, 4096)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        // SAFETY: the layout has a non-zero size (entries ≥ 1).
        let ring = unsafe { alloc_zeroed(layout) } as *mut types::BufRingEntry;
        if ring.is_null() {
            return Err(io::Error::new(io::ErrorKind::OutOfMemory, "buffer ring"));
        }
        let mut r = BufRing {
            ring,
            layout,
            entries,
            tail: 0,
            published: 0,
            bufs: vec![0; entries as usize * buf_bytes],
            buf_bytes,
        };
        for bid in 0..entries {
            r.push(bid);
        }
        r.publish();
        Ok(r)
    }

    fn push(&mut self, bid: u16) {
        let index = (self.tail & (self.entries - 1)) as usize;
        let addr = self.bufs.as_ptr() as u64 + bid as u64 * self.buf_bytes as u64;
        // SAFETY: index < entries, so the entry lies inside the ring allocation; the kernel
        // only reads entries between its head and the published tail, and this one is past it.
        let entry = unsafe { &mut *self.ring.add(index) };
        entry.set_addr(addr);
        entry.set_len(self.buf_bytes as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes pushed buffers visible to the kernel; returns whether any were new.
    fn publish(&mut self) -> bool {
        if self.published == self.tail {
            return false;
        }
        // SAFETY: the tail field lives in the first ring entry, inside our allocation; the
        // kernel reads it concurrently, hence the atomic release store.
        let tail = unsafe { &*(types::BufRingEntry::tail(self.ring) as *const AtomicU16) };
        tail.store(self.tail, Ordering::Release);
        self.published = self.tail;
        true
    }

    fn data(&self, bid: u16, len: usize) -> &[u8] {
        let start = bid as usize * self.buf_bytes;
        &self.bufs[start..start + len]
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the ring is unregistered (or the io_uring
        // instance dropped) before this, as UringBackend's field order guarantees.
        unsafe { dealloc(self.ring as *mut u8, self.layout) };
    }
}

/// The io_uring backend of one worker.
pub struct UringBackend {
    // Field order matters for Drop: the ring (and its registrations) goes before the buffers.
    ring: IoUring,
    bufs: BufRing,
    waker: Arc<EventFdWaker>,
    wake_buf: Box<u64>,
    /// SO_INCOMING_CPU results, one per slot (stable addresses for in-flight getsockopt).
    cpu_vals: Box<[i32]>,
    /// Accepted connections waiting for their getsockopt: (slot, listener).
    slots: Vec<Slot>,
    listeners: Vec<Option<ListenerState>>,
    ready: VecDeque<Completion>,
    /// Send buffers of closed connections, kept until the kernel is done with them.
    graveyard: Vec<(u64, Vec<u8>)>,
    starved: Vec<ConnId>,
    /// Connections whose first receive completed: (slot, generation), see `ArmAtSubmit`.
    arm_at_submit: Vec<(ConnId, u32)>,
    queued_sqes: u64,
    /// SQEs queued while reaping inside `wait` and handed over by its enter: the next
    /// `submit` reports them with its own.
    submitted_by_wait: u64,
    events: BackendEvents,
    /// Steals (one-shot accepts on other workers' listeners) submitted, not completed.
    steals_inflight: u32,
    /// Accepted direct descriptors whose SO_INCOMING_CPU query (hence `Accepted`) is pending.
    unreported: u32,
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
        let bufs = BufRing::new(config.bufs, config.buf_bytes)?;
        // SAFETY: the ring memory stays allocated and unmoved (heap, owned by `bufs`) until
        // after the io_uring instance is dropped (field order above).
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
            cpu_vals: vec![-1; config.files as usize].into_boxed_slice(),
            slots: (0..config.files)
                .map(|_| Slot {
                    generation: 0,
                    origin: Origin::Local(0),
                    recv: RecvState::Off,
                    send: None,
                    closing: false,
                    close_linked: false,
                })
                .collect(),
            listeners: Vec::new(),
            ready: VecDeque::new(),
            graveyard: Vec::new(),
            starved: Vec::new(),
            arm_at_submit: Vec::new(),
            queued_sqes: 0,
            submitted_by_wait: 0,
            events: BackendEvents::default(),
            steals_inflight: 0,
            unreported: 0,
        };
        backend.arm_waker();
        Ok(backend)
    }

    /// Queues an SQE, submitting first if the submission queue is full.
    fn sqe(&mut self, entry: squeue::Entry) {
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
    fn sqe_chain(&mut self, entries: &[squeue::Entry]) {
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

    fn arm_waker(&mut self) {
        let fd = self.waker.fd();
        let buf = &mut *self.wake_buf as *mut u64 as *mut u8;
        let entry = opcode::Read::new(types::Fd(fd), buf, 8)
            .build()
            .user_data(user_data(KIND_WAKE, 0, 0));
        self.sqe(entry);
    }

    fn arm_accept(&mut self, listener: u32, fd: RawFd) {
        let entry = opcode::AcceptMulti::new(types::Fd(fd))
            .allocate_file_index(true)
            .build()
            .user_data(user_data(KIND_ACCEPT, 0, listener));
        self.sqe(entry);
    }

    fn start_accepting(&mut self, listener: u32, fd: RawFd, budget: Option<u32>) {
        let slot = listener as usize;
        if self.listeners.len() <= slot {
            self.listeners.resize(slot + 1, None);
        }
        let state = self.listeners[slot].get_or_insert_with(|| ListenerState {
            fd,
            active: false,
            multishot: Multishot::Off,
            remaining: None,
            inflight: 0,
            multishot_min: crate::sys::socket::listen_queue(fd)
                .map_or(MULTISHOT_ALLOWANCE_MIN_DEFAULT, |q| {
                    q.cap.saturating_mul(2).saturating_add(64)
                }),
        });
        state.active = true;
        state.remaining = budget.map(|k| state.remaining.unwrap_or(0).saturating_add(k));
        self.arrange_accepts(listener);
    }

    /// Multishot while the allowance is unlimited or large; else cancels it and keeps
    /// min(remaining, ONESHOT_INFLIGHT_MAX) one-shot accepts in flight.
    fn arrange_accepts(&mut self, listener: u32) {
        let Some(Some(state)) = self.listeners.get(listener as usize).copied() else {
            return;
        };
        if !state.active {
            return;
        }
        let wide = state.remaining.is_none_or(|r| r >= state.multishot_min);
        let multishot = match (wide, state.multishot) {
            (true, Multishot::Off) => {
                self.arm_accept(listener, state.fd);
                Multishot::Armed
            }
            (false, Multishot::Armed) => {
                self.cancel(user_data(KIND_ACCEPT, 0, listener));
                Multishot::Cancelling
            }
            (_, m) => m,
        };
        if let Some(Some(s)) = self.listeners.get_mut(listener as usize) {
            s.multishot = multishot;
        }
        if !wide {
            self.top_up_accepts(listener);
        }
    }

    /// Keeps min(remaining, ONESHOT_INFLIGHT_MAX) one-shot accepts in flight.
    fn top_up_accepts(&mut self, listener: u32) {
        let Some(Some(state)) = self.listeners.get(listener as usize).copied() else {
            return;
        };
        let Some(remaining) = state.remaining.filter(|_| state.active) else {
            return;
        };
        let want = remaining.min(ONESHOT_INFLIGHT_MAX);
        for _ in state.inflight..want {
            let entry = opcode::Accept::new(
                types::Fd(state.fd),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
            .file_index(Some(types::DestinationSlot::auto_target()))
            .build()
            .user_data(user_data(KIND_ACCEPT_ONE, 0, listener));
            self.sqe(entry);
        }
        if let Some(Some(s)) = self.listeners.get_mut(listener as usize) {
            s.inflight = s.inflight.max(want);
        }
    }

    fn stop_accepting(&mut self, listener: u32) {
        let Some(Some(state)) = self.listeners.get_mut(listener as usize) else {
            return;
        };
        if !state.active {
            return;
        }
        state.active = false;
        let (multishot, inflight) = (state.multishot, state.inflight);
        if multishot == Multishot::Armed {
            state.multishot = Multishot::Cancelling;
            self.cancel(user_data(KIND_ACCEPT, 0, listener));
        }
        if inflight > 0 {
            // One cancel per request would not do: the one-shot accepts share a user_data, and
            // a cancel only marks the request it finds (it leaves the hash in task work), so
            // every cancel of a batch finds the same one and the others keep accepting.
            self.cancel_all(user_data(KIND_ACCEPT_ONE, 0, listener));
        }
    }

    /// One accept on another worker's listener into our table; EAGAIN if nothing waits.
    fn steal(&mut self, victim: u32, fd: RawFd) {
        let entry = opcode::Accept::new(types::Fd(fd), std::ptr::null_mut(), std::ptr::null_mut())
            .file_index(Some(types::DestinationSlot::auto_target()))
            .build()
            .user_data(user_data(KIND_STEAL, 0, victim));
        self.steals_inflight += 1;
        self.sqe(with_ioprio(entry, IORING_ACCEPT_DONTWAIT));
    }

    fn arm_recv(&mut self, conn: ConnId) {
        let generation = self.slots[conn as usize].generation;
        self.slots[conn as usize].recv = RecvState::Armed;
        let entry = opcode::RecvMulti::new(types::Fixed(conn), BUF_GROUP)
            .build()
            .user_data(user_data(KIND_RECV, generation, conn));
        self.sqe(entry);
    }

    /// Cancels every request with user_data `target` (IORING_ASYNC_CANCEL_ALL).
    fn cancel_all(&mut self, target: u64) {
        let entry = opcode::AsyncCancel2::new(types::CancelBuilder::user_data(target).all())
            .build()
            .user_data(user_data(KIND_CANCEL, 0, 0));
        self.sqe(entry);
    }

    fn cancel(&mut self, target: u64) {
        let entry = opcode::AsyncCancel::new(target)
            .build()
            .user_data(user_data(KIND_CANCEL, 0, 0));
        self.sqe(entry);
    }

    /// The socket uring_cmd that reads `SO_INCOMING_CPU` of a new direct descriptor.
    fn incoming_cpu_query(&mut self, conn: ConnId) -> squeue::Entry {
        let generation = self.slots[conn as usize].generation;
        let optval = &mut self.cpu_vals[conn as usize] as *mut i32;
        let entry = opcode::SetSockOpt::new(
            types::Fixed(conn),
            libc::SOL_SOCKET as u32,
            crate::sys::socket::SO_INCOMING_CPU as u32,
            optval as *const libc::c_void,
            4,
        )
        .build()
        .user_data(user_data(KIND_SOCKOPT, generation, conn));
        as_getsockopt(entry)
    }

    fn send_next(&mut self, conn: ConnId) {
        let slot = &mut self.slots[conn as usize];
        let generation = slot.generation;
        let Some(send) = slot.send.as_mut() else {
            return;
        };
        let remaining = &send.buf[send.sent..];
        let last = send.close_after && send.file.is_none();
        // The last output goes whole (MSG_WAITALL: a short send breaks the link) and waits for
        // the close (MSG_MORE), whose FIN then rides in the data's last segment.
        let flags = if last {
            libc::MSG_NOSIGNAL | libc::MSG_WAITALL | libc::MSG_MORE
        } else {
            libc::MSG_NOSIGNAL
        };
        let entry = opcode::Send::new(
            types::Fixed(conn),
            remaining.as_ptr(),
            remaining.len().min(u32::MAX as usize) as u32,
        )
        .flags(flags)
        .build()
        .user_data(user_data(KIND_SEND, generation, conn));
        if !last {
            self.sqe(entry);
            return;
        }
        let recv_in_flight = matches!(slot.recv, RecvState::Armed | RecvState::First);
        slot.recv = RecvState::Off;
        slot.closing = true;
        slot.close_linked = true;
        if recv_in_flight {
            self.cancel(user_data(KIND_RECV, generation, conn));
        }
        let close = opcode::Close::new(types::Fixed(conn))
            .build()
            .user_data(user_data(KIND_CLOSE, generation, conn));
        self.sqe_chain(&[entry, close]);
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
                if self.slots[conn as usize].recv == RecvState::Off {
                    self.arm_recv(conn);
                }
            }
            Op::RecvPause { conn } => {
                let slot = &mut self.slots[conn as usize];
                if matches!(slot.recv, RecvState::Armed | RecvState::First) {
                    let generation = slot.generation;
                    self.cancel(user_data(KIND_RECV, generation, conn));
                }
                self.slots[conn as usize].recv = RecvState::Off;
            }
            Op::Send {
                conn,
                buf,
                close_after,
            } => self.start_send(conn, buf, None, close_after),
            Op::SendFile { conn, region } => {
                let total = region.len;
                self.start_send(conn, Vec::new(), Some((region, total)), false);
            }
            Op::Close { conn } => self.close(conn),
            Op::AbortSend { conn } => self.abort_last_send(conn),
        }
    }

    fn start_send(
        &mut self,
        conn: ConnId,
        buf: Vec<u8>,
        file: Option<(FileRegion, u64)>,
        close_after: bool,
    ) {
        let slot = &mut self.slots[conn as usize];
        assert!(slot.send.is_none(), "one send at a time per connection");
        slot.send = Some(SendState {
            buf,
            sent: 0,
            file,
            close_after,
        });
        self.continue_send(conn);
    }

    /// Sends what is left; refills from the file region when the buffer is done.
    fn continue_send(&mut self, conn: ConnId) {
        let slot = &mut self.slots[conn as usize];
        let Some(send) = slot.send.as_mut() else {
            return;
        };
        if send.sent == send.buf.len() {
            if let Some((region, _)) = send.file.as_mut().filter(|(r, _)| r.len > 0) {
                // io_uring has no sendfile: read the next chunk (page cache) and send it.
                let chunk = region.len.min(FILE_CHUNK_BYTES as u64) as usize;
                send.buf.resize(chunk, 0);
                let n = read_at(region, &mut send.buf);
                match n {
                    Ok(n) if n > 0 => {
                        send.buf.truncate(n);
                        send.sent = 0;
                        region.offset += n as u64;
                        region.len -= n as u64;
                    }
                    other => {
                        let error = other.err().unwrap_or_else(|| {
                            io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank")
                        });
                        slot.send = None;
                        self.ready.push_back(Completion::SentFile {
                            conn,
                            result: Err(error),
                        });
                        return;
                    }
                }
            } else {
                let done = slot.send.take().expect("send in flight");
                self.ready.push_back(match done.file {
                    Some((_, total)) => Completion::SentFile {
                        conn,
                        result: Ok(total),
                    },
                    None => Completion::Sent {
                        conn,
                        result: Ok(done.sent),
                        buf: done.buf,
                    },
                });
                return;
            }
        }
        self.send_next(conn);
    }

    /// The last send (linked to its close) still waits: cancel it; the broken link then
    /// reissues the close (see `on_close`). A slot whose linked close already ran may hold a new
    /// connection by now (`close_linked` is false there): nothing is done to it.
    fn abort_last_send(&mut self, conn: ConnId) {
        let slot = &mut self.slots[conn as usize];
        let generation = slot.generation;
        if !slot.close_linked {
            return;
        }
        if let Some(send) = slot.send.take() {
            let ud = user_data(KIND_SEND, generation, conn);
            self.cancel(ud);
            self.graveyard.push((ud, send.buf));
        }
    }

    fn close(&mut self, conn: ConnId) {
        let slot = &mut self.slots[conn as usize];
        let generation = slot.generation;
        assert!(
            !slot.close_linked,
            "a close is already linked behind the last send"
        );
        slot.closing = true;
        let in_flight = matches!(slot.recv, RecvState::Armed | RecvState::First);
        slot.recv = RecvState::Off;
        if in_flight {
            self.cancel(user_data(KIND_RECV, generation, conn));
        }
        if let Some(send) = self.slots[conn as usize].send.take() {
            // A send waiting for socket space holds a reference to the socket: cancel it, or
            // closing the slot leaves the socket open (and its buffer here) for as long as the
            // peer does not read. The kernel may still read the buffer until the send's
            // completion: keep it till then.
            let ud = user_data(KIND_SEND, generation, conn);
            self.cancel(ud);
            self.graveyard.push((ud, send.buf));
        }
        let entry = opcode::Close::new(types::Fixed(conn))
            .build()
            .user_data(user_data(KIND_CLOSE, generation, conn));
        self.sqe(entry);
    }

    fn complete(&mut self, ud: u64, res: i32, flags: u32) {
        let (kind, generation, id) = split(ud);
        match kind {
            KIND_WAKE => self.arm_waker(),
            KIND_ACCEPT => self.on_accept(id, res, flags),
            KIND_ACCEPT_ONE => self.on_accept_one(id, res),
            KIND_STEAL => self.on_steal(id, res),
            KIND_CANCEL => {}
            _ => {
                let Some(slot) = self.slots.get(id as usize) else {
                    return;
                };
                if kind == KIND_SEND {
                    if let Some(pos) = self.graveyard.iter().position(|(u, _)| *u == ud) {
                        self.graveyard.swap_remove(pos);
                        return;
                    }
                }
                if slot.generation & 0x00ff_ffff != generation {
                    return; // A request of a connection closed since.
                }
                match kind {
                    KIND_SOCKOPT => self.on_sockopt(id, res),
                    KIND_RECV => self.on_recv(id, res, flags),
                    KIND_SEND => self.on_send(id, res),
                    KIND_CLOSE => self.on_close(id, res),
                    _ => {}
                }
            }
        }
    }

    /// A close completed — or, linked behind a send whose link broke, was cancelled: then it
    /// is reissued once the send is over (a send cut short is re-sent with its close again).
    fn on_close(&mut self, conn: ConnId, res: i32) {
        let slot = &mut self.slots[conn as usize];
        if res == -libc::ECANCELED && slot.close_linked {
            if slot.send.is_none() {
                slot.close_linked = false;
                let entry = opcode::Close::new(types::Fixed(conn))
                    .build()
                    .user_data(user_data(KIND_CLOSE, slot.generation, conn));
                self.sqe(entry);
            }
            return;
        }
        slot.close_linked = false;
        self.ready.push_back(Completion::Closed { conn });
    }

    fn on_accept_one(&mut self, listener: u32, res: i32) {
        let Some(Some(state)) = self.listeners.get_mut(listener as usize) else {
            return;
        };
        state.inflight = state.inflight.saturating_sub(1);
        if res >= 0 {
            if let Some(r) = state.remaining.as_mut() {
                *r = r.saturating_sub(1);
            }
            self.new_conn(res as u32, Origin::Local(listener));
        } else if res != -libc::ECANCELED {
            self.ready.push_back(Completion::AcceptFailed {
                listener,
                error: io::Error::from_raw_os_error(-res),
            });
        }
        self.arrange_accepts(listener);
    }

    fn on_accept(&mut self, listener: u32, res: i32, flags: u32) {
        let more = cqueue::more(flags);
        if let Some(Some(s)) = self.listeners.get_mut(listener as usize) {
            if !more {
                s.multishot = Multishot::Off;
            }
            if res >= 0 {
                if let Some(r) = s.remaining.as_mut() {
                    *r = r.saturating_sub(1);
                }
            }
        }
        if res >= 0 {
            self.new_conn(res as u32, Origin::Local(listener));
        } else if res != -libc::ECANCELED {
            self.ready.push_back(Completion::AcceptFailed {
                listener,
                error: io::Error::from_raw_os_error(-res),
            });
        }
        if !more {
            let before = self.listeners.get(listener as usize).copied().flatten();
            self.arrange_accepts(listener);
            let after = self.listeners.get(listener as usize).copied().flatten();
            if res != -libc::ECANCELED
                && after.is_some_and(|s| s.multishot == Multishot::Armed)
                && before.is_some_and(|s| s.multishot == Multishot::Off)
            {
                self.events.rearms += 1;
            }
        } else if res >= 0 {
            self.arrange_accepts(listener);
        }
    }

    /// A new direct descriptor: reset its slot and ask for its SO_INCOMING_CPU.
    fn new_conn(&mut self, conn: ConnId, origin: Origin) {
        let slot = &mut self.slots[conn as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.origin = origin;
        slot.recv = RecvState::Off;
        slot.send = None;
        slot.closing = false;
        slot.close_linked = false;
        self.cpu_vals[conn as usize] = -1;
        self.unreported += 1;
        // The SO_INCOMING_CPU query and the first receive in one submit, linked so that their
        // CQEs come in that order (`Accepted` before any `Recv`): a request already queued is
        // read in the same turn the connection is reported.
        let query = self.incoming_cpu_query(conn);
        let generation = self.slots[conn as usize].generation;
        let first_recv = opcode::Recv::new(types::Fixed(conn), std::ptr::null_mut(), 0)
            .buf_group(BUF_GROUP)
            .build()
            .flags(squeue::Flags::BUFFER_SELECT)
            .user_data(user_data(KIND_RECV, generation, conn));
        self.slots[conn as usize].recv = RecvState::First;
        self.sqe_chain(&[query, first_recv]);
    }

    fn on_steal(&mut self, victim: u32, res: i32) {
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

    fn on_sockopt(&mut self, conn: ConnId, res: i32) {
        self.unreported = self.unreported.saturating_sub(1);
        let cpu = self.cpu_vals[conn as usize];
        self.ready.push_back(Completion::Accepted {
            origin: self.slots[conn as usize].origin,
            conn,
            peer: None,
            incoming_cpu: (res >= 0 && cpu >= 0).then_some(cpu as usize),
        });
    }

    fn on_recv(&mut self, conn: ConnId, res: i32, flags: u32) {
        let more = cqueue::more(flags);
        if res > 0 {
            let bid = cqueue::buffer_select(flags).expect("multishot recv without a buffer");
            self.ready.push_back(Completion::Recv {
                conn,
                buf: bid as BufId,
                len: res as usize,
            });
            let state = self.slots[conn as usize].recv;
            if !more && state == RecvState::Armed {
                self.events.rearms += 1;
                self.arm_recv(conn);
            } else if state == RecvState::First {
                let generation = self.slots[conn as usize].generation;
                self.slots[conn as usize].recv = RecvState::ArmAtSubmit;
                self.arm_at_submit.push((conn, generation));
            }
            return;
        }
        let slot = &mut self.slots[conn as usize];
        let was_armed = matches!(slot.recv, RecvState::Armed | RecvState::First);
        if !more {
            slot.recv = RecvState::Off;
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
    }

    fn on_send(&mut self, conn: ConnId, res: i32) {
        let slot = &mut self.slots[conn as usize];
        let Some(send) = slot.send.as_mut() else {
            return;
        };
        if res < 0 {
            let send = slot.send.take().expect("send in flight");
            let error = io::Error::from_raw_os_error(-res);
            self.ready.push_back(match send.file {
                Some(_) => Completion::SentFile {
                    conn,
                    result: Err(error),
                },
                None => Completion::Sent {
                    conn,
                    buf: send.buf,
                    result: Err(error),
                },
            });
            return;
        }
        send.sent += res as usize;
        self.continue_send(conn);
    }

    /// Arms multishot receives on connections whose first receive completed and that are
    /// still open and not paused (see `RecvState::ArmAtSubmit`). While the answer to the
    /// first request is being sent, arming waits: a one-shot connection closes right after it.
    fn arm_after_first_recv(&mut self) {
        let pending = std::mem::take(&mut self.arm_at_submit);
        let mut waiting = Vec::new();
        for (conn, generation) in pending {
            let slot = &self.slots[conn as usize];
            if slot.generation != generation || slot.recv != RecvState::ArmAtSubmit || slot.closing
            {
                continue;
            }
            if slot.send.is_some() {
                waiting.push((conn, generation));
            } else {
                self.arm_recv(conn);
            }
        }
        self.arm_at_submit = waiting;
    }

    /// Re-arms receives that ran out of buffers, once buffers came back.
    fn feed_starved(&mut self) {
        let starved = std::mem::take(&mut self.starved);
        for conn in starved {
            if self.slots[conn as usize].recv == RecvState::Starved
                && !self.slots[conn as usize].closing
            {
                self.events.rearms += 1;
                self.arm_recv(conn);
            }
        }
    }

    fn drain_cq(&mut self) {
        let mut batch = 0;
        loop {
            let mut cq = self.ring.completion();
            let mut taken: Vec<(u64, i32, u32)> = Vec::new();
            for cqe in cq.by_ref().take(CQE_BATCH_MAX) {
                taken.push((cqe.user_data(), cqe.result(), cqe.flags()));
            }
            drop(cq);
            if taken.is_empty() {
                break;
            }
            batch += taken.len();
            for (ud, res, flags) in taken {
                self.complete(ud, res, flags);
            }
            if batch >= CQE_BATCH_MAX {
                break;
            }
        }
    }
}

/// Turns a socket SETSOCKOPT uring_cmd entry into GETSOCKOPT (the crate has no builder for it).
fn as_getsockopt(entry: squeue::Entry) -> squeue::Entry {
    // SAFETY: squeue::Entry is #[repr(C)] around the 64-byte kernel io_uring_sqe; `cmd_op`
    // (u32) sits at byte offset 8 in the kernel ABI. Only that field changes.
    unsafe {
        let mut raw: [u8; 64] = std::mem::transmute(entry);
        raw[8..12].copy_from_slice(&SOCKET_URING_OP_GETSOCKOPT.to_ne_bytes());
        std::mem::transmute::<[u8; 64], squeue::Entry>(raw)
    }
}

/// Sets an accept SQE's `ioprio` flags (the crate's one-shot Accept builder has no setter).
fn with_ioprio(entry: squeue::Entry, ioprio: u16) -> squeue::Entry {
    // SAFETY: squeue::Entry is #[repr(C)] around the 64-byte kernel io_uring_sqe; `ioprio`
    // (u16) sits at byte offset 2 in the kernel ABI. Only that field changes.
    unsafe {
        let mut raw: [u8; 64] = std::mem::transmute(entry);
        raw[2..4].copy_from_slice(&ioprio.to_ne_bytes());
        std::mem::transmute::<[u8; 64], squeue::Entry>(raw)
    }
}

fn read_at(region: &FileRegion, buf: &mut [u8]) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    region.file.read_at(buf, region.offset)
}

impl Backend for UringBackend {
    fn name(&self) -> &'static str {
        "uring"
    }

    fn push(&mut self, op: Op) {
        self.run(op);
    }

    fn submit(&mut self) -> io::Result<usize> {
        if self.bufs.publish() && !self.starved.is_empty() {
            self.feed_starved();
        }
        self.arm_after_first_recv();
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
        if !self.ready.is_empty() {
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
            .any(|l| l.multishot != Multishot::Off || l.inflight > 0);
        let unreaped = self
            .ready
            .iter()
            .any(|c| matches!(c, Completion::Accepted { .. }));
        !armed && self.steals_inflight == 0 && self.unreported == 0 && !unreaped
    }

    fn take_events(&mut self) -> BackendEvents {
        std::mem::take(&mut self.events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    fn backend() -> UringBackend {
        UringBackend::new(UringConfig {
            sq_entries: 64,
            files: 16,
            bufs: 8,
            buf_bytes: 4096,
        })
        .expect("io_uring (this kernel allows it)")
    }

    /// A backend accepting on a fresh listener, a client that connected and sent "ping", and
    /// the connection once accepted (its first bytes released).
    fn accepted_after_ping() -> (UringBackend, TcpListener, TcpStream, ConnId) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut b = backend();
        b.push(Op::Accept {
            listener: 0,
            fd: listener.as_raw_fd(),
            exclusive: false,
            budget: None,
        });
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.write_all(b"ping").unwrap();
        for _ in 0..50 {
            let (_, out) = turn(&mut b);
            let mut conn = None;
            for c in out {
                match c {
                    Completion::Accepted { conn: id, .. } => conn = Some(id),
                    Completion::Recv { buf, .. } => b.release(buf),
                    _ => {}
                }
            }
            if let Some(conn) = conn {
                return (b, listener, client, conn);
            }
        }
        panic!("no connection accepted");
    }

    /// One submit / wait / reap turn; returns the completions.
    fn turn(b: &mut UringBackend) -> (usize, Vec<Completion>) {
        let submitted = b.submit().unwrap();
        b.wait(Some(Duration::from_millis(20))).unwrap();
        let mut out = Vec::new();
        b.reap(&mut out, 64);
        (submitted, out)
    }

    /// A one-shot connection: the request is reported in the same reap as the connection
    /// (SO_INCOMING_CPU query and first receive linked in one submit), and closing it after
    /// the answer costs one SQE — no multishot receive is left to cancel.
    #[test]
    fn a_one_shot_connection_reads_at_once_and_closes_without_a_cancel() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut b = backend();
        b.push(Op::Accept {
            listener: 0,
            fd: listener.as_raw_fd(),
            exclusive: false,
            budget: None,
        });
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.write_all(b"ping").unwrap();
        // `Accepted` waits for the SO_INCOMING_CPU query; the request comes with it.
        let mut seen = Vec::new();
        for _ in 0..50 {
            let (_, out) = turn(&mut b);
            if !out.is_empty() {
                seen = out;
                break;
            }
        }
        let conn = match seen.as_slice() {
            [Completion::Accepted { conn, .. }, Completion::Recv { conn: c2, buf, len }] => {
                assert_eq!((conn, *len), (c2, 4));
                assert_eq!(b.recv_data(*buf, *len), b"ping");
                b.release(*buf);
                *conn
            }
            other => panic!("expected Accepted then Recv in one reap: {other:?}"),
        };
        b.push(Op::Recv { conn }); // what the worker does on Accepted: must not double-arm
        b.push(Op::Send {
            conn,
            buf: b"pong".to_vec(),
            close_after: false,
        });
        let (_, out) = turn(&mut b);
        assert!(
            out.iter().any(|c| matches!(c, Completion::Sent { .. })),
            "{out:?}"
        );
        b.push(Op::Close { conn });
        let (submitted, out) = turn(&mut b);
        assert_eq!(
            submitted, 1,
            "only the close: no receive was armed to cancel"
        );
        assert!(
            matches!(out.as_slice(), [Completion::Closed { .. }]),
            "{out:?}"
        );
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).unwrap();
        assert_eq!(answer, b"pong");
    }

    /// A connection that lives on gets its multishot receive after the first one.
    #[test]
    fn a_kept_connection_keeps_receiving() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut b = backend();
        b.push(Op::Accept {
            listener: 0,
            fd: listener.as_raw_fd(),
            exclusive: false,
            budget: None,
        });
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.write_all(b"one").unwrap();
        let mut got = Vec::new();
        for round in 0..100 {
            let (_, out) = turn(&mut b);
            for c in out {
                if let Completion::Recv { buf, len, .. } = c {
                    got.extend_from_slice(b.recv_data(buf, len));
                    b.release(buf);
                }
            }
            if round == 5 {
                client.write_all(b"two").unwrap();
            }
            if round == 10 {
                client.write_all(b"three").unwrap();
            }
            if got == b"onetwothree" {
                return;
            }
        }
        panic!("received {:?}", String::from_utf8_lossy(&got));
    }

    /// The last answer with its close: two linked SQEs (send, close) in one submit, both
    /// completions in one reap, the peer gets the data then EOF.
    #[test]
    fn the_last_send_takes_the_close_with_it() {
        let (mut b, _listener, mut client, conn) = accepted_after_ping();
        b.push(Op::Send {
            conn,
            buf: b"pong".to_vec(),
            close_after: true,
        });
        let (_, out) = turn(&mut b);
        assert!(
            matches!(
                out.as_slice(),
                [
                    Completion::Sent { result: Ok(4), .. },
                    Completion::Closed { .. }
                ]
            ),
            "{out:?}"
        );
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).unwrap();
        assert_eq!(answer, b"pong");
        // Aborting a send that already completed touches nothing (the slot may be reused).
        b.push(Op::AbortSend { conn });
        let (submitted, out) = turn(&mut b);
        assert_eq!((submitted, out.len()), (0, 0), "{out:?}");
    }

    /// A last send stuck behind a peer that does not read is aborted (idle timeout): the
    /// close is reissued once, and the connection reported closed once.
    #[test]
    fn a_stuck_last_send_is_aborted() {
        let (mut b, _listener, client, conn) = accepted_after_ping();
        // Far more than the socket buffers hold: the send waits for the reader.
        b.push(Op::Send {
            conn,
            buf: vec![b'x'; 64 << 20],
            close_after: true,
        });
        let (_, out) = turn(&mut b);
        assert!(
            out.is_empty(),
            "nothing completes while the peer does not read: {out:?}"
        );
        b.push(Op::AbortSend { conn });
        let mut closed = 0;
        for _ in 0..20 {
            let (_, out) = turn(&mut b);
            closed += out
                .iter()
                .filter(|c| matches!(c, Completion::Closed { .. }))
                .count();
        }
        assert_eq!(closed, 1);
        drop(client);
    }
}
