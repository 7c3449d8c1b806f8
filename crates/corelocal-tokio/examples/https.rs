//! HTTPS on every core with corelocal-tokio and tokio-rustls (rustls on the `ring` provider):
//! the `axum` example's app behind TLS, HTTP/1.1 (ALPN `http/1.1`).
//!
//! ```sh
//! openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
//!     -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
//!     -keyout key.pem -out cert.pem
//! cargo run --release -p corelocal-tokio --example https -- \
//!     --cert cert.pem --key key.pem --listen 127.0.0.1:8443 --cpus 0-1
//! curl --cacert cert.pem https://localhost:8443/cpu
//! ```
//!
//! Flags: `--cert PEM` / `--key PEM` (or `CORELOCAL_TLS_CERT` / `CORELOCAL_TLS_KEY`; the
//! certificate chain, leaf first, and its private key), `--listen ADDR` (default
//! 127.0.0.1:8443), `--cpus LIST` (default: all allowed), `--handshake-timeout SECS` (default
//! 10), `--drain-timeout SECS` (default 5), `--runtime multithread [--threads N]` (the
//! baseline: the same service on tokio's multi-thread runtime, see [`run_multithread`]).
//! SIGINT/SIGTERM stop it without losing a queued connection; the final counters are printed
//! as one JSON line on stderr.
//!
//! What is per core. For short connections the TLS handshake is most of the server's CPU, so
//! nothing it touches is written by two cores: each worker builds, on its own thread, its own
//! `Arc<ServerConfig>` (so the reference count `TlsAcceptor::accept` bumps per connection stays
//! in that core's cache), its own signing key (parsed from the shared PEM bytes), its own
//! session cache (TLS 1.2 session IDs: a `Mutex` only that worker takes) and its own ticketer.
//! The ticket *keys* are the same on every worker, though — see [`WorkerTickets`].

#[path = "common/app.rs"]
mod app;

use axum::routing::get;
use corelocal_tokio::{CpuSet, ErrorKind, Server, Stream, WorkerCtx};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};
use rustls::server::{ProducesTickets, ServerSessionMemoryCache};
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::TlsAcceptor;

/// TLS 1.2 sessions each worker remembers (session-ID resumption).
const SESSION_CACHE_ENTRIES: usize = 4096;
/// How long a ticket is good for. The ticket key lives as long as the process (no rotation in
/// this example: a restart changes it; corelocal-apps's `tls/tickets.rs` rotates by period).
const TICKET_LIFETIME_S: u32 = 6 * 3600;

struct Args {
    listen: String,
    cpus: Option<CpuSet>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    handshake_timeout: Duration,
    drain_timeout: Duration,
    /// `--runtime multithread`: the baseline (see [`run_multithread`]).
    multithread: bool,
    threads: Option<usize>,
}

fn secs(flag: &str, v: &str) -> Result<Duration, String> {
    let s: f64 = v
        .parse()
        .map_err(|_| format!("{flag} {v}: not a number of seconds"))?;
    Duration::try_from_secs_f64(s).map_err(|e| format!("{flag} {v}: {e}"))
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        listen: "127.0.0.1:8443".into(),
        cpus: None,
        cert: std::env::var_os("CORELOCAL_TLS_CERT").map(PathBuf::from),
        key: std::env::var_os("CORELOCAL_TLS_KEY").map(PathBuf::from),
        handshake_timeout: Duration::from_secs(10),
        drain_timeout: Duration::from_secs(5),
        multithread: false,
        threads: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => args.listen = value()?,
            "--cpus" => {
                let v = value()?;
                args.cpus = Some(CpuSet::parse_list(&v).map_err(|e| format!("--cpus {v}: {e}"))?)
            }
            "--cert" => args.cert = Some(value()?.into()),
            "--key" => args.key = Some(value()?.into()),
            "--handshake-timeout" => args.handshake_timeout = secs(&flag, &value()?)?,
            "--drain-timeout" => args.drain_timeout = secs(&flag, &value()?)?,
            "--runtime" => {
                args.multithread = match value()?.as_str() {
                    "per-core" => false,
                    "multithread" => true,
                    v => return Err(format!("--runtime {v}: per-core or multithread")),
                }
            }
            "--threads" => {
                let v = value()?;
                match v.parse() {
                    Ok(n) if n > 0 => args.threads = Some(n),
                    _ => return Err(format!("--threads {v}: not a positive number")),
                }
            }
            "-h" | "--help" => {
                println!(
                    "usage: https --cert PEM --key PEM [--listen ADDR] [--cpus LIST] \
                     [--handshake-timeout SECS] [--drain-timeout SECS] \
                     [--runtime per-core|multithread] [--threads N]\n\
                     (or CORELOCAL_TLS_CERT / CORELOCAL_TLS_KEY for the PEM paths)"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown flag {other:?} (try --help)")),
        }
    }
    Ok(args)
}

