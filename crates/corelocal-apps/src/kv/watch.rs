//! memcached's `watch`: a connection turns into a log stream of the events it asked for
//! (fetchers, mutations, evictions, connevents), lines as memcached 1.6.18's logger formats
//! them (`ts=… gid=… type=…`).
//!
//! Each watcher has a bounded buffer ([`Logger::new`]'s `buf_bytes_max`, memcached's
//! `watcher_logbuf_size`); an event that does not fit is counted as skipped, and the next line
//! that fits is preceded by `skipped=N` (memcached's accounting for a watcher that falls
//! behind). The event's thread appends and notifies the watcher's connection
//! ([`corelocal::runtime::Notifier`]); its worker moves the buffer into the connection's
//! output ([`Watcher::drain_into`]). With no watcher, an event costs one relaxed load.

use super::conn::ChunkResult;
use super::store::{EvictionSink, Now, Put, Stored};
use super::Inner;
use corelocal::runtime::{Notifier, Output};
use corelocal_proto::memcache::watch as events;
use corelocal_proto::memcache::StoreOp;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// Watchers at once (memcached's `WATCHER_LIMIT`).
pub(super) const WATCHERS_MAX: usize = 20;
/// Per-watcher buffer by default (memcached's `LOGGER_WATCHER_BUF_SIZE`).
pub(super) const WATCHER_BUF_BYTES_DEFAULT: usize = 256 << 10;
/// Longest key written (URI-encoded: 3 bytes per byte at most), and so longest line.
const KEY_BYTES_MAX: usize = 250;

/// The watchers of one service and what they were sent.
pub(super) struct Logger {
    /// Union of the watched events: what an event checks before anything else.
    mask: AtomicU8,
    /// memcached's `gid`: a number per line, in the order lines were made.
    gid: AtomicU64,
    watchers: RwLock<Vec<Arc<Watcher>>>,
    buf_bytes_max: usize,
    /// Lines not written to a watcher whose buffer was full (`log_watcher_skipped`).
    pub(super) skipped: AtomicU64,
    /// Lines written to watchers' buffers (`log_watcher_sent`).
    pub(super) sent: AtomicU64,
}

/// One watching connection's side of the logger.
pub(super) struct Watcher {
    events: u8,
    notifier: Notifier,
    buf: Mutex<WatchBuf>,
}

#[derive(Default)]
struct WatchBuf {
    bytes: Vec<u8>,
    /// Lines dropped since the last one written.
    skipped: u64,
}

/// Why a `watch` was not started; the reply says it (memcached's words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// [`WATCHERS_MAX`] watchers already.
    TooMany,
}

impl Logger {
    /// A logger whose watchers buffer at most `buf_bytes_max` bytes each.
    pub(super) fn new(buf_bytes_max: usize) -> Logger {
        Logger {
            mask: AtomicU8::new(0),
            gid: AtomicU64::new(0),
            watchers: RwLock::new(Vec::new()),
            buf_bytes_max,
            skipped: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        }
    }

    /// Whether some watcher wants `event` (one of [`events`]).
    #[inline]
    pub(super) fn wants(&self, event: u8) -> bool {
        self.mask.load(Ordering::Relaxed) & event != 0
    }

    /// Watchers now (`log_watchers`).
    pub(super) fn watchers(&self) -> u64 {
        self.read().len() as u64
    }

    /// Adds a watcher of `events` that wakes its connection through `notifier`; its buffer
    /// starts with memcached's `OK`.
    pub(super) fn add(&self, events: u8, notifier: Notifier) -> Result<Arc<Watcher>, Refused> {
        let mut list = self.watchers.write().unwrap_or_else(|e| e.into_inner());
        if list.len() >= WATCHERS_MAX {
            return Err(Refused::TooMany);
        }
        let buf = WatchBuf {
            bytes: b"OK\r\n".to_vec(),
            skipped: 0,
        };
        let w = Arc::new(Watcher {
            events,
            notifier,
            buf: Mutex::new(buf),
        });
        list.push(w.clone());
        self.mask.fetch_or(events, Ordering::Relaxed);
        w.notifier.notify();
        Ok(w)
    }

