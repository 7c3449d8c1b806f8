//! The `corelocal serve` subcommand and each app's own arguments (the options every server
//! shares are in `common`).

use super::common::CommonArgs;
use crate::duration::parse_duration;
use clap::{Args, Subcommand};
use corelocal_apps::kv::Protocol;
use std::path::PathBuf;
use std::time::Duration;

/// `corelocal serve` arguments.
#[derive(Debug, Args)]
pub struct Command {
    #[command(subcommand)]
    pub(super) app: App,
}

#[derive(Debug, Subcommand)]
pub(super) enum App {
    /// MegaPipe's RPC microbenchmark server: fixed-size request → fixed-size response.
    ///
    /// Examples:
    ///   corelocal serve rpc
    ///   corelocal serve rpc --listen 127.0.0.1:7000 --cpus 1 --mode local --one-shot
    ///   corelocal serve rpc --req-size 64 --resp-size 1024 --stats-interval 1s --json
    #[command(verbatim_doc_comment)]
    Rpc(RpcArgs),
    /// Static HTTP/1.1 file server (GET/HEAD, keep-alive, pipelining, 304, Range).
    ///
    /// Without --root it serves a built-in site: the Affinity-Accept paper's file set
    /// (30,000 files, 30 B..5,670 B, generated in memory) with an index page.
    ///
    /// Examples:
    ///   corelocal serve http
    ///   corelocal serve http --listen 0.0.0.0:8080 --root /var/www --cpus 0-3
    ///   curl -s http://127.0.0.1:8080/files/00/00000.txt
    ///   corelocal serve http --tls-cert chain.pem --tls-key key.pem --tls-listen 127.0.0.1:8443
    ///   curl -s --cacert ca.pem https://localhost:8443/files/00/00000.txt
    #[command(verbatim_doc_comment)]
    Http(HttpArgs),
    /// memcached text-protocol server (get/gets/set/add/replace/append/prepend/cas/delete/
    /// incr/decr/touch/flush_all/stats), with LRU eviction under a memory cap.
    ///
    /// Examples:
    ///   corelocal serve kv
    ///   corelocal serve kv --listen 127.0.0.1:11211 --memory-mb 256 --item-max 1048576
    ///   corelocal serve kv --tls-cert chain.pem --tls-key key.pem --tls-listen 127.0.0.1:11212
    #[command(verbatim_doc_comment)]
    Kv(KvArgs),
    /// The `sockperf server --tcp` protocol: answers ping-pong messages (client flag and
    /// pong request set) with the same bytes, the client flag cleared.
    ///
    /// Examples:
    ///   corelocal serve sockperf
    ///   sockperf ping-pong --tcp -i 127.0.0.1 -p 11111 -m 64 -t 5
    #[command(verbatim_doc_comment)]
    Sockperf(SockperfArgs),
}

impl App {
    /// The options every server shares.
    pub(super) fn common(&self) -> &CommonArgs {
        match self {
            App::Rpc(a) => &a.common,
            App::Http(a) => &a.common,
            App::Kv(a) => &a.common,
            App::Sockperf(a) => &a.common,
        }
    }
}

#[derive(Debug, Args)]
pub(super) struct SockperfArgs {
    #[command(flatten)]
    pub(super) common: CommonArgs,
    /// Largest message accepted, header included (sockperf server -m); longer closes.
    #[arg(long, default_value_t = 65_507, value_parser = clap::value_parser!(u32).range(14..=65_507))]
    pub(super) msg_size_max: u32,
}

#[derive(Debug, Args)]
pub(super) struct HttpArgs {
    #[command(flatten)]
    pub(super) common: CommonArgs,
    /// Directory to serve (default: the built-in paper file set).
    #[arg(long)]
    pub(super) root: Option<PathBuf>,
    /// In-memory cache of small files, in MiB (0 to 1048576).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(0..=1_048_576))]
    pub(super) cache_mb: u64,
    /// Access log: off, stderr, or a file path.
    #[arg(long, default_value = "off")]
    pub(super) access_log: String,
    /// A request head must be complete this long after its first byte, else 408 and close
    /// (slowloris); the idle timeout alone would not catch a client that trickles bytes.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(super) header_timeout: Duration,
    #[command(flatten)]
    pub(super) tls: TlsArgs,
}

