//! The cache saved at a graceful stop and loaded at the next start (memcached `-e`).

use super::memfile::{meta_text, parse_meta, Meta, Parsed, META_MAGIC};
use super::tests::{conn, WALL};
use super::*;
use corelocal::runtime::{Handler, Output, OutputFront};
use std::path::{Path, PathBuf};

/// A fresh directory under the system's temporary one, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("kv-memfile-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    fn file(&self) -> PathBuf {
        self.0.join("cache")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn meta_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".meta");
    PathBuf::from(name)
}

/// A service with `path` as its memory file whose wall clock reads `WALL + secs_later`.
fn service_at(path: &Path, memory_mb: u64, secs_later: u64) -> KvService {
    let config = KvConfig {
        memory_bytes_max: memory_mb << 20,
        memory_file: Some(path.to_path_buf()),
        ..KvConfig::default()
    };
    let wall = Duration::from_secs(WALL + secs_later);
    KvService::with_clock(config, wall, Instant::now()).unwrap()
}

fn talk(svc: &KvService, input: &[u8]) -> String {
    let now = Instant::now();
    let mut c = conn(svc, now);
    let mut out = Output::new();
    let step = c.on_input(input, &mut out, now);
    assert_eq!(step.consumed, input.len());
    let mut reply = Vec::new();
    while let OutputFront::Bytes(b) = out.front() {
        let n = b.len();
        reply.extend_from_slice(b);
        out.advance(n);
    }
    String::from_utf8(reply).unwrap()
}

/// `WALL` as memcached's relative clock would give it in a `set`'s exptime: absolute.
fn at(secs: u64) -> u64 {
    WALL + secs
}

#[test]
fn items_come_back_with_flags_cas_and_the_time_stopped_counted() {
    let dir = Dir::new("back");
    let path = dir.file();
    let old = service_at(&path, 64, 0);
    let set = format!(
        "set forever 7 0 2\r\nab\r\nset short 8 {} 2\r\ncd\r\nset long 9 {} 2\r\nef\r\n",
        at(5),
        at(20)
    );
    assert_eq!(talk(&old, set.as_bytes()), "STORED\r\n".repeat(3));
    let cas = talk(&old, b"gets forever\r\n");
    let saved = old.save_memory_file().unwrap().unwrap();
    assert!(saved.starts_with("saved 3 items"), "{saved}");
    assert!(meta_of(&path).exists() && path.exists());
    drop(old);

    // Ten seconds later: `short` ran out while the server was stopped, `long` has 10 s left.
    let new = service_at(&path, 64, 10);
    let told = new.restore_memory_file().unwrap().unwrap();
    assert!(told.contains("imported 2 items"), "{told}");
    assert!(told.contains("1 expired"), "{told}");
    assert!(
        !meta_of(&path).exists(),
        "the metadata is removed once read"
    );
    assert!(!path.exists(), "and the cache file with it");
    assert_eq!(talk(&new, b"gets forever\r\n"), cas, "value, flags and CAS");
    assert_eq!(talk(&new, b"get short\r\n"), "END\r\n");
    assert_eq!(
        talk(&new, b"get long\r\n"),
        "VALUE long 9 2\r\nef\r\nEND\r\n"
    );
    let ttl = talk(&new, b"mg long t\r\n");
    assert!(ttl == "HD t10\r\n" || ttl == "HD t9\r\n", "{ttl}");
    // A second start has nothing to load: the saved cache is used once.
    let again = service_at(&path, 64, 10);
    let told = again.restore_memory_file().unwrap().unwrap();
    assert!(told.starts_with("no metadata save file"), "{told}");
}

#[test]
fn other_limits_start_clean_and_say_so() {
    let dir = Dir::new("limits");
    let path = dir.file();
    let old = service_at(&path, 64, 0);
    assert_eq!(talk(&old, b"set k 0 0 1\r\nx\r\n"), "STORED\r\n");
    old.save_memory_file().unwrap().unwrap();
    let new = service_at(&path, 128, 1);
    let told = new.restore_memory_file().unwrap().unwrap();
    assert!(
        told.contains("starting with an empty cache: the server that saved the cache has --memory-mb 64, this one 128"),
        "{told}"
    );
    assert_eq!(talk(&new, b"get k\r\n"), "END\r\n");
    assert!(!meta_of(&path).exists() && !path.exists());
}

#[test]
fn a_corrupt_metadata_file_refuses_to_start() {
    // memcached aborts on one too (its t/restart.t starts it on an empty metadata file).
    let dir = Dir::new("corrupt");
    let path = dir.file();
    for text in [
        &b""[..],
        b"mmap_oldbase 0\n",
        b"corelocal-kv-memory-file 1\nbytes x\n",
    ] {
        std::fs::write(meta_of(&path), text).unwrap();
        let svc = service_at(&path, 64, 0);
        let why = svc.restore_memory_file().unwrap().unwrap_err();
        assert!(why.contains("corrupt metadata file"), "{why}");
        assert!(meta_of(&path).exists(), "kept: the next start refuses too");
    }
}

#[test]
fn a_cache_file_of_another_length_starts_clean() {
    let dir = Dir::new("length");
    let path = dir.file();
    let old = service_at(&path, 64, 0);
    assert_eq!(talk(&old, b"set k 0 0 1\r\nx\r\n"), "STORED\r\n");
    old.save_memory_file().unwrap().unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.pop();
    std::fs::write(&path, bytes).unwrap();
    let told = service_at(&path, 64, 0)
        .restore_memory_file()
        .unwrap()
        .unwrap();
    assert!(told.contains("starting with a clean cache"), "{told}");
}

#[test]
fn hash_power_level_grows_as_memcached_and_survives_a_restart() {
    let dir = Dir::new("hash");
    let path = dir.file();
    let old = service_at(&path, 64, 0);
    let level = |svc: &KvService| {
        let stats = talk(svc, b"stats\r\n");
        let line = stats
            .lines()
            .find(|l| l.starts_with("STAT hash_power_level "))
            .unwrap()
            .to_string();
        line.rsplit(' ').next().unwrap().parse::<u32>().unwrap()
    };
    assert_eq!(level(&old), 16);
    old.inner.grow_hash_power(98_304);
    assert_eq!(level(&old), 16, "1.5 items per bucket is not over");
    old.inner.grow_hash_power(98_305);
    assert_eq!(level(&old), 17);
    assert_eq!(level(&old), 17, "never shrinks");
    old.save_memory_file().unwrap().unwrap();
    let new = service_at(&path, 64, 0);
    new.restore_memory_file().unwrap().unwrap();
    assert_eq!(level(&new), 17);
    let settings = talk(&new, b"stats settings\r\n");
    let line = format!("STAT memory_file {}\r\n", path.display());
    assert!(settings.contains(&line), "{settings}");
}

#[test]
fn metadata_text_round_trips() {
    let meta = Meta {
        bytes: 123,
        hash_power: 17,
    };
    assert_eq!(
        parse_meta(meta_text(&meta).as_bytes()),
        Ok(Parsed::Ours(meta))
    );
    let other = format!("{META_MAGIC} 2\nwhatever\n");
    assert_eq!(parse_meta(other.as_bytes()), Ok(Parsed::OtherVersion(2)));
    assert!(parse_meta(b"corelocal-kv-memory-file 1\nbytes 1\n").is_err());
}
