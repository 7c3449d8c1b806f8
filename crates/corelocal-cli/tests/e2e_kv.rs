//! `corelocal serve kv` through the real binary with real clients: pymemcache and
//! libmemcached-tools, the same pymemcache suite also against real memcached (differential: the
//! suite is known to be right), and the `--metrics` endpoint. A missing client skips its test
//! with a printed reason, except under `CI=true`, where it fails (.ci/run installs them).

mod common;

use common::{first_of, need, python_has, require, run, run_ok, Served, TempDir};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Every command pymemcache speaks that the issue lists, with the replies memcached 1.6 gives.
const PYMEMCACHE_SUITE: &str = r#"
import sys
from pymemcache.client.base import Client
c = Client((sys.argv[1], int(sys.argv[2])), connect_timeout=3, timeout=3, default_noreply=False)
assert c.flush_all() is True
assert c.set("k1", b"v1") is True
assert c.get("k1") == b"v1"
assert c.get("nope") is None
val, cas = c.gets("k1")
assert val == b"v1" and cas is not None
assert c.cas("k1", b"v2", cas) is True
assert c.cas("k1", b"v3", cas) is False, "stale cas must fail (EXISTS)"
assert c.cas("absent", b"v", cas) is None, "cas on a missing key is NOT_FOUND"
assert c.get("k1") == b"v2"
assert c.set("n", b"10") is True
assert c.incr("n", 5) == 15
assert c.decr("n", 20) == 0, "decr floors at 0"
assert c.incr("n", 2**64 - 1) == 2**64 - 1
assert c.incr("n", 1) == 0, "incr wraps at 2^64"
assert c.incr("missing", 1) is None
assert c.add("k1", b"x") is False
assert c.add("k2", b"x") is True
assert c.replace("absent", b"x") is False
assert c.replace("k2", b"x") is True
assert c.append("k2", b"y") is True
assert c.prepend("k2", b"w") is True
assert c.get("k2") == b"wxy"
assert c.get_many(["k1", "k2", "nope"]) == {"k1": b"v2", "k2": b"wxy"}
assert c.set_many({"m1": b"1", "m2": b"2", "m3": b""}) == []
assert c.get_many(["m1", "m2", "m3"]) == {"m1": b"1", "m2": b"2", "m3": b""}
assert c.touch("k1", 100) is True
assert c.touch("nope", 100) is False
big = bytes(range(256)) * 400
assert c.set("big", big) is True
assert c.get("big") == big
assert c.set("flagged", b"f", flags=7) is True
assert c.gets_many(["k1", "flagged"])["k1"][0] == b"v2"
assert c.delete("k1") is True
assert c.delete("k1") is False
assert c.get("k1") is None
stats = c.stats()
for key in (b"curr_items", b"get_hits", b"get_misses", b"cmd_get", b"cmd_set"):
    assert key in stats, (key, stats)
assert c.version()
assert c.flush_all() is True
assert c.get_many(["k2", "m1", "big"]) == {}
c.set("q", b"1", noreply=True)
assert c.get("q") == b"1", "noreply set is applied before the next get"
c.quit()
print("ok")
"#;

fn pymemcache_suite(addr: SocketAddr) -> String {
    run_ok(
        20,
        "python3",
        &[
            "-c",
            PYMEMCACHE_SUITE,
            &addr.ip().to_string(),
            &addr.port().to_string(),
        ],
    )
}

#[test]
fn pymemcache_suite_passes_against_corelocal() {
    if !require("python3 module pymemcache", python_has("pymemcache")) {
        return;
    }
    let s = Served::start("kv", &[]);
    assert_eq!(pymemcache_suite(s.addr).trim(), "ok");
    assert_eq!(s.terminate().0, 0);
}

