//! Overload, end to end with the `corelocal` binary: memory stays bounded, what can be served
//! is served, nothing spins, and the stats count it.
//!
//! - A SYN flood from spoofed sources whose SYN-ACKs go nowhere (root, private network
//!   namespace) while legitimate clients keep connecting: SYN cookies answer them all.
//! - A connection flood beyond `--conns-per-worker`: the excess waits in the kernel's accept
//!   queue, the server idles at its limit and serves the waiting clients as slots free up.
//! - Slow readers pipelining requests for large responses: the output limit holds, a normal
//!   client is served meanwhile, and the idle timeout closes the stalled connections.
//!
//! With `CORELOCAL_RECORD=DIR` each scenario writes `DIR/overload-<name>.json`
//! (bench/overload.sh); the figures are recorded, never asserted as timings.

mod common;

use common::synflood::{checksum, syn_packet, SynFlood, SYN_LEN};
use common::{cpu_ticks, last_stats, record, rss_kib, Served};
use serde_json::{json, Value};
use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MIB_IN_KIB: u64 = 1024;

/// `0-1` on a machine with two CPUs or more, else `0`; and the worker count it gives.
fn cpus() -> (&'static str, usize) {
    match std::thread::available_parallelism().map_or(1, |n| n.get()) {
        1 => ("0", 1),
        _ => ("0-1", 2),
    }
}

/// A fresh stats-file path for `tag` (removed first).
fn stats_path(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "corelocal-overload-{tag}-{}.jsonl",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&p);
    p
}

