//! Locality with RPS spreading flows on loopback, inside a private network namespace.
//!
//! The test re-runs itself under `unshare --net --mount` (root only): the child mounts a
//! sysfs of the new namespace, brings `lo` up, sets `rps_cpus` so each flow's receive
//! processing lands on a CPU chosen by its hash (like RSS on a NIC), and checks that `local`
//! mode accepts ≥ 99% of connections on the worker whose CPU processed them. Nothing outside
//! the namespace is touched.

use corelocal::cpu::{current_affinity, pin_current_thread, CpuSet};
use corelocal::listen::{Mode, Steering};
use corelocal::runtime::{
    CloseReason, ConnInfo, Handler, Output, Server, ServerConfig, Service, Step,
};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const INNER_ENV: &str = "CORELOCAL_NETNS_INNER";
const CONNS: usize = 400;

struct OneShot;
struct OneShotConn;

impl Handler for OneShotConn {
    fn on_input(&mut self, input: &[u8], out: &mut Output, _now: Instant) -> Step {
        out.write(b"ok\n");
        Step::close(input.len(), 1, CloseReason::Done)
    }
}

impl Service for OneShot {
    type Conn = OneShotConn;
    fn name(&self) -> &'static str {
        "oneshot"
    }
    fn connect(&self, _info: &ConnInfo) -> OneShotConn {
        OneShotConn
    }
}

/// Runs `test` in a fresh network + mount namespace (this same test binary, filtered to it).
fn rerun_in_netns(test: &str) {
    let exe = std::env::current_exe().unwrap();
    let status = Command::new("unshare")
        .args(["--net", "--mount", "--"])
        .arg(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(INNER_ENV, "1")
        .status()
        .expect("running unshare");
    assert!(status.success(), "{test} failed inside the namespace");
}

fn sh(cmd: &str) {
    let status = Command::new("sh").args(["-c", cmd]).status().unwrap();
    assert!(status.success(), "{cmd}");
}

/// Inside the namespace: sysfs of this netns, lo up, RPS over `cpus`.
fn set_up_namespace(cpus: &CpuSet) {
    sh("mount -t sysfs sysfs /sys");
    sh("ip link set lo up");
    let mask = cpus.to_mask(0);
    std::fs::write("/sys/class/net/lo/queues/rx-0/rps_cpus", &mask).unwrap();
    let back = std::fs::read_to_string("/sys/class/net/lo/queues/rx-0/rps_cpus").unwrap();
    assert_eq!(
        CpuSet::parse_mask(&back).unwrap(),
        *cpus,
        "rps_cpus did not take"
    );
}

fn locality_with_rps(steering: Steering) {
    let cpus: CpuSet = current_affinity().unwrap().iter().take(2).collect();
    if cpus.len() < 2 {
        eprintln!("skipping: needs 2 CPUs");
        return;
    }
    set_up_namespace(&cpus);
    let mut config = ServerConfig::new(vec!["127.0.0.1:0".parse().unwrap()], &cpus, Mode::Local);
    config.listen.steering = Some(steering);
    let server = Server::start(config, Arc::new(OneShot)).unwrap();
    let addr = server.local_addrs()[0];
    let first_cpu = cpus.iter().next().unwrap();
    std::thread::spawn(move || {
        // Every SYN is sent from one CPU; RPS decides where it is processed.
        pin_current_thread(&CpuSet::single(first_cpu)).unwrap();
        for _ in 0..CONNS {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(b"x").unwrap();
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).unwrap();
            assert_eq!(buf, b"ok\n");
        }
    })
    .join()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.stats().total.accepted < CONNS as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stats = server.stats();
    server.stop();
    server.join().unwrap();
    assert_eq!(stats.total.accepted, CONNS as u64);
    assert!(stats.locality() >= 0.99, "{steering}: {stats:?}");
    for w in &stats.workers {
        // RPS really spread the flows: each worker got a fair share.
        assert!(
            w.accepted as usize > CONNS / 5,
            "{steering}: RPS did not spread: {stats:?}"
        );
    }
    eprintln!(
        "{steering}: locality {:.4} {:?}",
        stats.locality(),
        stats.workers.iter().map(|w| w.accepted).collect::<Vec<_>>()
    );
}

#[test]
fn rps_spread_flows_are_accepted_locally_with_ebpf() {
    if std::env::var(INNER_ENV).is_ok() {
        return locality_with_rps(Steering::Ebpf);
    }
    if corelocal::testing::root_or_skip("rps_spread_flows_are_accepted_locally_with_ebpf") {
        rerun_in_netns("rps_spread_flows_are_accepted_locally_with_ebpf");
    }
}

#[test]
fn rps_spread_flows_are_accepted_locally_with_incoming_cpu() {
    if std::env::var(INNER_ENV).is_ok() {
        return locality_with_rps(Steering::IncomingCpu);
    }
    if corelocal::testing::root_or_skip("rps_spread_flows_are_accepted_locally_with_incoming_cpu") {
        rerun_in_netns("rps_spread_flows_are_accepted_locally_with_incoming_cpu");
    }
}

#[test]
fn rps_spread_flows_are_accepted_locally_with_cbpf() {
    if std::env::var(INNER_ENV).is_ok() {
        return locality_with_rps(Steering::Cbpf);
    }
    if corelocal::testing::root_or_skip("rps_spread_flows_are_accepted_locally_with_cbpf") {
        rerun_in_netns("rps_spread_flows_are_accepted_locally_with_cbpf");
    }
}

#[test]
fn rps_spread_flows_lose_locality_in_fine_mode() {
    if std::env::var(INNER_ENV).is_ok() {
        let cpus: CpuSet = current_affinity().unwrap().iter().take(2).collect();
        if cpus.len() < 2 {
            return;
        }
        set_up_namespace(&cpus);
        let config = ServerConfig::new(vec!["127.0.0.1:0".parse().unwrap()], &cpus, Mode::Fine);
        let server = Server::start(config, Arc::new(OneShot)).unwrap();
        let addr = server.local_addrs()[0];
        for _ in 0..CONNS {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"x").unwrap();
            let _ = s.read_to_end(&mut Vec::new());
        }
        std::thread::sleep(Duration::from_millis(200));
        let stats = server.stats();
        server.stop();
        server.join().unwrap();
        let l = stats.locality();
        assert!(l > 0.3 && l < 0.7, "fine mode locality {l}: {stats:?}");
        return;
    }
    if corelocal::testing::root_or_skip("rps_spread_flows_lose_locality_in_fine_mode") {
        rerun_in_netns("rps_spread_flows_lose_locality_in_fine_mode");
    }
}
