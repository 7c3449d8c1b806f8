//! `corelocal serve kv --memory-file` (memcached's warm restart, `-e`) through the real binary
//! on both backends: a graceful stop (SIGUSR1, `shutdown graceful`) saves the cache, the next
//! start with the same file has the items back with their flags, CAS and time to live (an
//! item that ran out while stopped stays gone); other `--memory-mb` starts clean and says so;
//! SIGTERM saves nothing, as memcached.

mod common;

use common::{Served, TempDir};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const BACKENDS: [&str; 2] = ["auto", "epoll"];

/// Sends `cmd` and reads until the reply ends with one of `ends`.
fn ask(s: &Served, cmd: &str, ends: &[&str]) -> String {
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(cmd.as_bytes()).unwrap();
    let mut got = String::new();
    let mut buf = [0u8; 4096];
    while !ends.iter().any(|e| got.ends_with(e)) {
        let n = c.read(&mut buf).expect("a reply");
        assert!(n > 0, "closed while answering {cmd:?}: {got:?}");
        got.push_str(std::str::from_utf8(&buf[..n]).unwrap());
    }
    got
}

/// Sends `cmd` and reads until the server closes; the reply.
fn say_last(s: &Served, cmd: &str) -> String {
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(cmd.as_bytes()).unwrap();
    let mut got = String::new();
    c.read_to_string(&mut got).expect("a close");
    got
}

fn start(backend: &str, file: &str, memory_mb: &str) -> Served {
    Served::start(
        "kv",
        &[
            "--backend",
            backend,
            "--memory-file",
            file,
            "--memory-mb",
            memory_mb,
            "--enable-shutdown",
            "--drain-timeout",
            "1s",
        ],
    )
}

/// SIGUSR1 (memcached's graceful stop); the exit code and the rest of the log.
fn sigusr1(s: Served) -> (i32, String) {
    // SAFETY: signalling our own child process, which has not been reaped.
    unsafe { libc::kill(s.pid() as i32, libc::SIGUSR1) };
    s.wait_exit(Duration::from_secs(20))
}

/// The remaining time to live `mg KEY t` reports.
fn ttl(s: &Served, key: &str) -> u64 {
    let r = ask(s, &format!("mg {key} t f\r\n"), &["\r\n"]);
    let t = r.split_whitespace().find_map(|w| w.strip_prefix('t'));
    t.and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{r}"))
}

#[test]
fn a_graceful_stop_saves_the_cache_and_the_next_start_loads_it() {
    for backend in BACKENDS {
        let dir = TempDir::new("kv-restart");
        let file = dir.0.join("cache");
        let file = file.to_str().unwrap();
        let s = start(backend, file, "64");
        assert!(s.log.contains("no metadata save file"), "{}", s.log);
        let set = "set a 5 0 5\r\nhello\r\nset b 7 100 5\r\nworld\r\nset c 9 2 4\r\nsoon\r\n";
        assert_eq!(ask(&s, set, &["STORED\r\nSTORED\r\nSTORED\r\n"]).len(), 24);
        let set_at = Instant::now();
        let cas = ask(&s, "gets a\r\n", &["END\r\n"]);
        let (code, log) = sigusr1(s);
        let saved_after = set_at.elapsed();
        assert_eq!(code, 0, "{log}");
        // `c` lives until the second boundary 2 s after its set, at least one second: a save
        // taken later than that (a loaded machine) may have found it gone already.
        let saved_c = log.contains("--memory-file: saved 3 items");
        assert!(
            saved_c || (saved_after >= Duration::from_secs(1) && log.contains("saved 2 items")),
            "saved {saved_after:?} after the set: {log}"
        );

        // `c` (2 s to live) runs out while the server is stopped.
        std::thread::sleep(Duration::from_millis(2200).saturating_sub(set_at.elapsed()));
        let s = start(backend, file, "64");
        assert!(
            s.log.contains("restored from") && s.log.contains("imported 2 items"),
            "{}",
            s.log
        );
        assert_eq!(
            ask(&s, "gets a\r\n", &["END\r\n"]),
            cas,
            "value, flags, CAS"
        );
        assert_eq!(
            ask(&s, "get b c\r\n", &["END\r\n"]),
            "VALUE b 7 5\r\nworld\r\nEND\r\n"
        );
        let left = ttl(&s, "b");
        assert!((90..=100).contains(&left), "b's time to live: {left}");
        // `shutdown graceful` saves too; a server with other limits starts clean.
        assert_eq!(say_last(&s, "shutdown graceful\r\n"), "");
        let (code, log) = s.wait_exit(Duration::from_secs(20));
        assert_eq!(code, 0, "{log}");
        assert!(log.contains("saved 2 items"), "{log}");
        let s = start(backend, file, "32");
        let why = "starting with an empty cache: the server that saved the cache has \
                   --memory-mb 64, this one 32";
        assert!(s.log.contains(why), "{}", s.log);
        assert_eq!(ask(&s, "get a b\r\n", &["END\r\n"]), "END\r\n");
        assert_eq!(ask(&s, "set a 0 0 1\r\nx\r\n", &["\r\n"]), "STORED\r\n");
        // SIGTERM stops without saving, as memcached's does.
        let (code, log) = s.terminate();
        assert_eq!(code, 0, "{log}");
        assert!(log.contains("not saved"), "{log}");
        let s = start(backend, file, "32");
        assert!(s.log.contains("no metadata save file"), "{}", s.log);
        assert_eq!(s.terminate().0, 0);
    }
}

#[test]
fn a_corrupt_metadata_file_refuses_to_start() {
    // memcached's t/restart.t: an empty PATH.meta; memcached aborts.
    let dir = TempDir::new("kv-restart-corrupt");
    let file = dir.0.join("cache");
    std::fs::write(dir.0.join("cache.meta"), b"").unwrap();
    let out = common::run(
        20,
        common::BIN,
        &[
            "serve",
            "kv",
            "--listen",
            "127.0.0.1:0",
            "--memory-file",
            file.to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("corrupt metadata file"), "{err}");
}
