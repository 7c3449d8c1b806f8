//! What the server serves: the built-in site or a document root with its file cache.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::fs::{File, Metadata};
use std::hash::{Hash, Hasher};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use corelocal_proto::http::{date, fileset, response, NormPath, Status};

use super::HttpConfig;

/// The bytes of a file to send.
pub(crate) enum Body {
    /// Held in memory (cached or built-in).
    Memory(Box<[u8]>),
    /// An open file, sent as a file region (zero-copy).
    File(Arc<File>),
}

/// One servable file with its precomputed response fields.
pub(crate) struct Entry {
    pub body: Body,
    pub len: u64,
    /// Strong entity-tag, quotes included.
    pub etag: Box<[u8]>,
    /// IMF-fixdate of the modification time.
    pub last_modified: [u8; date::IMF_FIXDATE_LEN],
    pub mtime: u64,
    /// `Content-Type`, `Last-Modified`, `ETag`, `Accept-Ranges` lines, ready to copy.
    pub fields: Box<[u8]>,
    /// Identity of the file on disk (dev, inode, size, mtime ns) for revalidation.
    stamp: (u64, u64, u64, i64),
    /// When the entry was last checked against the disk (ms since the site's base instant).
    checked_ms: AtomicU64,
}

impl Entry {
    fn new(name: &[u8], body: Body, len: u64, mtime: u64, etag: String) -> Entry {
        let last_modified = date::format_imf_fixdate(mtime);
        let mut fields = Vec::with_capacity(160);
        fields.extend_from_slice(b"Content-Type: ");
        fields.extend_from_slice(response::content_type(name).as_bytes());
        fields.extend_from_slice(b"\r\nLast-Modified: ");
        fields.extend_from_slice(&last_modified);
        fields.extend_from_slice(b"\r\nETag: ");
        fields.extend_from_slice(etag.as_bytes());
        fields.extend_from_slice(b"\r\nAccept-Ranges: bytes\r\n");
        Entry {
            body,
            len,
            etag: etag.into_bytes().into_boxed_slice(),
            last_modified,
            mtime,
            fields: fields.into_boxed_slice(),
            stamp: (0, 0, 0, 0),
            checked_ms: AtomicU64::new(0),
        }
    }

    /// Bytes charged to the cache for this entry (body, fields, key, bookkeeping).
    fn cost(&self, key: &[u8]) -> u64 {
        let body = match &self.body {
            Body::Memory(b) => b.len() as u64,
            Body::File(_) => 0,
        };
        body + self.fields.len() as u64 + self.etag.len() as u64 + 2 * key.len() as u64 + 160
    }
}

/// The result of a lookup.
pub(crate) enum Found {
    /// Serve this.
    Entry(Arc<Entry>),
    /// A directory named without its trailing slash: redirect to this location.
    Redirect(Vec<u8>),
}

/// What is served.
pub(crate) enum Site {
    /// The generated file set, keyed by relative path (no leading slash).
    Builtin(HashMap<Box<[u8]>, Arc<Entry>>),
    /// Files under a root directory.
    Root(Box<RootSite>),
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Site {
    /// The built-in site (≈ 21 MB of generated files; built once at startup).
    pub fn builtin() -> Site {
        let mut map = HashMap::with_capacity(fileset::FILE_COUNT + 4);
        for (path, body) in fileset::files() {
            let key = path.trim_start_matches('/').as_bytes().to_vec();
            let etag = format!("\"{:016x}\"", fnv1a(&body));
            let len = body.len() as u64;
            let entry = Entry::new(
                &key,
                Body::Memory(body.into_boxed_slice()),
                len,
                fileset::MTIME_UNIX,
                etag,
            );
            map.insert(key.into_boxed_slice(), Arc::new(entry));
        }
        Site::Builtin(map)
    }

    /// A document root: canonicalised now, so later checks compare real paths.
    pub fn root(root: &Path, config: &HttpConfig, base: Instant) -> io::Result<Site> {
        let named = |e: io::Error| {
            io::Error::new(e.kind(), format!("document root {}: {e}", root.display()))
        };
        let root = root.canonicalize().map_err(named)?;
        if !root.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("document root {} is not a directory", root.display()),
            ));
        }
        let shard_bytes_max = config.cache_bytes_max / SHARDS as u64;
        let shards = (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect();
        Ok(Site::Root(Box::new(RootSite {
            root,
            shards,
            shard_bytes_max,
            file_bytes_max: config.cache_file_bytes_max,
            revalidate_ms: config.cache_revalidate_ms,
            base,
        })))
    }

    /// Finds what to serve for a normalised path.
    pub fn lookup(&self, path: &NormPath<'_>, now: Instant) -> Result<Found, Status> {
        match self {
            Site::Builtin(map) => {
                let key: &[u8] = if path.rel.is_empty() {
                    b"index.html"
                } else {
                    &path.rel
                };
                map.get(key)
                    .cloned()
                    .map(Found::Entry)
                    .ok_or(Status::NotFound)
            }
            Site::Root(r) => r.lookup(path, now),
        }
    }

    /// (entries, bytes) in the cache.
    pub fn cached(&self) -> (usize, u64) {
        match self {
            Site::Builtin(map) => (map.len(), map.iter().map(|(k, e)| e.cost(k)).sum()),
            Site::Root(r) => r.shards.iter().fold((0, 0), |(n, b), s| {
                let s = s.lock().unwrap_or_else(|e| e.into_inner());
                (n + s.map.len(), b + s.bytes)
            }),
        }
    }
}