/// TLS, the same flags for every app that has it (`serve http`, `serve kv`).
#[derive(Debug, Args)]
pub(super) struct TlsArgs {
    /// TLS: a PEM certificate chain (the server's certificate first, then intermediates),
    /// with its --tls-key. Repeat both for several certificates: the client's SNI name picks
    /// one, the first serves clients that name none. TLS 1.3 and 1.2 (ALPN http/1.1 for
    /// serve http; none for serve kv, as memcached).
    #[arg(long, value_name = "PEM", requires = "tls_key", help_heading = "TLS")]
    pub(super) tls_cert: Vec<PathBuf>,
    /// The PEM private key of each --tls-cert, in the same order (PKCS#8, RSA or EC).
    /// SIGHUP reads every --tls-cert and --tls-key file again: new handshakes use them,
    /// established connections keep theirs, a broken file keeps the ones in force.
    #[arg(long, value_name = "PEM", requires = "tls_cert", help_heading = "TLS")]
    pub(super) tls_key: Vec<PathBuf>,
    /// Address for TLS beside the plain --listen ones (repeat for several). Without it,
    /// every --listen address speaks TLS.
    #[arg(long, value_name = "ADDR", value_parser = crate::check::parse_socket_addr,
          requires = "tls_cert", help_heading = "TLS")]
    pub(super) tls_listen: Vec<std::net::SocketAddr>,
    /// A TLS handshake must complete this long after its first byte, else the connection
    /// closes; a client silent this long before its handshake completes is closed too.
    #[arg(long, default_value = "10s", value_parser = parse_duration, help_heading = "TLS")]
    pub(super) tls_handshake_timeout: Duration,
    /// Bytes a client may send before its handshake completes (an oversize ClientHello
    /// closes).
    #[arg(long, default_value_t = 16 << 10, value_name = "BYTES", help_heading = "TLS",
          value_parser = clap::value_parser!(u32).range(1024..=(1 << 20)))]
    pub(super) tls_handshake_bytes_max: u32,
    /// Sessions each worker's session-ID cache keeps (no cache is shared between cores; 0:
    /// none).
    #[arg(long, default_value_t = 4096, value_name = "N", help_heading = "TLS")]
    pub(super) tls_session_cache: usize,
    /// Send no session tickets (resumption then only by session ID / the server's cache).
    #[arg(long, help_heading = "TLS")]
    pub(super) tls_no_tickets: bool,
    /// Session-ticket keys rotate on this period; a ticket opens for one to two periods.
    #[arg(long, default_value = "6h", value_parser = parse_duration, help_heading = "TLS")]
    pub(super) tls_ticket_period: Duration,
    /// The oldest TLS version accepted: 1.2 (1.2 and 1.3) or 1.3 (1.3 only).
    #[arg(long, default_value = "1.2", value_parser = ["1.2", "1.3"], help_heading = "TLS")]
    pub(super) tls_min_version: String,
    /// The TLS 1.2 suites offered, as an OpenSSL cipher list (nginx's ssl_ciphers,
    /// memcached's ssl_ciphers: `ECDHE+AESGCM`, `HIGH:!aNULL`, names joined by `:`), from
    /// rustls's six ECDHE AES-GCM / ChaCha20-Poly1305 suites, in the list's order; a list
    /// that chooses none of them is refused. TLS 1.3's suites are not affected.
    #[arg(long, value_name = "LIST", requires = "tls_cert", help_heading = "TLS")]
    pub(super) tls_ciphers: Option<String>,
    /// Plaintext per TLS record at most (memcached's ssl_wbuf_size): 32 to 16384; more is
    /// TLS's own 16 KiB.
    #[arg(long, value_name = "BYTES", help_heading = "TLS",
          value_parser = clap::value_parser!(u32).range(32..=(64 << 20)))]
    pub(super) tls_record_bytes: Option<u32>,
    /// Ask every TLS client for a certificate and check it against these PEM CA
    /// certificates (memcached's ssl_ca_cert with ssl_verify_mode 2); a client without one
    /// is refused unless --tls-client-cert-optional.
    #[arg(long, value_name = "PEM", requires = "tls_cert", help_heading = "TLS")]
    pub(super) tls_client_ca: Option<PathBuf>,
    /// With --tls-client-ca: let in a client that presents no certificate (one it presents
    /// must still check out; memcached's ssl_verify_mode 1).
    #[arg(long, requires = "tls_client_ca", help_heading = "TLS")]
    pub(super) tls_client_cert_optional: bool,
    /// kTLS: `auto` hands a TLS 1.3 connection's sending records to the kernel after its
    /// handshake where the kernel has the `tls` ULP and takes the cipher (probed at start;
    /// the start line says which path), received records are opened in user space; `off`
    /// keeps every record in user space.
    #[arg(long, default_value = "auto", value_parser = ["auto", "off"], help_heading = "TLS")]
    pub(super) tls_ktls: String,
}

