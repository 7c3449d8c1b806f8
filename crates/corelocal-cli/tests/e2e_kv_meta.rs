//! `corelocal serve kv` through a meta-protocol client nobody here wrote: RevenueCat's
//! meta-memcache (PyPI `meta-memcache`, a pure-Python client over a Rust extension that speaks
//! only mg/ms/md/ma/mn). `kv_meta_client.py` drives sets, gets, deletes, invalidations, touches,
//! CAS, TTLs, set modes, arithmetic, leases, recache and stale items, base64 keys, values up to
//! 1 MB and over the limit, and a 2000-key multiget; it runs against both backends and against
//! memcached 1.6.18 itself (so its expectations are memcached's). A missing client skips with
//! a printed reason, except under `CI=true` (.ci/run installs it).

mod common;

use common::{need, python_has, require, run_ok, Served};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kv_meta_client.py");

fn client_run(addr: SocketAddr) -> String {
    run_ok(
        90,
        "python3",
        &[SCRIPT, &addr.ip().to_string(), &addr.port().to_string()],
    )
}

fn have_client() -> bool {
    require(
        "python3 module meta_memcache (pip install meta-memcache)",
        python_has("meta_memcache"),
    )
}

#[test]
fn meta_memcache_client_passes_against_corelocal_on_both_backends() {
    if !have_client() {
        return;
    }
    for backend in ["auto", "epoll"] {
        let s = Served::start("kv", &["--backend", backend]);
        assert_eq!(client_run(s.addr).trim(), "ok", "--backend {backend}");
        // Twice on one server: the script's keys are its own (prefixed by its pid).
        assert_eq!(client_run(s.addr).trim(), "ok", "--backend {backend}");
        assert_eq!(s.terminate().0, 0, "--backend {backend}");
    }
}

/// Real memcached on a free port, killed on drop.
struct Memcached(Child);

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Differential: the same script passes against memcached 1.6.18 itself.
#[test]
fn meta_memcache_client_passes_against_real_memcached() {
    if !have_client() || !need(&["memcached"]) {
        return;
    }
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
    let _mc = Memcached(child);
    let end = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < end, "memcached did not start on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(client_run(addr).trim(), "ok");
}
