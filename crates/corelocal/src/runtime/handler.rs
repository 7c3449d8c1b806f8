//! The sans-IO application interface.
//!
//! A server is a [`Service`] (shared by all workers, e.g. a key-value store) that makes one
//! [`Handler`] per connection. The runtime does all I/O: it hands the handler the bytes
//! received so far, the handler consumes what it can parse, appends responses to an [`Output`]
//! and says what to do next. Handlers never touch sockets, threads or clocks: time is passed in.
//!
//! A whole server is a [`Service`], a [`Handler`] and one call
//! ([`Server::run_until_signal`](super::Server::run_until_signal)); the crate's
//! `examples/echo.rs` and `examples/kv.rs` are complete ones (`cargo run -p corelocal
//! --example kv`).

use super::handoff::{StateExport, StateImport};
pub use super::notify::{Notifier, NotifyRef};
pub use crate::backend::{ControlMessage, FileRegion, SocketOption};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// What the runtime knows about a new connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnInfo<'a> {
    /// Index of the worker that owns the connection.
    pub worker: usize,
    /// Index of the address it arrived on, in the order of the server's addresses (a plain
    /// and a TLS port side by side tell their connections apart by it). A connection stolen
    /// from another worker came from that worker's first listener: 0.
    pub listener: usize,
    /// The client's address, when the backend knows it.
    pub peer: Option<SocketAddr>,
    /// Time of accept.
    pub now: Instant,
    /// Where the connection's [`Notifier`] comes from (`None` outside a worker: tests, UDP).
    pub notify: Option<NotifyRef<'a>>,
}

impl ConnInfo<'_> {
    /// A handle that makes the runtime call [`Handler::on_notify`] for this connection, from
    /// any thread; `None` outside a worker. Taking one costs a reference count: a handler that
    /// may never need it can skip it.
    pub fn notifier(&self) -> Option<Notifier> {
        self.notify.map(|n| n.notifier())
    }
}

/// Why a handler asks to close a connection; counted in the worker's stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// Normal end (one-shot service done, `Connection: close`, `quit`).
    Done,
    /// The client sent something that does not parse; the response (if any) is flushed first.
    BadRequest,
    /// A request exceeded a size limit.
    TooLarge,
    /// The client took too long to send its request (a head that never completes: slowloris).
    /// The answer goes out with the close and nothing more is read: unlike the other
    /// errors, such a close never lingers, since the client is the one holding things up.
    TimedOut,
}

/// What the handler wants after processing input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Keep the connection and read more input.
    Read,
    /// Flush the output, then close.
    Close(CloseReason),
}

/// The result of one [`Handler::on_input`] call.
///
/// ```
/// use corelocal::runtime::{CloseReason, Next, Step};
///
/// // 12 bytes consumed, 2 requests answered, keep reading.
/// assert_eq!(Step::read(12, 2).next, Next::Read);
/// // Nothing consumed: a partial request, wait for more bytes.
/// let more = Step::read(0, 0);
/// // Answered; close once the answer is sent.
/// let done = Step::close(6, 1, CloseReason::Done);
/// assert_eq!(done.next, Next::Close(CloseReason::Done));
/// // Stop with input left and let other connections run: the rest runs next turn.
/// assert!(Step::yielded(6, 1).yielded);
/// # let _ = more;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Bytes of the input consumed (the runtime drops them from the front of its buffer).
    pub consumed: usize,
    /// Requests completed in this call (for the stats).
    pub requests: u32,
    /// What to do next.
    pub next: Next,
    /// The handler stopped on its own with input left (memcached's requests per event): the
    /// runtime leaves the rest of the buffered input for its next loop turn, so that other
    /// connections run first. Only with [`Next::Read`].
    pub yielded: bool,
}

impl Step {
    /// Consumed `consumed` bytes, completed `requests`, keep reading.
    pub fn read(consumed: usize, requests: u32) -> Step {
        Step {
            consumed,
            requests,
            next: Next::Read,
            yielded: false,
        }
    }

    /// Consumed `consumed` bytes, completed `requests`, and yields: the rest of the input
    /// waits for the worker's next turn ([`Step::yielded`](Step#structfield.yielded)).
    pub fn yielded(consumed: usize, requests: u32) -> Step {
        Step {
            consumed,
            requests,
            next: Next::Read,
            yielded: true,
        }
    }

    /// Consumed `consumed` bytes, completed `requests`, then close for `reason`.
    pub fn close(consumed: usize, requests: u32, reason: CloseReason) -> Step {
        Step {
            consumed,
            requests,
            next: Next::Close(reason),
            yielded: false,
        }
    }
}

