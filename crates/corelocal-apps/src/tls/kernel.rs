//! kTLS: a TLS 1.3 connection's records handed to the kernel once rustls completed its
//! handshake, where the kernel offers the `tls` ULP and takes the negotiated cipher.
//!
//! - **TX in the kernel**: the handshake's last records (TLS 1.3's session tickets) go out
//!   first; then the runtime attaches the ULP and sets TLS_TX with the extracted keys and
//!   sequence number ([`Output::push_socket_options`]), and everything after is written as
//!   plaintext: the kernel makes the records, and a file region goes from the page cache
//!   (sendfile on epoll) without passing through a user-space encryption buffer.
//! - **RX in user space** ([`RecordOpener`]): the runtime's receive is armed all along and
//!   may already hold bytes past the handshake, so the kernel could not start reading at a
//!   record boundary; records are opened here with the extracted keys, as rustls would.
//! - rustls is fed whole records, one at a time, until its handshake completes (see
//!   `TlsConn::feed_records`), so that no record after the handshake is in rustls when its
//!   keys are taken out.
//! - Alerts (close_notify at an orderly close, a fatal alert for a record that does not open)
//!   are records of their own type: sent with a control message (`TLS_SET_RECORD_TYPE`,
//!   [`Output::push_control_message`]), so the kernel makes them in sequence with the data.
//! - What this gives up: no key update from the peer (the connection closes), and no move at
//!   an upgrade (the keys stay in this process). TLS 1.2 connections stay with rustls.

use super::ktls::{KernelCipher, RecordError, RecordOpener};
use corelocal::runtime::{CloseReason, ControlMessage, Handler, Next, Output, SocketOption, Step};
use std::time::{Duration, Instant};

/// Inner handler calls per `on_input`, as the runtime bounds its own.
const INNER_ROUNDS_MAX: usize = 256;

/// The ciphers this kernel takes as TLS_TX, and as TLS_RX (probed once at start): one bit
/// per cipher for TX, the same three bits higher for RX.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelCiphers(u8);

impl KernelCiphers {
    const ALL: [KernelCipher; 3] = [
        KernelCipher::Aes128Gcm,
        KernelCipher::Aes256Gcm,
        KernelCipher::Chacha20Poly1305,
    ];

    const RX_SHIFT: u8 = 3;
    const TX_BITS: u8 = 0b111;

    /// None: records stay in user space.
    pub fn none() -> KernelCiphers {
        KernelCiphers(0)
    }

    /// Asks the kernel which ciphers it takes as TLS_TX (a loopback connection per cipher);
    /// the reason when it takes none.
    pub fn probe() -> Result<KernelCiphers, String> {
        if let corelocal::sys::ktls::TlsUlp::Absent(why) = corelocal::sys::ktls::tls_ulp() {
            return Err(why);
        }
        let mut found = KernelCiphers::none();
        let mut why = String::new();
        for cipher in Self::ALL {
            match corelocal::sys::ktls::tx_accepts(&cipher.probe_info()) {
                Ok(()) => found.0 |= Self::bit(cipher),
                Err(e) => why = format!("the kernel refuses TLS_TX: {e}"),
            }
            // RX only with TX: a connection hands its receiving side over after its sending.
            if found.0 & Self::bit(cipher) != 0
                && corelocal::sys::ktls::rx_accepts(&cipher.probe_info()).is_ok()
            {
                found.0 |= Self::bit(cipher) << Self::RX_SHIFT;
            }
        }
        if found.is_empty() {
            return Err(why);
        }
        Ok(found)
    }

    /// Every cipher (tests: records are checked in memory, no kernel involved).
    #[cfg(test)]
    pub fn all() -> KernelCiphers {
        KernelCiphers(0b111)
    }

    fn bit(cipher: KernelCipher) -> u8 {
        match cipher {
            KernelCipher::Aes128Gcm => 1,
            KernelCipher::Aes256Gcm => 2,
            KernelCipher::Chacha20Poly1305 => 4,
        }
    }

    /// These, and as TLS_RX too (tests).
    #[cfg(test)]
    pub fn with_rx(self) -> KernelCiphers {
        KernelCiphers(self.0 | (self.0 & Self::TX_BITS) << Self::RX_SHIFT)
    }

    /// Whether none is taken.
    pub fn is_empty(self) -> bool {
        self.0 & Self::TX_BITS == 0
    }