#[derive(Debug, Args)]
pub(super) struct KvArgs {
    #[command(flatten)]
    pub(super) common: CommonArgs,
    /// Memory for items, in MiB (memcached -m).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub(super) memory_mb: u64,
    /// Largest item in bytes (memcached -I).
    #[arg(long, default_value_t = 1_048_576, value_parser = clap::value_parser!(u64).range(1024..=1_073_741_824))]
    pub(super) item_max: u64,
    /// Refuse flush_all (memcached -F): `CLIENT_ERROR flush_all not allowed`.
    #[arg(long)]
    pub(super) disable_flush_all: bool,
    /// Keep no CAS uniques (memcached -C): gets reports 0 and cas of a present item answers
    /// EXISTS.
    #[arg(long)]
    pub(super) disable_cas: bool,
    /// Connections over this many, process-wide, are answered `ERROR Too many open
    /// connections` and closed (memcached -c; 0: only --conns-per-worker applies).
    #[arg(long, default_value_t = 0)]
    pub(super) max_conns: u64,
    /// Refuse new items when memory is full instead of evicting (memcached -M).
    #[arg(long)]
    pub(super) disable_evictions: bool,
    /// Let the `shutdown` command stop the server (memcached -A).
    #[arg(long)]
    pub(super) enable_shutdown: bool,
    /// Refuse `stats cachedump` and `lru_crawler metadump` (memcached -X).
    #[arg(long)]
    pub(super) disable_dumping: bool,
    /// Requests a connection runs before the others get a turn (memcached -R).
    #[arg(long, value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) reqs_per_event: u32,
    /// Refuse `watch` (memcached -W).
    #[arg(long)]
    pub(super) disable_watch: bool,
    /// Log bytes buffered per `watch`er before lines are skipped (memcached -o
    /// watcher_logbuf_size, in KiB there).
    #[arg(long, value_name = "BYTES", default_value_t = 256 << 10,
          value_parser = clap::value_parser!(u32).range(1..=(64 << 20)))]
    pub(super) watcher_buf_bytes: u32,
    /// ASCII authentication (memcached -Y): a file of `user:password` lines; a connection
    /// must first send `set <k> <f> <t> <len>` with `user password` as its data.
    #[arg(long, value_name = "FILE")]
    pub(super) auth_file: Option<PathBuf>,
    /// No background reclaim of expired items (memcached -o no_lru_crawler).
    #[arg(long)]
    pub(super) no_lru_crawler: bool,
    /// Answer `stats sizes` from the start (memcached -o track_sizes).
    #[arg(long)]
    pub(super) track_sizes: bool,
    /// Count `stats detail` per key prefix from the start, prefixes ending at this byte
    /// (memcached -D).
    #[arg(long, value_name = "CHAR")]
    pub(super) detail_delimiter: Option<char>,
    /// memcached's UDP protocol on this port of each --listen address (memcached -U): 0 = off
    /// (memcached 1.6's default), `any` = one the kernel picks. One socket per worker CPU
    /// and address (SO_REUSEPORT), each served by a thread on that CPU.
    #[arg(long, default_value = "0", value_name = "PORT|any", value_parser = parse_udp_port)]
    pub(super) udp_port: UdpPort,
    /// Open no TCP listener (memcached -p 0): serve UDP only (--udp-port) on the --listen
    /// addresses' IPs, or, without UDP, nothing at all, as memcached does.
    #[arg(long)]
    pub(super) no_tcp: bool,
    /// Once listening, write the bound ports here as memcached does with
    /// MEMCACHED_PORT_FILENAME: `TCP INET: PORT` and `UDP INET: PORT` lines (INET6 for IPv6),
    /// written aside and renamed into place.
    #[arg(long, value_name = "PATH")]
    pub(super) port_file: Option<PathBuf>,
    /// Protocols a connection may speak (memcached -B): `ascii` (text, the default), `auto`
    /// (negotiated by the first byte: a binary request is closed, as this server speaks no
    /// binary protocol) or `binary` (every connection closed at its first byte: nothing here
    /// can answer it; for memcached command lines that ask for it).
    #[arg(long, default_value = "ascii", value_parser = parse_protocol)]
    pub(super) protocol: Protocol,
    /// memcached's warm restart (memcached -e): at a graceful stop (SIGUSR1 or `shutdown
    /// graceful`; not SIGTERM/SIGINT, as memcached) save the cache to PATH and its metadata
    /// to PATH.meta; at start load them if PATH.meta is there (then remove both), values,
    /// flags, CAS and expiry (time stopped counts). Other --memory-mb/--item-max: a clean
    /// start. A corrupt PATH.meta: refuses to start, as memcached.
    #[arg(long, value_name = "PATH")]
    pub(super) memory_file: Option<PathBuf>,
    #[command(flatten)]
    pub(super) tls: TlsArgs,
    /// Accept `debugtime <seconds>`, which moves the cache's clock forward (memcached's debug
    /// build has it for its tests; never for a shared cache: any client could expire items).
    #[arg(long, hide = true)]
    pub(super) debug_time: bool,
}

