//! The epoll [`Backend`]: the baseline, and the fallback when io_uring is refused.
//!
//! Completions are emulated on readiness: a queued send is attempted at `submit` and finishes
//! on EPOLLOUT if the socket buffer was full; multishot accept / receive are level-triggered
//! interests that produce one accept batch / one read per readiness event. Received bytes land
//! in a fixed pool of buffers; when the pool is empty, reading waits (level-triggered epoll
//! reports the socket again) until the worker releases buffers.
//!
//! Layout: this file holds the backend, its state, the dispatch of operations and readiness
//! events and the [`Backend`] impl; `interest` registers connections' interest in epoll;
//! `accept`, `recv` and `send` carry out each operation.

mod accept;
mod interest;
mod recv;
mod send;

use crate::backend::accept::{ListenerAccept, MULTISHOT_ALLOWANCE_MIN_DEFAULT};
use crate::backend::{Backend, BufId, Completion, ConnId, Op, Origin, Wake};
use crate::sys::eventfd::EventFdWaker;
use interest::Ctl;
use rustix::event::{epoll, Timespec};
use rustix::io::Errno;
use send::PendingSend;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

const TOKEN_WAKER: u64 = 0;
const TOKEN_LISTENER: u64 = 1 << 32;
const TOKEN_CONN: u64 = 2 << 32;
const TOKEN_ID_MASK: u64 = 0xffff_ffff;
/// Events taken per `epoll_wait`.
const EVENTS_MAX: usize = 256;

/// Sizes of the receive-buffer pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolConfig {
    /// Buffers in the pool.
    pub bufs: u32,
    /// Bytes per buffer.
    pub buf_bytes: usize,
}

#[derive(Debug, Clone, Copy)]
struct ListenerIo {
    fd: RawFd,
    events: u32,
    registered: bool,
    /// The accept policy's state: accepting or paused, the allowance left.
    policy: ListenerAccept,
}

#[derive(Debug)]
struct ConnIo {
    fd: OwnedFd,
    recv_on: bool,
    /// `Op::RecvStop` until `Op::RecvRelease`: `Op::Recv` does not turn reading on.
    recv_held: bool,
    registered: bool,
    interest: u32,
    pending: Option<PendingSend>,
    /// Close once the pending send is done (its last output; see `Op::Send::close_after`).
    close_after: bool,
    /// An upper-layer protocol is attached (`SocketOption::attaches_ulp`): the last send goes
    /// without `MSG_MORE`.
    ulp: bool,
    /// Its interest may have changed since it was last registered (see `interest_dirty`).
    dirty: bool,
}

/// The epoll backend of one worker.
#[derive(Debug)]
pub struct EpollBackend {
    epfd: OwnedFd,
    waker: Arc<EventFdWaker>,
    queued: Vec<Op>,
    /// Connections whose epoll interest is registered once, just before the next
    /// `epoll_wait`: a connection that reaches EOF and closes in the same turn (every one-shot
    /// connection) costs no `epoll_ctl` at all, and several changes in one turn cost one.
    interest_dirty: Vec<ConnId>,
    /// See [`EpollBackend::ctl_calls`].
    ctl_calls: std::cell::Cell<u64>,
    ready: VecDeque<Completion>,
    events: Events,
    listeners: Vec<Option<ListenerIo>>,
    conns: Vec<Option<ConnIo>>,
    pool: Vec<u8>,
    pool_free: Vec<BufId>,
    buf_bytes: usize,
}

