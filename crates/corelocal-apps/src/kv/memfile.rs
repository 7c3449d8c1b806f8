//! memcached's warm restart (`-e PATH`, [`super::KvConfig::memory_file`]): at a graceful stop
//! the cache is saved in [`super::snapshot`]'s format (the stream a binary upgrade sends) and
//! the next start with the same path loads it back.
//!
//! Two files, where memcached keeps its two: `PATH` holds the cache (memcached's is its item
//! memory) and `PATH.meta` a few text lines ([`META_MAGIC`], the cache file's length,
//! `hash_power_level`). Each is written aside (`.tmp`), synced and renamed into place, the
//! metadata last: a metadata file names a whole cache file, so a stop cut short leaves no
//! metadata and the next start is clean. As memcached: no metadata file, a clean start; a
//! corrupt one refuses to start (and stays); once read, the metadata is removed (the cache now running
//! no longer matches the saved one, and a crash must not bring the old one back). Other
//! limits (`--memory-mb`, `--item-max`) or another format start clean and say so, as a
//! takeover does. Expiry counts from the save's wall clock, so time stopped counts.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use corelocal::runtime::handoff::{StateExport, StateImport};

use super::takeover::{KvExport, KvImport};
use super::Inner;

/// The metadata file's first word; the format version follows it.
pub(super) const META_MAGIC: &str = "corelocal-kv-memory-file";
/// The metadata format this build writes and reads.
pub(super) const META_VERSION: u32 = 1;
/// Longest metadata file read (ours is under 100 bytes).
const META_BYTES_MAX: u64 = 4096;
/// Bytes read or written per step of the cache file.
const CHUNK_BYTES: usize = 1 << 20;
/// [`KvImport`]'s name for who wrote the stream.
const FROM_SAVED: &str = "the server that saved the cache";

/// What `PATH.meta` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Meta {
    /// Length of the cache file.
    pub(super) bytes: u64,
    /// `hash_power_level` at the save (memcached keeps its table's size across a restart).
    pub(super) hash_power: u32,
}

/// A metadata file's contents.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Parsed {
    /// Of [`META_VERSION`].
    Ours(Meta),
    /// Of another version of ours: start clean.
    OtherVersion(u32),
}

/// `PATH` with `suffix` appended (`PATH.meta`, `PATH.tmp`).
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The metadata file's text.
pub(super) fn meta_text(meta: &Meta) -> String {
    format!(
        "{META_MAGIC} {META_VERSION}\nbytes {}\nhash_power_level {}\n",
        meta.bytes, meta.hash_power
    )
}

/// Parses a metadata file; `Err` says why it is corrupt.
pub(super) fn parse_meta(text: &[u8]) -> Result<Parsed, String> {
    let text = std::str::from_utf8(text).map_err(|_| "not text".to_string())?;
    let mut lines = text.lines();
    let version = match lines.next().map(|l| l.split_once(' ')) {
        Some(Some((META_MAGIC, v))) => v
            .parse::<u32>()
            .map_err(|_| format!("version {v:?} is not a number"))?,
        _ => return Err(format!("its first line is not `{META_MAGIC} <version>`")),
    };
    if version != META_VERSION {
        return Ok(Parsed::OtherVersion(version));
    }
    let (mut bytes, mut hash_power) = (None, None);
    for line in lines {
        match line.split_once(' ') {
            Some(("bytes", v)) => bytes = v.parse::<u64>().ok(),
            Some(("hash_power_level", v)) => {
                hash_power = v.parse::<u32>().ok().filter(|p| *p <= 32);
            }
            _ => return Err(format!("unknown line {line:?}")),
        }
    }
    match (bytes, hash_power) {
        (Some(bytes), Some(hash_power)) => Ok(Parsed::Ours(Meta { bytes, hash_power })),
        _ => Err("no valid `bytes` and `hash_power_level` lines".into()),
    }
}

/// Reads at most [`META_BYTES_MAX`] bytes of `path` (a longer file is corrupt).
fn read_meta(path: &Path) -> io::Result<Vec<u8>> {
    let mut text = Vec::new();
    File::open(path)?
        .take(META_BYTES_MAX + 1)
        .read_to_end(&mut text)?;
    Ok(text)
}

