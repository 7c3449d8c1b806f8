//! A worker pins itself back to its CPU when its affinity was widened behind its back (what the
//! kernel does to a thread pinned to a CPU that goes offline). Its own test binary: worker
//! threads are found by name (`corelocal-w0`), which must be unique in the process, so the two
//! backends run one after the other here and no other test's server runs beside them.

use corelocal::cpu::current_affinity;
use corelocal::listen::Mode;
use corelocal::runtime::{
    BackendKind, CloseReason, ConnInfo, Handler, Output, Server, ServerConfig, Service, Step,
};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// `PING\n` → `PONG\n`; anything else closes.
struct Ping;
struct PingConn;

impl Handler for PingConn {
    fn on_input(&mut self, input: &[u8], out: &mut Output, _now: Instant) -> Step {
        let Some(end) = input.iter().position(|&b| b == b'\n') else {
            return Step::read(0, 0);
        };
        if &input[..end] == b"PING" {
            out.write(b"PONG\n");
            Step::read(end + 1, 1)
        } else {
            Step::close(end + 1, 0, CloseReason::Done)
        }
    }
}

impl Service for Ping {
    type Conn = PingConn;
    fn name(&self) -> &'static str {
        "ping"
    }
    fn connect(&self, _info: &ConnInfo) -> PingConn {
        PingConn
    }
}

/// The thread id of the worker named `corelocal-w{index}` in this process.
fn worker_tid(index: usize) -> i32 {
    let name = format!("corelocal-w{index}");
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let task = task.unwrap().path();
        if std::fs::read_to_string(task.join("comm")).is_ok_and(|c| c.trim() == name) {
            return task.file_name().unwrap().to_str().unwrap().parse().unwrap();
        }
    }
    panic!("no thread {name}");
}

fn allowed_cpus(tid: i32) -> String {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))
        .unwrap();
    line.split_whitespace().nth(1).unwrap().to_string()
}

/// A worker whose affinity was widened behind its back (what the kernel does to a thread
/// pinned to a CPU that goes offline; bringing the CPU back does not narrow it, seen in
/// bench/lab) pins itself back to its CPU, and keeps serving meanwhile.
fn a_worker_pins_itself_back_to_its_cpu(backend: BackendKind) {
    let all = current_affinity().unwrap();
    if all.len() < 2 {
        eprintln!("skipped: one CPU allowed, an affinity cannot be widened");
        return;
    }
    let mut config = ServerConfig::new(vec!["127.0.0.1:0".parse().unwrap()], &all, Mode::Local);
    config.backend = backend;
    let server = Server::start(config, Arc::new(Ping)).unwrap();
    let tid = worker_tid(0);
    let own = allowed_cpus(tid);
    assert_eq!(
        own,
        all.iter().next().unwrap().to_string(),
        "worker 0 starts pinned"
    );
    corelocal::cpu::pin_thread(tid, &all).unwrap();
    assert_eq!(allowed_cpus(tid), all.to_string());
    // The worker checks at its loop's turns: requests make turns, and each is answered. They
    // must reach worker 0: on loopback the SYN is processed on the sending CPU, so the client
    // runs on worker 0's CPU (from another CPU they went to that CPU's worker, and worker 0,
    // with nothing to do, never turned: it failed so in a CI run).
    let first = all.iter().next().unwrap();
    corelocal::cpu::pin_current_thread(&corelocal::cpu::CpuSet::single(first)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let stream = TcpStream::connect(server.local_addrs()[0]).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut c = BufReader::new(stream);
    while allowed_cpus(tid) != own {
        assert!(
            Instant::now() < deadline,
            "worker 0 still allowed on {} (not pinned back to {own})",
            allowed_cpus(tid)
        );
        c.get_mut().write_all(b"PING\n").unwrap();
        let mut line = String::new();
        c.read_line(&mut line).unwrap();
        assert_eq!(line, "PONG\n");
        thread::sleep(Duration::from_millis(50));
    }
    drop(c);
    corelocal::cpu::pin_current_thread(&all).unwrap();
    server.stop();
    server.join().unwrap();
}

#[test]
fn a_worker_pins_itself_back_to_its_cpu_on_each_backend() {
    a_worker_pins_itself_back_to_its_cpu(BackendKind::Epoll);
    a_worker_pins_itself_back_to_its_cpu(BackendKind::Uring);
}
