//! The `axum` example's app on corelocal-tokio with clients pinned to each CPU over loopback:
//! in `local` mode, with every steering method, ≥ 99% of fresh connections are answered by
//! the worker on the client's CPU (`GET /cpu`) and counted local; in `fine` mode about
//! 1/workers are.

#[path = "../examples/common/app.rs"]
mod app;
mod common;

use corelocal::testing::root_or_skip;
use corelocal_tokio::{ActiveSteering, CpuSet, Mode, Server, Steering};
use std::net::SocketAddr;

const CONNS_PER_CPU: usize = 200;

/// Fresh connections from a thread pinned to each worker CPU: (answered on the client's CPU,
/// total), and the server's (accepted_local, accepted).
fn run(mode: Mode, steering: Option<Steering>) -> Option<((usize, usize), (u64, u64))> {
    let cpus = common::cpus();
    if cpus.len() < 2 {
        eprintln!("skipping: needs 2 CPUs");
        return None;
    }
    let mut b = Server::builder()
        .cpus(cpus.iter().copied().collect::<CpuSet>())
        .mode(mode);
    if let Some(s) = steering {
        b = b.steering(s);
    }
    let server = b.listen("127.0.0.1:0").unwrap();
    if let Some(s) = steering {
        assert_eq!(server.steering(), ActiveSteering::Local(s));
    }
    let addr: SocketAddr = server.local_addrs()[0];
    let router = app::router();
    let running = server.start_tower(move |_| router.clone()).unwrap();
    let mut same = 0;
    let mut total = 0;
    for &cpu in &cpus {
        let answers: Vec<usize> = common::on_cpu(cpu, move || {
            (0..CONNS_PER_CPU)
                .map(|_| {
                    let r = common::get_once(addr, "/cpu").unwrap();
                    assert_eq!(r.status, 200);
                    r.text().trim().parse().unwrap()
                })
                .collect()
        });
        same += answers.iter().filter(|&&c| c == cpu).count();
        total += answers.len();
    }
    running.stop();
    let report = running.join().unwrap();
    let t = &report.stats.total;
    assert_eq!(t.accepted, total as u64);
    assert_eq!(t.requests, total as u64);
    assert_eq!(t.open, 0);
    Some(((same, total), (t.accepted_local, t.accepted)))
}

fn assert_local(steering: Steering) {
    let Some(((same, total), (local, accepted))) = run(Mode::Local, Some(steering)) else {
        return;
    };
    eprintln!(
        "{steering}: {same}/{total} answered on the client's CPU, {local}/{accepted} counted local"
    );
    assert!(same * 100 >= total * 99, "{steering}: {same}/{total}");
    assert!(
        local * 100 >= accepted * 99,
        "{steering}: counted {local}/{accepted}"
    );
}

#[test]
fn local_with_ebpf_answers_on_the_clients_cpu() {
    if root_or_skip("local_with_ebpf_answers_on_the_clients_cpu") {
        assert_local(Steering::Ebpf);
    }
}

#[test]
fn local_with_incoming_cpu_answers_on_the_clients_cpu() {
    if corelocal::sys::socket::kernel_version()
        .is_some_and(|v| v >= corelocal::listen::INCOMING_CPU_MIN_KERNEL)
    {
        assert_local(Steering::IncomingCpu);
    } else {
        eprintln!("skipping: SO_INCOMING_CPU steering needs kernel >= 6.2");
    }
}

#[test]
fn local_with_cbpf_answers_on_the_clients_cpu() {
    assert_local(Steering::Cbpf);
}

#[test]
fn fine_answers_on_the_clients_cpu_about_one_in_workers() {
    let Some(((same, total), (local, accepted))) = run(Mode::Fine, None) else {
        return;
    };
    let workers = common::cpus().len() as f64;
    let share = same as f64 / total as f64;
    eprintln!("fine: {same}/{total} on the client's CPU, {local}/{accepted} counted local");
    assert!(
        (share - 1.0 / workers).abs() < 0.2,
        "fine: {same}/{total} on the client's CPU, expected about 1/{workers}"
    );
    let counted = local as f64 / accepted as f64;
    assert!(
        (counted - share).abs() < 0.05,
        "counted {counted} vs seen {share}"
    );
}
