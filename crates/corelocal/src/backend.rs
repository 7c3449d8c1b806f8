//! The backend interface: completion-style I/O behind one submit / reap / wait API (Seastar's
//! reactor backend), so epoll and io_uring are interchangeable under the worker.
//!
//! A leaf: the operations, completions and file regions the runtime's worker and the backends
//! in [`crate::sys`] exchange live here, so that neither imports the other.
//!
//! The worker [`push`](Backend::push)es operations (no syscall), [`submit`](Backend::submit)s
//! the batch once per loop turn, [`wait`](Backend::wait)s for progress and
//! [`reap`](Backend::reap)s completions in a batch. Accept and receive are multishot: armed once,
//! they keep completing until paused, or (for receive) until end of stream or an error. A
//! receive can also be stopped with a completion ([`Op::RecvStop`] → [`Completion::RecvStopped`]
//! once no receive is in flight, held until [`Op::RecvRelease`]): what is then in the socket is
//! exactly what was never read (kTLS RX is set at a record boundary this way).
//! Buffers: received bytes live in the backend's pool until [`release`](Backend::release)d
//! (io_uring's provided-buffer ring; epoll's fixed pool); send buffers are owned by the backend
//! until their completion returns them.
//!
//! [`accept`] holds the accept policy both sides follow: the worker's allowances, and per
//! listener the backend's choice of how many to take and how (multishot or one-shot).
//!
//! [`key`] holds [`ConnKey`], a connection's slot and generation, and the slot table that
//! checks it: the worker's connections and the io_uring backend's slots both use it, so a
//! reference that outlives its connection never reaches the slot's next one.

pub mod accept;
pub mod key;

pub use key::ConnKey;

use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

/// A region of an open file to send after the bytes written before it (sent with sendfile or
/// the backend's zero-copy path, never copied through user space by the runtime).
#[derive(Debug, Clone)]
pub struct FileRegion {
    /// The open file.
    pub file: Arc<File>,
    /// Start offset in the file.
    pub offset: u64,
    /// Bytes to send.
    pub len: u64,
}

/// A socket option the runtime sets on a connection between two parts of its output
/// ([`crate::runtime::Output::push_socket_options`]): what a handler changes about its socket
/// once the bytes before it are sent (the kernel's TLS records after a user-space handshake).
///
/// A value may be a secret (kTLS's `TLS_TX` carries the connection's traffic key): it is
/// overwritten with zeros when the option is dropped, once the kernel has it, and `Debug`
/// prints its length only.
#[derive(Clone, PartialEq, Eq)]
pub struct SocketOption {
    /// `setsockopt`'s level (`SOL_TCP`, `SOL_TLS`, ...).
    pub level: i32,
    /// The option's name at that level.
    pub name: i32,
    /// Its value, as the kernel reads it.
    pub value: Vec<u8>,
}

impl Drop for SocketOption {
    fn drop(&mut self) {
        wipe(&mut self.value);
    }
}

