//! The epoll [`Backend`]: the baseline, and the fallback when io_uring is refused.
//!
//! Completions are emulated on readiness: a queued send is attempted at `submit` and finishes
//! on EPOLLOUT if the socket buffer was full; multishot accept / receive are level-triggered
//! interests that produce one accept batch / one read per readiness event. Received bytes land
//! in a fixed pool of buffers; when the pool is empty, reading waits (level-triggered epoll
//! reports the socket again) until the worker releases buffers.

use super::cvt;
use crate::runtime::backend::{Backend, BufId, Completion, ConnId, Op, Origin, Wake};
use crate::runtime::handler::FileRegion;
use crate::sys::eventfd::EventFdWaker;
use crate::sys::socket;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

const TOKEN_WAKER: u64 = 0;
const TOKEN_LISTENER: u64 = 1 << 32;
const TOKEN_CONN: u64 = 2 << 32;
const TOKEN_ID_MASK: u64 = 0xffff_ffff;
/// Events taken per `epoll_wait`.
const EVENTS_MAX: usize = 256;
/// Connections accepted per listener readiness event before going back to the loop.
const ACCEPT_BATCH_MAX: usize = 64;
/// Bytes moved per sendfile call.
const SENDFILE_CHUNK_BYTES: usize = 1 << 20;

/// Sizes of the receive-buffer pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolConfig {
    /// Buffers in the pool.
    pub bufs: u32,
    /// Bytes per buffer.
    pub buf_bytes: usize,
}

/// A send in progress (the socket buffer filled before all of it went out).
#[derive(Debug)]
enum PendingSend {
    Bytes { buf: Vec<u8>, sent: usize },
    File { region: FileRegion, sent: u64 },
}

#[derive(Debug, Clone, Copy)]
struct ListenerIo {
    fd: RawFd,
    events: u32,
    registered: bool,
    /// Connections still allowed (`None`: no limit); kept across pauses.
    budget: Option<u32>,
    /// Accepting (not paused).
    active: bool,
}

