//! One TLS connection: rustls's server state wrapped around the inner protocol's handler.
//!
//! Ciphertext in: fed to rustls, the plaintext it yields kept in `plain` (bounded) and given
//! to the inner handler as the runtime would give input. Its output (bytes and file regions)
//! goes into `inner_out`, then is encrypted into the connection's output as far as the
//! output's room allows: a file region the plain path sends with sendfile is read here, a
//! piece at a time, into records (user-space TLS has no zero-copy path). What is left
//! (plaintext the inner handler had no room to answer, output not yet encrypted, a close
//! waiting for them) is held: [`Handler::holds_input`] says so, and the runtime calls again
//! once the output drains.
//!
//! The handshake is bounded: bytes received before it completes (`handshake_bytes_max`: an
//! oversize ClientHello, or a flood of records) and time since the first byte
//! (`handshake_timeout`, checked at every byte that arrives: a client dribbling one byte at a
//! time). A client that goes silent before its handshake completes is closed by the runtime
//! after the same timeout ([`Handler::idle_timeout`]).

use std::io::Read as _;
use std::os::unix::fs::FileExt as _;
use std::time::{Duration, Instant};

use corelocal::runtime::{CloseReason, Handler, Next, Output, OutputFront, Step};
use rustls::ServerConnection;

/// Limits of one connection (from [`super::TlsConfig`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct ConnLimits {
    pub handshake_bytes_max: usize,
    pub handshake_timeout: Duration,
    pub plain_bytes_max: usize,
    /// Ciphers whose records go to the kernel after the handshake (see `super::kernel`).
    pub kernel: super::KernelCiphers,
}

/// The most of a file region read (and encrypted) in one go: one read, four full records.
const FILE_READ_BYTES_MAX: usize = 64 << 10;
/// Inner handler calls per `on_input`, as the runtime bounds its own.
const INNER_ROUNDS_MAX: usize = 256;

/// What one [`TlsConn::run_inner`] came to.
#[derive(Debug, Default)]
struct InnerRun {
    requests: u32,
    /// The inner handler asked to close.
    close: Option<CloseReason>,
    /// It stopped with requests left, for other connections' sake.
    yielded: bool,
    /// It took nothing of what `plain` holds.
    stalled: bool,
}

/// A TLS connection around the inner handler `H`.
pub struct TlsConn<H> {
    tls: ServerConnection,
    inner: H,
    /// Decrypted input the inner handler has not consumed.
    plain: Vec<u8>,
    /// The inner handler's output, not yet encrypted.
    inner_out: Output,
    /// Bytes received while handshaking, and when the first arrived.
    handshake: (usize, Option<Instant>),
    /// The inner handler (or the peer's close_notify) asked to close once its output is out.
    closing: Option<CloseReason>,
    /// Plaintext waits for output room, or output for encryption: see `holds_input`.
    held: bool,
    limits: ConnLimits,
    scratch: Vec<u8>,
    /// Where a failed handshake is counted.
    handle: super::TlsHandle,
}

impl<H: Handler> TlsConn<H> {
    pub(super) fn new(
        mut tls: ServerConnection,
        inner: H,
        limits: ConnLimits,
        handle: super::TlsHandle,
    ) -> TlsConn<H> {
        // rustls's own buffers unbounded: what goes in is bounded by the output's room and
        // `plain_bytes_max`, checked here.
        tls.set_buffer_limit(None);
        TlsConn {
            tls,
            inner,
            plain: Vec::new(),
            inner_out: Output::new(),
            handshake: (0, None),
            closing: None,
            held: false,
            limits,
            scratch: Vec::new(),
            handle,
        }
    }

    /// rustls's connection (protocol version, ALPN, resumption), for tests and logs.
    pub fn session(&self) -> &ServerConnection {
        &self.tls
    }

