//! memcached text-protocol server.
//!
//! [`KvService`] speaks the memcached text protocol (get/gets/gat/gats, set/add/replace/
//! append/prepend/cas, delete, incr/decr, touch, flush_all, version, verbosity, stats, quit,
//! `noreply`) and its meta protocol (mg/ms/md/ma/me/mn) over a [`store::Store`] shared by
//! every worker: striped locks, each stripe its own LRU and byte budget. Replies — errors included — are byte-identical to memcached
//! 1.6.18's for the cases in the tests (checked against a live memcached).

mod admin;
#[cfg(test)]
mod admin_tests;
mod conn;
mod conns;
mod memfile;
#[cfg(test)]
mod memfile_tests;
mod meta;
#[cfg(test)]
mod meta_tests;
mod snapshot;
mod stats;
#[cfg(test)]
mod stats_tests;
pub mod store;
mod takeover;
#[cfg(test)]
mod takeover_tests;
#[cfg(test)]
mod tests;
pub mod udp;
#[cfg(test)]
mod udp_tests;
mod watch;
#[cfg(test)]
mod watch_tests;

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use corelocal::runtime::handoff::{StateExport, StateImport};
use corelocal::runtime::{ConnInfo, Service};
use corelocal_proto::memcache::Limits;

pub use admin::{parse_auth_file, Credentials, ShutdownHook};
pub use conn::KvConn;
use store::{Now, Store};

/// Configuration of a [`KvService`].
#[derive(Debug, Clone)]
pub struct KvConfig {
    /// Memory for items (memcached `-m`), bytes, with memcached's per-item accounting plus a
    /// small per-item overhead.
    pub memory_bytes_max: u64,
    /// Largest item (memcached `-I`): key + value + 59 bytes of header (+4 with flags).
    pub item_bytes_max: u64,
    /// Lock stripes (rounded up to a power of two; reduced so that each stripe holds at least
    /// two maximum-size items).
    pub stripes: usize,
    /// Line framing limits.
    pub limits: Limits,
    /// Stop reading pipelined commands while this many reply bytes are queued; they also stop
    /// when the runtime's output limit leaves no room (`Output::room`).
    pub output_bytes_max: u64,
    /// Largest reply to one get (many large values): beyond it the get is answered
    /// `SERVER_ERROR out of memory writing get response`.
    pub get_response_bytes_max: u64,
    /// `flush_all` allowed (memcached `-F` turns it off: `CLIENT_ERROR flush_all not
    /// allowed`), so that a client cannot empty a cache others share.
    pub flush_enabled: bool,
    /// CAS uniques kept (memcached `-C` turns them off: `gets` reports 0, `cas` of a present
    /// item answers EXISTS, and `flush_all` can only tell items apart by the second they were
    /// stored in, so an item stored in the same second as a flush is flushed too).
    pub cas_enabled: bool,
    /// What `stats` and `stats settings` report about the server around the service (the
    /// runtime owns these; memcached's names).
    pub report: Report,
    /// `stats detail` key prefix delimiter (memcached `-D`, default `:`).
    pub prefix_delimiter: u8,
    /// `stats cachedump` and `lru_crawler metadump` allowed (memcached `-X` turns them off).
    pub dump_enabled: bool,
    /// Background reclaim of expired items at start (memcached's LRU crawler; `-o
    /// no_lru_crawler` turns it off, and then `lru_crawler crawl|metadump` answer
    /// `CLIENT_ERROR lru crawler disabled` until `lru_crawler enable`).
    pub lru_crawler: bool,
    /// `stats sizes` histogram kept from the start (memcached `-o track_sizes`).
    pub track_sizes: bool,
    /// `stats detail` counting from the start (memcached `-D` turns it on).
    pub detail: bool,
    /// Accept `debugtime <seconds>`, which moves the service's clock forward (memcached's
    /// debug build, for its tests); off, the command is `ERROR` as in memcached's release
    /// build.
    pub debug_time: bool,
    /// Evict to make room (memcached `-M` turns it off: a full store refuses new items with
    /// `SERVER_ERROR out of memory storing object`).
    pub evictions: bool,
    /// The `shutdown` command stops the server (memcached `-A`); else it is refused.
    pub shutdown_enabled: bool,
    /// What `shutdown` calls (with `-A`; without a hook the command is refused too).
    pub shutdown: Option<ShutdownHook>,
    /// The TLS layer around the service, when connections speak TLS: `refresh_certs` reloads
    /// its certificates, `stats` shows its counters (memcached's TLS build).
    pub tls: Option<crate::tls::TlsHandle>,
    /// Connections over this many (process-wide) are answered `ERROR Too many open
    /// connections` and closed (memcached `-c`); 0: no limit here.
    pub conn_limit: u64,
    /// ASCII authentication (memcached `-Y`): accepted user/password pairs; empty = off.
    pub auth: Vec<admin::Credentials>,
    /// What a connection's first byte decides (memcached `-B`).
    pub protocol: Protocol,
    /// memcached's warm restart (`-e`): where [`KvService::save_memory_file`] saves the
    /// cache and [`KvService::restore_memory_file`] finds it (`memfile`).
    pub memory_file: Option<std::path::PathBuf>,
    /// `watch` allowed (memcached `-W` turns it off: `CLIENT_ERROR watch commands not
    /// allowed`).
    pub watch_enabled: bool,
    /// Log bytes buffered per watcher before lines are skipped (memcached `-o
    /// watcher_logbuf_size`, which counts KiB).
    pub watcher_buf_bytes: usize,
}