/// The certificate chain and key as read from the PEM files: shared read-only by the
/// workers, each of which builds its own rustls objects from them.
struct CertKey {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

fn read_file(what: &str, path: &PathBuf) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))
}

/// Reads and checks the PEM files; every failure names the file and what is wrong with it.
fn load_cert_key(cert: Option<&PathBuf>, key: Option<&PathBuf>) -> Result<CertKey, String> {
    let (Some(cert), Some(key)) = (cert, key) else {
        return Err(
            "--cert and --key (or CORELOCAL_TLS_CERT and CORELOCAL_TLS_KEY) are \
                    required: the PEM certificate chain and its private key"
                .into(),
        );
    };
    let chain = CertificateDer::pem_slice_iter(&read_file("--cert", cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--cert {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("--cert {}: no CERTIFICATE in it", cert.display()));
    }
    let key_der = PrivateKeyDer::from_pem_slice(&read_file("--key", key)?)
        .map_err(|e| format!("--key {}: no private key in it ({e})", key.display()))?;
    let ck = CertKey {
        chain,
        key: key_der,
    };
    // Build one config now, so a key that does not belong to the certificate (or that ring
    // cannot use) stops the process before it listens, not at each handshake.
    server_config(&ck, Arc::new(TicketSecret::generate()?)).map_err(|e| {
        let why = match e {
            rustls::Error::InconsistentKeys(_) => {
                "the private key does not belong to the certificate".to_string()
            }
            e => e.to_string(),
        };
        format!(
            "--cert {} with --key {}: {why}",
            cert.display(),
            key.display()
        )
    })?;
    Ok(ck)
}

/// One worker's rustls configuration, built on the worker's own thread.
fn server_config(ck: &CertKey, secret: Arc<TicketSecret>) -> Result<ServerConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(ck.chain.clone(), ck.key.clone_key())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // Per worker: a session ID from another worker is unknown here (a full handshake), which
    // only TLS 1.2 clients that refuse tickets see; everyone else resumes by ticket.
    config.session_storage = ServerSessionMemoryCache::new(SESSION_CACHE_ENTRIES);
    config.ticketer = Arc::new(WorkerTickets::new(&secret));
    Ok(config)
}

/// The process's ticket secret, drawn once at start and only read afterwards.
struct TicketSecret([u8; 32]);

impl TicketSecret {
    fn generate() -> Result<TicketSecret, String> {
        let mut secret = [0u8; 32];
        SystemRandom::new()
            .fill(&mut secret)
            .map_err(|_| "no system randomness for the ticket secret".to_string())?;
        Ok(TicketSecret(secret))
    }
}

/// One worker's session-ticket sealer (rustls's `ProducesTickets`).
///
/// Shared or per core? A ticket must open on whichever core the client's *next* connection
/// reaches: the kernel steers a SYN by the CPU that processed it (RSS/RPS hash of the new
/// source port), so a returning client usually lands on another worker. Per-worker random keys
/// would turn those resumptions into full handshakes; one shared rustls `Ticketer` would
/// resume them but take its rotation lock (an atomic on one cache line, written by every core)
/// at each ticket made and opened. So each worker holds its *own copy* of the *same* AES-256-GCM
/// key, derived from the process secret with HKDF: any worker opens any worker's ticket, and
/// the handshake path shares nothing writable between cores. (The secret is copied, never
/// written after start; `ring`'s `LessSafeKey` and `SystemRandom` are lock-free.)
struct WorkerTickets {
    key: LessSafeKey,
    rng: SystemRandom,
}

impl std::fmt::Debug for WorkerTickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkerTickets") // never print the key
    }
}

impl WorkerTickets {
    fn new(secret: &TicketSecret) -> WorkerTickets {
        let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, b"corelocal-tokio https example tickets");
        let prk = salt.extract(&secret.0);
        let okm = prk
            .expand(&[], &aead::AES_256_GCM)
            .expect("32 bytes is within HKDF-SHA256's output limit");
        WorkerTickets {
            key: LessSafeKey::new(UnboundKey::from(okm)),
            rng: SystemRandom::new(),
        }
    }
}

/// A ticket is `nonce (12) || AES-256-GCM(session state) || tag (16)`.
impl ProducesTickets for WorkerTickets {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        TICKET_LIFETIME_S
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut ticket = Vec::with_capacity(NONCE_LEN + plain.len() + 16);
        ticket.extend_from_slice(&nonce);
        let mut sealed = plain.to_vec();
        let nonce = Nonce::assume_unique_for_key(nonce);
        self.key
            .seal_in_place_append_tag(nonce, Aad::empty(), &mut sealed)
            .ok()?;
        ticket.extend_from_slice(&sealed);
        Some(ticket)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        // rustls's session state is a few hundred bytes; refuse to work on anything huge.
        if cipher.len() < NONCE_LEN + 16 || cipher.len() > 16 << 10 {
            return None;
        }
        let (nonce, sealed) = cipher.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = sealed.to_vec();
        let n = self
            .key
            .open_in_place(nonce, Aad::empty(), &mut buf)
            .ok()?
            .len();
        buf.truncate(n);
        Some(buf)
    }
}