    fn cipher_of(suite: rustls::CipherSuite) -> Option<KernelCipher> {
        match suite {
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => Some(KernelCipher::Aes128Gcm),
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => Some(KernelCipher::Aes256Gcm),
            rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => {
                Some(KernelCipher::Chacha20Poly1305)
            }
            _ => None,
        }
    }

    /// Whether the kernel takes the TLS 1.3 suite a connection negotiated (as TLS_TX).
    pub fn takes(self, suite: rustls::CipherSuite) -> bool {
        Self::cipher_of(suite).is_some_and(|c| self.0 & Self::bit(c) != 0)
    }

    /// Whether the kernel also opens that suite's records (TLS_RX).
    pub fn takes_rx(self, suite: rustls::CipherSuite) -> bool {
        Self::cipher_of(suite).is_some_and(|c| self.0 & Self::bit(c) << Self::RX_SHIFT != 0)
    }

    /// The TX ciphers by name, for the start line.
    pub fn names(self) -> Vec<&'static str> {
        self.names_at(0)
    }

    /// The RX ciphers by name.
    pub fn rx_names(self) -> Vec<&'static str> {
        self.names_at(Self::RX_SHIFT)
    }

    fn names_at(self, shift: u8) -> Vec<&'static str> {
        Self::ALL
            .into_iter()
            .filter(|c| self.0 & Self::bit(*c) << shift != 0)
            .map(KernelCipher::name)
            .collect()
    }
}

/// kTLS's control message type that sets the record type of what goes with it.
const TLS_SET_RECORD_TYPE: i32 = 1;
/// TLS's alert record type.
const ALERT: u8 = 21;

/// Queues an alert record (`level`, `description`) for the kernel to make and send.
fn alert(out: &mut Output, level: u8, description: u8) {
    let control = ControlMessage {
        level: corelocal::sys::ktls::SOL_TLS,
        kind: TLS_SET_RECORD_TYPE,
        data: vec![ALERT],
    };
    out.push_control_message(control, vec![level, description]);
}

/// close_notify: the orderly end of what this side sends (RFC 8446 §6.1).
fn close_notify(out: &mut Output) {
    alert(out, 1, 0);
}

/// The fatal alert that says why a received record was refused (none for the peer's own
/// fatal alert).
fn refusal(error: RecordError) -> Option<u8> {
    match error {
        RecordError::Bad => Some(20),      // bad_record_mac
        RecordError::Overflow => Some(22), // record_overflow
        RecordError::Unexpected(_) | RecordError::Handshake => Some(10), // unexpected_message
        RecordError::SeqExhausted => Some(80), // internal_error
        RecordError::Alert(_) => None,
    }
}

/// The socket options that hand a connection's sending records to the kernel.
pub(super) fn tx_options(info: Vec<u8>) -> Vec<SocketOption> {
    vec![
        SocketOption {
            level: libc::SOL_TCP,
            name: libc::TCP_ULP,
            value: b"tls".to_vec(),
        },
        SocketOption {
            level: corelocal::sys::ktls::SOL_TLS,
            name: corelocal::sys::ktls::TLS_TX,
            value: info,
        },
    ]
}

/// The TLS_RX option: `info` (a crypto_info made for the receiving keys) with its record
/// sequence number, the struct's last 8 bytes in every cipher's layout, set to `seq`.
fn rx_option(mut info: Vec<u8>, seq: u64) -> SocketOption {
    let at = info.len() - 8;
    info[at..].copy_from_slice(&seq.to_be_bytes());
    SocketOption {
        level: corelocal::sys::ktls::SOL_TLS,
        name: corelocal::sys::ktls::TLS_RX,
        value: info,
    }
}

/// A TLS 1.3 connection after its handshake: the kernel makes the records it sends; the
/// records it receives are opened here until the kernel takes them too (kTLS RX, where it
/// can: see [`KernelTlsConn::on_recv_stopped`]); the inner handler reads plaintext and
/// writes plaintext.
pub struct KernelTlsConn<H> {
    inner: H,
    /// Opens the received records until TLS_RX is set; `None` once it is (here, or in the
    /// predecessor of a connection moved at an upgrade): the kernel opens them.
    rx: Option<RecordOpener>,
    /// The receiving keys as a TLS_RX crypto_info (sequence number set at the switch), while
    /// the switch may still happen; wiped when dropped (a [`SocketOption`]).
    rx_info: Option<SocketOption>,
    /// Opened input the inner handler has not consumed.
    plain: Vec<u8>,
    plain_bytes_max: usize,
    /// The peer's close_notify came: nothing more is read.
    peer_closed: bool,
}

