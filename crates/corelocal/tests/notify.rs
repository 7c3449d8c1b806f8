//! Output without input (`Handler::on_notify`), on both backends: a notifier from another
//! thread makes its connection write; a notifier kept past its connection's close never
//! reaches the slot's next connection; output larger than the limit arrives whole.

use corelocal::cpu::{current_affinity, CpuSet};
use corelocal::listen::Mode;
use corelocal::runtime::{
    BackendKind, ConnInfo, Handler, Next, Notifier, Output, Server, ServerConfig, Service, Step,
};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Hands every connection's notifier to the test, in accept order.
#[derive(Default)]
struct Notified {
    notifiers: Mutex<Vec<Notifier>>,
}

/// `OWE n\n` makes the next notifies write `n` bytes of `x` in all; a notify owing nothing
/// writes `N\n` (so that a misdelivered notify shows).
struct Owing {
    owed: usize,
}

impl Handler for Owing {
    fn on_input(&mut self, input: &[u8], out: &mut Output, _now: Instant) -> Step {
        let Some(end) = input.iter().position(|&b| b == b'\n') else {
            return Step::read(0, 0);
        };
        let n = std::str::from_utf8(&input[..end]).unwrap();
        self.owed = n.strip_prefix("OWE ").unwrap().parse().unwrap();
        out.write(b"OK\n");
        Step::read(end + 1, 1)
    }

    fn on_notify(&mut self, out: &mut Output, _now: Instant) -> Next {
        if self.owed == 0 {
            out.write(b"N\n");
            return Next::Read;
        }
        let n = (out.room() as usize).min(self.owed);
        out.write(&vec![b'x'; n]);
        self.owed -= n;
        Next::Read
    }
}

impl Service for Notified {
    type Conn = Owing;
    fn name(&self) -> &'static str {
        "notified"
    }
    fn connect(&self, info: &ConnInfo) -> Owing {
        let notifier = info
            .notifier()
            .expect("a worker's connection has a notifier");
        self.notifiers.lock().unwrap().push(notifier);
        Owing { owed: 0 }
    }
}

/// One worker, so that a closed connection's slot goes to the next one.
fn start(backend: BackendKind) -> (Server, Arc<Notified>) {
    let cpu = current_affinity().unwrap().iter().next().unwrap();
    let addr = "127.0.0.1:0".parse().unwrap();
    let mut config = ServerConfig::new(vec![addr], &CpuSet::single(cpu), Mode::Local);
    config.backend = backend;
    let service = Arc::new(Notified::default());
    (Server::start(config, service.clone()).unwrap(), service)
}

/// Connects and waits for the connection's notifier (the `index`th).
fn connect(server: &Server, service: &Notified, index: usize) -> (TcpStream, Notifier) {
    let s = TcpStream::connect(server.local_addrs()[0]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(n) = service.notifiers.lock().unwrap().get(index) {
            return (s, n.clone());
        }
        assert!(
            Instant::now() < deadline,
            "connection {index} never accepted"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn read_exact(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    s.read_exact(&mut buf).unwrap();
    buf
}

/// Nothing arrives within a while.
fn silent(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut b = [0u8; 16];
    let quiet = match s.read(&mut b) {
        Err(e) => matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        Ok(_) => false,
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    quiet
}

fn stop(server: Server) {
    server.stop();
    server.join().unwrap();
}

fn a_notify_from_another_thread_writes(backend: BackendKind) {
    let (server, service) = start(backend);
    let (mut s, notifier) = connect(&server, &service, 0);
    assert!(silent(&mut s), "nothing before the notify");
    let n = notifier.clone();
    std::thread::spawn(move || n.notify()).join().unwrap();
    assert_eq!(read_exact(&mut s, 2), b"N\n");
    // Notifies before the worker's turn coalesce into at most one call each turn.
    notifier.notify();
    assert_eq!(read_exact(&mut s, 2), b"N\n");
    stop(server);
}

fn a_stale_notifier_never_reaches_the_slots_next_connection(backend: BackendKind) {
    let (server, service) = start(backend);
    let (first, stale) = connect(&server, &service, 0);
    drop(first);
    // Wait until the server closed it: its slot is then free for the next connection.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.stats().total.open != 0 {
        assert!(Instant::now() < deadline, "first connection never closed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (mut second, fresh) = connect(&server, &service, 1);
    stale.notify();
    assert!(
        silent(&mut second),
        "the stale notifier reached the new connection"
    );
    fresh.notify();
    assert_eq!(read_exact(&mut second, 2), b"N\n");
    stop(server);
}

fn output_past_the_limit_arrives_whole(backend: BackendKind) {
    let (server, service) = start(backend);
    let (mut s, notifier) = connect(&server, &service, 0);
    let total = 5_000_000;
    s.write_all(format!("OWE {total}\n").as_bytes()).unwrap();
    assert_eq!(read_exact(&mut s, 3), b"OK\n");
    notifier.notify();
    // One notify: the rest is written as the output drains, without more notifies.
    let got = read_exact(&mut s, total);
    assert!(got.iter().all(|&b| b == b'x'));
    assert!(silent(&mut s));
    stop(server);
}

// Every behaviour above, on each backend.
corelocal::on_every_backend!(
    a_notify_from_another_thread_writes,
    a_stale_notifier_never_reaches_the_slots_next_connection,
    output_past_the_limit_arrives_whole,
);
