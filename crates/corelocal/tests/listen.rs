//! Steering tests for the listener group: each mode and each `local` steering method, measured
//! by where connections from pinned client threads land.

use corelocal::cpu::{current_affinity, pin_current_thread, CpuSet};
use corelocal::listen::{self, ActiveSteering, GroupConfig, ListenerGroup, Mode, Steering};
use std::net::{SocketAddr, TcpStream};
use std::thread;

const CONNS_PER_CPU: usize = 200;

fn two_cpus() -> Option<(usize, usize)> {
    let cpus: Vec<usize> = current_affinity().unwrap().iter().collect();
    if cpus.len() < 2 {
        eprintln!("skipping: needs 2 CPUs");
        return None;
    }
    Some((cpus[0], cpus[1]))
}

/// Opens `n` connections to `addr` from a thread pinned to `cpu`; returns them (kept open).
fn connect_from(cpu: usize, addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    thread::spawn(move || {
        pin_current_thread(&CpuSet::single(cpu)).unwrap();
        (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect()
    })
    .join()
    .unwrap()
}

/// Drains every worker's listener: per worker, the `SO_INCOMING_CPU` of each accepted socket.
fn drain(group: &ListenerGroup) -> Vec<Vec<Option<usize>>> {
    (0..group.workers())
        .map(|w| {
            let mut seen = Vec::new();
            for fd in group.listeners(w) {
                while let Ok(a) = listen::accept(fd) {
                    seen.push(a.incoming_cpu);
                }
            }
            seen
        })
        .collect()
}

fn bind(cpus: Vec<usize>, mode: Mode, steering: Option<Steering>) -> ListenerGroup {
    let mut config = GroupConfig::new(vec!["127.0.0.1:0".parse().unwrap()], cpus, mode);
    config.steering = steering;
    ListenerGroup::bind(config).unwrap()
}

/// Clients pinned to each worker's CPU: returns (connections landing on that worker, total).
fn locality(group: &ListenerGroup) -> (usize, usize) {
    let addr = group.local_addrs()[0];
    let mut local = 0;
    let mut total = 0;
    for w in 0..group.workers() {
        let _conns = connect_from(group.worker_cpu(w), addr, CONNS_PER_CPU);
        let per_worker = drain(group);
        local += per_worker[w].len();
        total += per_worker.iter().map(Vec::len).sum::<usize>();
    }
    (local, total)
}

fn assert_local(steering: Steering) {
    let Some((a, b)) = two_cpus() else { return };
    let group = bind(vec![a, b], Mode::Local, Some(steering));
    assert_eq!(group.steering(), ActiveSteering::Local(steering));
    let (local, total) = locality(&group);
    assert_eq!(total, 2 * CONNS_PER_CPU);
    assert!(
        local * 100 >= total * 99,
        "{steering}: {local}/{total} local"
    );
}

#[test]
fn local_with_incoming_cpu_keeps_connections_on_the_clients_cpu() {
    assert_local(Steering::IncomingCpu);
}

#[test]
fn local_with_cbpf_keeps_connections_on_the_clients_cpu() {
    assert_local(Steering::Cbpf);
}

#[test]
fn local_with_ebpf_keeps_connections_on_the_clients_cpu() {
    if corelocal::testing::root_or_skip("local_with_ebpf") {
        assert_local(Steering::Ebpf);
    }
}

#[test]
fn local_picks_the_best_available_method() {
    let Some((a, b)) = two_cpus() else { return };
    let group = bind(vec![a, b], Mode::Local, None);
    let expected = if corelocal::sys::process::is_root() {
        Steering::Ebpf
    } else {
        Steering::IncomingCpu
    };
    assert_eq!(group.steering(), ActiveSteering::Local(expected));
}

#[test]
fn fine_spreads_by_hash_without_locality() {
    let Some((a, b)) = two_cpus() else { return };
    let group = bind(vec![a, b], Mode::Fine, None);
    assert_eq!(group.steering(), ActiveSteering::KernelHash);
    let (local, total) = locality(&group);
    // About 1/workers: far from both 0% and 100% for 400 connections.
    assert!(
        local * 100 > total * 30 && local * 100 < total * 70,
        "fine: {local}/{total} local"
    );
}

#[test]
fn stock_shares_one_socket() {
    let Some((a, b)) = two_cpus() else { return };
    let group = bind(vec![a, b], Mode::Stock, None);
    assert_eq!(group.steering(), ActiveSteering::Shared);
    assert_eq!(group.listeners(0), group.listeners(1));
    let _conns = connect_from(a, group.local_addrs()[0], 10);
    let depth = group.queue_depth(0).unwrap();
    assert_eq!(depth.len, 10);
    assert_eq!(depth.cap, 4096);
}

#[test]
fn backlog_is_split_across_listeners_and_queue_depth_is_read() {
    let Some((a, b)) = two_cpus() else { return };
    let mut config = GroupConfig::new(
        vec!["127.0.0.1:0".parse().unwrap()],
        vec![a, b],
        Mode::Local,
    );
    config.steering = Some(Steering::IncomingCpu);
    config.backlog_total = 64;
    let group = ListenerGroup::bind(config).unwrap();
    let _conns = connect_from(b, group.local_addrs()[0], 7);
    assert_eq!(group.queue_depth(0).unwrap().len, 0);
    let depth = group.queue_depth(1).unwrap();
    assert_eq!((depth.len, depth.cap), (7, 32));
}

/// Workers on [a, a phantom CPU, b]. Closing the phantom's listener makes the kernel move b's
/// listener into its `socks[]` slot; b's clients must still reach b.
fn closing_a_listener_keeps_the_rest_local(steering: Steering) {
    let Some((a, b)) = two_cpus() else { return };
    let phantom = 1000;
    let mut group = bind(vec![a, phantom, b], Mode::Local, Some(steering));
    group.close_worker(1).unwrap();
    assert!(group.listeners(1).is_empty());
    let _conns = connect_from(b, group.local_addrs()[0], CONNS_PER_CPU);
    let per_worker = drain(&group);
    assert_eq!(
        per_worker[2].len(),
        CONNS_PER_CPU,
        "{steering}: {per_worker:?}"
    );
}

#[test]
fn closing_a_listener_keeps_cbpf_steering_right() {
    closing_a_listener_keeps_the_rest_local(Steering::Cbpf);
}

#[test]
fn closing_a_listener_keeps_incoming_cpu_steering_right() {
    closing_a_listener_keeps_the_rest_local(Steering::IncomingCpu);
}

#[test]
fn closing_a_listener_keeps_ebpf_steering_right() {
    if corelocal::testing::root_or_skip("closing_a_listener_keeps_ebpf_steering_right") {
        closing_a_listener_keeps_the_rest_local(Steering::Ebpf);
    }
}

#[test]
fn ebpf_flow_group_override_moves_connections() {
    if !corelocal::testing::root_or_skip("ebpf_flow_group_override_moves_connections") {
        return;
    }
    let Some((a, b)) = two_cpus() else { return };
    let group = bind(vec![a, b], Mode::Local, Some(Steering::Ebpf));
    for g in 0..group.flow_groups() {
        group.set_flow_group(g, Some(1)).unwrap();
    }
    let _conns = connect_from(a, group.local_addrs()[0], CONNS_PER_CPU);
    let per_worker = drain(&group);
    assert_eq!(per_worker[1].len(), CONNS_PER_CPU, "{per_worker:?}");
    for g in 0..group.flow_groups() {
        group.set_flow_group(g, None).unwrap();
    }
    let _conns = connect_from(a, group.local_addrs()[0], CONNS_PER_CPU);
    assert_eq!(drain(&group)[0].len(), CONNS_PER_CPU);
}

#[test]
fn ipv4_and_ipv6_bind_together() {
    let Some((a, b)) = two_cpus() else { return };
    let addrs = vec!["127.0.0.1:0".parse().unwrap(), "[::1]:0".parse().unwrap()];
    let mut config = GroupConfig::new(addrs, vec![a, b], Mode::Local);
    config.steering = Some(Steering::IncomingCpu);
    let group = ListenerGroup::bind(config).unwrap();
    let bound = group.local_addrs();
    assert!(bound[0].is_ipv4() && bound[1].is_ipv6());
    assert_eq!(group.listeners(0).len(), 2);
    let _c = connect_from(b, bound[1], 20);
    assert_eq!(drain(&group)[1].len(), 20);
}

#[test]
fn bad_configs_are_refused_clearly() {
    let err = ListenerGroup::bind(GroupConfig::new(vec![], vec![0], Mode::Fine)).unwrap_err();
    assert!(err.to_string().contains("no listen address"), "{err}");
    let err = ListenerGroup::bind(GroupConfig::new(
        vec!["127.0.0.1:0".parse().unwrap()],
        vec![],
        Mode::Fine,
    ))
    .unwrap_err();
    assert!(err.to_string().contains("no workers"), "{err}");
}

/// A port another server listens on with `SO_REUSEPORT` (same user) would be joined silently,
/// and that server's connections shared with ours: refused, unless joining is the point (a
/// binary upgrade by PID). A port held without `SO_REUSEPORT` is refused the same way.
#[test]
fn an_address_another_server_listens_on_is_refused_unless_joining() {
    let Some((a, b)) = two_cpus() else { return };
    let fine = |addr: SocketAddr| GroupConfig::new(vec![addr], vec![a, b], Mode::Fine);
    let stranger = bind(vec![a], Mode::Fine, None); // SO_REUSEPORT, this user
    let taken = stranger.local_addrs()[0];
    match ListenerGroup::bind(fine(taken)) {
        Err(listen::ListenError::AddrInUse(addr)) => assert_eq!(addr, taken),
        other => panic!(
            "joined a stranger's reuseport group: {:?}",
            other.map(|_| ())
        ),
    }
    let mut join = fine(taken);
    join.join_existing = true;
    let joined = ListenerGroup::bind(join).expect("joining on purpose");
    assert_eq!(joined.local_addrs(), vec![taken]);

    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap(); // no SO_REUSEPORT
    let held = plain.local_addr().unwrap();
    let err = ListenerGroup::bind(fine(held)).map(|_| ()).unwrap_err();
    assert!(
        err.to_string()
            .contains("in use by another listening socket"),
        "{err}"
    );
    drop(plain);
    ListenerGroup::bind(fine(held)).expect("free once the holder is gone");
}
