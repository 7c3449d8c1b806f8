//! Worker loss: closing one worker's listeners hands its queued connections to a live sibling
//! (the SELECT_OR_MIGRATE steering program), inside a private network namespace where
//! `net.ipv4.tcp_migrate_req` is 0, so only the program can be what migrates them.

use corelocal::cpu::{current_affinity, pin_current_thread, CpuSet};
use corelocal::listen::{self, GroupConfig, ListenerGroup, Migration, Mode, Steering};
use std::net::TcpStream;
use std::process::Command;

const QUEUED: usize = 40;

fn tcp_ext(name: &str) -> i64 {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for pair in lines.chunks(2) {
        if !pair[0].starts_with("TcpExt:") {
            continue;
        }
        let (h, v) = (pair[0].split_whitespace(), pair[1].split_whitespace());
        if let Some((_, v)) = h.zip(v).find(|(k, _)| *k == name) {
            return v.parse().unwrap();
        }
    }
    panic!("no TcpExt {name}");
}

#[test]
fn worker_loss_hands_its_queue_to_a_sibling() {
    let test = "worker_loss_hands_its_queue_to_a_sibling";
    if !corelocal::testing::inside_private_netns(test) {
        return;
    }
    let cpus: Vec<usize> = current_affinity().unwrap().iter().take(2).collect();
    if cpus.len() < 2 {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "needs 2 CPUs");
        eprintln!("skipping {test}: needs 2 CPUs");
        return;
    }
    assert!(Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .unwrap()
        .success());
    let sysctl = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_migrate_req").unwrap();
    assert_eq!(sysctl.trim(), "0", "the sysctl must not be what migrates");
    let mut config = GroupConfig::new(
        vec!["127.0.0.1:0".parse().unwrap()],
        cpus.clone(),
        Mode::Local,
    );
    config.steering = Some(Steering::Ebpf);
    let mut group = ListenerGroup::bind(config).unwrap();
    assert_eq!(group.migration(), Migration::Ebpf);
    let addr = group.local_addrs()[0];
    // Loopback SYNs are processed on the sending CPU: a client on worker 0's CPU fills its queue.
    pin_current_thread(&CpuSet::single(cpus[0])).unwrap();
    let clients: Vec<TcpStream> = (0..QUEUED)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    assert_eq!(group.queue_depth(0).unwrap().len as usize, QUEUED);
    assert_eq!(group.queue_depth(1).unwrap().len, 0);
    let migrated_before = tcp_ext("TCPMigrateReqSuccess");
    group.close_worker(0).unwrap();
    let sibling = group.listeners(1)[0];
    let mut served = 0;
    while listen::accept(sibling).is_ok() {
        served += 1;
    }
    assert_eq!(
        served, QUEUED,
        "queued connections of the closed worker lost"
    );
    assert_eq!(
        tcp_ext("TCPMigrateReqSuccess") - migrated_before,
        QUEUED as i64
    );
    drop(clients);
}
