//! The examples' servers (`examples/echo.rs`, `examples/kv.rs`), built from the examples' own
//! code and configuration, as a client sees them; on both backends. The echo server also runs
//! the way its `main` does, until a SIGTERM.

#[allow(dead_code)] // `main` and its helpers: the example's, not called here.
#[path = "../examples/echo.rs"]
mod echo;
#[allow(dead_code)]
#[path = "../examples/kv.rs"]
mod kv;

use corelocal::cpu::{current_affinity, pin_current_thread, CpuSet};
use corelocal::runtime::{BackendKind, Server, Service};
use corelocal::sys::signal;
use corelocal::testing::read_up_to;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

/// Where the tests listen: any free port.
fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Starts `service` with the example's configuration, on `backend`.
fn start<S: Service>(
    config: std::io::Result<corelocal::runtime::ServerConfig>,
    service: S,
    backend: BackendKind,
) -> Server {
    let mut config = config.unwrap();
    config.backend = backend;
    Server::start(config, Arc::new(service)).unwrap()
}

fn connect(a: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(a).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn read_to_end(mut s: TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

fn stop(server: Server) {
    server.stop();
    server.join().unwrap();
}

/// Whatever arrives comes back, in order, however it is cut; 1 MB from a client that writes
/// it all before reading (the server pauses reading at its output limit, then goes on).
fn echo_sends_back_what_it_receives(backend: BackendKind) {
    let server = start(echo::config(any_port()), echo::Echo, backend);
    let mut s = connect(server.local_addrs()[0]);
    s.write_all(b"hello\n").unwrap();
    assert_eq!(read_up_to(&mut s, 6), b"hello\n");
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let mut w = s.try_clone().unwrap();
    let sent = big.clone();
    let writer = thread::spawn(move || w.write_all(&sent).unwrap());
    let got = read_up_to(&mut s, big.len());
    writer.join().unwrap();
    assert_eq!(got.len(), big.len());
    assert!(got == big, "echo differs");
    drop(s);
    stop(server);
}

/// The protocol's every answer, pipelined in one write, in order; 5,000 pipelined GETs.
fn kv_answers_pipelined_requests(backend: BackendKind) {
    let server = start(kv::config(any_port()), kv::Kv::default(), backend);
    let mut s = connect(server.local_addrs()[0]);
    s.write_all(b"SET a 1\nGET a\r\nGET b\nSET b two words\nGET b\nDEL a\nDEL a\nGET a\nNOPE\n")
        .unwrap();
    let want = b"STORED\nVALUE 1\nNOT_FOUND\nSTORED\nVALUE two words\nDELETED\nNOT_FOUND\nNOT_FOUND\nERROR unknown command\n";
    assert_eq!(
        String::from_utf8_lossy(&read_up_to(&mut s, want.len())),
        String::from_utf8_lossy(want)
    );
    s.write_all(&b"GET b\n".repeat(5_000)).unwrap();
    let want = b"VALUE two words\n".repeat(5_000);
    let got = read_up_to(&mut s, want.len());
    assert_eq!(got.len(), want.len(), "answers to 5,000 pipelined GETs");
    assert!(got == want);
    s.write_all(b"QUIT\nGET b\n").unwrap();
    assert_eq!(
        read_to_end(s),
        b"",
        "QUIT closes; what follows is not answered"
    );
    stop(server);
}

/// A line past the limit gets its error line, then the end (not a reset), though the client
/// is still sending; a line just below the limit is served.
fn kv_answers_a_line_too_long_then_closes(backend: BackendKind) {
    let server = start(kv::config(any_port()), kv::Kv::default(), backend);
    let a = server.local_addrs()[0];
    let mut fits = connect(a);
    let key = vec![b'k'; kv::LINE_BYTES_MAX - 6];
    fits.write_all(&[&b"SET "[..], &key, b" v\n"].concat())
        .unwrap();
    assert_eq!(read_up_to(&mut fits, 7), b"STORED\n");
    let mut long = connect(a);
    let _ = long.write_all(b"SET k ");
    let _ = long.write_all(&vec![b'v'; 200_000]);
    assert_eq!(read_to_end(long), b"ERROR line too long\n");
    eventually_too_large(&server, 1);
    stop(server);
}

fn eventually_too_large(server: &Server, n: u64) {
    for _ in 0..500 {
        if server.stats().total.errors.too_large == n {
            return;
        }
        thread::sleep(Duration::from_millis(10));
    }
    panic!("too_large != {n}: {:?}", server.stats());
}

/// Each worker has its own store: a key stored from one CPU is found by a later connection
/// from that CPU (local mode gives it the same worker) and not from another CPU's.
fn kv_stores_are_per_worker(backend: BackendKind) {
    let cpus: Vec<usize> = current_affinity().unwrap().iter().collect();
    if cpus.len() < 2 {
        eprintln!("skipping: needs 2 CPUs");
        return;
    }
    let server = start(kv::config(any_port()), kv::Kv::default(), backend);
    let a = server.local_addrs()[0];
    let ask = move |cpu: usize, request: &'static [u8]| {
        thread::spawn(move || {
            pin_current_thread(&CpuSet::single(cpu)).unwrap();
            let mut s = connect(a);
            s.write_all(request).unwrap();
            s.write_all(b"QUIT\n").unwrap();
            String::from_utf8_lossy(&read_to_end(s)).into_owned()
        })
        .join()
        .unwrap()
    };
    assert_eq!(ask(cpus[0], b"SET here 0\n"), "STORED\n");
    assert_eq!(ask(cpus[0], b"GET here\n"), "VALUE 0\n");
    assert_eq!(ask(cpus[1], b"GET here\n"), "NOT_FOUND\n");
    stop(server);
}

/// The echo example's `main` path: `Server::run_until_signal` with the example's service and
/// configuration serves until a SIGTERM (sent to its thread alone: the test's other threads
/// do not block it), then stops gracefully and reports.
#[test]
fn echo_runs_until_a_signal_and_reports() {
    let (tx, rx) = mpsc::channel();
    let runner = thread::spawn(move || {
        let tid = signal::current_thread_id();
        let config = echo::config(any_port()).unwrap();
        Server::run_until_signal(config, Arc::new(echo::Echo), |server| {
            tx.send((tid, server.local_addrs()[0])).unwrap();
        })
    });
    let (tid, a) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let mut s = connect(a);
    s.write_all(b"ping\n").unwrap();
    assert_eq!(read_up_to(&mut s, 5), b"ping\n");
    signal::terminate_thread(tid).unwrap();
    let report = runner.join().unwrap().unwrap();
    assert_eq!(read_to_end(s), b"", "the stop closes the idle connection");
    assert_eq!(report.stats.total.accepted, 1, "{report:?}");
    assert_eq!(report.lost_at_close, 0, "{report:?}");
    assert!(!report.handed_over);
}

/// A start that fails (the address is taken) is an error of `run_until_signal`, carrying the
/// [`corelocal::runtime::ServerError`].
#[test]
fn run_until_signal_returns_a_failed_start() {
    let taken = std::net::TcpListener::bind(any_port()).unwrap();
    let config = echo::config(taken.local_addr().unwrap()).unwrap();
    let e = thread::spawn(move || Server::run_until_signal(config, Arc::new(echo::Echo), |_| {}))
        .join()
        .unwrap()
        .unwrap_err();
    let inner = e
        .get_ref()
        .and_then(|e| e.downcast_ref::<corelocal::runtime::ServerError>());
    assert!(inner.is_some(), "{e:?}");
}

// Every behaviour above, on each backend.
corelocal::on_every_backend!(
    echo_sends_back_what_it_receives,
    kv_answers_pipelined_requests,
    kv_answers_a_line_too_long_then_closes,
    kv_stores_are_per_worker,
);
