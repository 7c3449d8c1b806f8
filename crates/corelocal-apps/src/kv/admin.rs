//! Operational commands: `shutdown`, `cache_memlimit`, `lru_crawler` (crawl, metadump,
//! enable/disable, sleep, tocrawl), `watch`; the LRU crawler itself (a background thread that
//! reclaims expired and flushed items); ASCII authentication (memcached `-Y`).

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use corelocal_proto::memcache::{self, safe_strtoul, write_line, Crawler};

use super::store::Now;
use super::Inner;

/// A callback that stops the server (memcached's `shutdown` raises SIGINT or SIGUSR1; ours is
/// given by whoever runs the service). The flag says whether a graceful stop was asked.
#[derive(Clone)]
pub struct ShutdownHook(pub Arc<dyn Fn(bool) + Send + Sync>);

impl std::fmt::Debug for ShutdownHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShutdownHook")
    }
}

/// Items the background crawler looks at per stripe and pass (memcached's crawler walks every
/// item; a bounded pass keeps the stripe lock short).
const CRAWL_PER_STRIPE: usize = 4096;

/// How often the background crawler passes over the store.
const CRAWL_INTERVAL: Duration = Duration::from_secs(1);

/// memcached's `uriencode` for metadump keys: alphanumerics and `-._~` as is, others `%XX`.
fn uriencode(key: &[u8], out: &mut Vec<u8>) {
    for &b in key {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

/// A class list as `lru_crawler crawl|metadump` takes it: `all`, or ids separated by commas
/// (each below 64); `None` for a bad one. `hash` (metadump) walks everything too.
fn classes(list: &[u8]) -> Option<Option<Vec<u8>>> {
    if list == b"all" || list == b"hash" {
        return Some(None);
    }
    let mut ids = Vec::new();
    for part in list.split(|&b| b == b',') {
        let id = safe_strtoul(part)?;
        if id as usize >= memcache::slabs::CLASSES_MAX - 1 {
            return None;
        }
        ids.push(id as u8);
    }
    Some(Some(ids))
}

impl Inner {
    /// `refresh_certs`: the TLS layer reads its certificate files again (new handshakes use
    /// them); `ERROR` without TLS, as memcached without `-Z`.
    pub(super) fn refresh_certs(&self, out: &mut Vec<u8>) {
        let Some(tls) = &self.config.tls else {
            write_line(out, memcache::ERROR);
            return;
        };
        match tls.reload() {
            Ok(_) => write_line(out, "OK"),
            // One line: the reason may span several.
            Err(e) => write_line(out, &format!("ERROR {}", e.replace(['\r', '\n'], " "))),
        }
    }

    /// `shutdown [graceful]`: whether to close the connection.
    pub(super) fn shutdown(&self, mode: Option<bool>, out: &mut Vec<u8>) -> bool {
        let Some(hook) = self
            .config
            .shutdown
            .as_ref()
            .filter(|_| self.config.shutdown_enabled)
        else {
            write_line(out, "ERROR: shutdown not enabled");
            return false;
        };
        let Some(graceful) = mode else {
            write_line(out, memcache::BAD_SHUTDOWN_MODE);
            return false;
        };
        (hook.0)(graceful);
        true
    }

    /// `cache_memlimit <MiB>`: memcached's bounds and replies; a lower limit evicts as new
    /// items need room.
    pub(super) fn cache_memlimit(&self, mb: Option<u32>, noreply: bool, out: &mut Vec<u8>) {
        let reply = match mb {
            None => "ERROR",
            Some(mb) if mb < 8 => "MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m",
            Some(mb) if mb > 1_000_000_000 => {
                "MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes"
            }
            Some(mb) if u64::from(mb) << 20 < self.store.item_bytes_max() => {
                "MEMLIMIT_ADJUST_FAILED out of bounds or unable to adjust"
            }
            Some(mb) => {
                self.store.set_memory_limit(u64::from(mb) << 20);
                "OK"
            }
        };
        if !noreply {
            write_line(out, reply);
        }
    }

    /// `lru_crawler …`; `pipelined`: replies to earlier commands are still queued (memcached
    /// refuses a metadump then, its stream would interleave with them).
    pub(super) fn lru_crawler(
        self: &Arc<Self>,
        c: Crawler<'_>,
        out: &mut Vec<u8>,
        now: Now,
        pipelined: bool,
    ) {
        let s = &self.stats;
        let enabled = s.crawler_enabled.load(Ordering::Relaxed);
        if !enabled && matches!(c, Crawler::Crawl(_) | Crawler::Metadump(_)) {
            return write_line(out, "CLIENT_ERROR lru crawler disabled");
        }
        match c {
            Crawler::Crawl(list) => {
                let Some(which) = classes(list) else {
                    return write_line(out, "BADCLASS invalid class id");
                };
                if s.crawler_running.swap(true, Ordering::AcqRel) {
                    return write_line(out, "BUSY currently processing crawler request");
                }
                let inner = Arc::clone(self);
                std::thread::spawn(move || {
                    let now = inner.now(Instant::now());
                    inner.crawl(now, usize::MAX, which.as_deref());
                    inner.stats.crawler_running.store(false, Ordering::Release);
                });
                write_line(out, "OK");
            }
            Crawler::Metadump(list) => {
                if !self.config.dump_enabled {
                    return write_line(out, "ERROR metadump not allowed");
                }
                if pipelined {
                    return write_line(out, "ERROR cannot pipeline other commands before metadump");
                }
                let Some(which) = classes(list) else {
                    return write_line(out, "BADCLASS invalid class id");
                };
                self.metadump(out, now, which.as_deref());
            }
            Crawler::Tocrawl(None) | Crawler::Sleep(None) => write_line(out, memcache::BAD_FORMAT),
            Crawler::Sleep(Some(us)) if us > 1_000_000 => {
                write_line(out, "CLIENT_ERROR sleep must be one second or less")
            }
            Crawler::Tocrawl(Some(_)) | Crawler::Sleep(Some(_)) => write_line(out, "OK"),
            Crawler::Enable => {
                s.crawler_enabled.store(true, Ordering::Relaxed);
                write_line(out, "OK");
            }
            Crawler::Disable => {
                s.crawler_enabled.store(false, Ordering::Relaxed);
                write_line(out, "OK");
            }
        }
    }

    /// One crawler pass: reclaims dead items, counted in the crawler's statistics.
    fn crawl(&self, now: Now, per_stripe: usize, classes: Option<&[u8]>) {
        let s = &self.stats;
        s.crawler_starts.fetch_add(1, Ordering::Relaxed);
        let (checked, reclaimed) = self.store.crawl(now, per_stripe, classes);
        s.crawler_checked.fetch_add(checked, Ordering::Relaxed);
        s.crawler_reclaimed.fetch_add(reclaimed, Ordering::Relaxed);
    }

    /// `lru_crawler metadump`: one line per live item, then `END`, as memcached's crawler
    /// writes them (key URI-encoded; expiry and last access as unix times).
    fn metadump(&self, out: &mut Vec<u8>, now: Now, classes: Option<&[u8]>) {
        self.store.dump(now, |it| {
            if classes.is_some_and(|c| !c.contains(&it.class)) {
                return true;
            }
            out.extend_from_slice(b"key=");
            uriencode(it.key, out);
            let exp = if it.exp == 0 { -1 } else { it.exp as i64 };
            let size = self.item_total(it.key.len(), it.flags, it.value_len);
            let _ = writeln!(
                out,
                " exp={exp} la={} cas={} fetch={} cls={} size={size}",
                it.atime,
                it.cas,
                if it.fetched { "yes" } else { "no" },
                it.class,
            );
            true
        });
        write_line(out, "END");
    }
}

/// Starts the background crawler for `inner` (it stops when the service is dropped).
pub(super) fn start_crawler(inner: &Arc<Inner>) {
    let weak: Weak<Inner> = Arc::downgrade(inner);
    let spawned = std::thread::Builder::new()
        .name("kv-crawler".into())
        .spawn(move || loop {
            std::thread::sleep(CRAWL_INTERVAL);
            let Some(inner) = weak.upgrade() else { return };
            inner.grow_hash_power(inner.store.totals().curr_items);
            if !inner.stats.crawler_enabled.load(Ordering::Relaxed)
                || inner.stats.crawler_running.swap(true, Ordering::AcqRel)
            {
                continue;
            }
            let now = inner.now(Instant::now());
            inner.crawl(now, CRAWL_PER_STRIPE, None);
            inner.stats.crawler_running.store(false, Ordering::Release);
        });
    if let Err(e) = spawned {
        eprintln!("kv: no LRU crawler thread ({e}); expired items are reclaimed when touched");
    }
}

/// Where a connection is in memcached's ASCII authentication (`-Y`): before it, the only
/// accepted request is `set <any> <any> <any> <len>` whose data is `user pass`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Auth {
    /// Authenticated (or no authentication configured).
    Done,
    /// Waiting for the `set` line.
    Line,
    /// Waiting for this many bytes of `user pass\r\n`.
    Token(usize),
}

impl Inner {
    /// Runs the authentication exchange on `input`; returns bytes consumed and whether to
    /// close (a line over 2048 bytes without `\n`, or a token longer than the input limit).
    pub(super) fn authenticate(
        &self,
        auth: &mut Auth,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> (usize, bool) {
        match *auth {
            Auth::Done => (0, false),
            Auth::Line => {
                if input.len() < 2 {
                    return (0, false);
                }
                let Some(nl) = input.iter().position(|&b| b == b'\n') else {
                    return (0, input.len() > 2048);
                };
                // memcached tokenizes with the '\r' left in; its number parser stops there.
                let toks: Vec<&[u8]> = input[..nl]
                    .split(|&b| b == b' ')
                    .filter(|t| !t.is_empty())
                    .collect();
                let size = (toks.len() >= 5 && toks[0] == b"set")
                    .then(|| safe_strtoul(toks[4]))
                    .flatten();
                match size {
                    Some(n) if (n as usize) < self.config.limits.get_line_bytes_max => {
                        *auth = Auth::Token(n as usize + 2);
                    }
                    Some(_) => return (nl + 1, true),
                    None => write_line(out, "CLIENT_ERROR unauthenticated"),
                }
                (nl + 1, false)
            }
            Auth::Token(len) => {
                if input.len() < len {
                    return (0, false);
                }
                *auth = Auth::Line;
                let data = &input[..len];
                if !data.ends_with(b"\r\n") {
                    write_line(out, "CLIENT_ERROR bad command line termination");
                    return (len, false);
                }
                let toks: Vec<&[u8]> = data[..len - 2]
                    .split(|&b| b == b' ')
                    .filter(|t| !t.is_empty())
                    .collect();
                if toks.len() < 2 {
                    write_line(out, "CLIENT_ERROR bad authentication token format");
                    return (len, false);
                }
                self.stats.auth_cmds.fetch_add(1, Ordering::Relaxed);
                if self
                    .config
                    .auth
                    .iter()
                    .any(|(u, p)| u[..] == *toks[0] && p[..] == *toks[1])
                {
                    *auth = Auth::Done;
                    write_line(out, "STORED");
                } else {
                    self.stats.auth_errors.fetch_add(1, Ordering::Relaxed);
                    write_line(out, "CLIENT_ERROR authentication failure");
                }
                (len, false)
            }
        }
    }
}

/// A user and password accepted by ASCII authentication.
pub type Credentials = (Vec<u8>, Vec<u8>);

/// Parses a memcached `-Y` file: `user:password` lines (at most 8 are used, as memcached);
/// a line without `:` is an error.
pub fn parse_auth_file(text: &[u8]) -> Result<Vec<Credentials>, String> {
    let mut entries = Vec::new();
    for (n, line) in text.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err(format!("line {}: no ':' between user and password", n + 1));
        };
        entries.push((line[..colon].to_vec(), line[colon + 1..].to_vec()));
        if entries.len() == 8 {
            break;
        }
    }
    if entries.is_empty() {
        return Err("no user:password line".into());
    }
    Ok(entries)
}