/// The `epoll_wait` output buffer (EVENTS_MAX entries of capacity; `Debug` shows the count).
struct Events(Vec<epoll::Event>);

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} events", self.0.len())
    }
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl EpollBackend {
    /// Creates the epoll instance, its waker and the receive pool.
    pub fn new(pool: PoolConfig) -> io::Result<EpollBackend> {
        assert!(pool.bufs > 0 && pool.buf_bytes > 0, "empty receive pool");
        let epfd = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let waker = Arc::new(EventFdWaker::new()?);
        let backend = EpollBackend {
            epfd,
            waker,
            queued: Vec::new(),
            interest_dirty: Vec::new(),
            ready: VecDeque::new(),
            events: Events(Vec::with_capacity(EVENTS_MAX)),
            listeners: Vec::new(),
            conns: Vec::new(),
            pool: vec![0; pool.bufs as usize * pool.buf_bytes],
            pool_free: (0..pool.bufs).rev().collect(),
            buf_bytes: pool.buf_bytes,
            ctl_calls: std::cell::Cell::new(0),
        };
        backend.ctl(
            Ctl::Add,
            backend.waker.fd(),
            libc::EPOLLIN as u32,
            TOKEN_WAKER,
        )?;
        Ok(backend)
    }

    /// `epoll_ctl` calls made so far (the cost that per-turn interest registration saves).
    pub fn ctl_calls(&self) -> u64 {
        self.ctl_calls.get()
    }

    fn conn_mut(&mut self, conn: ConnId) -> Option<&mut ConnIo> {
        self.conns.get_mut(conn as usize).and_then(Option::as_mut)
    }

    fn run(&mut self, op: Op) -> io::Result<()> {
        match op {
            Op::Accept {
                listener,
                fd,
                exclusive,
                budget,
            } => {
                let slot = listener as usize;
                if self.listeners.len() <= slot {
                    self.listeners.resize(slot + 1, None);
                }
                let mut events = libc::EPOLLIN as u32;
                if exclusive {
                    events |= libc::EPOLLEXCLUSIVE as u32;
                }
                let state = self.listeners[slot].get_or_insert(ListenerIo {
                    fd,
                    events,
                    registered: false,
                    // Readiness-based: no multishot accept, the threshold is unused.
                    policy: ListenerAccept::new(MULTISHOT_ALLOWANCE_MIN_DEFAULT),
                });
                state.policy.allow(budget);
                self.sync_listener(listener)?;
            }
            Op::Steal { victim, fd } => {
                if let Err(error) = self.accept_one(fd, Origin::Stolen(victim)) {
                    self.ready
                        .push_back(Completion::StealFailed { victim, error });
                }
            }
            Op::AcceptPause { listener, .. } => {
                if let Some(Some(state)) = self.listeners.get_mut(listener as usize) {
                    state.policy.pause();
                    self.sync_listener(listener)?;
                }
            }
            Op::Recv { conn } | Op::RecvPause { conn } => {
                let on = matches!(op, Op::Recv { .. });
                if let Some(c) = self.conn_mut(conn) {
                    c.recv_on = on && !c.recv_held;
                }
                self.update_interest(conn)?;
            }
            Op::RecvStop { conn } => {
                // Reading happens only in this thread's `read_once`: off now is stopped now.
                if let Some(c) = self.conn_mut(conn) {
                    c.recv_on = false;
                    c.recv_held = true;
                    self.ready.push_back(Completion::RecvStopped { conn });
                }
                self.update_interest(conn)?;
            }
            Op::RecvRelease { conn } => {
                if let Some(c) = self.conn_mut(conn) {
                    c.recv_held = false;
                }
            }
            Op::Send {
                conn,
                buf,
                close_after,
            } => {
                if let Some(c) = self.conn_mut(conn) {
                    c.close_after = close_after;
                }
                self.start_send(conn, PendingSend::Bytes { buf, sent: 0 })?
            }
            Op::SendFile { conn, region } => {
                self.start_send(conn, PendingSend::File { region, sent: 0 })?
            }
            Op::SetOptions { conn, options } => self.set_options(conn, &options),
            Op::SendControl {
                conn,
                control,
                payload,
            } => {
                let msg = crate::sys::socket::ControlSend::new(&control, payload);
                self.start_send(conn, PendingSend::Control { msg, sent: false })?
            }
            Op::Shutdown { conn } => {
                // A failure (the peer reset already) shows up in the next receive.
                if let Some(c) = self.conn_mut(conn) {
                    let _ = crate::sys::socket::shutdown_write(c.fd.as_raw_fd());
                }
            }
            Op::Close { conn } => {
                // Dropping the descriptor closes it, which also removes it from the epoll set.
                if let Some(slot) = self.conns.get_mut(conn as usize) {
                    slot.take();
                }
                self.ready.push_back(Completion::Closed { conn });
            }
            Op::Detach { conn } => self.detach(conn),
            Op::AbortSend { conn } => {
                // Only the connection whose last send still waits: the fd may already be a new
                // connection's (its close_after is not set before the worker has seen it).
                let waiting = self
                    .conn_mut(conn)
                    .is_some_and(|c| c.close_after && c.pending.is_some());
                if waiting {
                    if let Some(slot) = self.conns.get_mut(conn as usize) {
                        slot.take();
                    }
                    self.ready.push_back(Completion::Closed { conn });
                }
            }
        }
        Ok(())
    }

    /// Sets the options at once, in order (the send before them has completed).
    fn set_options(&mut self, conn: ConnId, options: &[crate::backend::SocketOption]) {
        let Some(c) = self.conn_mut(conn) else {
            return;
        };
        let fd = c.fd.as_raw_fd();
        let mut result = Ok(());
        for option in options {
            result =
                crate::sys::socket::set_option_bytes(fd, option.level, option.name, &option.value);
            if result.is_err() {
                break;
            }
            c.ulp |= option.attaches_ulp();
        }
        self.ready
            .push_back(Completion::OptionsSet { conn, result });
    }

    /// Hands the connection's descriptor over: out of the epoll set, out of the table. What
    /// was read before is in `ready` already, ahead of the completion.
    fn detach(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(conn as usize).and_then(Option::take) else {
            return;
        };
        debug_assert!(c.pending.is_none(), "detached with a send in flight");
        let fd = if c.registered {
            self.ctl(Ctl::Delete, c.fd.as_raw_fd(), 0, 0).map(|()| c.fd)
        } else {
            Ok(c.fd)
        };
        self.ready.push_back(Completion::Detached { conn, fd });
    }

    fn drain_waker(&self) {
        // Reads the 8-byte counter back to 0 (EAGAIN: nothing pending); the value is unused.
        let mut value = [0u8; 8];
        let _ = rustix::io::read(self.waker.as_fd(), &mut value);
    }

    fn dispatch(&mut self, token: u64, events: u32) -> io::Result<()> {
        let id = (token & TOKEN_ID_MASK) as u32;
        match token & !TOKEN_ID_MASK {
            TOKEN_WAKER => self.drain_waker(),
            TOKEN_LISTENER => self.accept_batch(id)?,
            _ => {
                if events & libc::EPOLLOUT as u32 != 0 || events & libc::EPOLLERR as u32 != 0 {
                    self.continue_send(id)?;
                }
                if events & !(libc::EPOLLOUT as u32) != 0 {
                    self.read_once(id)?;
                }
            }
        }
        Ok(())
    }
}