/// memcached's `-B`: the protocols a connection may speak. Only the text protocols (classic
/// and meta) are spoken here; the binary one is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Text for every connection; a binary request is read as text (memcached `-B ascii`).
    Ascii,
    /// By the first byte, as memcached negotiates: the binary magic (0x80) closes the
    /// connection, as there is no binary protocol to answer it in; anything else is text.
    Auto,
    /// Binary only (memcached `-B binary`): no request can be answered, so every connection
    /// is closed at its first byte, as memcached closes a text one.
    Binary,
}

impl Protocol {
    /// memcached's name in `stats settings` (`binding_protocol`).
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Ascii => "ascii",
            Protocol::Auto => "auto-negotiate",
            Protocol::Binary => "binary",
        }
    }

    /// Whether a request (connection or UDP datagram) that starts with `first` is refused.
    fn refuses(self, first: u8) -> bool {
        match self {
            Protocol::Ascii => false,
            Protocol::Auto => first == BINARY_MAGIC,
            Protocol::Binary => true,
        }
    }
}

/// The first byte of a binary-protocol request.
const BINARY_MAGIC: u8 = 0x80;

/// Facts about the surrounding server that memcached's `stats` report and the service cannot
/// see for itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Worker threads (`threads`, `num_threads`).
    pub threads: u32,
    /// Connection limit (`max_connections`, `maxconns`).
    pub max_connections: u64,
    /// First listening port (`tcpport`).
    pub tcp_port: u16,
    /// Listen address when one was given (`inter`).
    pub interface: Option<String>,
    /// Listen backlog (`tcp_backlog`).
    pub backlog: u32,
    /// Idle connection timeout in seconds, 0 = none (`idle_timeout`).
    pub idle_timeout_secs: u64,
    /// Requests handled per read before yielding (`reqs_per_event`).
    pub reqs_per_event: u32,
    /// The listening addresses (`stats conns`).
    pub listen: Vec<std::net::SocketAddr>,
    /// The UDP port (`udpport`; 0: no UDP).
    pub udp_port: u16,
    /// Each UDP socket's bound address, one entry per socket ([`udp::UdpSockets::addrs`]):
    /// `stats conns` lists them and [`udp::serve`] registers them in this order.
    pub udp: Vec<std::net::SocketAddr>,
    /// memcached's `ssl_*` lines of `stats settings` (name, value) when connections speak
    /// TLS; none without TLS.
    pub tls: Vec<(String, String)>,
}

impl Default for Report {
    fn default() -> Report {
        Report {
            threads: 1,
            max_connections: 1024,
            tcp_port: 11211,
            interface: None,
            backlog: 1024,
            idle_timeout_secs: 0,
            reqs_per_event: 20,
            listen: Vec::new(),
            udp_port: 0,
            udp: Vec::new(),
            tls: Vec::new(),
        }
    }
}