/// Response bytes (and file regions) waiting to be sent on one connection, in order.
///
/// Bytes are appended to one contiguous buffer; a file region is anchored at the byte position
/// where it was pushed, so pipelined responses keep their order.
///
/// The runtime sets a limit on what the output may hold before it pauses reading the
/// connection ([`room`](Output::room)); a handler that answers many pipelined requests in one
/// call stops when no room is left and leaves the rest of the input unconsumed, so one call
/// cannot queue more than about one response past the limit.
///
/// ```
/// use corelocal::runtime::Output;
/// use std::io::Write as _;
///
/// let mut out = Output::new();
/// out.write(b"VALUE ");
/// write!(out.bytes_mut(), "{}\r\n", 42).unwrap(); // formatted in place
/// assert_eq!(out.as_bytes(), b"VALUE 42\r\n");
/// // The runtime sets the limit; a handler answering many requests stops at no room.
/// out.set_limit(16);
/// assert_eq!(out.room(), 6);
/// ```
#[derive(Debug)]
pub struct Output {
    bytes: Vec<u8>,
    /// Byte offset into `bytes` where the region goes, and the region. Sorted by offset.
    files: Vec<(usize, FileRegion)>,
    /// Socket options and messages with a control message, at the byte offset where they go
    /// (before the file regions anchored there). Sorted by offset.
    /// Absent when there is none (never `Some` and empty): an output without any (nearly
    /// every one) costs one test to look at and to drop.
    options: Option<Vec<Placed>>,
    /// Total length at which the runtime applies back-pressure.
    limit: u64,
    /// The handler asked the runtime to stop receiving ([`Output::stop_receiving`]).
    recv_stop: bool,
}

impl Default for Output {
    fn default() -> Self {
        Output {
            bytes: Vec::new(),
            files: Vec::new(),
            options: None,
            limit: u64::MAX,
            recv_stop: false,
        }
    }
}

impl Output {
    /// An empty output with no limit.
    pub fn new() -> Output {
        Output::default()
    }

    /// Sets the total length ([`total_len`](Output::total_len)) at which reading pauses
    /// (the runtime does, before each [`Handler::on_input`]).
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// Bytes that may still be queued before the limit (0 at or past it; `u64::MAX` less
    /// what is queued when there is no limit). Handlers producing several responses per
    /// call stop when it is 0.
    pub fn room(&self) -> u64 {
        self.limit.saturating_sub(self.total_len())
    }

    /// Appends bytes.
    pub fn write(&mut self, data: &[u8]) {
        self.bytes.extend_from_slice(data);
    }

    /// The bytes queued (file regions not included, nor what was sent already): what a
    /// handler wrote, for testing it without a server.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The byte buffer, for formatting responses in place (`write!` through `std::io::Write`).
    pub fn bytes_mut(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// Queues a file region after the bytes written so far.
    pub fn push_file(&mut self, region: FileRegion) {
        if region.len > 0 {
            self.files.push((self.bytes.len(), region));
        }
    }

    /// Asks the runtime to stop reading from the socket, at once (not in the output's order):
    /// once no receive is in flight and every byte read so far was given to
    /// [`Handler::on_input`], it calls [`Handler::on_recv_stopped`]; reading resumes after
    /// that call, and after the socket options it queued are set. For a protocol that
    /// hands its receiving side to the kernel at a boundary it must see (kTLS RX: the next
    /// byte in the socket must start a record). At most one stop at a time; asked again
    /// while one is under way, it is the same stop.
    pub fn stop_receiving(&mut self) {
        self.recv_stop = true;
    }

    /// Whether [`Output::stop_receiving`] was asked and the runtime has not taken the request
    /// yet (for tests that drive a handler in memory).
    pub fn recv_stop_asked(&self) -> bool {
        self.recv_stop
    }

    /// Takes the handler's [`Output::stop_receiving`] request.
    pub(crate) fn take_recv_stop(&mut self) -> bool {
        std::mem::take(&mut self.recv_stop)
    }

    /// Whether socket options wait in this output (not control messages).
    pub(crate) fn has_socket_options(&self) -> bool {
        self.marks()
            .iter()
            .any(|p| matches!(p.mark, Mark::Options(_)))
    }

    /// Sets socket options on the connection once everything queued so far is sent, before
    /// anything queued after: a TLS handler that hands its records to the kernel (kTLS) after
    /// its handshake's last record went out. An option that fails closes the connection.
    pub fn push_socket_options(&mut self, options: Vec<SocketOption>) {
        self.push_mark(Mark::Options(options));
    }

    /// Sends `payload` with one control message (`sendmsg`'s ancillary data) after
    /// everything queued so far and before anything queued after: a TLS alert record through
    /// the kernel's TLS (kTLS's `TLS_SET_RECORD_TYPE`). Its failure closes the connection.
    pub fn push_control_message(&mut self, control: ControlMessage, payload: Vec<u8>) {
        self.push_mark(Mark::Control(Box::new(control), payload));
    }

    /// The marks waiting (none, nearly always).
    fn marks(&self) -> &[Placed] {
        self.options.as_deref().unwrap_or(&[])
    }

    fn marks_mut(&mut self) -> &mut Vec<Placed> {
        self.options.get_or_insert_with(Vec::new)
    }

    /// Takes the first mark; none left: none at all (`options` is `None`).
    fn pop_front_mark(&mut self) -> Placed {
        let marks = self.options.as_mut().expect("a mark in front");
        let first = marks.remove(0);
        if marks.is_empty() {
            self.options = None;
        }
        first
    }

    /// File regions anchored at the end of the bytes (what a mark pushed now comes after).
    fn files_at_end(&self) -> usize {
        let end = self.bytes.len();
        self.files
            .iter()
            .rev()
            .take_while(|(f, _)| *f == end)
            .count()
    }

    /// A mark at the end: after the bytes and after the file regions queued so far at the
    /// same place (`files_ahead` of them).
    fn push_mark(&mut self, mark: Mark) {
        let at = self.bytes.len();
        let files_ahead = self.files_at_end();
        self.marks_mut().push(Placed {
            at,
            files_ahead,
            mark,
        });
    }

    /// Bytes (not counting file regions) waiting to be sent.
    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    /// Bytes plus file-region lengths waiting to be sent.
    pub fn total_len(&self) -> u64 {
        self.bytes.len() as u64 + self.files.iter().map(|(_, f)| f.len).sum::<u64>()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty() && self.files.is_empty() && self.options.is_none()
    }

    /// The next thing to send: the bytes before the first file region (or socket options),
    /// or that region, or the options.
    pub fn front(&self) -> OutputFront<'_> {
        let options_at = match self.marks().first() {
            Some(p) if p.in_front() => {
                return match &p.mark {
                    Mark::Options(options) => OutputFront::Options(options),
                    Mark::Control(control, payload) => OutputFront::Control(control, payload),
                }
            }
            Some(p) => p.at,
            None => usize::MAX,
        };
        match self.files.first() {
            Some((0, region)) => OutputFront::File(region),
            Some((at, _)) => OutputFront::Bytes(&self.bytes[..options_at.min(*at)]),
            None if self.bytes.is_empty() => OutputFront::Empty,
            None => OutputFront::Bytes(&self.bytes[..options_at.min(self.bytes.len())]),
        }
    }

