//! TLS for any service on the runtime: rustls (`ring` provider) inside each connection's
//! handler, on the worker that owns the connection.
//!
//! [`TlsService`] wraps a [`Service`]: connections on the addresses it is told speak TLS get a
//! [`TlsConn`] around the inner handler (handshake, records and session state on that
//! connection's worker, nowhere else); the others get the inner handler as it is, so a plain
//! and a TLS port serve side by side from one server.
//!
//! Per worker ([`Service::for_worker`]): its own rustls `ServerConfig`, with its own
//! session-ID cache (resumption by session ID works when the client comes back to the same
//! worker; no cache is shared between cores) and its own copy of the session-ticket keys
//! ([`tickets`]: derived from one process secret by time period, so any worker opens any
//! worker's tickets with no lock and no message between them). The certificates and the SNI
//! map are loaded once and shared read-only.
//!
//! TLS 1.3 and 1.2 (or 1.3 only), ALPN `http/1.1` (or what [`TlsConfig::alpn`] says: none
//! for memcached's protocol), ECDSA, RSA and
//! Ed25519 keys, chains, SNI among several certificates. Bounded: the handshake in bytes and
//! time, the decrypted input in bytes (see [`TlsConn`]).
//!
//! kTLS ([`kernel`]): where the kernel has the `tls` ULP and takes the negotiated cipher
//! ([`TlsConfig::ktls`], probed at start), a TLS 1.3 connection's sending records are made by
//! the kernel once the handshake is done, and its received records are opened here with the
//! same keys rustls derived ([`ktls`]); otherwise rustls does the records.

mod certs;
pub mod ciphers;
mod conn;
pub mod kernel;
pub mod ktls;
pub mod tickets;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corelocal::runtime::handoff::{StateExport, StateImport};
use corelocal::runtime::{CloseReason, ConnInfo, Handler, Next, Output, Service, Step};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{NoServerSessionStorage, ServerSessionMemoryCache, WebPkiClientVerifier};
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

pub use certs::{load, CertFiles, CertStore, SniResolver, WorkerCerts};
pub use conn::TlsConn;
pub use kernel::{KernelCiphers, KernelTlsConn};
use tickets::{TicketKeys, WorkerTickets};

/// TLS settings of a [`TlsService`].
#[derive(Debug, Clone)]
pub struct TlsConfig {
    /// Certificate chains and keys; the first is served when SNI names none of them.
    pub certs: Vec<CertFiles>,
    /// Indexes of the server's addresses that speak TLS (the others are plain).
    pub listeners: Vec<usize>,
    /// ALPN protocols offered, preferred first (`http/1.1` for the HTTP server). A client
    /// offering ALPN without any of them is refused (`no_application_protocol`).
    pub alpn: Vec<Vec<u8>>,
    /// Bytes a client may send before its handshake completes: its ClientHello (a few
    /// hundred bytes; ~1.3 KiB with a post-quantum key share) and its second flight.
    pub handshake_bytes_max: usize,
    /// A handshake must complete this long after its first byte.
    pub handshake_timeout: Duration,
    /// Decrypted input held for the inner handler (a request larger than this closes as too
    /// large, as the runtime's input limit does on plain connections).
    pub plain_bytes_max: usize,
    /// Sessions each worker's session-ID cache keeps (TLS 1.2 session IDs; TLS 1.3 stateful
    /// resumption when tickets are off).
    pub session_cache_entries_max: usize,
    /// Session tickets (TLS 1.2 RFC 5077 and TLS 1.3): on unless false.
    pub tickets: bool,
    /// Ticket keys rotate on this period (a ticket opens for one to two periods).
    pub ticket_period: Duration,
    /// TLS 1.2 offered besides 1.3 (false: TLS 1.3 only, memcached's `ssl_min_version=3`).
    pub tls12: bool,
    /// Largest TLS record's plaintext, when smaller than TLS's own 16 KiB (memcached's
    /// `ssl_wbuf_size`: it encrypts from a buffer of that size).
    pub record_bytes_max: Option<usize>,
    /// Client certificates: asked for and checked against these PEM CA certificates
    /// (memcached's `ssl_ca_cert` with `ssl_verify_mode` 1 to 3); none asked for without.
    pub client_ca: Option<std::path::PathBuf>,
    /// With `client_ca`: a client without a certificate is refused (else let in, while a
    /// certificate it does present must check out).
    pub client_cert_required: bool,
    /// Hand TLS 1.3 records to the kernel (kTLS) where it takes them: probed at start,
    /// records in user space where it does not (see [`kernel`]).
    pub ktls: bool,
    /// The TLS 1.2 suites offered, in this order (from an OpenSSL cipher list:
    /// [`ciphers::tls12_suites`]); `None`: rustls's six. TLS 1.3's suites are not affected.
    pub tls12_suites: Option<Vec<rustls::CipherSuite>>,
}

