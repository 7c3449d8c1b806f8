//! The balancer in the runtime: a slow worker's queue fills, it turns busy, the other worker
//! steals its connections (and, with eBPF steering, moves flow groups to itself).
//!
//! Worker 0 is made slow by its handler (2 ms of spinning per request, like a CPU hog sharing
//! its core); every client connects from CPU 0, so `local` mode queues everything on worker 0.

use corelocal::balance::BalanceConfig;
use corelocal::cpu::{current_affinity, pin_current_thread, CpuSet};
use corelocal::listen::{Mode, Steering};
use corelocal::runtime::{
    BackendKind, CloseReason, ConnInfo, Handler, Output, Server, ServerConfig, Service, Snapshot,
    Step,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CONNS_PER_ROUND: usize = 45;

/// The tests here make CPU 0 deliberately slow; run them one at a time so that they do not
/// slow each other down as well.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}
const SLOW_WORKER_SPIN: Duration = Duration::from_millis(2);

struct SlowZero;
struct SlowZeroConn {
    slow: bool,
}

impl Handler for SlowZeroConn {
    fn on_input(&mut self, input: &[u8], out: &mut Output, _now: Instant) -> Step {
        if self.slow {
            let t = Instant::now();
            while t.elapsed() < SLOW_WORKER_SPIN {
                std::hint::spin_loop();
            }
        }
        out.write(b"ok\n");
        Step::close(input.len(), 1, CloseReason::Done)
    }
}

impl Service for SlowZero {
    type Conn = SlowZeroConn;
    fn name(&self) -> &'static str {
        "slow-zero"
    }
    fn connect(&self, info: &ConnInfo) -> SlowZeroConn {
        SlowZeroConn {
            slow: info.worker == 0,
        }
    }
}

fn two_cpus() -> Option<CpuSet> {
    let cpus: CpuSet = current_affinity().unwrap().iter().take(2).collect();
    (cpus.len() == 2).then_some(cpus)
}

fn start(cpus: &CpuSet, steering: Steering, backend: BackendKind, balance: bool) -> Server {
    start_with(cpus, steering, backend, balance, None)
}

fn start_with(
    cpus: &CpuSet,
    steering: Steering,
    backend: BackendKind,
    balance: bool,
    xdp_iface: Option<&str>,
) -> Server {
    let mut config = ServerConfig::new(vec!["127.0.0.1:0".parse().unwrap()], cpus, Mode::Local);
    // Few flow groups, so that the groups moved during a short test carry many connections.
    config.listen.flow_groups = 16;
    config.listen.steering = Some(steering);
    config.listen.backlog_total = 64;
    config.limits.accept_batch_max = 8;
    config.backend = backend;
    if balance {
        let mut b = BalanceConfig::new(2);
        b.migrate_interval_ns = 20_000_000;
        config.balance = Some(b);
    }
    config.xdp_iface = xdp_iface.map(str::to_string);
    Server::start(config, Arc::new(SlowZero)).unwrap()
}

/// Rounds of 45 connections opened back to back from CPU 0 (the slow worker takes 8 a loop
/// turn and holds at most 16, the rest wait in its 33-deep queue, above the 75% busy mark),
/// then all answered.
fn load(addr: SocketAddr, cpu: usize, rounds: usize) {
    load_checked(addr, cpu, rounds, CONNS_PER_ROUND, None)
}

fn load_checked(
    addr: SocketAddr,
    cpu: usize,
    rounds: usize,
    per_round: usize,
    server: Option<&Server>,
) {
    let t = std::thread::spawn(move || {
        pin_current_thread(&CpuSet::single(cpu)).unwrap();
        for _ in 0..rounds {
            // Each client sends its request right after connecting, then all wait.
            let conns: Vec<TcpStream> = (0..per_round)
                .map(|_| {
                    let mut c = TcpStream::connect(addr).unwrap();
                    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    c.write_all(b"x").unwrap();
                    c
                })
                .collect();
            for mut c in conns {
                let mut v = Vec::new();
                c.read_to_end(&mut v).unwrap();
                assert_eq!(v, b"ok\n");
            }
        }
    });
    let r = t.join();
    if r.is_err() {
        if let Some(s) = server {
            eprintln!("server stats: {:#?}", s.stats());
        }
        panic!("client failed");
    }
}

fn finish(server: Server) -> Snapshot {
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.stats().total.open > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stats = server.stats();
    server.stop();
    server.join().unwrap();
    stats
}