/// Zeros `bytes` with stores the compiler may not remove, though the memory is freed next.
fn wipe(bytes: &mut [u8]) {
    for byte in bytes.iter_mut() {
        // SAFETY: `byte` is a valid, aligned, exclusive reference into `bytes`.
        unsafe { std::ptr::write_volatile(byte, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

impl std::fmt::Debug for SocketOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketOption")
            .field("level", &self.level)
            .field("name", &self.name)
            .field("value_len", &self.value.len())
            .finish()
    }
}

impl SocketOption {
    /// Whether the option attaches an upper-layer protocol (`TCP_ULP`): the backend then stops
    /// holding the last send for the close's FIN (`MSG_MORE`), which a ULP such as `tls` would
    /// keep as an open record.
    pub fn attaches_ulp(&self) -> bool {
        self.level == libc::SOL_TCP && self.name == libc::TCP_ULP
    }
}

/// A control message sent with a connection's bytes (`sendmsg`'s ancillary data, one
/// `cmsghdr`): [`crate::runtime::Output::push_control_message`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlMessage {
    /// `cmsg_level` (`SOL_TLS`, ...).
    pub level: i32,
    /// `cmsg_type` (`TLS_SET_RECORD_TYPE`, ...).
    pub kind: i32,
    /// Its data (at most [`ControlMessage::DATA_BYTES_MAX`] bytes).
    pub data: Vec<u8>,
}

impl ControlMessage {
    /// The most data one control message carries here (a record type is one byte).
    pub const DATA_BYTES_MAX: usize = 32;
}

/// A connection's id within one backend (epoll: its fd; io_uring: its direct-descriptor slot):
/// a slot, reused once the connection is closed. What outlives the connection holds a
/// [`ConnKey`] instead (the slot and its generation).
pub type ConnId = u32;
/// A received buffer's id within the backend's pool.
pub type BufId = u32;

/// An operation for the backend.
#[derive(Debug)]
pub enum Op {
    /// Start accepting on a listener. `listener` is the worker's index for it; `exclusive`
    /// asks for one waiter per event when workers share the socket (`stock`).
    Accept {
        /// The worker's index of the listener.
        listener: u32,
        /// The listening socket.
        fd: RawFd,
        /// Wake one worker per connection when the socket is shared.
        exclusive: bool,
        /// `None`: accept everything that arrives (multishot). `Some(k)`: add `k` to the
        /// listener's allowance; the backend accepts exactly as many connections as allowed
        /// in total, then stops by itself, leaving later connections in the kernel's queue
        /// (where the balancer sees them and other workers can steal them). `Some(0)` resumes
        /// with what is left. The allowance survives [`Op::AcceptPause`]: an accept cancelled
        /// by the pause does not use it up.
        budget: Option<u32>,
    },
    /// Accept one connection from another worker's listener if one is waiting (never waits):
    /// Affinity-Accept's connection stealing.
    Steal {
        /// The victim worker.
        victim: u32,
        /// The victim's listening socket.
        fd: RawFd,
    },
    /// Stop accepting on a listener (back-pressure or shutdown).
    AcceptPause {
        /// The worker's index of the listener.
        listener: u32,
        /// The listening socket.
        fd: RawFd,
    },
    /// Start (or resume) multishot receive on a connection.
    Recv {
        /// The connection.
        conn: ConnId,
    },
    /// Stop receiving on a connection (output back-pressure).
    RecvPause {
        /// The connection.
        conn: ConnId,
    },
    /// Stop receiving on a connection and hold it stopped: no byte is read from the socket
    /// until [`Op::RecvRelease`] (an [`Op::Recv`] meanwhile does nothing). Completes with
    /// [`Completion::RecvStopped`] once no receive is in flight any more — after every byte
    /// already read was reported — so that what is in the socket is what was never read
    /// (kTLS RX needs the socket at a record boundary).
    RecvStop {
        /// The connection.
        conn: ConnId,
    },
    /// Ends the hold of [`Op::RecvStop`]; receiving stays off until an [`Op::Recv`].
    RecvRelease {
        /// The connection.
        conn: ConnId,
    },
    /// Send all of `buf`; completes once everything is sent or on error.
    Send {
        /// The connection.
        conn: ConnId,
        /// Owned by the backend until [`Completion::Sent`] returns it.
        buf: Vec<u8>,
        /// This is the connection's last output: close it once everything is sent (or the
        /// send failed). [`Completion::Sent`] then [`Completion::Closed`] follow, and no
        /// [`Op::Close`] is needed. The backend may put the FIN in the data's last segment
        /// and hand send and close to the kernel together.
        close_after: bool,
    },
    /// Send a file region without copying through user space.
    SendFile {
        /// The connection.
        conn: ConnId,
        /// The region.
        region: FileRegion,
    },
    /// Set socket options, in order, after everything pushed before is sent; completes with
    /// [`Completion::OptionsSet`] (an option that fails stops the rest). Only while no send
    /// is in flight on the connection.
    SetOptions {
        /// The connection.
        conn: ConnId,
        /// The options, owned by the backend until the completion.
        options: Vec<SocketOption>,
    },
    /// Send `payload` with one control message; completes with [`Completion::Sent`] (the
    /// payload comes back as its buffer). All of it or an error: a short send is an error.
    SendControl {
        /// The connection.
        conn: ConnId,
        /// The control message (boxed: the common operations stay small).
        control: Box<ControlMessage>,
        /// The bytes (a TLS alert's two).
        payload: Vec<u8>,
    },
    /// Shut down the connection's sending side (`SHUT_WR`) once its output is sent: the peer
    /// reads the end of the answer and its FIN, while receiving goes on (the lingering close:
    /// the worker reads and discards what the peer still sends, then closes). No completion.
    Shutdown {
        /// The connection.
        conn: ConnId,
    },
    /// Close the connection; [`Completion::Closed`] follows, after which the id may be reused.
    Close {
        /// The connection.
        conn: ConnId,
    },
    /// Give up the connection without closing it (a binary upgrade moves it to the successor):
    /// receiving stops, and once no receive can complete any more [`Completion::Detached`]
    /// hands over an ordinary descriptor of the socket; the id is free from then on (no
    /// [`Completion::Closed`]). Bytes received before that come as [`Completion::Recv`]
    /// first. Only for a connection with no send in flight.
    Detach {
        /// The connection.
        conn: ConnId,
    },
    /// Abort a connection's last send (`Send { close_after: true }`) that is still waiting (a
    /// peer that does not read): the close that was to follow it happens now and
    /// [`Completion::Closed`] follows. Does nothing when that send already completed — its
    /// close is done or on its way, and the id may already belong to a new connection, which
    /// must not be touched.
    AbortSend {
        /// The connection.
        conn: ConnId,
    },
}

/// A finished operation, or an event of a multishot one.
#[derive(Debug)]
pub enum Completion {
    /// A new connection.
    Accepted {
        /// Where it came from.
        origin: Origin,
        /// The new connection.
        conn: ConnId,
        /// The client's address, if known.
        peer: Option<SocketAddr>,
        /// The CPU that processed its last packet (`SO_INCOMING_CPU`), if known.
        incoming_cpu: Option<usize>,
    },
    /// Accepting failed (e.g. EMFILE); the accept stays armed unless paused.
    AcceptFailed {
        /// The worker's index of the listener.
        listener: u32,
        /// The error.
        error: io::Error,
    },
    /// A steal found no connection waiting (EAGAIN) or failed.
    StealFailed {
        /// The victim worker.
        victim: u32,
        /// The error.
        error: io::Error,
    },
    /// Bytes arrived; read them with [`Backend::recv_data`], then release the buffer.
    Recv {
        /// The connection.
        conn: ConnId,
        /// The buffer holding them.
        buf: BufId,
        /// How many bytes.
        len: usize,
    },
    /// The peer closed its sending side; receiving has stopped.
    Eof {
        /// The connection.
        conn: ConnId,
    },
    /// Receiving failed (e.g. ECONNRESET); receiving has stopped.
    RecvFailed {
        /// The connection.
        conn: ConnId,
        /// The error.
        error: io::Error,
    },
    /// A [`Op::Send`] finished; the buffer comes back for reuse.
    Sent {
        /// The connection.
        conn: ConnId,
        /// The buffer that was sent.
        buf: Vec<u8>,
        /// Bytes sent, or the error.
        result: io::Result<usize>,
    },
    /// A [`Op::SendFile`] finished.
    SentFile {
        /// The connection.
        conn: ConnId,
        /// Bytes sent, or the error.
        result: io::Result<u64>,
    },
    /// A [`Op::RecvStop`] took effect: no receive is in flight, and none starts before
    /// [`Op::RecvRelease`].
    RecvStopped {
        /// The connection.
        conn: ConnId,
    },
    /// A [`Op::SetOptions`] finished.
    OptionsSet {
        /// The connection.
        conn: ConnId,
        /// Ok, or the first option's error.
        result: io::Result<()>,
    },
    /// A [`Op::Detach`] finished: the socket, no longer the backend's; the id is free.
    Detached {
        /// The connection.
        conn: ConnId,
        /// The socket (an ordinary descriptor), or why it could not be had (the connection
        /// is closed then).
        fd: io::Result<std::os::fd::OwnedFd>,
    },
    /// A connection is closed and its id free.
    Closed {
        /// The connection.
        conn: ConnId,
    },
}

/// Where an accepted connection came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The worker's own listener (its index among the worker's listeners).
    Local(u32),
    /// Stolen from another worker's listener.
    Stolen(u32),
}