impl Default for KvConfig {
    fn default() -> KvConfig {
        KvConfig {
            memory_bytes_max: 64 << 20,
            item_bytes_max: 1 << 20,
            stripes: 64,
            limits: Limits::default(),
            output_bytes_max: 4 << 20,
            get_response_bytes_max: 64 << 20,
            flush_enabled: true,
            cas_enabled: true,
            report: Report::default(),
            prefix_delimiter: b':',
            dump_enabled: true,
            lru_crawler: true,
            track_sizes: false,
            detail: false,
            debug_time: false,
            evictions: true,
            shutdown_enabled: false,
            shutdown: None,
            tls: None,
            conn_limit: 0,
            auth: Vec::new(),
            protocol: Protocol::Ascii,
            memory_file: None,
            watch_enabled: true,
            watcher_buf_bytes: watch::WATCHER_BUF_BYTES_DEFAULT,
        }
    }
}

/// Shared state: the store, the clock base and connection counters.
struct Inner {
    config: KvConfig,
    store: Store,
    wall_base: Duration,
    instant_base: Instant,
    /// Unix seconds at creation (memcached's `process_started`, for absolute expiry times).
    started_unix: u64,
    pid: u32,
    curr_connections: AtomicU64,
    total_connections: AtomicU64,
    cmd_flush: AtomicU64,
    /// Everything else `stats` reports that is not in the store.
    stats: stats::ServerStats,
    /// Live connections (`stats conns`).
    conns: conns::Registry,
    /// memcached's `watch` log streams.
    watch: Arc<watch::Logger>,
}

impl Inner {
    /// Time since the clock base, `debugtime` included.
    fn since_base(&self, now: Instant) -> Duration {
        let since = now.saturating_duration_since(self.instant_base);
        if !self.config.debug_time {
            return since;
        }
        since + Duration::from_secs(self.stats.time_offset.load(Ordering::Relaxed))
    }

    /// [`Now::unix`] alone (a new connection's registration needs no more).
    fn unix(&self, now: Instant) -> u64 {
        (self.wall_base + self.since_base(now)).as_secs()
    }

    fn now(&self, now: Instant) -> Now {
        let since = self.since_base(now);
        // Counted from the start of the wall-clock second the store was created in, so that
        // wall seconds begin at multiples of 1e9 (flush_all without CAS works by seconds).
        let since_second = since + Duration::from_nanos(self.wall_base.subsec_nanos().into());
        Now {
            unix: (self.wall_base + since).as_secs(),
            ns: u64::try_from(since_second.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// memcached's relative clock for a unix time: seconds since its `process_started`, which
    /// it sets 62 s before it starts; its "already expired" time 1 stays 1. (Remaining TTLs
    /// are differences of these, in 32 bits, as memcached prints them.)
    fn rel_time(&self, unix: u64) -> u32 {
        let base = self.started_unix.saturating_sub(62);
        if unix <= base {
            1
        } else {
            (unix - base) as u32
        }
    }

    /// [`Now::ns`] at the start of wall-clock second `unix` (not before the store's first).
    fn second_start_ns(&self, unix: u64) -> u64 {
        unix.saturating_sub(self.wall_base.as_secs())
            .saturating_mul(1_000_000_000)
    }
}

/// The memcached-protocol server: one per process, shared by every worker.
#[derive(Clone)]
pub struct KvService {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KvService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvService")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl KvService {
    /// A service with an empty store. The wall clock is read once, here.
    pub fn new(config: KvConfig) -> io::Result<KvService> {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        KvService::with_clock(config, wall, Instant::now())
    }

    /// Like [`KvService::new`] with an explicit clock base (`wall_since_epoch` at
    /// `instant_base`).
    pub fn with_clock(
        mut config: KvConfig,
        wall_since_epoch: Duration,
        instant_base: Instant,
    ) -> io::Result<KvService> {
        if config.item_bytes_max < 1024 || config.memory_bytes_max < config.item_bytes_max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "kv: need item_bytes_max >= 1024 and memory_bytes_max >= item_bytes_max",
            ));
        }
        let fit = (config.memory_bytes_max / (2 * config.item_bytes_max)).max(1) as usize;
        config.stripes = config.stripes.clamp(1, 1 << 16).next_power_of_two();
        while config.stripes > 1 && config.stripes > fit {
            config.stripes /= 2;
        }
        let config_for_stats = config.clone();
        let registry = conns::Registry::new(
            config.report.threads as usize,
            config.report.listen.clone(),
            config.report.udp.len(),
            wall_since_epoch.as_secs(),
        );
        let store = Store::new(
            config.memory_bytes_max,
            config.item_bytes_max,
            config.stripes,
        )
        .with_cas(config.cas_enabled)
        .with_evictions(config.evictions);
        let logger = Arc::new(watch::Logger::new(config.watcher_buf_bytes));
        let store = if config.watch_enabled {
            store.with_eviction_sink(watch::eviction_sink(&logger))
        } else {
            store
        };
        let inner = Arc::new(Inner {
            config,
            store,
            wall_base: wall_since_epoch,
            instant_base,
            started_unix: wall_since_epoch.as_secs(),
            pid: std::process::id(),
            curr_connections: AtomicU64::new(0),
            total_connections: AtomicU64::new(0),
            cmd_flush: AtomicU64::new(0),
            stats: stats::ServerStats::new(&config_for_stats),
            conns: registry,
            watch: logger,
        });
        // Started even when off: `lru_crawler enable` turns it on.
        admin::start_crawler(&inner);
        Ok(KvService { inner })
    }