    /// Feeds ciphertext to rustls until it is all taken or `plain` is full; `Err` closes.
    /// While the records may still go to the kernel, whole records only, up to the end of
    /// the handshake (see `feed_records`).
    fn feed(&mut self, input: &[u8], out: &mut Output, now: Instant) -> Result<usize, CloseReason> {
        let mut taken = 0;
        if !self.limits.kernel.is_empty() {
            taken = self.feed_records(input, out, now)?;
            if self.kernel_ready() || self.tls.is_handshaking() {
                return Ok(taken);
            }
            // Not for the kernel (TLS 1.2, a cipher it does not take): rustls goes on.
            self.limits.kernel = super::KernelCiphers::none();
        }
        while taken < input.len() && self.plain.len() < self.limits.plain_bytes_max {
            let handshaking = self.tls.is_handshaking();
            let mut rest = &input[taken..];
            let n = match self.tls.read_tls(&mut rest) {
                Ok(0) | Err(_) => return Err(CloseReason::BadRequest),
                Ok(n) => n,
            };
            taken += n;
            if handshaking {
                self.check_handshake(n, now)?;
            }
            if let Err(_e) = self.tls.process_new_packets() {
                if handshaking {
                    self.handle.count_handshake_error();
                }
                // rustls queued the alert that says why: it goes out before the close.
                self.write_records(out);
                return Err(CloseReason::BadRequest);
            }
            if handshaking && !self.tls.is_handshaking() {
                self.handle.count_handshake_done(self.tls.handshake_kind());
            }
            self.take_plaintext()?;
        }
        Ok(taken)
    }

    /// Feeds rustls whole records, one at a time, while it handshakes: when the handshake
    /// completes no later record is in rustls, whose keys may then go to the kernel. A partial
    /// record stays in the runtime's input until the rest arrives.
    fn feed_records(
        &mut self,
        input: &[u8],
        out: &mut Output,
        now: Instant,
    ) -> Result<usize, CloseReason> {
        // The time bound holds while a record is still arriving (a byte a second).
        if !input.is_empty() {
            self.check_handshake(0, now)?;
        }
        let mut taken = 0;
        while self.tls.is_handshaking() {
            let rest = &input[taken..];
            if super::kernel::not_a_record(rest) {
                return Err(self.refuse(rest, out));
            }
            let Some(len) = super::ktls::record_len(rest) else {
                break;
            };
            let mut record = &rest[..len];
            while !record.is_empty() {
                if matches!(self.tls.read_tls(&mut record), Ok(0) | Err(_)) {
                    return Err(CloseReason::BadRequest);
                }
            }
            taken += len;
            self.check_handshake(len, now)?;
            if self.tls.process_new_packets().is_err() {
                self.handle.count_handshake_error();
                self.write_records(out);
                return Err(CloseReason::BadRequest);
            }
            if !self.tls.is_handshaking() {
                self.handle.count_handshake_done(self.tls.handshake_kind());
            }
        }
        Ok(taken)
    }

    /// Bytes that cannot be a TLS record (plain HTTP on the TLS port, a length TLS does
    /// not allow): rustls is given them to say why in its alert, which goes out before the
    /// close, after whatever the handshake had to send.
    fn refuse(&mut self, bytes: &[u8], out: &mut Output) -> CloseReason {
        let mut rest = bytes;
        let _ = self.tls.read_tls(&mut rest);
        let _ = self.tls.process_new_packets();
        self.handle.count_handshake_error();
        self.write_records(out);
        CloseReason::BadRequest
    }