/// Cache shards: a lookup locks one; few enough to keep the overhead small.
const SHARDS: usize = 16;

/// One cache shard: entries, their insertion order (FIFO eviction) and their cost.
#[derive(Default)]
struct Shard {
    map: HashMap<Box<[u8]>, (Arc<Entry>, u64)>,
    /// (sequence, key) in insertion order; stale items (replaced entries) are skipped.
    order: VecDeque<(u64, Box<[u8]>)>,
    seq: u64,
    bytes: u64,
}

impl Shard {
    fn insert(&mut self, key: &[u8], entry: Arc<Entry>, bytes_max: u64) {
        let cost = entry.cost(key);
        if cost > bytes_max {
            return;
        }
        self.remove(key);
        while self.bytes + cost > bytes_max {
            let Some((seq, old)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&old).is_some_and(|(_, s)| *s == seq) {
                self.remove(&old);
            }
        }
        self.seq += 1;
        self.bytes += cost;
        self.map.insert(key.into(), (entry, self.seq));
        self.order.push_back((self.seq, key.into()));
        // Replaced entries leave stale order items: compact so the queue stays O(entries).
        if self.order.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.order
                .retain(|(seq, k)| map.get(k).is_some_and(|(_, s)| s == seq));
        }
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some((old, _)) = self.map.remove(key) {
            self.bytes -= old.cost(key);
        }
    }
}

/// A document root and its cache.
pub(crate) struct RootSite {
    /// Canonical root.
    root: PathBuf,
    shards: Vec<Mutex<Shard>>,
    shard_bytes_max: u64,
    file_bytes_max: u64,
    revalidate_ms: u64,
    base: Instant,
}

fn stamp(m: &Metadata) -> (u64, u64, u64, i64) {
    (
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime_nsec() + m.mtime() * 1_000_000_000,
    )
}

fn io_status(e: &io::Error) -> Status {
    match e.kind() {
        io::ErrorKind::PermissionDenied => Status::Forbidden,
        // Not found, not a directory, symlink loops, names too long: all "no such file".
        _ => Status::NotFound,
    }
}

impl RootSite {
    fn shard(&self, key: &[u8]) -> &Mutex<Shard> {
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        &self.shards[h.finish() as usize % SHARDS]
    }