    /// Where the bytes in front end: at the first file region or the socket options.
    fn bytes_front_len(&self) -> usize {
        let files_at = self.files.first().map_or(self.bytes.len(), |(at, _)| *at);
        self.marks()
            .first()
            .map_or(files_at, |p| files_at.min(p.at))
    }

    /// Marks `n` bytes of the front as sent (bytes or file region, whichever [`front`] gave).
    ///
    /// [`front`]: Output::front
    pub fn advance(&mut self, n: usize) {
        if let Some(p) = self.marks().first().filter(|p| p.in_front()) {
            // Taken whole: `n` is 0 for options, the payload's length for a control message.
            let whole = match &p.mark {
                Mark::Options(_) => 0,
                Mark::Control(_, payload) => payload.len(),
            };
            assert!(
                n == whole,
                "advanced past socket options or a control message"
            );
            self.pop_front_mark();
            return;
        }
        if let Some((0, region)) = self.files.first_mut() {
            assert!(n as u64 <= region.len, "advanced past a file region");
            region.offset += n as u64;
            region.len -= n as u64;
            if region.len == 0 {
                self.remove_front_file();
            }
            return;
        }
        assert!(
            n <= self.bytes_front_len(),
            "advanced past the bytes in front"
        );
        self.bytes.drain(..n);
        for (at, _) in &mut self.files {
            *at -= n;
        }
        for p in self.options.iter_mut().flat_map(|m| m.iter_mut()) {
            p.at -= n;
        }
    }

    /// The file region in front is done: the marks queued after it at the same place move up.
    fn remove_front_file(&mut self) {
        let (at, _) = self.files.remove(0);
        let marks = self.options.iter_mut().flat_map(|m| m.iter_mut());
        for p in marks.filter(|p| p.at == at && p.files_ahead > 0) {
            p.files_ahead -= 1;
        }
    }

    /// Removes and returns the next thing to send: the bytes before the first file region
    /// (reusing `spare`'s allocation when the whole buffer goes), or that region.
    pub fn take_front(&mut self, mut spare: Vec<u8>) -> Option<Chunk> {
        if self.options.is_some() {
            return self.take_front_before_options(spare);
        }
        match self.files.first() {
            Some((0, _)) => Some(Chunk::File(self.files.remove(0).1)),
            Some((at, _)) => {
                let at = *at;
                spare.clear();
                spare.extend_from_slice(&self.bytes[..at]);
                self.advance(at);
                Some(Chunk::Bytes(spare))
            }
            None if self.bytes.is_empty() => None,
            None => {
                spare.clear();
                Some(Chunk::Bytes(std::mem::replace(&mut self.bytes, spare)))
            }
        }
    }