impl Backend for EpollBackend {
    fn name(&self) -> &'static str {
        "epoll"
    }

    fn push(&mut self, op: Op) {
        self.queued.push(op);
    }

    fn submit(&mut self) -> io::Result<usize> {
        let count = self.queued.len();
        let mut ops = std::mem::take(&mut self.queued);
        for op in ops.drain(..) {
            self.run(op)?;
        }
        self.queued = ops; // keep the allocation
        Ok(count)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.flush_interest()?;
        let timeout_ms = if !self.ready.is_empty() {
            0
        } else {
            timeout.map_or(-1, |t| {
                t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
            })
        };
        // Whole milliseconds, so rustix passes exactly `timeout_ms` to epoll_pwait (null
        // sigmask: epoll_wait).
        let timeout = (timeout_ms >= 0).then(|| Timespec {
            tv_sec: (timeout_ms / 1000).into(),
            tv_nsec: ((timeout_ms % 1000) * 1_000_000).into(),
        });
        self.events.0.clear();
        debug_assert_eq!(self.events.0.capacity(), EVENTS_MAX);
        // The kernel fills at most the spare capacity (EVENTS_MAX) and the length follows.
        match epoll::wait(
            &self.epfd,
            rustix::buffer::spare_capacity(&mut self.events.0),
            timeout.as_ref(),
        ) {
            Ok(_) => {}
            Err(Errno::INTR) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        for i in 0..self.events.0.len() {
            // Copied out of the packed struct, field by field.
            let (data, flags) = (self.events.0[i].data, self.events.0[i].flags);
            self.dispatch(data.u64(), flags.bits())?;
        }
        Ok(())
    }

    fn reap(&mut self, out: &mut Vec<Completion>, max: usize) {
        let n = self.ready.len().min(max);
        out.extend(self.ready.drain(..n));
    }

    fn recv_data(&self, buf: BufId, len: usize) -> &[u8] {
        let start = buf as usize * self.buf_bytes;
        &self.pool[start..start + len]
    }

    fn release(&mut self, buf: BufId) {
        debug_assert!(!self.pool_free.contains(&buf), "buffer released twice");
        self.pool_free.push(buf);
    }

    fn waker(&self) -> Arc<dyn Wake> {
        self.waker.clone()
    }

    fn adopt(&mut self, fd: OwnedFd) -> io::Result<ConnId> {
        crate::sys::socket::set_nonblocking(fd.as_raw_fd())?;
        Ok(self.insert_conn(fd))
    }

    /// Accepts run inside `submit` (steals) and `wait` (readiness), straight into `ready`.
    fn accepts_settled(&self) -> bool {
        let queued = self
            .queued
            .iter()
            .any(|op| matches!(op, Op::Accept { .. } | Op::Steal { .. }));
        let unreaped = self
            .ready
            .iter()
            .any(|c| matches!(c, Completion::Accepted { .. }));
        !queued && !unreaped
    }
}

#[cfg(test)]
mod tests;
