//! Offered load and loss accounting for the restart and takeover tests: closed-loop one-shot
//! RPC clients, client outcomes counted by kind ([`Tally`]), the namespace's TCP counters
//! (RSTs, migrations), one scenario run ([`under_load`]) and its record
//! (`CORELOCAL_RECORD=DIR` → `DIR/restart-<name>.json`).

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Request (and response) size of the one-shot RPC clients: `serve rpc --one-shot` defaults.
pub const REQ: usize = 64;
/// Closed-loop clients: the offered load every restart scenario runs under.
pub const CLIENT_THREADS: usize = 4;
/// How long the load runs before and after the event.
pub const LOAD_AROUND: Duration = Duration::from_millis(500);

/// Runs `test` again in a fresh network namespace (root; skipped with a reason otherwise, never
/// under CI=true); returns false when this is the inner run, which does the work (lo is up).
pub fn outer(test: &str) -> bool {
    if corelocal::testing::inside_private_netns(test) {
        corelocal::testing::sh("ip link set lo up");
        return false;
    }
    true
}

/// TCP counters of this namespace: `Tcp:` from snmp and `TcpExt:` from netstat.
pub fn counters() -> BTreeMap<String, i64> {
    let mut map = BTreeMap::new();
    for file in ["/proc/net/snmp", "/proc/net/netstat"] {
        let text = std::fs::read_to_string(file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for pair in lines.chunks(2) {
            let (Some(h), Some(v)) = (pair.first(), pair.get(1)) else {
                continue;
            };
            let prefix = h.split(':').next().unwrap_or("");
            for (k, v) in h.split_whitespace().zip(v.split_whitespace()).skip(1) {
                map.insert(format!("{prefix}.{k}"), v.parse().unwrap_or(0));
            }
        }
    }
    map
}

/// How much counter `key` grew since `before`.
pub fn delta(before: &BTreeMap<String, i64>, key: &str) -> i64 {
    counters()[key] - before[key]
}

/// `0-1` on two or more CPUs, else `0`.
pub fn cpus() -> String {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get().min(2));
    if n >= 2 {
        "0-1".into()
    } else {
        "0".into()
    }
}

/// One-shot RPC client outcomes.
#[derive(Default)]
pub struct Tally {
    /// Connections tried.
    pub attempted: AtomicU64,
    /// Answered in full.
    pub served: AtomicU64,
    /// connect() refused (RST to the SYN).
    pub refused: AtomicU64,
    /// Reset, or closed before the whole answer.
    pub reset: AtomicU64,
    /// Anything else (timeouts…).
    pub other: AtomicU64,
}

impl Tally {
    /// Counts one connection's outcome.
    pub fn count(&self, r: std::io::Result<()>) {
        self.attempted.fetch_add(1, Ordering::Relaxed);
        let c = match r {
            Ok(()) => &self.served,
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => &self.refused,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => &self.reset,
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => &self.reset,
            Err(_) => &self.other,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The record line of scenario `name`.
    pub fn json(&self, name: &str, rsts: i64, extra: &str) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "{{\"scenario\":\"{name}\",\"attempted\":{},\"served\":{},\"refused\":{},\"reset\":{},\"other_errors\":{},\"server_rsts\":{rsts}{extra}}}",
            g(&self.attempted), g(&self.served), g(&self.refused), g(&self.reset), g(&self.other)
        )
    }

    /// Refused + reset + other.
    pub fn errors(&self) -> u64 {
        [&self.refused, &self.reset, &self.other]
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Connections answered in full.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }
}

/// Reads a one-shot answer to the end: exactly [`REQ`] bytes, else `UnexpectedEof`.
pub fn finish_request(mut s: TcpStream) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut v = Vec::new();
    s.read_to_end(&mut v)?;
    if v.len() != REQ {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Connect, send one request, read the answer to the end.
pub fn one_request(addr: SocketAddr) -> std::io::Result<()> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.write_all(&[b'x'; REQ])?;
    finish_request(s)
}

/// [`CLIENT_THREADS`] closed-loop one-shot clients against `addr` until `stop`.
pub fn load(
    addr: SocketAddr,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..CLIENT_THREADS)
        .map(|_| {
            let (t, s) = (tally.clone(), stop.clone());
            std::thread::spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    t.count(one_request(addr));
                }
            })
        })
        .collect()
}

/// Prints the record line and, with `CORELOCAL_RECORD=DIR`, writes `DIR/restart-<name>.json`.
pub fn record(name: &str, json: &str) {
    eprintln!("RECORD {json}");
    if let Ok(dir) = std::env::var("CORELOCAL_RECORD") {
        std::fs::write(format!("{dir}/restart-{name}.json"), format!("{json}\n")).unwrap();
    }
}

/// One scenario under the same offered load as every other: the clients run [`LOAD_AROUND`]
/// before and after `event` (which returns the server's summary line). Records the outcome
/// with the namespace's RST and migration counts; returns the tally, the RSTs and the line.
pub fn under_load(
    name: &str,
    addr: SocketAddr,
    event: impl FnOnce() -> String,
) -> (Arc<Tally>, i64, String) {
    let before = counters();
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let threads = load(addr, tally.clone(), stop.clone());
    std::thread::sleep(LOAD_AROUND);
    let what = event();
    std::thread::sleep(LOAD_AROUND);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let rsts = delta(&before, "Tcp.OutRsts");
    let migrated = delta(&before, "TcpExt.TCPMigrateReqSuccess");
    let failed = delta(&before, "TcpExt.TCPMigrateReqFailure");
    let extra = format!(
        ",\"migrated\":{migrated},\"migrate_failed\":{failed},\"server\":\"{}\"",
        what.replace('"', "'")
    );
    record(name, &tally.json(name, rsts, &extra));
    (tally, rsts, what)
}