/// Loads the saved cache at `path` into the (empty, not yet serving) store. `Ok`: what
/// happened, for the log (a clean start included); `Err`: the server must not start (a
/// corrupt metadata file, as memcached, or one that cannot be removed).
pub(super) fn restore(inner: &Arc<Inner>, path: &Path) -> Result<String, String> {
    let meta_path = with_suffix(path, ".meta");
    let text = match read_meta(&meta_path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(format!(
                "no metadata save file ({}), starting with a clean cache",
                meta_path.display()
            ))
        }
        Err(e) => return Err(format!("{}: {e}", meta_path.display())),
    };
    let parsed = parse_meta(&text).map_err(|why| {
        format!(
            "{}: corrupt metadata file ({why}); remove it (and {}) to start with an empty cache",
            meta_path.display(),
            path.display()
        )
    })?;
    // Kept when corrupt (above), so that every start refuses until someone looks, as
    // memcached's do.
    fs::remove_file(&meta_path).map_err(|e| {
        format!(
            "{}: {e}: it must be removed once read, or a crash would bring this cache back",
            meta_path.display()
        )
    })?;
    let told = match parsed {
        Parsed::OtherVersion(v) => Ok(format!(
            "{}: metadata format {v}, this server reads {META_VERSION}: starting with a clean \
             cache",
            meta_path.display()
        )),
        Parsed::Ours(meta) => Ok(load(inner, path, &meta)),
    };
    // Read or not, it no longer matches anything.
    let _ = fs::remove_file(path);
    told
}

/// Streams the cache file into the store; says what came of it.
fn load(inner: &Arc<Inner>, path: &Path, meta: &Meta) -> String {
    let shown = path.display();
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) => return format!("{shown}: {e}: starting with a clean cache"),
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len != meta.bytes {
        return format!(
            "{shown}: {len} bytes where its metadata says {}: starting with a clean cache",
            meta.bytes
        );
    }
    let mut import = Box::new(KvImport::new(inner, FROM_SAVED));
    let mut buf = vec![0; CHUNK_BYTES];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return format!("{shown}: {e}: {} items restored before it", count(inner)),
        };
        if let Err(why) = import.chunk(&buf[..n]) {
            return format!("{shown}: {why}");
        }
    }
    match import.finish() {
        Ok(summary) => {
            inner
                .stats
                .hash_power
                .fetch_max(meta.hash_power, Ordering::Relaxed);
            format!("restored from {shown}: {summary}")
        }
        Err(why) => format!("{shown}: {why}"),
    }
}

fn count(inner: &Inner) -> u64 {
    inner.store.totals().curr_items
}

/// Saves the cache (the workers have stopped: nothing changes it any more) to `path` and its
/// metadata to `PATH.meta`; says what was saved.
pub(super) fn save(inner: &Arc<Inner>, path: &Path) -> Result<String, String> {
    let started = Instant::now();
    let meta_path = with_suffix(path, ".meta");
    // A metadata file must never name a cache file other than the one it was written with.
    match fs::remove_file(&meta_path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(format!("{}: {e}", meta_path.display()))
        }
        _ => {}
    }
    let (bytes, summary) = write_aside(path, |file| write_cache(inner, file))?;
    let meta = Meta {
        bytes,
        hash_power: inner.stats.hash_power.load(Ordering::Relaxed),
    };
    write_aside(&meta_path, |file| {
        file.write_all(meta_text(&meta).as_bytes())
    })?;
    sync_dir(path);
    Ok(format!(
        "saved {summary} to {} in {:.1} s",
        path.display(),
        started.elapsed().as_secs_f64()
    ))
}

/// Writes `path` through `PATH.tmp` (mode 0600: the cache is the clients' data), synced and
/// renamed into place; returns what `write` returned.
fn write_aside<T>(
    path: &Path,
    write: impl FnOnce(&mut File) -> io::Result<T>,
) -> Result<T, String> {
    let aside = with_suffix(path, ".tmp");
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&aside)
        .and_then(|mut file| {
            let done = write(&mut file)?;
            file.sync_all()?;
            Ok(done)
        })
        .and_then(|done| fs::rename(&aside, path).map(|()| done));
    written.map_err(|e| {
        let _ = fs::remove_file(&aside);
        format!("{}: {e}", path.display())
    })
}

/// The cache as [`KvExport`] streams it at a takeover, [`CHUNK_BYTES`] at a time.
fn write_cache(inner: &Arc<Inner>, file: &mut File) -> io::Result<(u64, String)> {
    let mut export = KvExport::new(inner, Instant::now());
    let mut buf = Vec::with_capacity(CHUNK_BYTES);
    let mut bytes = 0;
    loop {
        buf.clear();
        let more = export
            .next_chunk(&mut buf, CHUNK_BYTES)
            .map_err(io::Error::other)?;
        file.write_all(&buf)?;
        bytes += buf.len() as u64;
        if !more {
            return Ok((bytes, export.summary()));
        }
    }
}

/// Syncs the directory holding `path`, so that the renames outlive a power cut; best effort
/// (a restart after a clean stop reads the files either way).
fn sync_dir(path: &Path) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}
