//! hyper and axum both served on corelocal-tokio: fresh, keep-alive, pipelined and concurrent
//! requests; the counters add up; the Prometheus text carries the runtime's metric names.

#[path = "../examples/common/app.rs"]
mod app;
mod common;

use common::{read_response, Response};
use corelocal_tokio::{CpuSet, Running, Server};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response as HyperResponse};
use std::convert::Infallible;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

fn server() -> Server {
    Server::builder()
        .cpus(common::cpus().into_iter().collect::<CpuSet>())
        .listen("127.0.0.1:0")
        .unwrap()
}

fn axum_server() -> (Running, SocketAddr) {
    let s = server();
    let addr = s.local_addrs()[0];
    let router = app::router();
    (s.start_tower(move |_| router.clone()).unwrap(), addr)
}

/// A plain hyper `service_fn`: echoes the path and the worker's CPU.
fn hyper_server() -> (Running, SocketAddr) {
    let s = server();
    let addr = s.local_addrs()[0];
    let running = s
        .start_hyper(|info| {
            let cpu = info.cpu;
            hyper::service::service_fn(move |req: Request<Incoming>| async move {
                let body = format!("hyper {} on {cpu}\n", req.uri().path());
                Ok::<_, Infallible>(HyperResponse::new(Full::new(Bytes::from(body))))
            })
        })
        .unwrap();
    (running, addr)
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// `n` requests on one connection, one after another.
fn keep_alive(addr: SocketAddr, path: &str, n: usize) -> Vec<Response> {
    let mut s = connect(addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    (0..n)
        .map(|_| {
            write!(s, "GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
            read_response(&mut r).unwrap()
        })
        .collect()
}

/// `n` requests written at once on one connection, then `n` responses read.
fn pipelined(addr: SocketAddr, path: &str, n: usize) -> Vec<Response> {
    let mut s = connect(addr);
    let batch: String = (0..n)
        .map(|_| format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n"))
        .collect();
    s.write_all(batch.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    (0..n).map(|_| read_response(&mut r).unwrap()).collect()
}

/// `threads` × `conns` fresh connections at once.
fn concurrent(addr: SocketAddr, path: &'static str, threads: usize, conns: usize) -> usize {
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                (0..conns)
                    .filter(|_| common::get_once(addr, path).unwrap().status == 200)
                    .count()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).sum()
}

fn check(running: Running, addr: SocketAddr, path: &'static str, expect: &str) {
    let one = common::get_once(addr, path).unwrap();
    assert_eq!(one.status, 200);
    assert!(one.text().contains(expect), "{:?}", one.text());

    let ka = keep_alive(addr, path, 20);
    assert!(ka
        .iter()
        .all(|r| r.status == 200 && r.text().contains(expect)));

    let pl = pipelined(addr, path, 16);
    assert_eq!(pl.len(), 16);
    assert!(pl
        .iter()
        .all(|r| r.status == 200 && r.text().contains(expect)));

    assert_eq!(concurrent(addr, path, 8, 25), 200);

    // Every connection above was accepted, counted and closed; every request counted.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while running.stats().snapshot().total.open > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let snap = running.stats().snapshot();
    assert_eq!(snap.total.accepted, 1 + 1 + 1 + 200);
    assert_eq!(snap.total.requests, 1 + 20 + 16 + 200);
    assert_eq!(snap.total.open, 0);
    assert_eq!(snap.total.errors.total(), 0, "{:?}", snap.total.errors);
    running.stop();
    let report = running.join().unwrap();
    assert_eq!(report.lost_at_close, 0);
}

#[test]
fn axum_router_serves_fresh_keep_alive_pipelined_and_concurrent_requests() {
    let (running, addr) = axum_server();
    check(running, addr, "/", "Hello from corelocal-tokio");
}

#[test]
fn hyper_service_serves_fresh_keep_alive_pipelined_and_concurrent_requests() {
    let (running, addr) = hyper_server();
    check(running, addr, "/x", "hyper /x on ");
}

#[test]
fn prometheus_text_has_the_runtime_metric_names() {
    let (running, addr) = axum_server();
    for _ in 0..3 {
        assert_eq!(common::get_once(addr, "/cpu").unwrap().status, 200);
    }
    let text = running.stats().prometheus();
    let sum = |name: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(sum("corelocal_accepted_total"), 3);
    assert_eq!(sum("corelocal_requests_total"), 3);
    assert!(text.contains("corelocal_info{app=\"tokio\""));
    assert!(text.contains("# TYPE corelocal_accepted_local_total counter"));
    assert!(text.contains("# TYPE corelocal_open_connections gauge"));
    running.stop();
    running.join().unwrap();
}

#[test]
fn bad_requests_get_an_error_and_a_closed_connection() {
    let (running, addr) = axum_server();
    let mut s = connect(addr);
    s.write_all(b"NOT HTTP AT ALL\r\n\r\n").unwrap();
    let r = read_response(&mut BufReader::new(s)).unwrap();
    assert_eq!(r.status, 400);
    // A head over the input limit (64 KiB) is refused too.
    let mut s = connect(addr);
    let big = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(100 * 1024));
    let _ = s.write_all(big.as_bytes());
    let r = read_response(&mut BufReader::new(s)).unwrap();
    assert_eq!(r.status, 431);
    std::thread::sleep(Duration::from_millis(100));
    let e = running.stats().snapshot().total.errors;
    assert_eq!((e.bad_request, e.too_large), (1, 1), "{e:?}");
    running.stop();
    running.join().unwrap();
}

#[test]
fn stop_closes_idle_keep_alive_and_finishes_requests_in_progress_with_close() {
    let s = server();
    let addr = s.local_addrs()[0];
    let running = s
        .start_hyper(|_| {
            hyper::service::service_fn(|req: Request<Incoming>| async move {
                if req.uri().path() == "/slow" {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                }
                Ok::<_, Infallible>(HyperResponse::new(Full::new(Bytes::from_static(b"ok\n"))))
            })
        })
        .unwrap();
    // An idle keep-alive connection (one request served) and one with a request in progress.
    let mut idle = connect(addr);
    let mut idle_r = BufReader::new(idle.try_clone().unwrap());
    write!(idle, "GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let first = read_response(&mut idle_r).unwrap();
    assert_eq!((first.status, first.header("connection")), (200, None));
    let mut busy = connect(addr);
    write!(busy, "GET /slow HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let stop = running.stop_handle();
    stop.stop();
    // The request in progress is answered, announcing the close, then the connection ends.
    let mut busy_r = BufReader::new(busy);
    let r = read_response(&mut busy_r).unwrap();
    assert_eq!((r.status, r.header("connection")), (200, Some("close")));
    let mut rest = Vec::new();
    assert_eq!(
        std::io::Read::read_to_end(&mut busy_r, &mut rest).unwrap(),
        0
    );
    // The idle keep-alive connection is closed.
    let mut rest = Vec::new();
    assert_eq!(
        std::io::Read::read_to_end(&mut idle_r, &mut rest).unwrap(),
        0
    );
    let report = running.join().unwrap();
    assert_eq!(report.stats.total.requests, 2);
    assert_eq!(report.stats.total.open, 0);
}

#[test]
fn stock_mode_serves_from_one_shared_listener() {
    let s = Server::builder()
        .cpus(common::cpus().into_iter().collect::<CpuSet>())
        .mode(corelocal_tokio::Mode::Stock)
        .listen("127.0.0.1:0")
        .unwrap();
    assert_eq!(s.steering(), corelocal_tokio::ActiveSteering::Shared);
    let addr = s.local_addrs()[0];
    let router = app::router();
    let running = s.start_tower(move |_| router.clone()).unwrap();
    assert_eq!(concurrent(addr, "/cpu", 4, 25), 100);
    running.stop();
    let report = running.join().unwrap();
    assert_eq!(report.stats.total.accepted, 100);
    assert_eq!(report.lost_at_close, 0);
}