/// The app as hyper serves it.
type App = TowerToHyperService<axum::Router>;

/// The handshake, bounded: a client that sends garbage gets an alert and a close at once, one
/// that stalls mid-handshake is dropped at `timeout` — neither holds the connection slot (or
/// the worker's drain at stop) longer. Then the app over HTTP/1.1, counted like plain HTTP.
async fn serve_tls(ctx: WorkerCtx, stream: Stream, tls: TlsAcceptor, app: App, timeout: Duration) {
    match tokio::time::timeout(timeout, tls.accept(stream)).await {
        Ok(Ok(conn)) => corelocal_tokio::http::serve_connection(ctx, conn, app).await,
        Ok(Err(_)) => ctx.record_error(ErrorKind::BadRequest),
        Err(_) => ctx.record_error(ErrorKind::IdleTimeout),
    }
}

/// One worker: its own TLS configuration (built here, on its thread), then the accept loop.
fn worker(
    ctx: WorkerCtx,
    ck: &CertKey,
    secret: Arc<TicketSecret>,
    router: axum::Router,
    timeout: Duration,
) -> impl std::future::Future<Output = io::Result<()>> {
    let config = server_config(ck, secret).map_err(io::Error::other);
    async move {
        let tls = TlsAcceptor::from(Arc::new(config?));
        let app = TowerToHyperService::new(router);
        while let Some((stream, _peer)) = ctx.accept().await {
            let conn = serve_tls(ctx.clone(), stream, tls.clone(), app.clone(), timeout);
            tokio::task::spawn_local(conn);
        }
        Ok(())
    }
}

fn run(args: Args) -> Result<(), String> {
    let ck = Arc::new(load_cert_key(args.cert.as_ref(), args.key.as_ref())?);
    if args.multithread {
        return run_multithread(&args, &ck);
    }
    let secret = Arc::new(TicketSecret::generate()?);
    let mut builder = Server::builder().drain_timeout(args.drain_timeout);
    if let Some(cpus) = args.cpus {
        builder = builder.cpus(cpus);
    }
    let server = builder
        .listen(args.listen.as_str())
        .map_err(|e| e.to_string())?;
    let stats = server.stats();
    let router = app::router().route("/metrics", get(move || async move { stats.prometheus() }));
    eprintln!(
        "https on corelocal-tokio: listening on {:?}, {} workers on CPUs {:?}, steering {}",
        server.local_addrs(),
        server.workers(),
        server.worker_cpus(),
        server.steering()
    );
    let timeout = args.handshake_timeout;
    let report = server
        .serve(move |ctx| worker(ctx, &ck, secret.clone(), router.clone(), timeout))
        .map_err(|e| e.to_string())?;
    eprintln!(
        "{}",
        serde_json::to_string(&report).expect("report serialises")
    );
    Ok(())
}

/// The baseline for results/tokio/https-example.md: the same app and TLS settings served the
/// way most tokio services are — one `ServerConfig` (one session cache, one ticketer) shared
/// by every thread of tokio's multi-thread runtime, one listener, tasks that may run on any
/// core. SIGINT/SIGTERM end it at once (no drain: it is a measurement baseline).
fn run_multithread(args: &Args, ck: &CertKey) -> Result<(), String> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Some(n) = args.threads {
        rt.worker_threads(n);
    }
    let rt = rt
        .build()
        .map_err(|e| format!("building the runtime: {e}"))?;
    let config =
        server_config(ck, Arc::new(TicketSecret::generate()?)).map_err(|e| e.to_string())?;
    let tls = TlsAcceptor::from(Arc::new(config));
    let timeout = args.handshake_timeout;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .map_err(|e| format!("bind {}: {e}", args.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        eprintln!("https on tokio multi-thread: listening on [{addr}]");
        let app = TowerToHyperService::new(app::router());
        let stop = stop_signal();
        tokio::pin!(stop);
        loop {
            let stream = tokio::select! {
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(_) => continue,
                },
                _ = &mut stop => return Ok(()),
            };
            let (tls, app) = (tls.clone(), app.clone());
            tokio::spawn(async move {
                if let Ok(Ok(conn)) = tokio::time::timeout(timeout, tls.accept(stream)).await {
                    let http = hyper::server::conn::http1::Builder::new();
                    let _ = http.serve_connection(TokioIo::new(conn), app).await;
                }
            });
        }
    })
}

async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("https: {e}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("https: {e}");
            ExitCode::FAILURE
        }
    }
}
