//! The client side of a load generator (`corelocal bench`): connection slots driven through
//! io_uring ([`uring::Uring`]) or epoll ([`epoll::Epoll`]) behind one interface,
//! [`ClientIo`], and the client socket helpers both use. The server runtime does not use this
//! module.
//!
//! The calls go through `rustix` and the `io-uring` crate; what neither covers
//! (`IP_BIND_ADDRESS_NO_PORT`) is [`super::socket`]'s. The one `unsafe` block is the io_uring
//! client's push of submission entries, which point into buffers the client owns.
//!
//! # Buffers and the kernel
//!
//! Each slot has three buffers, all owned by the backend:
//!
//! - the *staging* buffer ([`ClientIo::out`]), which the caller fills with the next request
//!   and which keeps it after it was sent (a connection opened again resends it). No I/O ever
//!   points into it: the caller may write it at any time.
//! - the *sending* buffer, which only the backend sees: [`ClientIo::open`] and
//!   [`ClientIo::send`] copy the staging buffer into it (no allocation once its capacity
//!   fits) and send from there. The io_uring client overwrites it only when no send of the
//!   slot is in flight: a `send` while one is (its completion not reaped yet) copies the
//!   request into a third, *queued* buffer instead, sent when the one in flight completed
//!   (the latest request wins if several wait). No block the kernel reads is reachable from
//!   safe code.
//! - the *receive* buffer, a fixed-size boxed slice into whose free tail (`inbuf[in_len..]`) at
//!   most one receive is armed. The caller reads the received bytes
//!   ([`ClientIo::received`]) and empties the buffer ([`ClientIo::consume`]) only while no
//!   receive is armed into it (both panic otherwise): after a [`Event::Recv`] and before the
//!   next [`ClientIo::send`] or [`ClientIo::recv`].
//!
//! The io_uring client reuses a slot (a new `open`) only when all its requests completed, and
//! its `Drop` cancels and reaps every request before freeing the buffers (it leaks them, and
//! the addresses requests point at, if the kernel does not give them back in time). Together
//! these are the invariant its `unsafe` push rests on: every buffer a submitted request points
//! at stays allocated, in place and untouched by safe code until the request completed.

pub mod epoll;
pub mod uring;

use rustix::io::Errno;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

/// The step of a connection that failed (the kind of an [`Event::Error`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrOp {
    /// socket()/setsockopt()/bind() failed.
    Socket,
    /// connect() failed.
    Connect,
    /// send() failed.
    Send,
    /// recv() failed.
    Recv,
}

/// What a backend reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The connection of slot `.0` is established.
    Connected(usize),
    /// `.1` bytes of the slot's request were sent (the backend sends the rest by itself).
    Sent(usize, usize),
    /// `.1` bytes were appended to the slot's received bytes (0: the peer closed).
    Recv(usize, usize),
    /// An operation of slot `.0` failed with errno `.2`.
    Error(usize, ErrOp, i32),
    /// After [`ClientIo::close`]: the slot's socket is gone and no I/O points into its buffers.
    Released(usize),
}

/// Socket settings every connection gets.
#[derive(Debug, Clone)]
pub struct SockOpts {
    /// Server address.
    pub target: SocketAddrV4,
    /// Source addresses to spread connections over (empty: the kernel picks).
    pub src: Arc<[Ipv4Addr]>,
    /// SO_LINGER 0: close sends RST, no TIME_WAIT.
    pub linger0: bool,
    /// TCP_NODELAY.
    pub nodelay: bool,
}

/// A client I/O backend: io_uring or epoll, with numbered connection slots (module doc: which
/// buffer the caller may touch when).
pub trait ClientIo {
    /// The slot's staging buffer: the next request, sent by the next `open` or `send`. Always
    /// writable (no I/O points into it).
    fn out(&mut self, slot: usize) -> &mut Vec<u8>;
    /// The bytes received and not consumed yet. Panics while a receive is armed for the slot.
    fn received(&self, slot: usize) -> &[u8];
    /// Empties the received bytes. Panics while a receive is armed for the slot.
    fn consume(&mut self, slot: usize);
    /// Opens a socket from source address `src`, connects, sends the staging buffer, arms a
    /// receive. Err(EBUSY) when the slot is not free (open, or not yet released).
    fn open(&mut self, slot: usize, src: Option<Ipv4Addr>) -> Result<(), i32>;
    /// Sends (a copy of) the staging buffer and arms a receive. While a send of the slot is
    /// still in flight the io_uring client queues the request and sends it when that one
    /// completed.
    fn send(&mut self, slot: usize);
    /// Arms a receive (no-op when one is armed).
    fn recv(&mut self, slot: usize);
    /// Closes the socket (cancelling what is in flight); a `Released` event follows.
    fn close(&mut self, slot: usize);
    /// Submits queued work and waits up to `timeout_ns` for events.
    fn wait(&mut self, timeout_ns: u64, events: &mut Vec<Event>) -> std::io::Result<()>;
    /// The backend's name for the report.
    fn name(&self) -> &'static str;
}