#[derive(Debug)]
struct ConnIo {
    fd: OwnedFd,
    recv_on: bool,
    registered: bool,
    interest: u32,
    pending: Option<PendingSend>,
    /// Close once the pending send is done (its last output; see `Op::Send::close_after`).
    close_after: bool,
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
    events: Vec<libc::epoll_event>,
    listeners: Vec<Option<ListenerIo>>,
    conns: Vec<Option<ConnIo>>,
    pool: Vec<u8>,
    pool_free: Vec<BufId>,
    buf_bytes: usize,
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl EpollBackend {
    /// Creates the epoll instance, its waker and the receive pool.
    pub fn new(pool: PoolConfig) -> io::Result<EpollBackend> {
        assert!(pool.bufs > 0 && pool.buf_bytes > 0, "empty receive pool");
        // SAFETY: plain epoll_create1; the result is checked.
        let epfd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: a new descriptor owned by nobody else.
        let epfd = unsafe { OwnedFd::from_raw_fd(epfd) };
        let waker = Arc::new(EventFdWaker::new()?);
        let backend = EpollBackend {
            epfd,
            waker,
            queued: Vec::new(),
            interest_dirty: Vec::new(),
            ready: VecDeque::new(),
            events: Vec::with_capacity(EVENTS_MAX),
            listeners: Vec::new(),
            conns: Vec::new(),
            pool: vec![0; pool.bufs as usize * pool.buf_bytes],
            pool_free: (0..pool.bufs).rev().collect(),
            buf_bytes: pool.buf_bytes,
            ctl_calls: std::cell::Cell::new(0),
        };
        backend.ctl(
            libc::EPOLL_CTL_ADD,
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

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.ctl_calls.set(self.ctl_calls.get() + 1);
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` is a live epoll_event; both descriptors are open.
        cvt(unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), op, fd, &mut ev) }).map(|_| ())
    }

    fn conn_mut(&mut self, conn: ConnId) -> Option<&mut ConnIo> {
        self.conns.get_mut(conn as usize).and_then(Option::as_mut)
    }

    /// Marks the connection's interest for registration before the next `epoll_wait`.
    fn update_interest(&mut self, conn: ConnId) -> io::Result<()> {
        if let Some(c) = self.conn_mut(conn) {
            if !c.dirty {
                c.dirty = true;
                self.interest_dirty.push(conn);
            }
        }
        Ok(())
    }

    /// Registers the interest of every connection marked since the last wait (still open).
    fn flush_interest(&mut self) -> io::Result<()> {
        let mut dirty = std::mem::take(&mut self.interest_dirty);
        for conn in dirty.drain(..) {
            self.register_interest(conn)?;
        }
        self.interest_dirty = dirty; // keep the allocation
        Ok(())
    }

    /// Registers the interest the connection's state asks for, if it changed.
    fn register_interest(&mut self, conn: ConnId) -> io::Result<()> {
        let Some(c) = self.conns.get_mut(conn as usize).and_then(Option::as_mut) else {
            return Ok(());
        };
        if !c.dirty {
            return Ok(()); // Closed and its id reused since it was marked.
        }
        c.dirty = false;
        let mut want = 0u32;
        if c.recv_on {
            want |= (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
        }
        if c.pending.is_some() {
            want |= libc::EPOLLOUT as u32;
        }
        if c.registered && want == c.interest {
            return Ok(());
        }
        let op = if c.registered {
            libc::EPOLL_CTL_MOD
        } else {
            libc::EPOLL_CTL_ADD
        };
        c.registered = true;
        c.interest = want;
        let fd = c.fd.as_raw_fd();
        self.ctl(op, fd, want, TOKEN_CONN | conn as u64)
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
                    budget: None,
                    active: false,
                });
                state.active = true;
                state.budget = budget.map(|k| state.budget.unwrap_or(0).saturating_add(k));
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
                    state.active = false;
                    self.sync_listener(listener)?;
                }
            }
            Op::Recv { conn } | Op::RecvPause { conn } => {
                let on = matches!(op, Op::Recv { .. });
                if let Some(c) = self.conn_mut(conn) {
                    c.recv_on = on;
                }
                self.update_interest(conn)?;
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
            Op::Close { conn } => {
                // Dropping the descriptor closes it, which also removes it from the epoll set.
                if let Some(slot) = self.conns.get_mut(conn as usize) {
                    slot.take();
                }
                self.ready.push_back(Completion::Closed { conn });
            }
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

    fn start_send(&mut self, conn: ConnId, send: PendingSend) -> io::Result<()> {
        let Some(c) = self.conn_mut(conn) else {
            return Ok(());
        };
        assert!(c.pending.is_none(), "one send at a time per connection");
        c.pending = Some(send);
        self.continue_send(conn)
    }

    /// Pushes a pending send as far as the socket takes it; completes it when done or failed.
    fn continue_send(&mut self, conn: ConnId) -> io::Result<()> {
        let Some(c) = self.conn_mut(conn) else {
            return Ok(());
        };
        let fd = c.fd.as_raw_fd();
        let close_after = c.close_after;
        let Some(mut pending) = c.pending.take() else {
            return Ok(());
        };
        let outcome = drive_send(fd, &mut pending, close_after);
        match outcome {
            Err(e) if would_block(&e) => {
                c.pending = Some(pending);
            }
            result => self.ready.push_back(match pending {
                PendingSend::Bytes { buf, .. } => Completion::Sent {
                    conn,
                    buf,
                    result: result.map(|n| n as usize),
                },
                PendingSend::File { .. } => Completion::SentFile { conn, result },
            }),
        }
        let done = self.conn_mut(conn).is_some_and(|c| c.pending.is_none());
        if close_after && done {
            // Dropping the descriptor closes it; the FIN follows the data (MSG_MORE).
            if let Some(slot) = self.conns.get_mut(conn as usize) {
                slot.take();
            }
            self.ready.push_back(Completion::Closed { conn });
            return Ok(());
        }
        self.update_interest(conn)
    }

    /// Registers the listener in epoll while active with budget left, removes it otherwise.
    fn sync_listener(&mut self, listener: u32) -> io::Result<()> {
        let Some(Some(l)) = self.listeners.get(listener as usize).copied() else {
            return Ok(());
        };
        let want = l.active && l.budget != Some(0);
        if want != l.registered {
            let (op, events) = if want {
                (libc::EPOLL_CTL_ADD, l.events)
            } else {
                (libc::EPOLL_CTL_DEL, 0)
            };
            self.ctl(op, l.fd, events, TOKEN_LISTENER | listener as u64)?;
            if let Some(Some(state)) = self.listeners.get_mut(listener as usize) {
                state.registered = want;
            }
        }
        Ok(())
    }

    fn accept_batch(&mut self, listener: u32) -> io::Result<()> {
        let Some(Some(l)) = self.listeners.get(listener as usize).copied() else {
            return Ok(());
        };
        if !l.active {
            return Ok(());
        }
        let limit = l
            .budget
            .map_or(ACCEPT_BATCH_MAX, |b| (b as usize).min(ACCEPT_BATCH_MAX));
        let mut accepted = 0;
        let mut failure = None;
        while accepted < limit {
            match self.accept_one(l.fd, Origin::Local(listener)) {
                Ok(()) => accepted += 1,
                Err(e) if would_block(&e) => break,
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }
        if let Some(error) = failure {
            self.ready
                .push_back(Completion::AcceptFailed { listener, error });
        }
        if let Some(Some(state)) = self.listeners.get_mut(listener as usize) {
            if let Some(b) = state.budget.as_mut() {
                *b -= accepted as u32;
            }
        }
        self.sync_listener(listener)
    }

    fn accept_one(&mut self, fd: RawFd, origin: Origin) -> io::Result<()> {
        let a = crate::listen::accept(fd)?;
        let conn = a.fd.as_raw_fd() as ConnId;
        let slot = conn as usize;
        if self.conns.len() <= slot {
            self.conns.resize_with(slot + 1, || None);
        }
        self.conns[slot] = Some(ConnIo {
            fd: a.fd,
            recv_on: false,
            registered: false,
            interest: 0,
            dirty: false,
            pending: None,
            close_after: false,
        });
        self.ready.push_back(Completion::Accepted {
            origin,
            conn,
            peer: a.peer,
            incoming_cpu: a.incoming_cpu,
        });
        Ok(())
    }

    fn read_once(&mut self, conn: ConnId) -> io::Result<()> {
        let Some(c) = self.conns.get(conn as usize).and_then(Option::as_ref) else {
            return Ok(());
        };
        if !c.recv_on {
            return Ok(());
        }
        let fd = c.fd.as_raw_fd();
        let Some(buf) = self.pool_free.pop() else {
            return Ok(()); // Pool empty: level-triggered epoll reports the socket again.
        };
        let start = buf as usize * self.buf_bytes;
        let result = socket::recv(fd, &mut self.pool[start..start + self.buf_bytes]);
        let stop = match result {
            Ok(0) => {
                self.pool_free.push(buf);
                self.ready.push_back(Completion::Eof { conn });
                true
            }
            Ok(len) => {
                self.ready.push_back(Completion::Recv { conn, buf, len });
                false
            }
            Err(e) if would_block(&e) => {
                self.pool_free.push(buf);
                false
            }
            Err(error) => {
                self.pool_free.push(buf);
                self.ready.push_back(Completion::RecvFailed { conn, error });
                true
            }
        };
        if stop {
            if let Some(c) = self.conn_mut(conn) {
                c.recv_on = false;
            }
            self.update_interest(conn)?;
        }
        Ok(())
    }

    fn drain_waker(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd.
        let _ = unsafe {
            libc::read(
                self.waker.fd(),
                &mut value as *mut u64 as *mut libc::c_void,
                8,
            )
        };
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

fn drive_send(fd: RawFd, pending: &mut PendingSend, last: bool) -> io::Result<u64> {
    loop {
        match pending {
            PendingSend::Bytes { buf, sent } => {
                if *sent == buf.len() {
                    return Ok(*sent as u64);
                }
                *sent += if last {
                    socket::send_more(fd, &buf[*sent..])?
                } else {
                    socket::send(fd, &buf[*sent..])?
                };
            }
            PendingSend::File { region, sent } => {
                if *sent == region.len {
                    return Ok(*sent);
                }
                let chunk = (region.len - *sent).min(SENDFILE_CHUNK_BYTES as u64) as usize;
                let n =
                    socket::sendfile(fd, region.file.as_raw_fd(), region.offset + *sent, chunk)?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "file shorter than the region to send",
                    ));
                }
                *sent += n as u64;
            }
        }
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
        self.events.clear();
        // SAFETY: `events` has capacity EVENTS_MAX and the kernel writes at most that many.
        let n = unsafe {
            libc::epoll_wait(
                self.epfd.as_raw_fd(),
                self.events.as_mut_ptr(),
                EVENTS_MAX as libc::c_int,
                timeout_ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        // SAFETY: the kernel initialised the first `n` entries.
        unsafe { self.events.set_len(n as usize) };
        for i in 0..n as usize {
            let ev = self.events[i];
            self.dispatch(ev.u64, ev.events)?;
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
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    /// Waits (bounded) until the backend reports a completion matching `want`.
    fn next(b: &mut EpollBackend, want: impl Fn(&Completion) -> bool) -> Completion {
        let mut out = Vec::new();
        for _ in 0..200 {
            b.submit().unwrap();
            b.wait(Some(Duration::from_millis(10))).unwrap();
            b.reap(&mut out, 64);
            if let Some(i) = out.iter().position(&want) {
                return out.swap_remove(i);
            }
        }
        panic!("no such completion; got {out:?}");
    }

    /// A one-shot connection (request, then the peer closes, then we close) costs exactly one
    /// `epoll_ctl`, its ADD: the interest change at EOF is dropped because the connection
    /// closes in the same turn.
    #[test]
    fn a_connection_closed_at_eof_costs_one_epoll_ctl() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let mut b = EpollBackend::new(PoolConfig {
            bufs: 4,
            buf_bytes: 4096,
        })
        .unwrap();
        b.push(Op::Accept {
            listener: 0,
            fd: listener.as_raw_fd(),
            exclusive: false,
            budget: None,
        });
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.write_all(b"ping").unwrap();
        drop(client);
        let Completion::Accepted { conn, .. } =
            next(&mut b, |c| matches!(c, Completion::Accepted { .. }))
        else {
            unreachable!()
        };
        let before = b.ctl_calls();
        b.push(Op::Recv { conn });
        if let Completion::Recv { buf, .. } = next(&mut b, |c| matches!(c, Completion::Recv { .. }))
        {
            b.release(buf);
        }
        next(&mut b, |c| matches!(c, Completion::Eof { .. }));
        b.push(Op::Close { conn });
        next(&mut b, |c| matches!(c, Completion::Closed { .. }));
        b.submit().unwrap();
        b.wait(Some(Duration::ZERO)).unwrap();
        assert_eq!(b.ctl_calls() - before, 1, "only the connection's ADD");
    }

    /// The last answer with its close: `Sent` then `Closed` without an `Op::Close`, and the
    /// peer reads the data, then EOF.
    #[test]
    fn the_last_send_takes_the_close_with_it() {
        use std::io::Read;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let mut b = EpollBackend::new(PoolConfig {
            bufs: 4,
            buf_bytes: 4096,
        })
        .unwrap();
        b.push(Op::Accept {
            listener: 0,
            fd: listener.as_raw_fd(),
            exclusive: false,
            budget: None,
        });
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let Completion::Accepted { conn, .. } =
            next(&mut b, |c| matches!(c, Completion::Accepted { .. }))
        else {
            unreachable!()
        };
        b.push(Op::Send {
            conn,
            buf: b"pong".to_vec(),
            close_after: true,
        });
        b.submit().unwrap();
        b.wait(Some(Duration::ZERO)).unwrap();
        let mut out = Vec::new();
        b.reap(&mut out, 64);
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
        // Aborting touches only a connection whose last send still waits: after the close the
        // fd number may belong to a new connection (no last send of its own) — left alone.
        b.push(Op::AbortSend { conn });
        let mut second = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let Completion::Accepted { conn: new_conn, .. } =
            next(&mut b, |c| matches!(c, Completion::Accepted { .. }))
        else {
            unreachable!()
        };
        b.push(Op::AbortSend { conn: new_conn });
        b.push(Op::Recv { conn: new_conn });
        second.write_all(b"still open").unwrap();
        let Completion::Recv { len, .. } = next(&mut b, |c| matches!(c, Completion::Recv { .. }))
        else {
            unreachable!()
        };
        assert_eq!(len, 10);
    }
}
