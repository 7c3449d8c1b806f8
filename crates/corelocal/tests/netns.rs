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
use std::sync::Arc;
use std::time::{Duration, Instant};

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

fn locality_with_rps(steering: Steering) {
    let cpus: CpuSet = current_affinity().unwrap().iter().take(2).collect();
    if cpus.len() < 2 {
        eprintln!("skipping: needs 2 CPUs");
        return;
    }
    corelocal::testing::set_up_loopback(Some(&cpus));
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
    if corelocal::testing::inside_private_netns("rps_spread_flows_are_accepted_locally_with_ebpf") {
        locality_with_rps(Steering::Ebpf);
    }
}

#[test]
fn rps_spread_flows_are_accepted_locally_with_incoming_cpu() {
    if corelocal::testing::inside_private_netns(
        "rps_spread_flows_are_accepted_locally_with_incoming_cpu",
    ) {
        locality_with_rps(Steering::IncomingCpu);
    }
}

#[test]
fn rps_spread_flows_are_accepted_locally_with_cbpf() {
    if corelocal::testing::inside_private_netns("rps_spread_flows_are_accepted_locally_with_cbpf") {
        locality_with_rps(Steering::Cbpf);
    }
}

#[test]
fn rps_spread_flows_lose_locality_in_fine_mode() {
    if corelocal::testing::inside_private_netns("rps_spread_flows_lose_locality_in_fine_mode") {
        let cpus: CpuSet = current_affinity().unwrap().iter().take(2).collect();
        if cpus.len() < 2 {
            return;
        }
        corelocal::testing::set_up_loopback(Some(&cpus));
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
    }
}