/// One slot's buffers, owned by the backend (module doc).
#[derive(Debug)]
struct ConnBuf {
    /// The caller's staging buffer.
    out: Vec<u8>,
    /// The request being sent (a copy of `out`).
    sending: Vec<u8>,
    /// The request to send once the one in flight completed (io_uring).
    queued: Vec<u8>,
    /// Receive buffer.
    inbuf: Box<[u8]>,
    /// Valid bytes in `inbuf`.
    in_len: usize,
}

impl ConnBuf {
    /// Buffers with a receive capacity of `cap`.
    fn new(cap: usize) -> Self {
        ConnBuf {
            out: Vec::with_capacity(256),
            sending: Vec::with_capacity(256),
            queued: Vec::new(),
            inbuf: vec![0; cap.max(64)].into_boxed_slice(),
            in_len: 0,
        }
    }

    /// Copies the staging buffer's request into the sending buffer (the caller checked that
    /// no send is in flight).
    fn stage(&mut self) {
        self.sending.clear();
        self.sending.extend_from_slice(&self.out);
    }

    /// Copies the staging buffer's request into the queued buffer (no I/O points into it).
    fn queue(&mut self) {
        self.queued.clear();
        self.queued.extend_from_slice(&self.out);
    }

    /// Makes the queued request the one to send (the caller checked that no send is in
    /// flight).
    fn dequeue(&mut self) {
        std::mem::swap(&mut self.sending, &mut self.queued);
    }
}

/// The errno of a failed call.
fn errno(e: Errno) -> i32 {
    e.raw_os_error()
}

/// A `sockaddr_in` for `a` (what the io_uring client's connect and bind requests point at).
fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Sets SO_LINGER {on, 0}: close() sends RST and leaves no TIME_WAIT.
pub fn set_linger0(fd: impl AsFd) -> Result<(), i32> {
    rustix::net::sockopt::set_socket_linger(fd, Some(std::time::Duration::ZERO)).map_err(errno)
}

/// Creates a TCP socket with the per-connection options, bound to `src` (port chosen at
/// connect time thanks to IP_BIND_ADDRESS_NO_PORT, so 28k ports per source address).
pub fn client_socket(
    nonblock: bool,
    src: Option<Ipv4Addr>,
    linger0: bool,
    nodelay: bool,
) -> Result<OwnedFd, i32> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let flags = SocketFlags::CLOEXEC
        | if nonblock {
            SocketFlags::NONBLOCK
        } else {
            SocketFlags::empty()
        };
    let fd = rustix::net::socket_with(AddressFamily::INET, SocketType::STREAM, flags, None)
        .map_err(errno)?;
    // On an error the descriptor is closed when `fd` drops.
    if nodelay {
        rustix::net::sockopt::set_tcp_nodelay(&fd, true).map_err(errno)?;
    }
    if linger0 {
        set_linger0(&fd)?;
    }
    if let Some(ip) = src {
        super::socket::set_bind_address_no_port(&fd)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        rustix::net::bind(&fd, &SocketAddrV4::new(ip, 0)).map_err(errno)?;
    }
    Ok(fd)
}

/// Starts a non-blocking connect; Ok(()) also when it is in progress.
pub fn connect(fd: impl AsFd, sa: &SocketAddrV4) -> Result<(), i32> {
    match rustix::net::connect(fd, sa) {
        Ok(()) | Err(Errno::INPROGRESS) => Ok(()),
        Err(e) => Err(errno(e)),
    }
}

/// SO_ERROR of a socket (0: no error).
pub fn so_error(fd: impl AsFd) -> i32 {
    match rustix::net::sockopt::socket_error(fd) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) | Err(e) => errno(e),
    }
}

/// Reads into `buf`: Ok(n) (0 = EOF), Err(errno).
pub fn read(fd: impl AsFd, buf: &mut [u8]) -> Result<usize, i32> {
    rustix::io::read(fd, buf).map_err(errno)
}

/// Sends `buf` without SIGPIPE: Ok(n), Err(errno).
pub fn send(fd: impl AsFd, buf: &[u8]) -> Result<usize, i32> {
    rustix::net::send(fd, buf, rustix::net::SendFlags::NOSIGNAL).map_err(errno)
}