fn steals(backend: BackendKind, steering: Steering) {
    let Some(cpus) = two_cpus() else {
        eprintln!("skipping: needs 2 CPUs");
        return;
    };
    let first = cpus.iter().next().unwrap();
    let server = start(&cpus, steering, backend, true);
    load_checked(
        server.local_addrs()[0],
        first,
        4,
        CONNS_PER_ROUND,
        Some(&server),
    );
    let stats = finish(server);
    assert_eq!(
        stats.total.requests,
        4 * CONNS_PER_ROUND as u64,
        "{stats:?}"
    );
    let w1 = &stats.workers[1];
    assert!(w1.stolen > 10, "worker 1 stole too little: {stats:?}");
    assert_eq!(
        stats.workers[0].stolen, 0,
        "the busy worker stole: {stats:?}"
    );
}

#[test]
fn without_the_balancer_the_idle_worker_gets_nothing() {
    let _serial = serial();
    let Some(cpus) = two_cpus() else { return };
    let first = cpus.iter().next().unwrap();
    let server = start(&cpus, Steering::IncomingCpu, BackendKind::Epoll, false);
    load(server.local_addrs()[0], first, 1);
    let stats = finish(server);
    // Nothing is stolen; only a stray SYN retransmitted from another CPU may land on worker 1.
    assert_eq!(stats.total.stolen, 0, "{stats:?}");
    assert!(
        stats.workers[1].accepted * 10 < CONNS_PER_ROUND as u64,
        "{stats:?}"
    );
}

#[test]
fn an_idle_worker_steals_from_a_busy_one_epoll() {
    let _serial = serial();
    steals(BackendKind::Epoll, Steering::IncomingCpu);
}

#[test]
fn an_idle_worker_steals_from_a_busy_one_uring() {
    let _serial = serial();
    steals(BackendKind::Uring, Steering::IncomingCpu);
}

#[test]
fn flow_groups_migrate_to_the_stealer_with_ebpf() {
    let _serial = serial();
    if !corelocal::testing::root_or_skip("flow_groups_migrate_to_the_stealer_with_ebpf") {
        return;
    }
    let Some(cpus) = two_cpus() else { return };
    let first = cpus.iter().next().unwrap();
    let server = start(&cpus, Steering::Ebpf, BackendKind::Uring, true);
    load(server.local_addrs()[0], first, 8);
    let stats = finish(server);
    let w1 = &stats.workers[1];
    assert!(w1.migrated_in > 0, "no flow group moved: {stats:?}");
    assert_eq!(stats.workers[0].migrated_out, w1.migrated_in, "{stats:?}");
    // Connections of migrated groups now arrive on worker 1's own listener although their SYN
    // was processed on CPU 0: accepted there, not stolen, not local.
    assert!(
        w1.accepted > w1.stolen + w1.accepted_local,
        "no connection arrived through a moved group: {stats:?}"
    );
}

/// Packet level: with XDP + CPUMAP on `lo` (private namespace), the groups the balancer moves
/// to worker 1 have their packets — and so their SYNs — processed on worker 1's CPU: the
/// XDP table ends with most groups there, and worker 1 accepts connections locally that
/// clients on CPU 0 opened.
#[test]
fn flow_groups_migrate_at_packet_level_with_xdp() {
    let _serial = serial();
    if !corelocal::testing::inside_private_netns("flow_groups_migrate_at_packet_level_with_xdp") {
        return;
    }
    let Some(cpus) = two_cpus() else { return };
    corelocal::testing::set_up_loopback(None);
    let first = cpus.iter().next().unwrap();
    let server = start_with(
        &cpus,
        Steering::IncomingCpu,
        BackendKind::Uring,
        true,
        Some("lo"),
    );
    // Twice the usual round: XDP starts with half the groups on CPU 1.
    load_checked(
        server.local_addrs()[0],
        first,
        8,
        2 * CONNS_PER_ROUND,
        Some(&server),
    );
    let stats = finish(server);
    let w1 = &stats.workers[1];
    assert!(w1.migrated_in > 0, "no flow group moved: {stats:?}");
    // Locally accepted on worker 1 although every client ran on CPU 0: their packets were
    // redirected to CPU 1 by the XDP table.
    assert!(w1.accepted_local > 0, "{stats:?}");
    assert!(
        w1.accepted_local > stats.workers[0].accepted_local,
        "moved groups did not bring their packets: {stats:?}"
    );
}