    /// Whether the connection's records go to the kernel now: its handshake is done, TLS 1.3
    /// with a cipher the kernel takes, and nothing decrypted or waiting here.
    pub(super) fn kernel_ready(&self) -> bool {
        let suite = self.tls.negotiated_cipher_suite().map(|s| s.suite());
        !self.limits.kernel.is_empty()
            && !self.tls.is_handshaking()
            && self.tls.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3)
            && suite.is_some_and(|s| self.limits.kernel.takes(s))
            && self.plain.is_empty()
            && self.closing.is_none()
    }

    /// Hands the sending records to the kernel (see `super::kernel`): the handshake's last
    /// records go first, then the socket options with the keys, then the inner handler's
    /// waiting output as plaintext. `Err` when rustls keeps its keys.
    pub(super) fn into_kernel(
        mut self,
        out: &mut Output,
    ) -> Result<super::KernelTlsConn<H>, rustls::Error> {
        self.write_records(out);
        let suite = self.tls.negotiated_cipher_suite().map(|s| s.suite());
        let secrets = self.tls.dangerous_extract_secrets()?;
        let (tx_seq, tx) = secrets.tx;
        let (rx_seq, rx) = secrets.rx;
        let unknown = || rustls::Error::General("a suite the kernel does not know".into());
        let info = super::ktls::tls13_tx_info(tx_seq, &tx).ok_or_else(unknown)?;
        // The same struct for the receiving keys (its sequence number is set at the switch).
        let rx_info = suite
            .is_some_and(|s| self.limits.kernel.takes_rx(s))
            .then(|| super::ktls::tls13_tx_info(rx_seq, &rx))
            .flatten();
        let opener = super::ktls::RecordOpener::new(rx_seq, rx).ok_or_else(unknown)?;
        out.push_socket_options(super::kernel::tx_options(info));
        out.append(&mut self.inner_out);
        if rx_info.is_some() {
            // The receiving side follows once the runtime stopped reading (`on_recv_stopped`).
            out.stop_receiving();
        }
        self.handle.count_kernel_connection();
        Ok(super::KernelTlsConn::new(
            self.inner,
            opener,
            rx_info,
            self.limits.plain_bytes_max,
        ))
    }

    /// Bounds the handshake: bytes and time since its first byte.
    fn check_handshake(&mut self, arrived: usize, now: Instant) -> Result<(), CloseReason> {
        let (bytes, started) = &mut self.handshake;
        let started = *started.get_or_insert(now);
        *bytes += arrived;
        if *bytes > self.limits.handshake_bytes_max {
            return Err(CloseReason::TooLarge);
        }
        if now.saturating_duration_since(started) > self.limits.handshake_timeout {
            return Err(CloseReason::TimedOut);
        }
        Ok(())
    }

    /// Moves the plaintext rustls decrypted into `plain`; the peer's close_notify ends input.
    fn take_plaintext(&mut self) -> Result<(), CloseReason> {
        loop {
            let at = self.plain.len();
            self.plain.resize(at + 4096, 0);
            match self.tls.reader().read(&mut self.plain[at..]) {
                Ok(n) => {
                    self.plain.truncate(at + n);
                    if n == 0 {
                        // close_notify: no more requests will come.
                        self.closing.get_or_insert(CloseReason::Done);
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.plain.truncate(at);
                    return Ok(());
                }
                Err(_) => {
                    // Closed without close_notify (a truncation attack, or a careless peer).
                    self.plain.truncate(at);
                    return Err(CloseReason::BadRequest);
                }
            }
        }
    }

    /// Runs the inner handler over `plain` while it makes progress and has room.
    fn run_inner(&mut self, room: u64, now: Instant) -> InnerRun {
        let mut run = InnerRun::default();
        self.inner_out.set_limit(room);
        for round in 0..INNER_ROUNDS_MAX {
            if self.plain.is_empty() || self.inner_out.room() == 0 {
                return run;
            }
            let step = self.inner.on_input(&self.plain, &mut self.inner_out, now);
            self.plain.drain(..step.consumed.min(self.plain.len()));
            run.requests += step.requests;
            if let Next::Close(reason) = step.next {
                run.close = Some(reason);
                return run;
            }
            // Its own yield (memcached's requests per event), or out of rounds with requests
            // left: the rest runs at the connection's next turn, as the runtime does.
            if step.yielded || (round + 1 == INNER_ROUNDS_MAX && !self.plain.is_empty()) {
                run.yielded = true;
                return run;
            }
            if step.consumed == 0 {
                // Waiting for more of a request (or, with `plain` full, one too large).
                run.stalled = true;
                return run;
            }
        }
        run
    }

    /// Encrypts the inner output into `out` while it has room; true when all of it went.
    fn encrypt(&mut self, out: &mut Output) -> bool {
        if self.tls.is_handshaking() {
            // Written now it would wait in rustls's buffer: it stays here until then.
            return self.inner_out.is_empty();
        }
        while out.room() > 0 && !self.inner_out.is_empty() {
            let room = usize::try_from(out.room()).unwrap_or(usize::MAX);
            let n = match self.inner_out.front() {
                OutputFront::Empty => break,
                OutputFront::Options(options) => {
                    // The inner handler's own socket options (none of ours has any): set once
                    // the records before them are out.
                    let options = options.to_vec();
                    self.write_records(out);
                    out.push_socket_options(options);
                    self.inner_out.advance(0);
                    continue;
                }
                OutputFront::Control(_, payload) => {
                    // A control message means something to the socket, not to TLS records
                    // made here: its bytes go as records, the control message is dropped.
                    let n = payload.len();
                    let _ = self.tls.writer().write_all_plain(payload);
                    n
                }
                OutputFront::Bytes(b) => {
                    let n = b.len().min(room.max(1));
                    let _ = self.tls.writer().write_all_plain(&b[..n]);
                    n
                }
                OutputFront::File(region) => {
                    let n = (region.len as usize)
                        .min(room.max(1))
                        .min(FILE_READ_BYTES_MAX);
                    self.scratch.resize(n, 0);
                    if region
                        .file
                        .read_exact_at(&mut self.scratch, region.offset)
                        .is_err()
                    {
                        // The file shrank or failed under us: the response cannot complete.
                        self.inner_out.clear();
                        self.closing = Some(CloseReason::BadRequest);
                        break;
                    }
                    let _ = self.tls.writer().write_all_plain(&self.scratch);
                    n
                }
            };
            self.inner_out.advance(n);
            self.write_records(out);
        }
        self.write_records(out);
        self.inner_out.is_empty()
    }

    /// Moves rustls's pending records (handshake, data, alerts) into `out`.
    fn write_records(&mut self, out: &mut Output) {
        while self.tls.wants_write() {
            if self.tls.write_tls(out.bytes_mut()).is_err() {
                break;
            }
        }
    }

    /// After the inner handler ran: encrypt what it said; close once all of it went.
    fn finish(&mut self, out: &mut Output, consumed: usize, requests: u32, more: bool) -> Step {
        let all_out = self.encrypt(out);
        if let Some(reason) = self.closing.filter(|_| all_out && !more) {
            self.tls.send_close_notify();
            self.write_records(out);
            self.held = false;
            return Step::close(consumed, requests, reason);
        }
        // Decrypted requests left (the output was full, or one is partial: then the extra
        // call the runtime makes finds nothing to do) are run again once the output drains.
        self.held = !all_out || !self.plain.is_empty() || self.closing.is_some();
        Step::read(consumed, requests)
    }
}