impl<H: Handler> KernelTlsConn<H> {
    /// With `rx_info` (the receiving keys' crypto_info), the receiving side goes to the
    /// kernel too once the runtime stopped reading at a record boundary.
    pub(super) fn new(
        inner: H,
        rx: RecordOpener,
        rx_info: Option<Vec<u8>>,
        plain_bytes_max: usize,
    ) -> KernelTlsConn<H> {
        KernelTlsConn {
            inner,
            rx: Some(rx),
            rx_info: rx_info.map(|info| rx_option(info, 0)),
            plain: Vec::new(),
            plain_bytes_max,
            peer_closed: false,
        }
    }

    /// TLS_RX is set (or was, in the predecessor): the input is plaintext the kernel opened.
    fn rx_in_kernel(&self) -> bool {
        self.rx.is_none()
    }

    /// A connection moved from the predecessor at an upgrade with both directions in the
    /// kernel (the socket carries the keys and sequence numbers): plaintext both ways.
    pub(super) fn resumed(inner: H, plain_bytes_max: usize) -> KernelTlsConn<H> {
        KernelTlsConn {
            inner,
            rx: None,
            rx_info: None,
            plain: Vec::new(),
            plain_bytes_max,
            peer_closed: false,
        }
    }

    /// Opens what whole records `input` holds (bounded by `plain_bytes_max`); how many bytes.
    /// A record refused: its fatal alert is queued, and the connection closes.
    fn open(&mut self, input: &[u8], out: &mut Output) -> Result<usize, CloseReason> {
        if self.peer_closed {
            return Ok(0);
        }
        if self.rx_in_kernel() {
            let n = input
                .len()
                .min(self.plain_bytes_max.saturating_sub(self.plain.len()));
            self.plain.extend_from_slice(&input[..n]);
            return Ok(n);
        }
        let Some(rx) = self.rx.as_mut() else {
            unreachable!("without an opener the kernel opens the records");
        };
        match rx.open(input, &mut self.plain, self.plain_bytes_max) {
            Ok(opened) => {
                self.peer_closed |= opened.close_notify;
                Ok(opened.consumed)
            }
            Err(error) => {
                if let Some(description) = refusal(error) {
                    alert(out, 2, description);
                }
                Err(CloseReason::BadRequest)
            }
        }
    }

    /// After the peer's close_notify: the inner handler says what it does with the rest.
    fn finish_input(
        &mut self,
        out: &mut Output,
        now: Instant,
        consumed: usize,
        requests: u32,
    ) -> Step {
        let next = self.inner.on_eof(&self.plain, out, now);
        self.plain.clear();
        close_notify(out);
        match next {
            Next::Close(reason) => Step::close(consumed, requests, reason),
            _ => Step::close(consumed, requests, CloseReason::Done),
        }
    }
}

impl<H: Handler> Handler for KernelTlsConn<H> {
    fn on_input(&mut self, input: &[u8], out: &mut Output, now: Instant) -> Step {
        let (mut consumed, mut requests) = (0, 0);
        for _ in 0..INNER_ROUNDS_MAX {
            let taken = match self.open(&input[consumed..], out) {
                Ok(n) => n,
                Err(reason) => return Step::close(input.len(), requests, reason),
            };
            consumed += taken;
            if self.plain.is_empty() {
                break;
            }
            let step = self.inner.on_input(&self.plain, out, now);
            self.plain.drain(..step.consumed.min(self.plain.len()));
            requests += step.requests;
            if let Next::Close(reason) = step.next {
                close_notify(out);
                return Step::close(consumed, requests, reason);
            }
            if step.yielded {
                return Step::yielded(consumed, requests);
            }
            if step.consumed == 0 && self.plain.len() >= self.plain_bytes_max {
                // A request larger than the inner handler takes.
                self.inner.on_input_limit(&self.plain, out, now);
                close_notify(out);
                return Step::close(consumed, requests, CloseReason::TooLarge);
            }
            if (step.consumed == 0 && taken == 0) || out.room() == 0 {
                break;
            }
        }
        if self.peer_closed && (self.plain.is_empty() || out.room() > 0) {
            return self.finish_input(out, now, input.len(), requests);
        }
        Step::read(consumed, requests)
    }