    /// [`Output::take_front`] while socket options wait (rare: once per kTLS connection).
    #[cold]
    fn take_front_before_options(&mut self, mut spare: Vec<u8>) -> Option<Chunk> {
        if self.marks().first().is_some_and(Placed::in_front) {
            return Some(match self.pop_front_mark().mark {
                Mark::Options(options) => Chunk::Options(options),
                Mark::Control(control, payload) => Chunk::Control(control, payload),
            });
        }
        if let Some((0, region)) = self.files.first() {
            let region = region.clone();
            self.remove_front_file();
            return Some(Chunk::File(region));
        }
        let n = self.bytes_front_len();
        spare.clear();
        spare.extend_from_slice(&self.bytes[..n]);
        self.advance(n);
        Some(Chunk::Bytes(spare))
    }

    /// Moves everything `other` holds (bytes, file regions, socket options) to the end of
    /// this output, in order; `other` is left empty.
    pub fn append(&mut self, other: &mut Output) {
        let base = self.bytes.len();
        let files_at_end = self.files_at_end();
        if let Some(theirs) = other.options.take() {
            self.marks_mut().extend(theirs.into_iter().map(|p| Placed {
                at: base + p.at,
                // Marks at `other`'s start come after this output's file regions at its end.
                files_ahead: p.files_ahead + if p.at == 0 { files_at_end } else { 0 },
                mark: p.mark,
            }));
        }
        self.files.extend(
            other
                .files
                .drain(..)
                .map(|(at, region)| (base + at, region)),
        );
        self.bytes.extend_from_slice(&other.bytes);
        other.bytes.clear();
        self.recv_stop |= other.take_recv_stop();
    }

    /// The byte buffer, emptied, leaving none (the runtime reuses a closed connection's).
    pub(crate) fn take_buffer(&mut self) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.bytes);
        buf.clear();
        buf
    }

    /// Whether the byte buffer was never allocated (or was taken: [`Output::take_buffer`]).
    pub(crate) fn has_no_buffer(&self) -> bool {
        self.bytes.capacity() == 0
    }

    /// Gives the output `buf` (empty) as its byte buffer, so that the first write does not
    /// allocate. Only when it has none ([`Output::has_no_buffer`]).
    pub(crate) fn set_buffer(&mut self, buf: Vec<u8>) {
        debug_assert!(buf.is_empty() && self.has_no_buffer());
        self.bytes = buf;
    }

    /// Drops everything queued.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.files.clear();
        self.options = None;
    }
}

/// A part of an [`Output`] taken out to send.
#[derive(Debug)]
pub enum Chunk {
    /// Bytes.
    Bytes(Vec<u8>),
    /// A file region.
    File(FileRegion),
    /// Socket options to set (see [`Output::push_socket_options`]).
    Options(Vec<SocketOption>),
    /// Bytes to send with a control message (see [`Output::push_control_message`]); boxed,
    /// so that the common chunks stay small.
    Control(Box<ControlMessage>, Vec<u8>),
}

/// What waits in an [`Output`] at a place among its bytes.
#[derive(Debug)]
enum Mark {
    Options(Vec<SocketOption>),
    Control(Box<ControlMessage>, Vec<u8>),
}

/// A mark and its place: after `at` bytes and after `files_ahead` file regions anchored there.
#[derive(Debug)]
struct Placed {
    at: usize,
    files_ahead: usize,
    mark: Mark,
}

impl Placed {
    fn in_front(&self) -> bool {
        self.at == 0 && self.files_ahead == 0
    }
}