/// `write_all` on rustls's writer: its buffer for plaintext is unbounded (the output's room
/// bounds what goes in).
trait WriteAllPlain {
    fn write_all_plain(&mut self, data: &[u8]) -> std::io::Result<()>;
}

impl WriteAllPlain for rustls::Writer<'_> {
    fn write_all_plain(&mut self, data: &[u8]) -> std::io::Result<()> {
        std::io::Write::write_all(self, data)
    }
}

impl<H: Handler> Handler for TlsConn<H> {
    fn on_input(&mut self, input: &[u8], out: &mut Output, now: Instant) -> Step {
        let (mut consumed, mut requests, mut yielded) = (0, 0, false);
        // The inner handler (or its input limit) closes: no on_eof for it then.
        let mut inner_closed = false;
        // Decrypt and run by turns: `plain` holds at most `plain_bytes_max`, so a long
        // pipeline (70,000 noreply sets) goes through in pieces. Bounded like the runtime's.
        for _ in 0..INNER_ROUNDS_MAX {
            let taken = match self.feed(&input[consumed..], out, now) {
                Ok(n) => n,
                Err(reason) => return Step::close(input.len(), requests, reason),
            };
            consumed += taken;
            if self.tls.is_handshaking() || self.kernel_ready() {
                // Handshaking, or done with the rest for the kernel (`MaybeTls::move_to_kernel`).
                self.write_records(out);
                return Step::read(consumed, requests);
            }
            let run = self.run_inner(out.room(), now);
            requests += run.requests;
            if let Some(reason) = run.close {
                self.closing = Some(reason);
                inner_closed = true;
                break;
            }
            let full = self.plain.len() >= self.limits.plain_bytes_max;
            if run.stalled && full && self.inner_out.room() > 0 {
                // A request larger than the inner handler takes, however far it is decrypted.
                self.inner
                    .on_input_limit(&self.plain, &mut self.inner_out, now);
                self.closing = Some(CloseReason::TooLarge);
                inner_closed = true;
                break;
            }
            if run.yielded {
                yielded = true;
                break;
            }
            let progress = taken > 0 || !run.stalled;
            if consumed == input.len() || full || self.inner_out.room() == 0 || !progress {
                break;
            }
        }
        if self.closing.is_some() && !self.plain.is_empty() && !yielded && !inner_closed {
            // close_notify after a partial request: the inner handler says what it does.
            let next = self.inner.on_eof(&self.plain, &mut self.inner_out, now);
            self.plain.clear();
            if let Next::Close(reason) = next {
                self.closing = Some(reason);
            }
        }
        // The peer's close_notify waits for the requests a yield left.
        let step = self.finish(out, consumed, requests, yielded && !inner_closed);
        match step.next {
            Next::Read if yielded => Step::yielded(step.consumed, step.requests),
            _ => step,
        }
    }