    /// Removes a watcher (its connection closed).
    pub(super) fn remove(&self, w: &Arc<Watcher>) {
        let mut list = self.watchers.write().unwrap_or_else(|e| e.into_inner());
        list.retain(|x| !Arc::ptr_eq(x, w));
        let mask = list.iter().fold(0, |m, x| m | x.events);
        self.mask.store(mask, Ordering::Relaxed);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Watcher>>> {
        self.watchers.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Logs an `event` line whose fields after `type=` `body` writes; only when watched.
    pub(super) fn log(&self, event: u8, body: impl FnOnce(&mut Vec<u8>)) {
        if !self.wants(event) {
            return;
        }
        let line = self.line(body);
        for w in self.read().iter().filter(|w| w.events & event != 0) {
            let (sent, skipped) = w.push(&line, self.buf_bytes_max);
            self.sent.fetch_add(sent, Ordering::Relaxed);
            self.skipped.fetch_add(skipped, Ordering::Relaxed);
            w.notifier.notify();
        }
    }

    fn line(&self, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let gid = self.gid.fetch_add(1, Ordering::Relaxed) + 1;
        let mut line = Vec::with_capacity(128 + 3 * KEY_BYTES_MAX);
        let head = format!("ts={}.{} gid={gid} type=", ts.as_secs(), ts.subsec_micros());
        line.extend_from_slice(head.as_bytes());
        body(&mut line);
        line.push(b'\n');
        line
    }
}

impl Watcher {
    /// Appends `line` if it fits in `cap` bytes (after a `skipped=N` line for those dropped
    /// before it); returns (lines written, lines skipped).
    fn push(&self, line: &[u8], cap: usize) -> (u64, u64) {
        let mut b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        let skip_line = (b.skipped > 0).then(|| format!("skipped={}\n", b.skipped));
        let skip_len = skip_line.as_ref().map_or(0, String::len);
        if b.bytes.len() + skip_len + line.len() > cap {
            b.skipped += 1;
            return (0, 1);
        }
        if let Some(s) = skip_line {
            b.bytes.extend_from_slice(s.as_bytes());
            b.skipped = 0;
        }
        b.bytes.extend_from_slice(line);
        (1, 0)
    }

    /// Moves what is buffered into `out`, as much as its room allows.
    pub(super) fn drain_into(&self, out: &mut Output) {
        let mut b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        let n = b
            .bytes
            .len()
            .min(out.room().try_into().unwrap_or(usize::MAX));
        out.write(&b.bytes[..n]);
        b.bytes.drain(..n);
    }
}

/// Writes `key` URI-encoded as memcached's logger does (unreserved bytes as they are, the
/// rest as `%XX`), at most [`KEY_BYTES_MAX`] bytes of it.
pub(super) fn uri_key(out: &mut Vec<u8>, key: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in key.iter().take(KEY_BYTES_MAX) {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
}

/// The event bits of `watch`'s arguments, re-exported for the service.
pub(super) use events::{CONNEVENTS, EVICTIONS, FETCHERS, MUTATIONS};

/// The store's eviction sink: `type=eviction` lines.
pub(super) fn eviction_sink(logger: &Arc<Logger>) -> EvictionSink {
    // The logger holds nothing of the store: no cycle.
    let logger = logger.clone();
    Arc::new(move |e| {
        logger.log(EVICTIONS, |line| {
            line.extend_from_slice(b"eviction key=");
            uri_key(line, e.key);
            let fetch = if e.fetched { "yes" } else { "no" };
            let ttl = e.exp as i64 - e.now as i64;
            let ttl = if e.exp == 0 { -1 } else { ttl };
            let size = e.value_len;
            let la = e.now.saturating_sub(e.atime);
            let clsid = e.class;
            let tail = format!(" fetch={fetch} ttl={ttl} la={la} clsid={clsid} size={size}");
            line.extend_from_slice(tail.as_bytes());
        });
    })
}

/// `type=item_get` for `key` (`found`: its value's bytes and slab class) fetched by the
/// connection `cfd`.
pub(super) fn log_get(inner: &Inner, cfd: u64, key: &[u8], found: Option<(usize, u8)>) {
    inner.watch.log(FETCHERS, |line| {
        line.extend_from_slice(b"item_get key=");
        uri_key(line, key);
        let (status, (size, clsid)) = match found {
            Some(f) => ("found", f),
            None => ("not_found", (0, 0)),
        };
        let tail = format!(" status={status} clsid={clsid} cfd={cfd} size={size}");
        line.extend_from_slice(tail.as_bytes());
    });
}

/// Stores `put` (its data with the `\r\n`) for the connection `cfd`, logging what memcached
/// logs around a store: the lookup (`item_get`) and the outcome (`item_store`). `text`: a
/// classic storage command (meta ones are not logged here).
pub(super) fn log_store(
    inner: &Inner,
    cfd: u64,
    put: Put<'_>,
    text: bool,
    now: Now,
) -> ChunkResult {
    let (key, op, exp, flags, data) = (put.key, put.op, put.exp, put.flags, put.data);
    if text && inner.watch.wants(FETCHERS) {
        log_get(inner, cfd, key, inner.store.peek(key, now));
    }
    let r = inner.store_chunk(put, now);
    let ChunkResult::Stored(stored, _) = r else {
        return r;
    };
    if text && inner.watch.wants(MUTATIONS) {
        let ttl = if exp == 0 {
            0
        } else {
            exp.saturating_sub(now.unix)
        };
        let size = data.len().saturating_sub(2);
        let class = inner.store.class_of(key, flags, &data[..size]);
        inner.watch.log(MUTATIONS, |line| {
            line.extend_from_slice(b"item_store key=");
            uri_key(line, key);
            let (status, cmd) = (stored_name(stored), op_name(op));
            let tail =
                format!(" status={status} cmd={cmd} ttl={ttl} clsid={class} cfd={cfd} size={size}");
            line.extend_from_slice(tail.as_bytes());
        });
    }
    r
}

fn stored_name(s: Stored) -> &'static str {
    match s {
        Stored::Stored => "stored",
        Stored::NotStored => "not_stored",
        Stored::Exists => "exists",
        Stored::NotFound => "not_found",
        Stored::NoMemory => "no_memory",
    }
}

fn op_name(op: StoreOp) -> &'static str {
    match op {
        StoreOp::Set => "set",
        StoreOp::Add => "add",
        StoreOp::Replace => "replace",
        StoreOp::Append => "append",
        StoreOp::Prepend => "prepend",
        StoreOp::Cas => "cas",
    }
}

/// `type=conn_new` / `type=conn_close` (`error`: closed for a protocol error) for the
/// connection `cfd` from `peer`.
pub(super) fn log_conn(inner: &Inner, what: &str, peer: Option<SocketAddr>, cfd: u64, error: bool) {
    inner.watch.log(CONNEVENTS, |line| {
        let (rip, rport) = peer.map_or((String::from("unknown"), 0), |p| {
            (p.ip().to_string(), p.port())
        });
        let reason = match (what, error) {
            ("conn_close", false) => " reason=normal",
            ("conn_close", true) => " reason=error",
            _ => "",
        };
        let text = format!("{what} rip={rip} rport={rport} transport=tcp{reason} cfd={cfd}");
        line.extend_from_slice(text.as_bytes());
    });
}