/// The next part of an [`Output`] to send.
#[derive(Debug)]
pub enum OutputFront<'a> {
    /// Nothing to send.
    Empty,
    /// Bytes to send.
    Bytes(&'a [u8]),
    /// A file region to send.
    File(&'a FileRegion),
    /// Socket options to set before anything else goes.
    Options(&'a [SocketOption]),
    /// Bytes to send with a control message.
    Control(&'a ControlMessage, &'a [u8]),
}

/// Per-connection protocol state: bytes in, bytes out.
///
/// Only [`Handler::on_input`] is required; the other methods have defaults that suit a
/// request/response protocol where the client speaks first.
///
/// ```
/// use corelocal::runtime::{CloseReason, Handler, Output, Step};
/// use std::time::Instant;
///
/// /// `PING` → `PONG`, `QUIT` closes, anything else is answered `ERROR` and closed.
/// struct Ping;
///
/// impl Handler for Ping {
///     fn on_input(&mut self, input: &[u8], out: &mut Output, _now: Instant) -> Step {
///         let Some(end) = input.iter().position(|&b| b == b'\n') else {
///             return Step::read(0, 0); // a partial line: wait for more bytes
///         };
///         match &input[..end] {
///             b"PING" => {
///                 out.write(b"PONG\n");
///                 Step::read(end + 1, 1)
///             }
///             b"QUIT" => Step::close(end + 1, 1, CloseReason::Done),
///             _ => {
///                 out.write(b"ERROR\n");
///                 Step::close(end + 1, 0, CloseReason::BadRequest)
///             }
///         }
///     }
/// }
///
/// // Sans-IO: a handler is tested without a socket. One request per call: the runtime calls
/// // again while input is left (pipelined requests).
/// let mut out = Output::new();
/// assert_eq!(Ping.on_input(b"PING\nPI", &mut out, Instant::now()), Step::read(5, 1));
/// assert_eq!(Ping.on_input(b"PI", &mut out, Instant::now()), Step::read(0, 0));
/// assert_eq!(out.as_bytes(), b"PONG\n");
/// ```
pub trait Handler: Send + 'static {
    /// Processes `input` (every byte received and not yet consumed), appending responses to
    /// `out`. Consuming nothing and returning [`Next::Read`] means "need more bytes"; the
    /// runtime closes the connection with [`CloseReason::TooLarge`] if its input buffer limit
    /// is reached without progress (after [`Handler::on_input_limit`]).
    ///
    /// A handler may answer one request per call or all it can: the runtime calls again while
    /// input is left, the last call consumed some and the output has room (a bounded number
    /// of calls in one go; what is left then runs at the worker's next turn, without waiting
    /// for more input, as after [`Step::yielded`]).
    fn on_input(&mut self, input: &[u8], out: &mut Output, now: Instant) -> Step;

    /// The connection's unconsumed input reached the runtime's limit
    /// ([`Limits::input_bytes_max`](super::Limits#structfield.input_bytes_max)) while this
    /// handler, with room to answer, made no progress on it: a request larger than the server
    /// takes. What goes into `out` (an error line, such as memcached's `SERVER_ERROR object too
    /// large for cache`) is sent before the connection closes as [`CloseReason::TooLarge`];
    /// the close lingers, so the answer reaches a client that is still sending. `input` is the
    /// full buffer (its start may name the request). The default writes nothing.
    fn on_input_limit(&mut self, input: &[u8], out: &mut Output, now: Instant) {
        let _ = (input, out, now);
    }

    /// Called once when the connection is accepted, before anything is read: what the
    /// protocol says first (a greeting, or a refusal such as memcached's `ERROR Too many open
    /// connections`) goes into `out` and is sent at once; [`Next::Close`] closes once it is
    /// sent. Not called for a connection resumed at a binary upgrade. The default says
    /// nothing and reads.
    fn on_connect(&mut self, out: &mut Output, now: Instant) -> Next {
        let _ = (out, now);
        Next::Read
    }

    /// The peer closed its sending side with `input` still unconsumed (usually empty).
    /// The default closes once the output is flushed.
    fn on_eof(&mut self, input: &[u8], out: &mut Output, now: Instant) -> Next {
        let _ = (input, out, now);
        Next::Close(CloseReason::Done)
    }

    /// Its [`Notifier`] was notified (see [`super::notify`]): output that no input asked for
    /// (a log stream) goes into `out`, at most [`Output::room`] of it; the runtime sends it
    /// and calls again once the output drained to half its limit if this call left no room.
    /// Called once per loop turn however many notifies came, only while the connection is
    /// open, and possibly spuriously. The default writes nothing.
    fn on_notify(&mut self, out: &mut Output, now: Instant) -> Next {
        let _ = (out, now);
        Next::Read
    }

    /// The idle timeout closes the connection, with nothing pending either way: what the
    /// protocol says before it goes (a TLS layer's close_notify, which lets the peer tell a
    /// close from a cut) goes into `out`, and is sent before a normal close. The default
    /// writes nothing: the connection closes at once.
    fn on_idle_close(&mut self, out: &mut Output) {
        let _ = out;
    }

    /// The server began a graceful stop. A protocol that can tell its peer the connection is
    /// about to close (HTTP's `Connection: close`) arranges to close after its next response
    /// and returns true: the runtime then lets an idle connection live a short grace period
    /// for that next request instead of closing it under a request already on its way. The
    /// default (false) suits protocols with no such signal: idle connections close at once.
    fn on_drain(&mut self) -> bool {
        false
    }

    /// The receive stop asked for with [`Output::stop_receiving`] took effect: nothing is
    /// read from the socket until this returns and the socket options it queues
    /// ([`Output::push_socket_options`]) are set; `input` is the input not consumed yet
    /// (every byte read from the socket so far has been offered to `on_input`). Not called
    /// on a connection that is closing or whose peer's end came. The default does nothing.
    fn on_recv_stopped(&mut self, input: &[u8], out: &mut Output, now: Instant) {
        let _ = (input, out, now);
    }

    /// Asked when a normal close ([`CloseReason::Done`]) begins: whether the peer still has
    /// input on its way that this handler will not read (the rest of a request body it
    /// skips). The runtime then closes lingering — sending side shut down after the answer,
    /// the rest read and discarded — instead of closing with the last answer, which would
    /// make the kernel reset the connection and destroy the answer. Unconsumed bytes already
    /// buffered count without asking. The default: nothing more is expected.
    fn expects_input(&self) -> bool {
        false
    }

    /// A shorter idle timeout of the handler's own, while it returns `Some`: the connection
    /// closes once it has been silent (nothing received, nothing sent) that long, as with
    /// [`Limits::idle_timeout`](super::Limits#structfield.idle_timeout), which still applies.
    /// A TLS layer returns its handshake timeout until the handshake completes, so a client
    /// that stalls mid-handshake is closed then and not a minute later. Asked when the
    /// connection is accepted and whenever its deadline comes up; the default: none.
    fn idle_timeout(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether the handler holds work of its own that no new input will bring: bytes it took
    /// from the input but has not processed yet, or output it has not produced yet (a TLS
    /// layer's decrypted requests, waiting while the output was full, or the rest of a file it
    /// encrypts a piece at a time). While true, the runtime calls [`Handler::on_input`] even
    /// with no input left (an empty slice), once per processing of the connection, as it does
    /// when the output drains. The default: nothing is held back.
    fn holds_input(&self) -> bool {
        false
    }

    /// At a binary upgrade the runtime moves open connections to the successor process
    /// between two requests. It asks when the connection is quiet (nothing queued to send,
    /// nothing in flight): `None` while a request is half-handled in the handler's own state
    /// (the data of a storage command being stored): the runtime reads on and asks again;
    /// `Some(state)`: what the successor's handler needs besides the unconsumed input, which
    /// moves apart ([`Service::resume`] gets it back). The default: nothing is kept between
    /// requests.
    fn handoff(&self) -> Option<Vec<u8>> {
        Some(Vec::new())
    }
}

/// A server application: shared state plus a factory of per-connection handlers.
///
/// One service serves every worker (per-worker state: [`Service::for_worker`]); it makes a
/// [`Handler`] for each connection. Only `name` and `connect` are required; the rest are for
/// per-worker state and binary upgrades.
///
/// ```no_run
/// use corelocal::cpu::current_affinity;
/// use corelocal::runtime::{ConnInfo, Handler, Output, Server, ServerConfig, Service, Step};
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use std::time::Instant;
///
/// /// Numbers each line it receives, counting over all connections and workers.
/// #[derive(Default)]
/// struct Numbered {
///     lines: Arc<AtomicU64>,
/// }
/// struct NumberedConn {
///     lines: Arc<AtomicU64>,
/// }
///
/// impl Service for Numbered {
///     type Conn = NumberedConn;
///     fn name(&self) -> &'static str {
///         "numbered"
///     }
///     fn connect(&self, _info: &ConnInfo) -> NumberedConn {
///         NumberedConn { lines: Arc::clone(&self.lines) }
///     }
/// }
///
/// impl Handler for NumberedConn {
///     fn on_input(&mut self, input: &[u8], out: &mut Output, _now: Instant) -> Step {
///         let Some(end) = input.iter().position(|&b| b == b'\n') else {
///             return Step::read(0, 0);
///         };
///         let n = self.lines.fetch_add(1, Ordering::Relaxed) + 1;
///         out.write(format!("{n} ").as_bytes());
///         out.write(&input[..=end]);
///         Step::read(end + 1, 1)
///     }
/// }
///
/// let addrs = vec!["127.0.0.1:7008".parse().unwrap()];
/// let config = ServerConfig::recommended(addrs, &current_affinity().unwrap());
/// let report = Server::run_until_signal(config, Arc::new(Numbered::default()), |server| {
///     println!("listening on {:?}", server.local_addrs());
/// })
/// .unwrap();
/// println!("{} lines", report.stats.total.requests);
/// ```
pub trait Service: Send + Sync + 'static {
    /// The per-connection handler.
    type Conn: Handler;

    /// A short name for logs and stats ("rpc", "http", "kv").
    fn name(&self) -> &'static str;

    /// Makes the handler of a new connection.
    fn connect(&self, info: &ConnInfo) -> Self::Conn;

    /// Makes the service worker `worker` uses, on that worker's thread (pinned to its CPU)
    /// before it accepts anything: per-worker state (a cache, counters, scratch buffers) with
    /// no thread-locals and no lock shared between cores. The default shares this service
    /// among all workers. The service given to [`Server::start`](super::Server::start) still
    /// answers [`Service::export_state`] and [`Service::import_state`] at a binary upgrade:
    /// what the per-worker services hold is not moved.
    ///
    /// Each worker's state is touched by that worker's thread only, so a `Mutex` around it is
    /// never contended (handlers are `Send`, so `Rc<RefCell<_>>` is not an option). The
    /// service given to the server serves as the template:
    ///
    /// ```
    /// use corelocal::runtime::{ConnInfo, Handler, Output, Service, Step};
    /// use std::sync::{Arc, Mutex};
    /// use std::time::Instant;
    ///
    /// /// Answers each line with how many lines its worker has seen.
    /// #[derive(Default)]
    /// struct Count {
    ///     /// This worker's count.
    ///     seen: Arc<Mutex<u64>>,
    /// }
    /// struct CountConn(Arc<Mutex<u64>>);
    ///
    /// impl Service for Count {
    ///     type Conn = CountConn;
    ///     fn name(&self) -> &'static str {
    ///         "count"
    ///     }
    ///     fn for_worker(self: Arc<Self>, _worker: usize) -> Arc<Self> {
    ///         Arc::new(Count::default())
    ///     }
    ///     fn connect(&self, _info: &ConnInfo) -> CountConn {
    ///         CountConn(Arc::clone(&self.seen))
    ///     }
    /// }
    ///
    /// impl Handler for CountConn {
    ///     fn on_input(&mut self, input: &[u8], out: &mut Output, _now: Instant) -> Step {
    ///         let Some(end) = input.iter().position(|&b| b == b'\n') else {
    ///             return Step::read(0, 0);
    ///         };
    ///         let mut seen = self.0.lock().unwrap();
    ///         *seen += 1;
    ///         out.write(format!("{seen}\n").as_bytes());
    ///         Step::read(end + 1, 1)
    ///     }
    /// }
    ///
    /// // What each worker does: its own service, then one handler per connection.
    /// let template = Arc::new(Count::default());
    /// let (w0, w1) = (template.clone().for_worker(0), template.for_worker(1));
    /// let info = ConnInfo { worker: 0, listener: 0, peer: None, now: Instant::now(), notify: None };
    /// let (mut a, mut b, mut c) = (w0.connect(&info), w0.connect(&info), w1.connect(&info));
    /// let mut out = Output::new();
    /// for conn in [&mut a, &mut b, &mut c] {
    ///     conn.on_input(b"x\n", &mut out, Instant::now());
    /// }
    /// assert_eq!(out.as_bytes(), b"1\n2\n1\n");
    /// ```
    fn for_worker(self: Arc<Self>, worker: usize) -> Arc<Self> {
        let _ = worker;
        self
    }

    /// Makes the handler of a connection moved from the predecessor process at a binary
    /// upgrade, from what its handler gave ([`Handler::handoff`]). The default ignores the
    /// state and makes a fresh handler.
    fn resume(&self, info: &ConnInfo, state: &[u8]) -> Self::Conn {
        let _ = state;
        self.connect(info)
    }

    /// At a binary upgrade, once this process's workers stopped: the state to hand to the
    /// successor (see [`super::handoff`]). The default: none.
    fn export_state(self: Arc<Self>) -> Option<Box<dyn StateExport>> {
        None
    }

    /// At a binary upgrade, before this process's workers start: where the predecessor's
    /// state goes (see [`super::handoff`]). The default: none (a stream offered is skipped).
    fn import_state(self: Arc<Self>) -> Option<Box<dyn StateImport>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    fn region(len: u64) -> FileRegion {
        FileRegion {
            file: Arc::new(File::open("/dev/null").unwrap()),
            offset: 10,
            len,
        }
    }

    #[test]
    fn output_keeps_bytes_and_files_in_order() {
        let mut out = Output::new();
        out.write(b"head1");
        out.push_file(region(7));
        out.write(b"head2");
        assert_eq!(out.total_len(), 17);
        match out.front() {
            OutputFront::Bytes(b) => assert_eq!(b, b"head1"),
            other => panic!("{other:?}"),
        }
        out.advance(3);
        out.advance(2);
        match out.front() {
            OutputFront::File(f) => assert_eq!((f.offset, f.len), (10, 7)),
            other => panic!("{other:?}"),
        }
        out.advance(7);
        match out.front() {
            OutputFront::Bytes(b) => assert_eq!(b, b"head2"),
            other => panic!("{other:?}"),
        }
        out.advance(5);
        assert!(out.is_empty());
        assert!(matches!(out.front(), OutputFront::Empty));
    }

    #[test]
    fn take_front_moves_bytes_and_regions_out_in_order() {
        let mut out = Output::new();
        out.write(b"a");
        out.push_file(region(3));
        out.write(b"bc");
        assert!(matches!(out.take_front(Vec::new()), Some(Chunk::Bytes(b)) if b == b"a"));
        assert!(matches!(out.take_front(Vec::new()), Some(Chunk::File(f)) if f.len == 3));
        assert!(
            matches!(out.take_front(Vec::with_capacity(9)), Some(Chunk::Bytes(b)) if b == b"bc")
        );
        assert!(out.take_front(Vec::new()).is_none());
        assert!(out.is_empty());
    }

    #[test]
    fn room_is_what_is_left_below_the_limit() {
        let mut out = Output::new();
        assert_eq!(out.room(), u64::MAX);
        out.set_limit(10);
        out.write(b"abcd");
        out.push_file(region(4));
        assert_eq!(out.room(), 2);
        out.write(b"xyz");
        assert_eq!(out.room(), 0);
    }

    #[test]
    fn empty_file_regions_are_ignored() {
        let mut out = Output::new();
        out.push_file(region(0));
        assert!(out.is_empty());
    }

    fn nodelay() -> Vec<SocketOption> {
        vec![SocketOption {
            level: libc::SOL_TCP,
            name: libc::TCP_NODELAY,
            value: 1i32.to_ne_bytes().to_vec(),
        }]
    }

    /// Socket options go between the bytes queued before and after them, before a file region
    /// queued after them at the same place, whether taken out or looked at and advanced.
    #[test]
    fn socket_options_go_between_what_came_before_and_after() {
        let build = || {
            let mut out = Output::new();
            out.write(b"handshake");
            out.push_socket_options(nodelay());
            out.push_file(region(4));
            out.write(b"after");
            out
        };
        let mut out = build();
        assert_eq!(out.total_len(), 18, "options have no length");
        assert!(matches!(out.take_front(Vec::new()), Some(Chunk::Bytes(b)) if b == b"handshake"));
        assert!(matches!(out.take_front(Vec::new()), Some(Chunk::Options(o)) if o == nodelay()));
        assert!(matches!(out.take_front(Vec::new()), Some(Chunk::File(f)) if f.len == 4));
        assert!(matches!(out.take_front(Vec::new()), Some(Chunk::Bytes(b)) if b == b"after"));
        assert!(out.take_front(Vec::new()).is_none() && out.is_empty());

        let mut out = build();
        assert!(matches!(out.front(), OutputFront::Bytes(b) if b == b"handshake"));
        out.advance(4);
        assert!(matches!(out.front(), OutputFront::Bytes(b) if b == b"shake"));
        out.advance(5);
        assert!(matches!(out.front(), OutputFront::Options(o) if o == nodelay()));
        out.advance(0);
        assert!(matches!(out.front(), OutputFront::File(f) if f.len == 4));
        out.advance(4);
        assert!(matches!(out.front(), OutputFront::Bytes(b) if b == b"after"));
        out.advance(5);
        assert!(out.is_empty());
    }

    /// Options alone still make the output non-empty (the runtime must take them), and
    /// `append` carries them over at their place.
    #[test]
    fn options_alone_are_output_and_append_keeps_their_place() {
        let mut inner = Output::new();
        inner.write(b"ab");
        inner.push_socket_options(nodelay());
        inner.write(b"cd");
        let mut out = Output::new();
        out.write(b"xy");
        out.append(&mut inner);
        assert!(inner.is_empty());
        assert!(matches!(out.take_front(Vec::new()), Some(Chunk::Bytes(b)) if b == b"xyab"));
        assert!(matches!(
            out.take_front(Vec::new()),
            Some(Chunk::Options(_))
        ));
        assert!(matches!(out.take_front(Vec::new()), Some(Chunk::Bytes(b)) if b == b"cd"));
        let mut only = Output::new();
        only.push_socket_options(nodelay());
        assert!(!only.is_empty());
        only.clear();
        assert!(only.is_empty());
    }

    /// A mark queued right after a file region goes after it (a TLS close_notify after a file
    /// the kernel sends), also when looked at and advanced.
    #[test]
    fn a_mark_after_a_file_region_goes_after_it() {
        let control = ControlMessage {
            level: 282,
            kind: 1,
            data: vec![21],
        };
        let build = || {
            let mut out = Output::new();
            out.write(b"head");
            out.push_file(region(3));
            out.push_control_message(control.clone(), vec![1, 0]);
            out
        };
        let mut out = build();
        assert!(matches!(out.take_front(Vec::new()), Some(Chunk::Bytes(b)) if b == b"head"));
        assert!(matches!(out.take_front(Vec::new()), Some(Chunk::File(f)) if f.len == 3));
        assert!(
            matches!(out.take_front(Vec::new()), Some(Chunk::Control(c, p)) if *c == control && p == [1, 0])
        );
        assert!(out.is_empty());
        let mut out = build();
        out.advance(4);
        assert!(matches!(out.front(), OutputFront::File(_)));
        out.advance(3);
        assert!(matches!(out.front(), OutputFront::Control(_, p) if p == [1, 0]));
        out.advance(2);
        assert!(out.is_empty());
    }
}