    fn on_input_limit(&mut self, _input: &[u8], out: &mut Output, _now: Instant) {
        // Ciphertext piled up while `plain` stayed full: whatever alert rustls has goes out.
        self.write_records(out);
    }

    fn on_connect(&mut self, out: &mut Output, now: Instant) -> Next {
        // A greeting waits in `inner_out` until the handshake completes.
        let next = self.inner.on_connect(&mut self.inner_out, now);
        if let Next::Close(reason) = next {
            // Refused at accept (kv over its connection limit): as memcached, its line goes
            // out in the clear before any TLS, and the connection closes; no handshake is
            // spent on a connection that will not be served.
            if let OutputFront::Bytes(line) = self.inner_out.front() {
                out.write(line);
            }
            self.inner_out.clear();
            return Next::Close(reason);
        }
        Next::Read
    }

    fn on_eof(&mut self, _input: &[u8], out: &mut Output, now: Instant) -> Next {
        if self.tls.is_handshaking() {
            return Next::Close(CloseReason::Done);
        }
        let next = self.inner.on_eof(&self.plain, &mut self.inner_out, now);
        self.plain.clear();
        // Nothing more will be read: what the inner handler said goes out now, all of it.
        out.set_limit(u64::MAX);
        self.encrypt(out);
        self.tls.send_close_notify();
        self.write_records(out);
        next
    }

    fn on_notify(&mut self, out: &mut Output, now: Instant) -> Next {
        // Output the inner handler makes unasked (kv's `watch` log lines), encrypted as its
        // answers are; before the handshake completes it has nowhere to go yet.
        if self.tls.is_handshaking() {
            return Next::Read;
        }
        self.inner_out.set_limit(out.room());
        let next = self.inner.on_notify(&mut self.inner_out, now);
        let all_out = self.encrypt(out);
        // What did not fit goes once the output drains (`holds_input`).
        self.held |= !all_out;
        next
    }

    fn on_idle_close(&mut self, out: &mut Output) {
        // As memcached's TLS does at its idle kick: close_notify, so that the client reads an
        // orderly end (and does not write into a reset connection).
        if !self.tls.is_handshaking() {
            self.tls.send_close_notify();
            self.write_records(out);
        }
    }

    fn on_drain(&mut self) -> bool {
        self.inner.on_drain()
    }

    fn expects_input(&self) -> bool {
        self.inner.expects_input()
    }

    fn holds_input(&self) -> bool {
        self.held
    }

    fn idle_timeout(&self) -> Option<Duration> {
        // Until the handshake completes, silence closes after the handshake timeout.
        self.tls
            .is_handshaking()
            .then_some(self.limits.handshake_timeout)
    }

    fn handoff(&self) -> Option<Vec<u8>> {
        // rustls's session state cannot move to another process: the connection stays here
        // until it closes.
        None
    }
}