/// `serve kv --protocol`: memcached's `-B` names.
pub(super) fn parse_protocol(text: &str) -> Result<Protocol, String> {
    match text {
        "ascii" => Ok(Protocol::Ascii),
        "auto" => Ok(Protocol::Auto),
        "binary" => Ok(Protocol::Binary),
        _ => Err(format!("{text:?}: ascii, auto or binary")),
    }
}

/// `serve kv --udp-port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UdpPort {
    /// No UDP (0).
    Off,
    /// This port.
    Port(u16),
    /// One the kernel picks (`any`; memcached's `-U -1`).
    Any,
}

pub(super) fn parse_udp_port(text: &str) -> Result<UdpPort, String> {
    match text {
        "any" => Ok(UdpPort::Any),
        "0" => Ok(UdpPort::Off),
        _ => match text.parse::<u16>() {
            Ok(port) => Ok(UdpPort::Port(port)),
            Err(_) => Err(format!(
                "{text:?} is not a UDP port: 1 to 65535, 0 for no UDP, or `any` for one the \
                 kernel picks"
            )),
        },
    }
}

#[derive(Debug, Args)]
pub(super) struct RpcArgs {
    #[command(flatten)]
    pub(super) common: CommonArgs,
    /// Request size in bytes.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub(super) req_size: u32,
    /// Response size in bytes.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=16_777_216))]
    pub(super) resp_size: u32,
    /// Close after one response (connection-rate services).
    #[arg(long)]
    pub(super) one_shot: bool,
}