    fn lock<'a>(&self, m: &'a Mutex<Shard>) -> std::sync::MutexGuard<'a, Shard> {
        // A panic while holding a shard leaves it consistent enough to serve (worst case a
        // stale byte count); do not propagate poisoning to every later request.
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lookup(&self, path: &NormPath<'_>, now: Instant) -> Result<Found, Status> {
        let key: &[u8] = &path.rel;
        let now_ms = now.saturating_duration_since(self.base).as_millis() as u64;
        let cached = self
            .lock(self.shard(key))
            .map
            .get(key)
            .map(|(e, _)| e.clone());
        if let Some(entry) = cached {
            if self.still_valid(&entry, key, path.dir, now_ms) {
                return Ok(Found::Entry(entry));
            }
        }
        self.load(path, now_ms)
    }

    /// Whether a cached entry may be served: checked recently, or unchanged on disk.
    fn still_valid(&self, entry: &Entry, key: &[u8], dir: bool, now_ms: u64) -> bool {
        let checked = entry.checked_ms.load(Ordering::Relaxed);
        if now_ms.saturating_sub(checked) < self.revalidate_ms {
            return true;
        }
        let full = self.root.join(OsStr::from_bytes(&file_rel(key, dir)));
        match std::fs::metadata(full) {
            Ok(m) if stamp(&m) == entry.stamp => {
                entry.checked_ms.store(now_ms, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    fn load(&self, path: &NormPath<'_>, now_ms: u64) -> Result<Found, Status> {
        let key: &[u8] = &path.rel;
        if key.first() == Some(&b'/') {
            // Never produced by normalisation; joining it would replace the root.
            return Err(Status::NotFound);
        }
        let rel = file_rel(key, path.dir);
        let full = self.root.join(OsStr::from_bytes(&rel));
        let file = open_beneath(&full, &self.root).map_err(|e| io_status(&e))?;
        let meta = file.metadata().map_err(|e| io_status(&e))?;
        if meta.is_dir() {
            return if path.dir {
                Err(Status::NotFound)
            } else {
                Ok(Found::Redirect(location_for_dir(key)))
            };
        }
        if !meta.is_file() {
            return Err(Status::NotFound);
        }
        let entry = Arc::new(self.entry(&rel, file, &meta, now_ms)?);
        if matches!(entry.body, Body::Memory(_)) {
            self.lock(self.shard(key))
                .insert(key, entry.clone(), self.shard_bytes_max);
        }
        Ok(Found::Entry(entry))
    }

    fn entry(
        &self,
        rel: &[u8],
        mut file: File,
        meta: &Metadata,
        now_ms: u64,
    ) -> Result<Entry, Status> {
        let len = meta.len();
        let mtime = u64::try_from(meta.mtime()).unwrap_or(0);
        let etag = format!("\"{:x}-{:x}-{:x}\"", meta.ino(), mtime, len);
        let body = if len <= self.file_bytes_max {
            let mut buf = Vec::with_capacity(len as usize);
            // The file may change under us: read at most what `stat` said, and serve exactly
            // that many bytes (short read → 500 rather than a wrong Content-Length).
            (&mut file)
                .take(len)
                .read_to_end(&mut buf)
                .map_err(|_| Status::InternalError)?;
            if buf.len() as u64 != len {
                return Err(Status::InternalError);
            }
            Body::Memory(buf.into_boxed_slice())
        } else {
            Body::File(Arc::new(file))
        };
        let mut entry = Entry::new(rel, body, len, mtime, etag);
        entry.stamp = stamp(meta);
        entry.checked_ms = AtomicU64::new(now_ms);
        Ok(entry)
    }
}

/// The file to open for a key: directories serve their `index.html`.
fn file_rel(key: &[u8], dir: bool) -> Vec<u8> {
    let mut rel = key.to_vec();
    if dir {
        rel.extend_from_slice(b"index.html");
    }
    rel
}

/// Opens `full` for reading without blocking on FIFOs or devices, then checks that what was
/// opened really lies under `root` (symlinks anywhere on the path are resolved by the kernel;
/// reading back `/proc/self/fd/N` names the file actually opened, so a symlink swapped in
/// between a check and the open cannot escape).
fn open_beneath(full: &Path, root: &Path) -> io::Result<File> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(full)?;
    let real = match std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) {
        Ok(p) => p,
        // No /proc: fall back to resolving the name (racy, but still refuses static escapes).
        Err(_) => full.canonicalize()?,
    };
    if real.starts_with(root) {
        Ok(file)
    } else {
        Err(io::Error::new(io::ErrorKind::NotFound, "outside the root"))
    }
}

/// `/key/`, percent-encoded, for a directory redirect.
fn location_for_dir(key: &[u8]) -> Vec<u8> {
    let mut loc = Vec::with_capacity(key.len() + 2);
    loc.push(b'/');
    for &b in key {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            loc.push(b);
        } else {
            loc.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    loc.push(b'/');
    loc
}