impl Default for TlsConfig {
    fn default() -> TlsConfig {
        TlsConfig {
            certs: Vec::new(),
            listeners: vec![0],
            alpn: vec![b"http/1.1".to_vec()],
            handshake_bytes_max: 16 << 10,
            handshake_timeout: Duration::from_secs(10),
            plain_bytes_max: 64 << 10,
            session_cache_entries_max: 4096,
            tickets: true,
            ticket_period: Duration::from_secs(6 * 3600),
            tls12: true,
            record_bytes_max: None,
            client_ca: None,
            client_cert_required: false,
            ktls: true,
            tls12_suites: None,
        }
    }
}

/// What every worker shares: the certificates (replaced only at a reload) and the ticket
/// secret.
#[derive(Debug)]
struct Shared {
    config: TlsConfig,
    handle: TlsHandle,
    ticket_keys: Arc<TicketKeys>,
    /// Checks client certificates (`client_ca`), shared read-only.
    clients: Option<Arc<dyn ClientCertVerifier>>,
    /// The ciphers whose records go to the kernel (none: all in user space), and why none.
    kernel: (KernelCiphers, Option<String>),
}

/// The certificates in force and the TLS counters, for whoever runs the service (SIGHUP) and
/// the service inside (memcached's `refresh_certs`, `ssl_handshake_errors`,
/// `time_since_server_cert_refresh`).
#[derive(Debug, Clone)]
pub struct TlsHandle {
    certs: Arc<CertStore>,
    counters: Arc<Counters>,
}

/// Counted across workers: written once per handshake, reload or kTLS connection.
#[derive(Debug)]
struct Counters {
    handshake_errors: AtomicU64,
    new_sessions: AtomicU64,
    kernel_connections: AtomicU64,
    refreshed: Mutex<Instant>,
}

impl TlsHandle {
    /// Loads and checks the certificates and keys of `config`.
    pub fn load(config: &TlsConfig) -> Result<TlsHandle, String> {
        Ok(TlsHandle {
            certs: Arc::new(CertStore::load(config.certs.clone())?),
            counters: Arc::new(Counters {
                handshake_errors: AtomicU64::new(0),
                new_sessions: AtomicU64::new(0),
                kernel_connections: AtomicU64::new(0),
                refreshed: Mutex::new(Instant::now()),
            }),
        })
    }

    /// Reads the certificate files again (see [`CertStore::reload`]); how many loaded.
    pub fn reload(&self) -> Result<usize, String> {
        let n = self.certs.reload()?;
        *self
            .counters
            .refreshed
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Instant::now();
        Ok(n)
    }

    /// Handshakes that failed (bad records, an alert, a protocol the server refuses).
    pub fn handshake_errors(&self) -> u64 {
        self.counters.handshake_errors.load(Ordering::Relaxed)
    }

    /// Full (not resumed) handshakes completed: the new sessions (memcached's
    /// `ssl_new_sessions`).
    pub fn new_sessions(&self) -> u64 {
        self.counters.new_sessions.load(Ordering::Relaxed)
    }

