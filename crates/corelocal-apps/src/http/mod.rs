//! Static HTTP/1.1 file server.
//!
//! [`HttpService`] serves GET and HEAD from a document root, or, with no root, the built-in
//! site: the paper's 30,000-file workload generated in memory
//! ([`corelocal_proto::http::fileset`]). Protocol logic is `corelocal_proto::http`; this module
//! adds the file system, the cache, the Date clock and the access log.
//!
//! - Small files (≤ `cache_file_bytes_max`) are kept in a sharded in-memory cache bounded by
//!   `cache_bytes_max` (FIFO eviction per shard) and revalidated with a `stat` at most every
//!   `cache_revalidate_ms`; larger files are opened per request and queued as a
//!   [`corelocal::runtime::FileRegion`] for the runtime to send without copying.
//! - Nothing outside the root is served: the target is normalised (no `..` escape, no NUL), and
//!   the real path of every opened file (`/proc/self/fd/N`, which resolves every symlink of the
//!   path actually opened, so there is no check-then-open race) must lie under the canonical
//!   root.
//! - Slow clients: a request head not complete `header_timeout_ms` after its first byte is
//!   answered 408 and the connection closed (the runtime's idle timeout catches silent ones).

mod conn;
mod log;
mod site;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use corelocal::runtime::{ConnInfo, Service};
use corelocal_proto::http::{date, fileset, Limits};

pub use conn::HttpConn;
use site::Site;

/// Where access-log lines go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AccessLog {
    /// No access log (the default: logging costs a write per batch of requests).
    #[default]
    Off,
    /// Standard error.
    Stderr,
    /// Appended to a file.
    File(PathBuf),
}

/// Configuration of an [`HttpService`].
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Document root; `None` serves the built-in site (the paper's file set, in memory).
    pub root: Option<PathBuf>,
    /// Request-head limits (request line, header bytes and count, body).
    pub limits: Limits,
    /// Total bytes of the in-memory file cache (bodies plus per-entry overhead).
    pub cache_bytes_max: u64,
    /// Files larger than this are not cached but sent as file regions (sendfile).
    pub cache_file_bytes_max: u64,
    /// A cached file is re-checked with `stat` when its entry is older than this.
    pub cache_revalidate_ms: u64,
    /// Access log destination.
    pub access_log: AccessLog,
    /// A request head must be complete this long after its first byte, or 408 and close.
    pub header_timeout_ms: u64,
    /// Requests served on one connection before it is closed (`Connection: close`).
    pub requests_per_conn_max: u64,
    /// Stop parsing pipelined requests while this many response bytes are queued (the runtime
    /// calls again with the unconsumed input once output drains); parsing also stops when the
    /// runtime's output limit leaves no room (`Output::room`).
    pub output_bytes_max: u64,
}

impl Default for HttpConfig {
    fn default() -> HttpConfig {
        HttpConfig {
            root: None,
            limits: Limits::default(),
            cache_bytes_max: 64 << 20,
            cache_file_bytes_max: 256 << 10,
            cache_revalidate_ms: 1_000,
            access_log: AccessLog::Off,
            header_timeout_ms: 10_000,
            requests_per_conn_max: 1_000_000,
            output_bytes_max: 4 << 20,
        }
    }
}

/// The access-log sink, shared by all connections.
enum LogSink {
    Stderr,
    File(Mutex<File>),
}

impl LogSink {
    fn write(&self, lines: &[u8]) {
        // A failing log must not take the server down; lines are dropped.
        let _ = match self {
            LogSink::Stderr => io::stderr().lock().write_all(lines),
            LogSink::File(f) => match f.lock() {
                Ok(mut f) => f.write_all(lines),
                Err(_) => Ok(()),
            },
        };
    }
}

/// State shared by every connection.
struct Inner {
    config: HttpConfig,
    site: Site,
    log: Option<LogSink>,
    /// Wall-clock time (since the epoch) at `instant_base`: `now` → unix time without reading
    /// the clock on the request path.
    wall_base: Duration,
    instant_base: Instant,
}

impl Inner {
    fn unix_secs(&self, now: Instant) -> u64 {
        (self.wall_base + now.saturating_duration_since(self.instant_base)).as_secs()
    }
}

/// The static file server: one per process, shared by every worker.
#[derive(Clone)]
pub struct HttpService {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for HttpService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpService")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl HttpService {
    /// Opens the root (or generates the built-in site) and the access log. The wall clock is
    /// read once, here.
    pub fn new(config: HttpConfig) -> io::Result<HttpService> {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        HttpService::with_clock(config, wall, Instant::now())
    }

    /// Like [`HttpService::new`] with an explicit clock base: `wall_since_epoch` is the wall
    /// time at `instant_base` (tests use this to get fixed dates).
    pub fn with_clock(
        config: HttpConfig,
        wall_since_epoch: Duration,
        instant_base: Instant,
    ) -> io::Result<HttpService> {
        let site = match &config.root {
            Some(root) => Site::root(root, &config, instant_base)?,
            None => Site::builtin(),
        };
        let log = match &config.access_log {
            AccessLog::Off => None,
            AccessLog::Stderr => Some(LogSink::Stderr),
            AccessLog::File(p) => Some(LogSink::File(Mutex::new(
                File::options()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| {
                        io::Error::new(e.kind(), format!("access log {}: {e}", p.display()))
                    })?,
            ))),
        };
        Ok(HttpService {
            inner: Arc::new(Inner {
                config,
                site,
                log,
                wall_base: wall_since_epoch,
                instant_base,
            }),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &HttpConfig {
        &self.inner.config
    }

    /// Files (and bytes) in the in-memory cache now.
    pub fn cached(&self) -> (usize, u64) {
        self.inner.site.cached()
    }
}

impl Service for HttpService {
    type Conn = HttpConn;

    fn name(&self) -> &'static str {
        "http"
    }

    fn connect(&self, info: &ConnInfo) -> HttpConn {
        HttpConn::new(self.inner.clone(), info)
    }
}

/// Writes the built-in site (the paper's file set and its index) under `dir`, so nginx,
/// lighttpd or `--root` serve byte-identical files. Returns the number of files written.
pub fn write_default_site(dir: &Path) -> io::Result<usize> {
    let mut n = 0;
    for (path, body) in fileset::files() {
        let target = dir.join(path.trim_start_matches('/'));
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&target, body)?;
        n += 1;
    }
    Ok(n)
}

/// The IMF-fixdate for unix second `unix`, formatted at most once per second per thread.
fn http_date(unix: u64) -> [u8; date::IMF_FIXDATE_LEN] {
    use std::cell::Cell;
    thread_local! {
        static CACHE: Cell<(u64, [u8; date::IMF_FIXDATE_LEN])> =
            const { Cell::new((u64::MAX, [0; date::IMF_FIXDATE_LEN])) };
    }
    CACHE.with(|c| {
        let (secs, text) = c.get();
        if secs == unix {
            return text;
        }
        let text = date::format_imf_fixdate(unix);
        c.set((unix, text));
        text
    })
}