    /// The configuration in use (stripes as adjusted).
    pub fn config(&self) -> &KvConfig {
        &self.inner.config
    }

    /// The store (for metrics).
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// memcached's warm restart, at start: loads the cache saved in
    /// [`KvConfig::memory_file`] (`None`: no memory file configured). `Ok`: what happened,
    /// for the log (a clean start included); `Err`: the server must not start (memcached
    /// refuses a corrupt metadata file too). Call it before serving.
    pub fn restore_memory_file(&self) -> Option<Result<String, String>> {
        let path = self.inner.config.memory_file.as_ref()?;
        Some(memfile::restore(&self.inner, path))
    }

    /// memcached's warm restart, at a graceful stop: saves the cache to
    /// [`KvConfig::memory_file`] (`None`: none configured). Call it once the workers have
    /// stopped, so that nothing changes the cache while it is written.
    pub fn save_memory_file(&self) -> Option<Result<String, String>> {
        let path = self.inner.config.memory_file.as_ref()?;
        Some(memfile::save(&self.inner, path))
    }

    /// The addresses the server listens on once bound (`stats conns` lists them; a port 0
    /// in the configuration becomes the kernel's choice).
    pub fn set_listening(&self, addrs: &[std::net::SocketAddr]) {
        self.inner.conns.set_listen(addrs);
    }
}

impl Service for KvService {
    type Conn = KvConn;

    fn name(&self) -> &'static str {
        "kv"
    }

    fn connect(&self, info: &ConnInfo) -> KvConn {
        let curr = self.inner.curr_connections.fetch_add(1, Ordering::Relaxed) + 1;
        self.inner.total_connections.fetch_add(1, Ordering::Relaxed);
        let limit = self.inner.config.conn_limit;
        let rejected = limit != 0 && curr > limit;
        if rejected {
            self.inner
                .stats
                .rejected_connections
                .fetch_add(1, Ordering::Relaxed);
        }
        let at = self.inner.unix(info.now);
        let registration = self.inner.conns.add(info.worker, info.peer, at);
        let conn = KvConn::new(self.inner.clone(), info, rejected, registration);
        conn.log_connect();
        conn
    }

    fn resume(&self, info: &ConnInfo, state: &[u8]) -> KvConn {
        let mut conn = self.connect(info);
        conn.resume(state);
        conn
    }

    fn export_state(self: Arc<Self>) -> Option<Box<dyn StateExport>> {
        Some(Box::new(takeover::KvExport::new(
            &self.inner,
            Instant::now(),
        )))
    }

    fn import_state(self: Arc<Self>) -> Option<Box<dyn StateImport>> {
        Some(Box::new(takeover::KvImport::new(
            &self.inner,
            takeover::FROM_PREDECESSOR,
        )))
    }
}
