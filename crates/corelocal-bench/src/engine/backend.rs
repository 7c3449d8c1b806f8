//! The I/O backend interface: the [`Backend`] trait, a slot's buffers, the events a backend
//! reports and the socket options every connection gets.

use crate::stats::ErrKind;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

/// One slot's buffers, owned by the backend (their addresses stay put while I/O is in flight).
#[derive(Debug)]
pub struct ConnBuf {
    /// Bytes to send; the backend sends all of it, then the engine clears it.
    pub out: Vec<u8>,
    /// Receive buffer.
    pub inbuf: Box<[u8]>,
    /// Valid bytes in `inbuf`.
    pub in_len: usize,
}

impl ConnBuf {
    /// Buffers with a receive capacity of `cap`.
    pub fn new(cap: usize) -> Self {
        ConnBuf {
            out: Vec::with_capacity(256),
            inbuf: vec![0; cap.max(64)].into_boxed_slice(),
            in_len: 0,
        }
    }
}

/// What the backend reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The connection is established.
    Connected(usize),
    /// `n` bytes of `out` were sent (the backend sends the rest by itself).
    Sent(usize, usize),
    /// `n` bytes were appended to `inbuf` (0: the peer closed).
    Recv(usize, usize),
    /// An operation failed with this errno.
    Error(usize, ErrKind, i32),
    /// After `close`: the slot's socket is gone and its buffers are free.
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

/// An I/O backend: io_uring or epoll.
pub trait Backend {
    /// The slot's buffers.
    fn buf(&mut self, slot: usize) -> &mut ConnBuf;
    /// Opens a socket from source address `src`, connects, sends `out`, arms a receive.
    fn open(&mut self, slot: usize, src: Option<Ipv4Addr>) -> Result<(), i32>;
    /// Sends `out` and arms a receive.
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