/// Real memcached on a free port, killed on drop.
struct Memcached(Child);

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_memcached() -> (Memcached, SocketAddr) {
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let child = Command::new("memcached")
        .args(["-l", "127.0.0.1", "-p", &addr.port().to_string()])
        .args(["-U", "0", "-m", "64", "-u", "root", "-t", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn memcached");
    let mc = Memcached(child);
    let end = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < end, "memcached did not start on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
    (mc, addr)
}

/// Differential: the same suite passes against memcached itself, so its expectations are
/// memcached's behaviour, not ours.
#[test]
fn pymemcache_suite_passes_against_real_memcached() {
    if !require("python3 module pymemcache", python_has("pymemcache")) || !need(&["memcached"]) {
        return;
    }
    let (_mc, addr) = start_memcached();
    assert_eq!(pymemcache_suite(addr).trim(), "ok");
}

/// The libmemcached tool named `base` (Debian ships them as memc*: memccp, memccat, …).
fn tool(base: &str) -> Option<String> {
    let found = first_of(&[&format!("memc{base}"), &format!("mem{base}")]);
    require(
        &format!("libmemcached-tools' mem{base} (memc{base})"),
        found.is_some(),
    )
    .then_some(())?;
    found
}

#[test]
fn libmemcached_tools_copy_cat_exist_touch_rm_stat_flush_slap() {
    let (Some(cp), Some(cat), Some(exist), Some(rm), Some(stat), Some(flush), Some(slap)) = (
        tool("cp"),
        tool("cat"),
        tool("exist"),
        tool("rm"),
        tool("stat"),
        tool("flush"),
        tool("slap"),
    ) else {
        return;
    };
    let s = Served::start("kv", &["--metrics", "127.0.0.1:0"]);
    let servers = format!("--servers={}", s.hostport());
    let t = TempDir::new("kv");
    let file = t.0.join("payload.bin");
    let payload: Vec<u8> = (0..50_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    std::fs::write(&file, &payload).unwrap();

    run_ok(10, &cp, &[&servers, file.to_str().unwrap()]);
    let out = run(10, &cat, &[&servers, "payload.bin"]);
    assert!(out.status.success());
    assert!(
        out.stdout.starts_with(&payload),
        "memccat returned {} bytes",
        out.stdout.len()
    );
    assert!(run(10, &exist, &[&servers, "payload.bin"]).status.success());
    if let Some(touch) = first_of(&["memctouch", "memtouch"]) {
        run_ok(10, &touch, &[&servers, "--expire=100", "payload.bin"]);
    }
    run_ok(10, &rm, &[&servers, "payload.bin"]);
    assert!(
        !run(10, &exist, &[&servers, "payload.bin"]).status.success(),
        "key still exists after memcrm"
    );
    let stats = run_ok(10, &stat, &[&servers]);
    for key in ["pid:", "curr_items:", "get_hits:", "version:"] {
        assert!(stats.contains(key), "{key} missing in {stats}");
    }
    run_ok(10, &cp, &[&servers, file.to_str().unwrap()]);
    run_ok(10, &flush, &[&servers]);
    assert!(!run(10, &exist, &[&servers, "payload.bin"]).status.success());

    for test in ["set", "get", "mget"] {
        let out = run(
            20,
            &slap,
            &[
                &servers,
                "--concurrency=2",
                "--execute-number=200",
                &format!("--test={test}"),
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{slap} --test={test}: {text}");
        assert!(
            !text.to_ascii_lowercase().contains("error")
                && !text.to_ascii_lowercase().contains("fail"),
            "{text}"
        );
    }
    // The server counted that traffic, per worker, with no errors.
    let m = common::http_get(s.metrics.unwrap(), "/metrics.json");
    let v: serde_json::Value = serde_json::from_str(m.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert!(v["total"]["requests"].as_u64().unwrap() >= 800, "{v}");
    let errors = &v["total"]["errors"];
    assert_eq!(errors["bad_request"], 0, "{v}");
    assert_eq!(errors["too_large"], 0, "{v}");
    assert_eq!(s.terminate().0, 0);
}

#[test]
fn kv_metrics_endpoint_has_per_worker_lines() {
    let s = Served::start("kv", &["--metrics", "127.0.0.1:0"]);
    // A few text-protocol commands over a plain socket, so the counters move without tools.
    {
        use std::io::{BufRead, BufReader, Write};
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"set a 0 0 1\r\nx\r\nget a\r\nbogus\r\n")
            .unwrap();
        let mut r = BufReader::new(c);
        let mut lines = Vec::new();
        for _ in 0..5 {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            lines.push(l);
        }
        assert_eq!(
            lines.concat(),
            "STORED\r\nVALUE a 0 1\r\nx\r\nEND\r\nERROR\r\n"
        );
    }
    let text = common::http_get(s.metrics.unwrap(), "/metrics");
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains("corelocal_info{app=\"kv\""), "{text}");
    let workers: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("corelocal_workers "))
        .unwrap()
        .parse()
        .unwrap();
    let per_worker = |name: &str| {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{worker=\"")))
            .count()
    };
    assert_eq!(per_worker("corelocal_requests_total"), workers);
    assert_eq!(per_worker("corelocal_accepted_total"), workers);
    assert_eq!(per_worker("corelocal_errors_total"), workers * 5);
    let requests: u64 = text
        .lines()
        .filter(|l| l.starts_with("corelocal_requests_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(requests >= 2, "{text}");
    if need(&["curl"]) {
        let out = run_ok(
            10,
            "curl",
            &[
                "-s",
                "--max-time",
                "5",
                &format!("http://{}/metrics", s.metrics.unwrap()),
            ],
        );
        assert!(
            out.contains("corelocal_accepted_total{worker=\"0\""),
            "{out}"
        );
    }
    assert_eq!(s.terminate().0, 0);
}

/// Sends `bytes`, shuts the write side, and reads until the server closes (or 5 s pass).
fn exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = c.write_all(bytes);
    let _ = c.shutdown(std::net::Shutdown::Write);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let started = Instant::now();
    loop {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "connection held open after the client's half-close"
    );
    String::from_utf8_lossy(&got).into_owned()
}

fn assert_kv_serving(addr: SocketAddr) {
    let r = exchange(addr, b"set ok 0 0 2\r\nhi\r\nget ok\r\n");
    assert_eq!(r, "STORED\r\nVALUE ok 0 2\r\nhi\r\nEND\r\n");
}

#[test]
fn oversize_keys_binary_garbage_and_half_closed_clients_keep_the_kv_server_serving() {
    let s = Served::start("kv", &[]);
    let key = "k".repeat(300);
    // memcached 1.6: keys over 250 bytes are a bad command line.
    let r = exchange(s.addr, format!("get {key}\r\n").as_bytes());
    assert!(r.starts_with("CLIENT_ERROR"), "{r:?}");
    let r = exchange(s.addr, format!("set {key} 0 0 1\r\nx\r\n").as_bytes());
    assert!(r.starts_with("CLIENT_ERROR"), "{r:?}");
    assert_kv_serving(s.addr);

    // Binary garbage (NULs, high bytes, stray line ends): ERROR lines or a close, nothing else.
    let mut x: u32 = 0x1234_5678;
    let mut junk: Vec<u8> = (0..4096)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (x >> 16) as u8
        })
        .collect();
    junk[0] = 0x01;
    junk.extend_from_slice(b"\r\n");
    let r = exchange(s.addr, &junk);
    assert!(
        r.lines().all(|l| l == "ERROR"
            || l.starts_with("CLIENT_ERROR")
            || l.starts_with("SERVER_ERROR")),
        "{r:?}"
    );
    assert_kv_serving(s.addr);

    // Half a command, then the write side shut: closed without a reply owed.
    let r = exchange(s.addr, b"get ok");
    assert!(r.is_empty() || r.starts_with("ERROR"), "{r:?}");
    // A value promised but cut short: no STORED.
    let r = exchange(s.addr, b"set half 0 0 100\r\nabc");
    assert!(!r.contains("STORED"), "{r:?}");
    assert_kv_serving(s.addr);
    assert!(exchange(s.addr, b"get half\r\n").starts_with("END"));
    assert_eq!(s.terminate().0, 0);
}
