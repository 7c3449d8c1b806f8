//! SIGTERM with queued connections loses none: both workers are held busy (a handler that
//! blocks its thread), clients pinned to each CPU queue connections with a request in the
//! kernel's accept queues, the server process gets SIGTERM, and every queued connection is
//! still accepted and answered (`Connection: close`) before the process exits 0 — new SYNs
//! refused meanwhile with eBPF steering. Without the drain in `WorkerCtx::accept` the queued
//! connections would be reset when the listeners close.
//!
//! The server runs in a child process (this test binary, re-run filtered to
//! `child_server`), so the signal reaches only it.

mod common;

use common::read_response;
use corelocal::testing::root_or_skip;
use corelocal_tokio::{CpuSet, Server, Steering};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use std::convert::Infallible;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

const CHILD_ENV: &str = "CORELOCAL_TOKIO_STOP_CHILD";
const QUEUED_PER_CPU: usize = 100;
const BLOCK_MS: u64 = 1500;

/// The child: serves `/block?ms` (blocks the worker's thread) and `/` until SIGTERM; prints
/// `PORT n` once the signal handlers are in place, and the shutdown report as JSON at exit.
#[test]
fn child_server() {
    let Ok(steering) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut b = Server::builder()
        .cpus(common::cpus().into_iter().collect::<CpuSet>())
        .drain_timeout(Duration::from_secs(10));
    if steering != "best" {
        b = b.steering(steering.parse().unwrap());
    }
    let server = b.listen("127.0.0.1:0").unwrap();
    let port = server.local_addrs()[0].port();
    let report = server
        .serve(move |ctx| {
            if ctx.index() == 0 {
                // serve() registered SIGTERM/SIGINT before starting the workers.
                println!("PORT {port}");
                std::io::stdout().flush().unwrap();
            }
            let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                if let Some(ms) = req.uri().query().and_then(|q| q.strip_prefix("ms=")) {
                    std::thread::sleep(Duration::from_millis(ms.parse().unwrap()));
                }
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
            });
            corelocal_tokio::http::serve_worker(ctx, service)
        })
        .unwrap();
    println!("REPORT {}", serde_json::to_string(&report).unwrap());
}

fn send(addr: SocketAddr, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    s
}

fn sigterm_loses_no_queued_connection(steering: &str) {
    let cpus = common::cpus();
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["--exact", "child_server", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, steering)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let port: u16 = loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child exited early");
        // libtest prints "test child_server ... " on the same line.
        if let Some((_, p)) = line.trim().split_once("PORT ") {
            break p.parse().unwrap();
        }
    };
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();

    // Hold every worker busy: a blocking request from a client pinned to each worker's CPU.
    let blockers: Vec<TcpStream> = cpus
        .iter()
        .map(|&cpu| common::on_cpu(cpu, move || send(addr, &format!("/block?ms={BLOCK_MS}"))))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    // Queue connections (handshake done, request sent) behind the busy workers.
    let queued: Vec<TcpStream> = cpus
        .iter()
        .flat_map(|&cpu| {
            common::on_cpu(cpu, move || {
                (0..QUEUED_PER_CPU)
                    .map(|_| send(addr, "/"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    // SAFETY: kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);

    for s in blockers {
        let r = read_response(&mut BufReader::new(s)).unwrap();
        assert_eq!(r.status, 200);
    }
    let mut answered = 0;
    for s in queued {
        let r = read_response(&mut BufReader::new(s)).expect("a queued connection was lost");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("connection"), Some("close"));
        answered += 1;
    }
    assert_eq!(answered, cpus.len() * QUEUED_PER_CPU);

    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(
        child.wait().unwrap().success(),
        "the server exited with an error"
    );
    let report = rest
        .lines()
        .find_map(|l| l.split_once("REPORT ").map(|(_, r)| r))
        .expect("shutdown report");
    let report: serde_json::Value = serde_json::from_str(report).unwrap();
    eprintln!("{steering}: {answered} queued connections answered; report {report}");
    assert_eq!(report["lost_at_close"], 0);
    let total = &report["stats"]["total"];
    assert!(total["drain_accepted"].as_u64().unwrap() >= answered as u64);
    assert_eq!(total["open"], 0);
    if steering == "best" || steering == "ebpf" {
        assert_eq!(report["refused_new_syns"], true);
    }
}

#[test]
fn sigterm_with_queued_connections_loses_none_ebpf() {
    if root_or_skip("sigterm_with_queued_connections_loses_none_ebpf") {
        sigterm_loses_no_queued_connection("ebpf");
    }
}

#[test]
fn sigterm_with_queued_connections_loses_none_cbpf() {
    // No SYN refusal without eBPF: the queues are drained until they stay empty.
    let _ = Steering::Cbpf;
    sigterm_loses_no_queued_connection("cbpf");
}