    fn on_input_limit(&mut self, _input: &[u8], _out: &mut Output, _now: Instant) {
        // Ciphertext piled up while `plain` stayed full: nothing to say in the clear.
    }

    /// The runtime stopped reading (asked for when the handshake handed TX over): every
    /// record read so far was offered to `on_input`. With none of them left partial or
    /// unopened here, the socket's next byte starts a record: TLS_RX with the next record's
    /// sequence number, set before anything more is read. Else the records stay here.
    fn on_recv_stopped(&mut self, input: &[u8], out: &mut Output, _now: Instant) {
        let Some(mut option) = self.rx_info.take() else {
            return;
        };
        if !input.is_empty() || self.peer_closed {
            return; // A partial record (or the end): opened here, as before.
        }
        let Some(rx) = self.rx.take() else {
            return;
        };
        option = rx_option(std::mem::take(&mut option.value), rx.seq());
        out.push_socket_options(vec![option]);
    }

    fn on_eof(&mut self, _input: &[u8], out: &mut Output, now: Instant) -> Next {
        let next = self.inner.on_eof(&self.plain, out, now);
        self.plain.clear();
        // Nothing more will be read: what the inner handler said, then the orderly end.
        out.set_limit(u64::MAX);
        close_notify(out);
        next
    }

    fn on_notify(&mut self, out: &mut Output, now: Instant) -> Next {
        self.inner.on_notify(out, now)
    }

    fn on_idle_close(&mut self, out: &mut Output) {
        // As rustls's side does (and memcached's TLS at its idle kick): an orderly end.
        self.inner.on_idle_close(out);
        close_notify(out);
    }

    fn on_drain(&mut self) -> bool {
        self.inner.on_drain()
    }

    fn expects_input(&self) -> bool {
        self.inner.expects_input()
    }

    fn holds_input(&self) -> bool {
        !self.plain.is_empty()
    }

    fn idle_timeout(&self) -> Option<Duration> {
        self.inner.idle_timeout()
    }

    fn handoff(&self) -> Option<Vec<u8>> {
        // With both directions in the kernel the socket carries all of TLS's state (no open
        // record: the last send went without MSG_MORE), and the connection moves as a plain
        // one does, between two requests. While the receiving keys live here, it stays.
        if !self.rx_in_kernel() || !self.plain.is_empty() || self.peer_closed {
            return None;
        }
        self.inner.handoff()
    }
}

/// What rustls would refuse before a record is whole: a content type TLS does not have, a
/// version other than 3.x, a length TLS does not allow. Refused at once (rustls sends its
/// alert) instead of waiting for a record that will never be one.
pub(super) fn not_a_record(input: &[u8]) -> bool {
    const RECORD_BYTES_MAX: usize = 5 + (1 << 14) + 2048;
    let bad_type = input.first().is_some_and(|t| !(20..=23).contains(t));
    let bad_version = input.get(1).is_some_and(|v| *v != 3);
    let too_long = input.len() >= 5
        && 5 + u16::from_be_bytes([input[3], input[4]]) as usize > RECORD_BYTES_MAX;
    bad_type || bad_version || too_long
}

/// Connections driven in memory: a rustls client on one side, [`super::MaybeTls`] on the
/// other, and the kernel played by a sealer made from the socket options the connection
/// asked for (the kernel's own records are checked in the lab, bench/lab: `ktls`).
#[cfg(test)]
mod tests {
    use super::super::ktls::tests::{cert_dir, Sealer, SUITES};
    use super::super::{CertFiles, MaybeTls, TlsConfig, TlsService};
    use super::*;
    use crate::tls::ktls::tests::parse_info;
    use corelocal::runtime::{Chunk, ConnInfo, Service};
    use rustls::crypto::ring::default_provider;
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use rustls::{ClientConfig, ClientConnection, RootCertStore, SupportedCipherSuite};
    use std::io::{Read as _, Write as _};
    use std::sync::Arc;

    /// `x\n` → `got x\n`; `big\n` → 40,000 bytes; `quit\n` → close.
    struct Lines;
    struct LineConn;

    impl Handler for LineConn {
        fn on_input(&mut self, input: &[u8], out: &mut Output, _now: Instant) -> Step {
            let Some(end) = input.iter().position(|&b| b == b'\n') else {
                return Step::read(0, 0);
            };
            match &input[..end] {
                b"quit" => return Step::close(end + 1, 1, CloseReason::Done),
                b"big" => out.write(&big()),
                line => {
                    out.write(b"got ");
                    out.write(line);
                    out.write(b"\n");
                }
            }
            Step::read(end + 1, 1)
        }
    }