/// Waits (bounded) until the last stats line satisfies `ok`; returns that line.
fn wait_stats(
    path: &std::path::Path,
    what: &str,
    limit: Duration,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let end = Instant::now() + limit;
    loop {
        let s = last_stats(path);
        if ok(&s) {
            return s;
        }
        assert!(Instant::now() < end, "{what}: not within {limit:?}: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn total(s: &Value, key: &str) -> u64 {
    s["total"][key].as_u64().unwrap_or(0)
}

/// Samples a process's resident memory every 20 ms until stopped; the peak in KiB.
struct RssPeak {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl RssPeak {
    fn start(pid: u32) -> RssPeak {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !flag.load(Ordering::Relaxed) {
                peak = peak.max(rss_kib(pid));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak.max(rss_kib(pid))
        });
        RssPeak { stop, thread }
    }

    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

// ---------------------------------------------------------------------------------------------
// SYN flood

/// Spoofed SYNs sent per run.
const FLOOD_SYNS: u64 = 40_000;
/// SYNs per burst, and the pause between bursts (~2–4 s of flood on a loaded 2-core VM).
const FLOOD_BURST: usize = 1_000;
const FLOOD_PAUSE: Duration = Duration::from_millis(40);
/// The server's address; SYN-ACKs to the spoofed 10.99.0.0/16 leave on a veth whose peer
/// drops them (a gateway with a static MAC nobody has), as on the Internet.
const FLOOD_SERVER_IP: [u8; 4] = [10, 98, 0, 1];
/// Resident memory the flood may add to the server: no spoofed SYN reaches user space (the
/// SYN queue and cookies are kernel state); legitimate one-shot connections come and go. 16 MiB
/// covers allocator arenas and the stats thread.
const FLOOD_RSS_GROWTH_MAX_KIB: u64 = 16 * MIB_IN_KIB;

fn set_up_flood_network() {
    corelocal::testing::set_up_loopback(None);
    for cmd in [
        "ip link add fl0 type veth peer name fl1",
        "ip link set fl0 up",
        "ip link set fl1 up",
        "ip addr add 10.98.0.1/24 dev fl0",
        "ip neigh replace 10.98.0.2 lladdr 02:00:00:00:00:02 dev fl0 nud permanent",
        "ip route add 10.99.0.0/16 via 10.98.0.2 dev fl0",
    ] {
        corelocal::testing::sh(cmd);
    }
    let cookies = corelocal::testing::sh("sysctl -n net.ipv4.tcp_syncookies");
    assert_eq!(cookies.trim(), "1", "SYN cookies must be on (the default)");
}

/// Outcomes of the legitimate clients.
#[derive(Default)]
struct Tally {
    attempted: AtomicU64,
    served: AtomicU64,
    failed: AtomicU64,
    slowest_ms: AtomicU64,
}

impl Tally {
    fn get(&self) -> (u64, u64, u64, u64) {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (
            g(&self.attempted),
            g(&self.served),
            g(&self.failed),
            g(&self.slowest_ms),
        )
    }
}

/// One one-shot RPC (64 B each way); connecting and answering get 10 s each, time for the
/// client's SYN retransmissions (1 s, 3 s, 7 s) should a SYN be lost.
fn one_shot(addr: SocketAddr) -> io::Result<()> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(&[b'q'; 64])?;
    let mut v = Vec::new();
    s.read_to_end(&mut v)?;
    if v.len() != 64 {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Two closed-loop one-shot clients until `stop`.
fn legit_clients(
    addr: SocketAddr,
    tally: &Arc<Tally>,
    stop: &Arc<AtomicBool>,
) -> Vec<JoinHandle<()>> {
    (0..2)
        .map(|_| {
            let (t, s) = (tally.clone(), stop.clone());
            std::thread::spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let r = one_shot(addr);
                    let ms = started.elapsed().as_millis() as u64;
                    t.attempted.fetch_add(1, Ordering::Relaxed);
                    t.slowest_ms.fetch_max(ms, Ordering::Relaxed);
                    match r {
                        Ok(()) => t.served.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            eprintln!("legit client: {e}");
                            t.failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
        })
        .collect()
}

/// Sends [`FLOOD_SYNS`] spoofed SYNs in bursts; returns how many were sent and how long it took.
fn flood(dst: SocketAddrV4) -> (u64, Duration) {
    let mut syns = SynFlood::new(dst).expect("raw socket (CAP_NET_RAW)");
    let started = Instant::now();
    while syns.sent < FLOOD_SYNS {
        syns.send(FLOOD_BURST).expect("sending SYNs");
        std::thread::sleep(FLOOD_PAUSE);
    }
    (syns.sent, started.elapsed())
}

fn net(s: &Value, key: &str) -> u64 {
    s["net"][key].as_u64().unwrap_or(0)
}

#[test]
fn syn_packets_carry_valid_checksums() {
    let src = "10.99.1.2:40000".parse().unwrap();
    let dst = "10.98.0.1:7000".parse().unwrap();
    let p = syn_packet(src, dst, 0x1234_5678);
    assert_eq!(p.len(), SYN_LEN);
    assert_eq!((p[0], p[9], p[33]), (0x45, 6, 0x02), "IPv4, TCP, SYN");
    // Summing a segment with its checksum over the pseudo-header gives 0 (RFC 1071).
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&p[12..20]);
    pseudo.extend_from_slice(&[0, 6, 0, (SYN_LEN - 20) as u8]);
    pseudo.extend_from_slice(&p[20..]);
    assert_eq!(checksum(&pseudo, 0), 0);
    assert_ne!(
        syn_packet(src, dst, 1)[36..38],
        p[36..38],
        "checksum covers seq"
    );
    assert_eq!(checksum(&[0x45, 0x00, 0x00, 0x1c], 0), !0x451cu16);
}

/// Legitimate clients are served during a flood of ~40,000 spoofed SYNs: once the listeners'
/// SYN queues (backlog 256 in all) fill with requests that never complete, every SYN —
/// spoofed or not — is answered with a cookie, which keeps no state; a legitimate client's ACK
/// completes its handshake from the cookie. Bound: at most 1% of legitimate attempts may
/// fail (0 expected: a SYN lost to a full queue is retransmitted within the 10 s connect
/// window). The server's memory stays flat: the flood never reaches user space.
#[test]
fn syn_flood_keeps_serving_legitimate_clients() {
    if !corelocal::testing::inside_private_netns("syn_flood_keeps_serving_legitimate_clients") {
        return;
    }
    set_up_flood_network();
    let stats = stats_path("synflood");
    let file = stats.to_str().unwrap();
    let listen = format!("{}:7000", std::net::Ipv4Addr::from(FLOOD_SERVER_IP));
    let server = Served::start_at(
        "rpc",
        &listen,
        &[
            "--one-shot",
            "--backlog",
            "256",
            "--stats-interval",
            "200ms",
            "--stats-file",
            file,
            "--metrics",
            "127.0.0.1:0",
        ],
    );
    let addr = server.addr;
    for _ in 0..100 {
        one_shot(addr).expect("warm-up request");
    }
    let rss_before = rss_kib(server.pid());
    let peak = RssPeak::start(server.pid());
    let (tally, stop) = (Arc::new(Tally::default()), Arc::new(AtomicBool::new(false)));
    let clients = legit_clients(addr, &tally, &stop);
    std::thread::sleep(Duration::from_millis(300));
    let dst = SocketAddrV4::new(FLOOD_SERVER_IP.into(), addr.port());
    let served_before = tally.get().1;
    let (sent, took) = flood(dst);
    let served_during = tally.get().1 - served_before;
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let rss_peak = peak.finish();
    let metrics = common::http_get(server.metrics.unwrap(), "/metrics");
    let (code, rest) = server.terminate();
    let last = last_stats(&stats);
    let (attempted, served, failed, slowest_ms) = tally.get();
    record(
        "overload-synflood",
        &json!({
            "scenario": "syn flood, one-shot rpc, backlog 256, syncookies on",
            "syns_sent": sent, "flood_ms": took.as_millis() as u64,
            "legit_attempted": attempted, "legit_served": served, "legit_failed": failed,
            "legit_slowest_ms": slowest_ms, "legit_served_during_flood": served_during,
            "rss_before_kib": rss_before, "rss_peak_kib": rss_peak,
            "net": last["net"], "accepted": total(&last, "accepted"),
        }),
    );
    assert_eq!(code, 0, "{rest}");
    assert!(rest.contains("syncookies sent"), "stop line: {rest}");
    assert!(
        served >= 100,
        "too few legitimate requests to judge: {attempted}"
    );
    assert!(
        served_during > 0,
        "no legitimate request served during the flood"
    );
    assert!(
        failed * 100 <= attempted,
        "{failed} of {attempted} legitimate requests failed"
    );
    let cookies = net(&last, "syncookies_sent");
    assert!(
        cookies >= sent * 9 / 10,
        "{cookies} cookies for {sent} SYNs: {}",
        last["net"]
    );
    assert!(
        net(&last, "req_q_full_do_cookies") >= sent * 9 / 10,
        "{}",
        last["net"]
    );
    let scraped = metrics
        .lines()
        .find_map(|l| l.strip_prefix("corelocal_net_syncookies_sent_total "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        scraped >= sent / 2,
        "/metrics: {scraped} cookies sent\n{metrics}"
    );
    let growth = rss_peak.saturating_sub(rss_before);
    assert!(
        growth <= FLOOD_RSS_GROWTH_MAX_KIB,
        "RSS grew {growth} KiB during the flood ({rss_before} → {rss_peak})"
    );
    let _ = std::fs::remove_file(&stats);
}

// ---------------------------------------------------------------------------------------------
// Connection flood beyond the connection limit

/// Connections per worker, and the clients that try to connect at once.
const CONN_LIMIT: usize = 25;
const FLOOD_CLIENTS: usize = 600;
/// Resident memory the waiting clients may add: they live in the kernel's accept queues, the
/// server holds only its limit of connections (a few KiB each) — 16 MiB is generous.
const CONN_FLOOD_RSS_GROWTH_MAX_KIB: u64 = 16 * MIB_IN_KIB;
/// Server CPU while every slot is held by an idle client and the rest wait: USER_HZ ticks per
/// second (100 = one core). Near 0 when nothing spins; 30 is a generous bound.
const AT_LIMIT_TICKS_MAX: u64 = 30;

/// A keep-alive client that sent one 64-byte request and waits for its 64-byte answer.
struct Waiter {
    stream: Option<TcpStream>,
    got: usize,
    lost: bool,
}

impl Waiter {
    fn connect(addr: SocketAddr) -> Waiter {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect");
        s.write_all(&[b'r'; 64]).expect("request");
        s.set_nonblocking(true).unwrap();
        Waiter {
            stream: Some(s),
            got: 0,
            lost: false,
        }
    }

    fn answered(&self) -> bool {
        self.got >= 64
    }

    /// Reads what arrived; an end of stream or an error before the answer is a lost client.
    fn poll(&mut self) {
        if self.answered() || self.lost {
            return;
        }
        let Some(s) = self.stream.as_mut() else {
            return;
        };
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => self.lost = true,
            Ok(n) => self.got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(_) => self.lost = true,
        }
    }
}

/// Polls every client; returns (answered, lost).
fn poll_all(clients: &mut [Waiter]) -> (usize, usize) {
    clients.iter_mut().for_each(Waiter::poll);
    let answered = clients.iter().filter(|c| c.answered()).count();
    (answered, clients.iter().filter(|c| c.lost).count())
}

/// Polls until `want` clients are answered (bounded), checking on every pass that no more
/// than `most` are and that none was dropped.
fn answered_until(clients: &mut [Waiter], want: usize, most: usize, limit: Duration) {
    let end = Instant::now() + limit;
    loop {
        let (answered, lost) = poll_all(clients);
        assert_eq!(lost, 0, "clients dropped instead of waiting in the queue");
        assert!(
            answered <= most,
            "{answered} answered, more than the limit allows ({most})"
        );
        if answered >= want {
            return;
        }
        assert!(
            Instant::now() < end,
            "{answered} of {want} answered after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Far more clients than `--conns-per-worker` allows connect at once. The server takes its
/// limit and stops accepting; the rest wait, handshake done, in the kernel's accept queues
/// (backlog 4096 in all; beyond it the kernel would drop SYNs and clients retransmit). At the
/// limit, with every slot held by an idle client, the server uses no CPU; closing served
/// clients frees slots and the waiting ones are served, never more at once than the limit.
fn conn_flood(backend: &str, test: &str) {
    let (cpus, workers) = cpus();
    let capacity = CONN_LIMIT * workers;
    let stats = stats_path(&format!("connflood-{backend}"));
    let file = stats.to_str().unwrap();
    let limit = CONN_LIMIT.to_string();
    let server = Served::start(
        "rpc",
        &[
            "--backend",
            backend,
            "--cpus",
            cpus,
            "--mode",
            "fine",
            "--balance",
            "off",
            "--conns-per-worker",
            &limit,
            "--stats-interval",
            "200ms",
            "--stats-file",
            file,
        ],
    );
    let pid = server.pid();
    let rss_before = rss_kib(pid);
    let mut clients: Vec<Waiter> = (0..FLOOD_CLIENTS)
        .map(|_| Waiter::connect(server.addr))
        .collect();
    answered_until(&mut clients, capacity, capacity, Duration::from_secs(20));
    let at_limit = wait_stats(&stats, "open at the limit", Duration::from_secs(10), |s| {
        total(s, "open") == capacity as u64
    });
    // Every slot is held by an idle client and the rest wait: nothing to do, nothing to spin.
    std::thread::sleep(Duration::from_millis(300));
    let t0 = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    let idle_ticks = cpu_ticks(pid) - t0;
    let (answered, _) = poll_all(&mut clients);
    assert_eq!(answered, capacity, "served past the limit");
    let rss_at_limit = rss_kib(pid);
    // Free the slots of the served clients: the waiting ones are served (at least one more
    // each round, as the kernel spread them over the workers' queues), never more than the
    // freed slots allow.
    let mut closed = 0;
    loop {
        for c in clients
            .iter_mut()
            .filter(|c| c.answered() && c.stream.is_some())
        {
            c.stream = None;
            closed += 1;
        }
        if closed == FLOOD_CLIENTS {
            break;
        }
        answered_until(
            &mut clients,
            closed + 1,
            closed + capacity,
            Duration::from_secs(10),
        );
    }
    let (code, rest) = server.terminate();
    let last = last_stats(&stats);
    record(
        &format!("overload-connflood-{backend}"),
        &json!({
            "scenario": "connection flood beyond --conns-per-worker, keep-alive rpc",
            "backend": backend, "workers": workers, "conns_per_worker": CONN_LIMIT,
            "clients": FLOOD_CLIENTS, "served": FLOOD_CLIENTS,
            "server_cpu_ticks_in_1s_at_limit": idle_ticks,
            "rss_before_kib": rss_before, "rss_at_limit_kib": rss_at_limit,
            "conn_limit_pauses": total(&last, "conn_limit_pauses"),
            "accept_errors": last["total"]["errors"]["accept"],
            "open_at_limit": total(&at_limit, "open"),
        }),
    );
    assert_eq!(code, 0, "{test}: {rest}");
    assert!(
        idle_ticks < AT_LIMIT_TICKS_MAX,
        "{test}: {idle_ticks} ticks/s at the limit: spinning"
    );
    let growth = rss_at_limit.saturating_sub(rss_before);
    assert!(
        growth <= CONN_FLOOD_RSS_GROWTH_MAX_KIB,
        "{test}: RSS grew {growth} KiB"
    );
    // Each worker paused at its limit at least once per round of refills.
    assert!(
        total(&last, "conn_limit_pauses") >= workers as u64,
        "{test}: {last}"
    );
    assert_eq!(
        total(&last, "accepted"),
        FLOOD_CLIENTS as u64,
        "{test}: {last}"
    );
    let _ = std::fs::remove_file(&stats);
}

#[test]
fn connection_flood_waits_at_the_limit_epoll() {
    conn_flood("epoll", "connection_flood_waits_at_the_limit_epoll");
}

#[test]
fn connection_flood_waits_at_the_limit_uring() {
    conn_flood("uring", "connection_flood_waits_at_the_limit_uring");
}

// ---------------------------------------------------------------------------------------------
// Slow readers

/// Slow-reader connections, the requests each pipelines, and the server's limits.
const SLOW_CONNS: usize = 200;
const SLOW_PIPELINED: usize = 200;
const RESP_BYTES: u64 = 64 << 10;
const OUTPUT_LIMIT: u64 = 256 << 10;
const INPUT_LIMIT: u64 = 64 << 10;
/// Resident memory beyond the per-connection limits: allocator arenas, the receive pools
/// (2 × 256 × 16 KiB), the spare send buffers and the normal client's responses.
const SLOW_RSS_SLACK_KIB: u64 = 48 * MIB_IN_KIB;

/// A keep-alive client that reads every 64 KiB answer, until `stop`; returns the count.
fn normal_client(addr: SocketAddr, stop: Arc<AtomicBool>) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).expect("normal client connects");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = vec![0u8; RESP_BYTES as usize];
        let mut served = 0;
        while !stop.load(Ordering::Relaxed) {
            s.write_all(&[b'n'; 64]).expect("normal client writes");
            s.read_exact(&mut answer)
                .expect("normal client is answered within 10 s");
            served += 1;
        }
        served
    })
}

/// A connection that pipelines [`SLOW_PIPELINED`] requests for 64 KiB answers and never reads.
fn slow_reader(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect");
    s.write_all(&[b's'; 64 * SLOW_PIPELINED])
        .expect("pipelined requests");
    s
}

/// Server-side TCP sockets on `port` (IPv4) still in ESTABLISHED state, from /proc/net/tcp.
fn established_on(port: u16) -> usize {
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!(":{port:04X}");
    text.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&local) && f[3] == "01"
        })
        .count()
}