/// Wakes a worker blocked in [`Backend::wait`] from another thread.
pub trait Wake: Send + Sync {
    /// Wakes the worker; never lost (a wake before the wait makes the wait return at once).
    fn wake(&self);
}

/// Per-worker I/O engine. See the module docs.
pub trait Backend {
    /// A short name ("epoll", "uring").
    fn name(&self) -> &'static str;
    /// Queues an operation (no syscall).
    fn push(&mut self, op: Op);
    /// Hands every queued operation to the kernel; returns how many were handed over.
    fn submit(&mut self) -> io::Result<usize>;
    /// Waits until completions are ready, a wake-up arrives or `timeout` passes (`None`:
    /// no limit). Returns at once when completions are already ready.
    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()>;
    /// Moves ready completions into `out` (at most `max`).
    fn reap(&mut self, out: &mut Vec<Completion>, max: usize);
    /// The bytes of a received buffer.
    fn recv_data(&self, buf: BufId, len: usize) -> &[u8];
    /// Returns a received buffer to the pool.
    fn release(&mut self, buf: BufId);
    /// A handle other threads use to wake this worker.
    fn waker(&self) -> Arc<dyn Wake>;
    /// Whether no accepted connection can still surface: no accept or steal is queued or in
    /// flight in the kernel (a cancelled multishot accept counts until its final completion)
    /// and no accepted connection waits to be reaped. A stopping worker exits only when this
    /// holds, so a connection taken from a queue is never closed unseen with the backend.
    fn accepts_settled(&self) -> bool;
    /// Takes over an established connection (one a predecessor process handed over) and
    /// returns its id; nothing is armed on it. The id may be that of a connection whose
    /// [`Completion::Closed`] is still queued here (io_uring's table gives the slot freed last,
    /// and adopting reaps the kernel's completions; a descriptor number is reused at once):
    /// the caller handles every completion `reap` gives before it uses the id.
    fn adopt(&mut self, fd: std::os::fd::OwnedFd) -> io::Result<ConnId>;
    /// Events since the last call that the stats count (and resets them).
    fn take_events(&mut self) -> BackendEvents {
        BackendEvents::default()
    }
}

/// Backend events worth counting: multishot requests re-armed after ending without
/// `IORING_CQE_F_MORE`, and receives that ran out of provided buffers (ENOBUFS).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendEvents {
    /// Multishot requests re-armed.
    pub rearms: u64,
    /// Receives starved of buffers (re-armed once buffers came back).
    pub recv_starved: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_option_value_is_wiped_and_not_printed() {
        let mut key = vec![0xa5u8; 40];
        wipe(&mut key[..]);
        assert_eq!(key, vec![0u8; 40]);
        let option = SocketOption {
            level: 282,
            name: 1,
            value: vec![0xa5; 40],
        };
        let printed = format!("{option:?}");
        assert!(printed.contains("value_len: 40"), "{printed}");
        assert!(
            !printed.contains("165"),
            "the value's bytes are printed: {printed}"
        );
    }
}