    impl Service for Lines {
        type Conn = LineConn;
        fn name(&self) -> &'static str {
            "lines"
        }
        fn connect(&self, _info: &ConnInfo) -> LineConn {
            LineConn
        }
    }

    fn big() -> Vec<u8> {
        (0..40_000u32).map(|i| (i % 251) as u8).collect()
    }

    fn service() -> TlsService<Lines> {
        service_timing_out_after(Duration::from_secs(10))
    }

    fn service_with(ciphers: KernelCiphers) -> TlsService<Lines> {
        let mut service = service();
        service.assume_kernel_ciphers(ciphers);
        service
    }

    fn service_timing_out_after(handshake_timeout: Duration) -> TlsService<Lines> {
        let config = TlsConfig {
            handshake_timeout,
            certs: vec![CertFiles {
                chain: cert_dir().join("ecdsa.pem"),
                key: cert_dir().join("ecdsa.key"),
            }],
            alpn: Vec::new(),
            ..TlsConfig::default()
        };
        let mut service = TlsService::new(Arc::new(Lines), config).unwrap();
        service.assume_kernel_ciphers(KernelCiphers::all());
        service
    }

    fn client(suite: SupportedCipherSuite, tls12: bool) -> ClientConnection {
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(cert_dir().join("ca.pem")).unwrap() {
            roots.add(ca.unwrap()).unwrap();
        }
        let suites = match tls12 {
            true => default_provider().cipher_suites,
            false => vec![suite],
        };
        let provider = CryptoProvider {
            cipher_suites: suites,
            ..default_provider()
        };
        let versions: &[&rustls::SupportedProtocolVersion] = match tls12 {
            true => &[&rustls::version::TLS12],
            false => &[&rustls::version::TLS13],
        };
        let config = ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from("localhost").unwrap();
        ClientConnection::new(Arc::new(config), name).unwrap()
    }

    /// One connection: the server's handler, the client, and the "kernel" once asked for.
    struct Pair {
        server: MaybeTls<LineConn>,
        client: ClientConnection,
        kernel: Option<Sealer>,
        /// The TLS_TX and TLS_RX crypto_infos the server set, if it did.
        tx_info: Option<Vec<u8>>,
        rx_info: Option<Vec<u8>>,
        input: Vec<u8>,
        /// Plaintext the client read.
        received: Vec<u8>,
        /// The client read the server's close_notify.
        saw_close_notify: bool,
        /// What the client's rustls said of the server's records (an alert it received).
        client_error: Option<rustls::Error>,
        closed: Option<CloseReason>,
    }

    impl Pair {
        fn new(service: &TlsService<Lines>, client: ClientConnection) -> Pair {
            let server = service.connect(&ConnInfo {
                listener: 0,
                worker: 0,
                peer: None,
                now: Instant::now(),
                notify: None,
            });
            Pair {
                server,
                client,
                kernel: None,
                tx_info: None,
                rx_info: None,
                input: Vec::new(),
                received: Vec::new(),
                saw_close_notify: false,
                client_error: None,
                closed: None,
            }
        }

        /// Client → server → client, until neither side has anything more to say. As the
        /// runtime does, the server's handler is called only when bytes arrived (or it holds
        /// input): what it leaves unconsumed waits for more.
        fn pump(&mut self) {
            for _ in 0..64 {
                let before = self.input.len();
                while self.client.wants_write() {
                    self.client.write_tls(&mut self.input).unwrap();
                }
                if self.input.len() == before && !self.server.holds_input() {
                    return;
                }
                let mut out = Output::new();
                let step = self.server.on_input(&self.input, &mut out, Instant::now());
                self.input.drain(..step.consumed);
                if let Next::Close(reason) = step.next {
                    self.closed = Some(reason);
                }
                let stop = out.recv_stop_asked();
                self.deliver(&mut out);
                if stop {
                    // As the runtime: reading stops, the handler is told with what is unread.
                    let mut out = Output::new();
                    self.server
                        .on_recv_stopped(&self.input, &mut out, Instant::now());
                    self.deliver(&mut out);
                }
            }
            panic!("no end to the exchange");
        }

        /// What the server's output holds reaches the client, through the "kernel" after
        /// the socket options.
        fn deliver(&mut self, out: &mut Output) {
            while let Some(chunk) = out.take_front(Vec::new()) {
                match chunk {
                    Chunk::Options(options) if options[0].name == corelocal::sys::ktls::TLS_RX => {
                        assert!(self.kernel.is_some(), "RX after TX");
                        assert!(self.rx_info.is_none(), "once per connection");
                        self.rx_info = Some(options[0].value.clone());
                    }
                    Chunk::Options(options) => {
                        assert_eq!(options[0].value, b"tls", "the ULP first");
                        self.tx_info = Some(options[1].value.clone());
                        assert!(self.kernel.is_none(), "once per connection");
                        self.kernel = Some(Sealer::from_info(&options[1].value));
                    }
                    Chunk::Bytes(bytes) => self.send_to_client(&bytes),
                    Chunk::Control(control, payload) => {
                        // An alert record: made by the kernel, with the type the control says.
                        let kernel = self.kernel.as_mut().expect("only after the options");
                        let record = kernel.seal(control.data[0], &payload, 0);
                        self.feed_client(&record);
                    }
                    Chunk::File(_) => panic!("no file regions here"),
                }
            }
        }

        fn send_to_client(&mut self, bytes: &[u8]) {
            let records = match self.kernel.as_mut() {
                // The kernel cuts plaintext into records of at most 16 KiB.
                Some(kernel) => bytes
                    .chunks(16 << 10)
                    .flat_map(|piece| kernel.seal(23, piece, 0))
                    .collect(),
                None => bytes.to_vec(),
            };
            self.feed_client(&records);
        }

        /// Records to the client, read out as they come (rustls holds 16 KiB unread at most).
        fn feed_client(&mut self, records: &[u8]) {
            let mut rest = records;
            while !rest.is_empty() && self.client_error.is_none() {
                self.client.read_tls(&mut rest).unwrap();
                if let Err(e) = self.client.process_new_packets() {
                    self.client_error = Some(e);
                    return;
                }
                let mut got = vec![0; 1 << 20];
                loop {
                    match self.client.reader().read(&mut got) {
                        Ok(0) => {
                            self.saw_close_notify = true;
                            break;
                        }
                        Ok(n) => self.received.extend_from_slice(&got[..n]),
                        Err(_) => break,
                    }
                }
            }
        }

        fn request(&mut self, line: &[u8]) -> Vec<u8> {
            self.client.writer().write_all(line).unwrap();
            self.pump();
            self.read()
        }

        fn read(&mut self) -> Vec<u8> {
            std::mem::take(&mut self.received)
        }

        fn in_kernel(&self) -> bool {
            matches!(self.server, MaybeTls::Kernel(_))
        }
    }

    /// TLS 1.3, each suite: the request sent with the client's Finished is answered, the
    /// connection's records go to the kernel (once), requests and a 40,000-byte answer over
    /// several kernel records follow, close_notify closes.
    #[test]
    fn a_tls13_connection_moves_to_the_kernel_after_its_handshake() {
        for (suite, _) in SUITES {
            let service = service();
            let mut pair = Pair::new(&service, client(suite, false));
            // Written before the handshake completes: it goes right behind the Finished.
            pair.client.writer().write_all(b"first\n").unwrap();
            pair.pump();
            assert!(pair.in_kernel(), "{suite:?}");
            assert_eq!(pair.read(), b"got first\n", "{suite:?}");
            assert_eq!(pair.request(b"second\n"), b"got second\n");
            let all = pair.request(b"big\n");
            assert!(
                all == big(),
                "{suite:?}: the big answer differs ({} bytes)",
                all.len()
            );
            assert!(!pair.saw_close_notify);
            pair.client.send_close_notify();
            pair.pump();
            assert_eq!(pair.closed, Some(CloseReason::Done));
            assert!(
                pair.saw_close_notify,
                "the server's close_notify, made by the kernel"
            );
            assert_eq!(service.handle().kernel_connections(), 1);
        }
    }

    /// With the kernel taking TLS_RX too: once the runtime stopped reading with no record
    /// left partial, the handler sets TLS_RX with the next record's sequence number (one
    /// record, the first request, was opened here) and the TX crypto_info's cipher; from
    /// then its input is plaintext, which it serves; the peer's end (the kernel's EIO for
    /// close_notify) ends with its close_notify. A partial record at the stop keeps RX here.
    #[test]
    fn tls13_rx_goes_to_the_kernel_at_a_record_boundary() {
        for (suite, _) in SUITES {
            let service = service_with(KernelCiphers::all().with_rx());
            let mut pair = Pair::new(&service, client(suite, false));
            pair.client.writer().write_all(b"first\n").unwrap();
            pair.pump();
            assert_eq!(pair.read(), b"got first\n", "{suite:?}");
            let info = pair.rx_info.clone().expect("TLS_RX set");
            let (cipher, _, _, seq) = parse_info(&info);
            assert_eq!(seq, 1, "{suite:?}: one record opened in user space");
            let tx_cipher = parse_info(pair.tx_info.as_ref().unwrap()).0;
            assert_eq!(cipher, tx_cipher, "{suite:?}");
            // What the kernel gives now: plaintext.
            let mut out = Output::new();
            let step = pair.server.on_input(b"second\n", &mut out, Instant::now());
            assert_eq!(step.consumed, 7);
            pair.deliver(&mut out);
            assert_eq!(pair.read(), b"got second\n", "{suite:?}");
            let mut out = Output::new();
            pair.server.on_eof(&[], &mut out, Instant::now());
            pair.deliver(&mut out);
            assert!(pair.saw_close_notify, "{suite:?}");
        }
        let service = service_with(KernelCiphers::all().with_rx());
        let mut server = service.connect(&ConnInfo {
            listener: 0,
            worker: 0,
            peer: None,
            now: Instant::now(),
            notify: None,
        });
        let mut out = Output::new();
        server.on_recv_stopped(&[23, 3, 3], &mut out, Instant::now());
        assert!(out.is_empty(), "not a kTLS connection: nothing to do");
    }

    /// A partial record unread when reading stopped: no TLS_RX, the records are opened here
    /// as before (the rest of that record, then another); at a boundary, TLS_RX carries the
    /// next record's sequence number.
    #[test]
    fn a_partial_record_at_the_stop_keeps_rx_in_user_space() {
        let (opener, mut sealer, info) = crate::tls::ktls::tests::made_up_with_info(5);
        let mut k = KernelTlsConn::new(LineConn, opener, Some(info.clone()), 1 << 16);
        let record = sealer.seal(23, b"one\n", 0);
        let mut out = Output::new();
        k.on_recv_stopped(&record[..3], &mut out, Instant::now());
        assert!(
            out.is_empty() && !k.rx_in_kernel(),
            "no TLS_RX with a partial record"
        );
        let step = k.on_input(&record, &mut out, Instant::now());
        assert_eq!(
            (step.consumed, out.as_bytes()),
            (record.len(), &b"got one\n"[..])
        );
        // A stop later finds nothing to switch: the keys went with the first stop.
        let mut out = Output::new();
        k.on_recv_stopped(&[], &mut out, Instant::now());
        assert!(out.is_empty());

        let (opener, mut sealer, info) = crate::tls::ktls::tests::made_up_with_info(5);
        let mut k = KernelTlsConn::new(LineConn, opener, Some(info), 1 << 16);
        let record = sealer.seal(23, b"two\n", 0);
        let mut out = Output::new();
        k.on_input(&record, &mut out, Instant::now());
        let mut out = Output::new();
        k.on_recv_stopped(&[], &mut out, Instant::now());
        let Some(Chunk::Options(options)) = out.take_front(Vec::new()) else {
            panic!("TLS_RX queued");
        };
        assert_eq!(options[0].name, corelocal::sys::ktls::TLS_RX);
        assert_eq!(parse_info(&options[0].value).3, 6, "after record 5");
        let step = k.on_input(b"three\n", &mut out, Instant::now());
        assert_eq!((step.consumed, out.as_bytes()), (6, &b"got three\n"[..]));
    }

    /// A tampered record after the move closes the connection as a bad request.
    #[test]
    fn a_tampered_record_closes() {
        let service = service();
        let mut pair = Pair::new(&service, client(SUITES[0].0, false));
        assert_eq!(pair.request(b"a\n"), b"got a\n");
        assert!(pair.in_kernel());
        pair.client.writer().write_all(b"b\n").unwrap();
        while pair.client.wants_write() {
            pair.client.write_tls(&mut pair.input).unwrap();
        }
        let last = pair.input.len() - 1;
        pair.input[last] ^= 1;
        let mut out = Output::new();
        let step = pair.server.on_input(&pair.input, &mut out, Instant::now());
        assert_eq!(step.next, Next::Close(CloseReason::BadRequest));
        pair.deliver(&mut out);
        assert!(pair.received.is_empty(), "no answer to a tampered request");
        let alert = rustls::AlertDescription::BadRecordMac;
        assert!(
            matches!(pair.client_error, Some(rustls::Error::AlertReceived(a)) if a == alert),
            "{:?}",
            pair.client_error
        );
    }

    /// A request answered and the connection closed by the inner handler: the answer, then
    /// close_notify, both through the kernel.
    #[test]
    fn the_inner_handlers_close_ends_with_close_notify() {
        let service = service();
        let mut pair = Pair::new(&service, client(SUITES[2].0, false));
        assert_eq!(pair.request(b"a\n"), b"got a\n");
        assert_eq!(pair.request(b"b\nquit\n"), b"got b\n");
        assert_eq!(pair.closed, Some(CloseReason::Done));
        assert!(pair.saw_close_notify && pair.client_error.is_none());
    }

    /// TLS 1.2 stays with rustls, as does a connection when no cipher is the kernel's.
    #[test]
    fn tls12_and_ciphers_the_kernel_lacks_stay_in_user_space() {
        let service = service();
        let mut pair = Pair::new(&service, client(SUITES[0].0, true));
        assert_eq!(pair.request(b"a\n"), b"got a\n");
        assert!(!pair.in_kernel() && pair.kernel.is_none());
        assert_eq!(pair.request(b"b\n"), b"got b\n");
        let mut none = super::super::TlsService::new(
            Arc::new(Lines),
            TlsConfig {
                ktls: false,
                ..service.shared.config.clone()
            },
        )
        .unwrap();
        none.assume_kernel_ciphers(KernelCiphers::none());
        let mut pair = Pair::new(&none, client(SUITES[1].0, false));
        assert_eq!(pair.request(b"c\n"), b"got c\n");
        assert!(!pair.in_kernel());
    }

    /// A ClientHello dribbled byte by byte is closed once the handshake timeout passes, though
    /// no whole record has come yet (whole records only go to rustls here).
    #[test]
    fn a_dribbled_handshake_times_out_before_its_record_is_whole() {
        let service = service_timing_out_after(Duration::from_millis(300));
        let mut pair = Pair::new(&service, client(SUITES[0].0, false));
        let mut hello = Vec::new();
        while pair.client.wants_write() {
            pair.client.write_tls(&mut hello).unwrap();
        }
        let t0 = Instant::now();
        let mut out = Output::new();
        for (i, at) in [0u64, 200, 400].into_iter().enumerate() {
            let now = t0 + Duration::from_millis(at);
            let step = pair.server.on_input(&hello[..i + 1], &mut out, now);
            match i {
                2 => assert_eq!(step.next, Next::Close(CloseReason::TimedOut)),
                _ => assert_eq!((step.consumed, step.next), (0, Next::Read)),
            }
        }
    }

    /// Plain HTTP on the TLS port, and a record of a length TLS does not allow after a
    /// ClientHello: refused at once with rustls's alert (after the server's flight), not left
    /// waiting for the rest of a record.
    #[test]
    fn bytes_that_are_no_record_get_an_alert_at_once() {
        let service = service();
        let mut pair = Pair::new(&service, client(SUITES[0].0, false));
        let mut out = Output::new();
        let step = pair
            .server
            .on_input(b"GET / HTTP/1.1\r\n", &mut out, Instant::now());
        assert_eq!(step.next, Next::Close(CloseReason::BadRequest));
        assert_eq!(
            out.as_bytes().first(),
            Some(&21),
            "an alert: {:?}",
            out.as_bytes()
        );

        let mut pair = Pair::new(&service, client(SUITES[0].0, false));
        let mut hello = Vec::new();
        while pair.client.wants_write() {
            pair.client.write_tls(&mut hello).unwrap();
        }
        hello.extend_from_slice(&[23, 3, 3, 0xff, 0xff, 1, 2, 3]);
        let mut out = Output::new();
        let step = pair.server.on_input(&hello, &mut out, Instant::now());
        assert_eq!(step.next, Next::Close(CloseReason::BadRequest));
        let got = out.as_bytes();
        assert_eq!(got.first(), Some(&22), "the server's flight first");
        assert!(got.len() > 100, "then its alert: {} bytes", got.len());
    }
}
