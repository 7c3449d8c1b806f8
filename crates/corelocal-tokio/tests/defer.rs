//! `Builder::defer_accept`: a connection is accepted with its first bytes, a silent one only
//! after the period, and a stop still answers a client that connected before it and speaks
//! during it (the accept phase waits the period out instead of ending at an empty queue,
//! where such a connection would be reset when the listeners close).

mod common;

use common::read_response;
use corelocal_tokio::{CpuSet, Running, Server};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use std::convert::Infallible;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

fn start(defer_accept_s: u32) -> (Running, SocketAddr) {
    let server = Server::builder()
        .cpus(common::cpus().into_iter().collect::<CpuSet>())
        .defer_accept(defer_accept_s)
        .listen("127.0.0.1:0")
        .unwrap();
    let addr = server.local_addrs()[0];
    let running = server
        .start_hyper(|_| {
            hyper::service::service_fn(|_: Request<Incoming>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
            })
        })
        .unwrap();
    (running, addr)
}

fn accepted(running: &Running) -> u64 {
    running.stats().snapshot().total.accepted
}

/// Waits until `n` connections were accepted, at most `within`.
fn wait_accepted(running: &Running, n: u64, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while accepted(running) < n {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Sends one request on `s` and returns the response's status and body.
fn ask(s: &mut TcpStream) -> (u16, String) {
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let r = read_response(&mut BufReader::new(s.try_clone().unwrap())).unwrap();
    (r.status, r.text())
}

#[test]
fn silent_connections_are_accepted_after_the_period_and_speakers_at_once() {
    let (running, addr) = start(1);
    let mut silent = connect(addr);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        accepted(&running),
        0,
        "a silent connection was accepted at once"
    );
    assert_eq!(ask(&mut silent), (200, "ok\n".into()));
    assert_eq!(accepted(&running), 1);
    // A connection that never speaks is still accepted once the period is over.
    let _quiet = connect(addr);
    let never = "the silent connection was never accepted";
    wait_accepted(&running, 2, Duration::from_secs(10), never);
    running.stop();
    running.join().unwrap();
}

#[test]
fn without_it_a_silent_connection_is_accepted_at_once() {
    let (running, addr) = start(0);
    let _silent = connect(addr);
    let late = "not accepted at once without defer-accept";
    // Well under the 1 s a deferred silent connection waits, so this fails if defer stuck.
    wait_accepted(&running, 1, Duration::from_millis(500), late);
    running.stop();
    running.join().unwrap();
}

#[test]
fn a_stop_answers_a_client_that_connected_before_it_and_speaks_during_it() {
    let (running, addr) = start(1);
    let mut late = connect(addr);
    std::thread::sleep(Duration::from_millis(100));
    running.stop();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(ask(&mut late), (200, "ok\n".into()));
    let report = running.join().unwrap();
    assert_eq!(report.stats.total.accepted, 1);
    assert_eq!(report.lost_at_close, 0);
}