    /// Time since the certificates were loaded or last reloaded.
    pub fn since_reload(&self) -> Duration {
        let at = *self
            .counters
            .refreshed
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        at.elapsed()
    }

    /// Connections whose records went to the kernel (kTLS) after their handshake.
    pub fn kernel_connections(&self) -> u64 {
        self.counters.kernel_connections.load(Ordering::Relaxed)
    }

    pub(crate) fn count_kernel_connection(&self) {
        self.counters
            .kernel_connections
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a completed handshake that made a new session (not a resumption).
    pub(crate) fn count_handshake_done(&self, kind: Option<rustls::HandshakeKind>) {
        if kind != Some(rustls::HandshakeKind::Resumed) {
            self.counters.new_sessions.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn count_handshake_error(&self) {
        self.counters
            .handshake_errors
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// A service whose connections on some addresses speak TLS (see the module docs).
pub struct TlsService<S> {
    inner: Arc<S>,
    shared: Arc<Shared>,
    /// This worker's rustls configuration (the template's serves tests and non-worker use).
    server: Arc<ServerConfig>,
}

impl<S> std::fmt::Debug for TlsService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsService")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S: Service> TlsService<S> {
    /// Loads and checks every certificate and key, draws the ticket secret.
    pub fn new(inner: Arc<S>, config: TlsConfig) -> Result<TlsService<S>, String> {
        let handle = TlsHandle::load(&config)?;
        TlsService::with_handle(inner, config, handle)
    }

    /// As [`TlsService::new`], with certificates already loaded (`handle`, which the inner
    /// service may hold too: kv's `refresh_certs`).
    pub fn with_handle(
        inner: Arc<S>,
        config: TlsConfig,
        handle: TlsHandle,
    ) -> Result<TlsService<S>, String> {
        let ticket_keys = Arc::new(TicketKeys::generate(config.ticket_period.as_secs())?);
        let clients = client_verifier(&config)?;
        let kernel = match config.ktls {
            false => (KernelCiphers::none(), Some("off".into())),
            // The kernel makes records of its own size (16 KiB), not memcached's ssl_wbuf_size.
            true if config.record_bytes_max.is_some() => (
                KernelCiphers::none(),
                Some("off: a record size is set".into()),
            ),
            true => match KernelCiphers::probe() {
                Ok(found) => (found, None),
                Err(why) => (KernelCiphers::none(), Some(why)),
            },
        };
        let shared = Arc::new(Shared {
            config,
            handle,
            ticket_keys,
            clients,
            kernel,
        });
        let server = worker_config(&shared)?;
        Ok(TlsService {
            inner,
            shared,
            server,
        })
    }

    /// The certificate store, to reload it (SIGHUP): new handshakes on every worker use
    /// the files' new contents, established connections keep theirs.
    pub fn certs(&self) -> Arc<CertStore> {
        self.shared.handle.certs.clone()
    }

    /// Which record path connections take, for the start line: the kernel's for TLS 1.3
    /// with the ciphers it takes, or user space and why.
    pub fn record_path(&self) -> String {
        match &self.shared.kernel {
            (found, _) if !found.is_empty() => {
                let rx = found.rx_names();
                let received = match rx.is_empty() {
                    true => "received in user space".to_string(),
                    false => format!(
                        "received by the kernel once the handshake's last record is read \
                         (kTLS RX: {})",
                        rx.join(", ")
                    ),
                };
                format!(
                    "TLS 1.3 records sent by the kernel (kTLS TX: {}), {received}; TLS 1.2 in \
                     user space",
                    found.names().join(", ")
                )
            }
            (_, why) => format!(
                "records in user space (kTLS: {})",
                why.as_deref().unwrap_or("not taken")
            ),
        }
    }

    /// Hands records to the kernel for these ciphers whatever the kernel says (tests that
    /// drive connections in memory).
    #[cfg(test)]
    pub(crate) fn assume_kernel_ciphers(&mut self, ciphers: KernelCiphers) {
        let shared = Arc::get_mut(&mut self.shared).expect("not shared yet");
        shared.kernel = (ciphers, None);
        self.server = worker_config(shared).expect("config checked");
    }

    /// The certificates and counters (reload through it to keep the refresh time).
    pub fn handle(&self) -> TlsHandle {
        self.shared.handle.clone()
    }

    fn limits(&self) -> conn::ConnLimits {
        let c = &self.shared.config;
        conn::ConnLimits {
            handshake_bytes_max: c.handshake_bytes_max,
            handshake_timeout: c.handshake_timeout,
            plain_bytes_max: c.plain_bytes_max,
            kernel: self.shared.kernel.0,
        }
    }
}

/// The client-certificate check `config.client_ca` asks for, from its PEM certificates.
fn client_verifier(config: &TlsConfig) -> Result<Option<Arc<dyn ClientCertVerifier>>, String> {
    let Some(path) = &config.client_ca else {
        return Ok(None);
    };
    let shown = path.display();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| format!("{shown}: {e}"))? {
        let cert = cert.map_err(|e| format!("{shown}: {e}"))?;
        roots.add(cert).map_err(|e| format!("{shown}: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("{shown}: no CA certificate in it"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    let builder = if config.client_cert_required {
        builder
    } else {
        builder.allow_unauthenticated()
    };
    builder
        .build()
        .map(Some)
        .map_err(|e| format!("{shown}: {e}"))
}

/// ring's provider, its TLS 1.2 suites narrowed to `tls12` in that order when given.
fn provider(tls12: Option<&[rustls::CipherSuite]>) -> rustls::crypto::CryptoProvider {
    let mut provider = rustls::crypto::ring::default_provider();
    if let Some(wanted) = tls12 {
        let all = std::mem::take(&mut provider.cipher_suites);
        let (tls13, tls12): (Vec<_>, Vec<_>) = all
            .into_iter()
            .partition(|s| matches!(s, rustls::SupportedCipherSuite::Tls13(_)));
        provider.cipher_suites = tls13;
        provider.cipher_suites.extend(
            wanted
                .iter()
                .filter_map(|id| tls12.iter().find(|s| s.suite() == *id).copied()),
        );
    }
    provider
}

/// One worker's rustls configuration: its own session cache and ticketer.
fn worker_config(shared: &Shared) -> Result<Arc<ServerConfig>, String> {
    let config = &shared.config;
    let provider = Arc::new(provider(config.tls12_suites.as_deref()));
    let versions: &[&rustls::SupportedProtocolVersion] = if config.tls12 {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    } else {
        &[&rustls::version::TLS13]
    };
    let builder = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| e.to_string())?;
    let builder = match &shared.clients {
        Some(verifier) => builder.with_client_cert_verifier(verifier.clone()),
        None => builder.with_no_client_auth(),
    };
    let mut server =
        builder.with_cert_resolver(Arc::new(WorkerCerts::new(shared.handle.certs.clone())));
    server.alpn_protocols = config.alpn.clone();
    server.session_storage = match config.session_cache_entries_max {
        // No cache at all (memcached's default): no session is resumed by its ID.
        0 => Arc::new(NoServerSessionStorage {}),
        n => ServerSessionMemoryCache::new(n),
    };
    // rustls counts the record's header (5 bytes) in its fragment size.
    server.max_fragment_size = config
        .record_bytes_max
        .map(|n| n.clamp(32, 16 << 10) + 5)
        .filter(|n| *n < (16 << 10) + 5);
    if config.tickets {
        server.ticketer = Arc::new(WorkerTickets::new(shared.ticket_keys.clone()));
    }
    // The keys leave rustls only for the kernel's records (`kernel`).
    server.enable_secret_extraction = !shared.kernel.0.is_empty();
    Ok(Arc::new(server))
}

/// A connection of a [`TlsService`]: TLS or plain, by the address it came on.
pub enum MaybeTls<H> {
    /// A plain connection: the inner handler as it is.
    Plain(H),
    /// A TLS connection, rustls doing its records.
    Tls(Box<TlsConn<H>>),
    /// A TLS 1.3 connection after its handshake, the kernel making its records (kTLS).
    Kernel(Box<KernelTlsConn<H>>),
    /// rustls refused to start a session (never with a configuration `TlsService::new`
    /// accepted): closed at once.
    Refused,
}

impl<S: Service> Service for TlsService<S> {
    type Conn = MaybeTls<S::Conn>;

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn connect(&self, info: &ConnInfo) -> Self::Conn {
        let inner = self.inner.connect(info);
        if !self.shared.config.listeners.contains(&info.listener) {
            return MaybeTls::Plain(inner);
        }
        match rustls::ServerConnection::new(self.server.clone()) {
            Ok(tls) => {
                let handle = self.shared.handle.clone();
                MaybeTls::Tls(Box::new(TlsConn::new(tls, inner, self.limits(), handle)))
            }
            // Only a configuration error fails here, and `new` checked it: refuse the client.
            Err(_) => MaybeTls::Refused,
        }
    }

    fn for_worker(self: Arc<Self>, worker: usize) -> Arc<Self> {
        let inner = self.inner.clone().for_worker(worker);
        let server = worker_config(&self.shared).unwrap_or_else(|_| self.server.clone());
        Arc::new(TlsService {
            inner,
            shared: self.shared.clone(),
            server,
        })
    }

    fn resume(&self, info: &ConnInfo, state: &[u8]) -> Self::Conn {
        let inner = self.inner.resume(info, state);
        if !self.shared.config.listeners.contains(&info.listener) {
            return MaybeTls::Plain(inner);
        }
        // On a TLS port only a connection with both directions in the kernel moves
        // (`KernelTlsConn::handoff`; rustls's never do): it goes on as one.
        self.shared.handle.count_kernel_connection();
        MaybeTls::Kernel(Box::new(KernelTlsConn::resumed(
            inner,
            self.shared.config.plain_bytes_max,
        )))
    }

    fn export_state(self: Arc<Self>) -> Option<Box<dyn StateExport>> {
        self.inner.clone().export_state()
    }

    fn import_state(self: Arc<Self>) -> Option<Box<dyn StateImport>> {
        self.inner.clone().import_state()
    }
}

impl<H: Handler> MaybeTls<H> {
    /// The handshake is done and its records out: the kernel takes the connection's sending
    /// records from here, and the records that came after the handshake (`input` past what
    /// `step` consumed: a request sent with the client's Finished) are opened at once.
    fn move_to_kernel(
        &mut self,
        input: &[u8],
        step: Step,
        out: &mut Output,
        now: std::time::Instant,
    ) -> Step {
        let MaybeTls::Tls(t) = std::mem::replace(self, MaybeTls::Refused) else {
            unreachable!("only a rustls connection moves to the kernel");
        };
        let Ok(kernel) = t.into_kernel(out) else {
            // rustls would not give its keys (never once `kernel_ready` said yes).
            return Step::close(input.len(), step.requests, CloseReason::BadRequest);
        };
        *self = MaybeTls::Kernel(Box::new(kernel));
        let MaybeTls::Kernel(k) = self else {
            unreachable!("set just above");
        };
        let rest = k.on_input(&input[step.consumed..], out, now);
        Step {
            consumed: step.consumed + rest.consumed,
            requests: step.requests + rest.requests,
            ..rest
        }
    }
}

impl<H: Handler> Handler for MaybeTls<H> {
    fn on_input(&mut self, input: &[u8], out: &mut Output, now: std::time::Instant) -> Step {
        match self {
            MaybeTls::Plain(h) => h.on_input(input, out, now),
            MaybeTls::Tls(t) => {
                let step = t.on_input(input, out, now);
                if !t.kernel_ready() {
                    return step;
                }
                self.move_to_kernel(input, step, out, now)
            }
            MaybeTls::Kernel(k) => k.on_input(input, out, now),
            MaybeTls::Refused => Step::close(input.len(), 0, CloseReason::BadRequest),
        }
    }

    fn on_input_limit(&mut self, input: &[u8], out: &mut Output, now: std::time::Instant) {
        match self {
            MaybeTls::Plain(h) => h.on_input_limit(input, out, now),
            MaybeTls::Tls(t) => t.on_input_limit(input, out, now),
            MaybeTls::Kernel(k) => k.on_input_limit(input, out, now),
            MaybeTls::Refused => {}
        }
    }

    fn on_connect(&mut self, out: &mut Output, now: std::time::Instant) -> Next {
        match self {
            MaybeTls::Plain(h) => h.on_connect(out, now),
            MaybeTls::Tls(t) => t.on_connect(out, now),
            MaybeTls::Kernel(k) => k.on_connect(out, now),
            MaybeTls::Refused => Next::Close(CloseReason::BadRequest),
        }
    }

    fn on_eof(&mut self, input: &[u8], out: &mut Output, now: std::time::Instant) -> Next {
        match self {
            MaybeTls::Plain(h) => h.on_eof(input, out, now),
            MaybeTls::Tls(t) => t.on_eof(input, out, now),
            MaybeTls::Kernel(k) => k.on_eof(input, out, now),
            MaybeTls::Refused => Next::Close(CloseReason::Done),
        }
    }

    fn on_notify(&mut self, out: &mut Output, now: std::time::Instant) -> Next {
        match self {
            MaybeTls::Plain(h) => h.on_notify(out, now),
            MaybeTls::Tls(t) => t.on_notify(out, now),
            MaybeTls::Kernel(k) => k.on_notify(out, now),
            MaybeTls::Refused => Next::Read,
        }
    }

    fn on_idle_close(&mut self, out: &mut Output) {
        match self {
            MaybeTls::Plain(h) => h.on_idle_close(out),
            MaybeTls::Tls(t) => t.on_idle_close(out),
            MaybeTls::Kernel(k) => k.on_idle_close(out),
            MaybeTls::Refused => {}
        }
    }

    fn on_drain(&mut self) -> bool {
        match self {
            MaybeTls::Plain(h) => h.on_drain(),
            MaybeTls::Tls(t) => t.on_drain(),
            MaybeTls::Kernel(k) => k.on_drain(),
            MaybeTls::Refused => false,
        }
    }

    fn expects_input(&self) -> bool {
        match self {
            MaybeTls::Plain(h) => h.expects_input(),
            MaybeTls::Tls(t) => t.expects_input(),
            MaybeTls::Kernel(k) => k.expects_input(),
            MaybeTls::Refused => false,
        }
    }

    fn holds_input(&self) -> bool {
        match self {
            MaybeTls::Plain(h) => h.holds_input(),
            MaybeTls::Tls(t) => t.holds_input(),
            MaybeTls::Kernel(k) => k.holds_input(),
            MaybeTls::Refused => false,
        }
    }

    fn idle_timeout(&self) -> Option<std::time::Duration> {
        match self {
            MaybeTls::Plain(h) => h.idle_timeout(),
            MaybeTls::Tls(t) => t.idle_timeout(),
            MaybeTls::Kernel(k) => k.idle_timeout(),
            MaybeTls::Refused => None,
        }
    }

    fn on_recv_stopped(&mut self, input: &[u8], out: &mut Output, now: std::time::Instant) {
        match self {
            MaybeTls::Plain(h) => h.on_recv_stopped(input, out, now),
            MaybeTls::Kernel(k) => k.on_recv_stopped(input, out, now),
            // rustls's connections never ask for a stop.
            MaybeTls::Tls(_) | MaybeTls::Refused => {}
        }
    }

    fn handoff(&self) -> Option<Vec<u8>> {
        match self {
            MaybeTls::Plain(h) => h.handoff(),
            MaybeTls::Tls(t) => t.handoff(),
            MaybeTls::Kernel(k) => k.handoff(),
            MaybeTls::Refused => None,
        }
    }
}