/// Slow readers that pipeline requests for large answers and never read: each connection
/// holds at most the output limit plus one answer (reading pauses there) and its unconsumed
/// input, so the server grows by at most conns × (output limit + answer + input limit) plus a
/// fixed slack; a normal client is served meanwhile; back-pressure is counted; and the idle
/// timeout closes the stalled connections — the sockets really close, not only the slots.
///
/// Runs in a private network namespace (root) whose loopback has a 1500-byte MTU: with the
/// default 64 KiB one, each stalled connection makes the kernel buffer megabytes (socket
/// buffers sized from the MSS), which the host's TCP memory limits share with everyone.
fn slow_readers(backend: &str, test: &str) {
    if !corelocal::testing::inside_private_netns(test) {
        return;
    }
    corelocal::testing::set_up_loopback(None);
    corelocal::testing::sh("ip link set lo mtu 1500");
    let stats = stats_path(&format!("slow-{backend}"));
    let file = stats.to_str().unwrap();
    let (resp, out, inp) = (
        RESP_BYTES.to_string(),
        OUTPUT_LIMIT.to_string(),
        INPUT_LIMIT.to_string(),
    );
    let server = Served::start(
        "rpc",
        &[
            "--backend",
            backend,
            "--resp-size",
            &resp,
            "--output-limit",
            &out,
            "--input-limit",
            &inp,
            "--idle-timeout",
            "2s",
            "--stats-interval",
            "200ms",
            "--stats-file",
            file,
        ],
    );
    let (pid, addr) = (server.pid(), server.addr);
    let stop = Arc::new(AtomicBool::new(false));
    let warm = normal_client(addr, stop.clone());
    std::thread::sleep(Duration::from_millis(300));
    let rss_before = rss_kib(pid);
    let peak = RssPeak::start(pid);
    let slow: Vec<TcpStream> = (0..SLOW_CONNS).map(|_| slow_reader(addr)).collect();
    let paused = wait_stats(
        &stats,
        "every slow reader paused",
        Duration::from_secs(15),
        |s| total(s, "backpressure_pauses") >= SLOW_CONNS as u64,
    );
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let normal_served = warm.join().expect("normal client");
    let rss_peak = peak.finish();
    // The normal client is gone; the stalled connections must be closed by the idle timeout.
    let closed = wait_stats(&stats, "idle timeout", Duration::from_secs(15), |s| {
        total(s, "open") == 0
    });
    let lingering = established_on(addr.port());
    drop(slow);
    let (code, rest) = server.terminate();
    let bound =
        SLOW_CONNS as u64 * (OUTPUT_LIMIT + RESP_BYTES + INPUT_LIMIT) / 1024 + SLOW_RSS_SLACK_KIB;
    record(
        &format!("overload-slowreaders-{backend}"),
        &json!({
            "scenario": "slow readers pipelining requests for 64 KiB answers, never reading",
            "backend": backend, "conns": SLOW_CONNS, "pipelined": SLOW_PIPELINED,
            "resp_bytes": RESP_BYTES, "output_limit": OUTPUT_LIMIT, "input_limit": INPUT_LIMIT,
            "rss_before_kib": rss_before, "rss_peak_kib": rss_peak, "rss_bound_kib": rss_before + bound,
            "normal_client_served": normal_served,
            "backpressure_pauses": total(&paused, "backpressure_pauses"),
            "idle_timeouts": closed["total"]["errors"]["idle_timeout"],
            "established_after_idle_close": lingering,
        }),
    );
    assert_eq!(code, 0, "{test}: {rest}");
    let growth = rss_peak.saturating_sub(rss_before);
    assert!(
        growth <= bound,
        "{test}: RSS grew {growth} KiB, bound {bound} KiB"
    );
    assert!(
        normal_served >= 5,
        "{test}: normal client served {normal_served}"
    );
    let timeouts = closed["total"]["errors"]["idle_timeout"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        timeouts >= SLOW_CONNS as u64,
        "{test}: {timeouts} idle timeouts"
    );
    assert_eq!(
        lingering, 0,
        "{test}: sockets still open after their idle timeout"
    );
    let _ = std::fs::remove_file(&stats);
}

#[test]
fn slow_readers_hold_the_output_limit_epoll() {
    slow_readers("epoll", "slow_readers_hold_the_output_limit_epoll");
}

#[test]
fn slow_readers_hold_the_output_limit_uring() {
    slow_readers("uring", "slow_readers_hold_the_output_limit_uring");
}
