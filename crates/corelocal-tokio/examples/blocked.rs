//! Issue 33's scenario as a measurement: an axum handler blocks its thread (`std::thread::sleep`
//! in an async handler), then fresh clients arrive from that thread's CPU. Prints one JSON line:
//! how many clients were answered within the timeout, and their latencies.
//!
//! ```sh
//! cargo run --release -p corelocal-tokio --example blocked -- --server corelocal --balance on
//! cargo run --release -p corelocal-tokio --example blocked -- --server corelocal --balance off
//! cargo run --release -p corelocal-tokio --example blocked -- --server multithread
//! ```
//!
//! Flags: `--server corelocal|multithread` (corelocal-tokio on 2 workers, or `axum::serve` on a
//! 2-worker-thread tokio runtime), `--balance on|off`, `--steering ebpf|incoming-cpu|cbpf`
//! (corelocal; default the best available), `--cpus A,B` (default the first two allowed),
//! `--clients N` (50), `--block-ms MS` (6000), `--timeout-ms MS` (2000). The blocking request
//! and every client run on threads pinned to CPU A, so on loopback their SYNs are processed
//! there: with corelocal-tokio the blocking request lands on worker A.

#[path = "common/app.rs"]
mod app;

use axum::routing::get;
use corelocal::cpu::{current_affinity, pin_current_thread, CpuSet};
use corelocal_tokio::{BusyReason, Running, Server, Steering};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

struct Args {
    multithread: bool,
    balance: bool,
    steering: Option<Steering>,
    cpus: Option<[usize; 2]>,
    clients: usize,
    block: Duration,
    timeout: Duration,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        multithread: false,
        balance: true,
        steering: None,
        cpus: None,
        clients: 50,
        block: Duration::from_secs(6),
        timeout: Duration::from_secs(2),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag} {v}: not a number"))
        };
        match flag.as_str() {
            "--server" => a.multithread = v == "multithread",
            "--balance" => a.balance = v == "on",
            "--steering" => a.steering = Some(v.parse()?),
            "--cpus" => {
                let c: Vec<usize> = v.split(',').filter_map(|x| x.parse().ok()).collect();
                a.cpus = Some(
                    c.try_into()
                        .map_err(|_| format!("--cpus {v}: two CPUs, A,B"))?,
                );
            }
            "--clients" => a.clients = num(&v)?.clamp(1, 1000) as usize,
            "--block-ms" => a.block = Duration::from_millis(num(&v)?),
            "--timeout-ms" => a.timeout = Duration::from_millis(num(&v)?),
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    Ok(a)
}

/// The example's app plus `GET /block`: says it started, then blocks its thread.
fn router(blocking: Arc<AtomicBool>, block: Duration) -> axum::Router {
    app::router().route(
        "/block",
        get(move || {
            let blocking = blocking.clone();
            async move {
                blocking.store(true, Ordering::SeqCst);
                thread::sleep(block);
                "unblocked\n"
            }
        }),
    )
}

/// One fresh connection, `GET path`, answered (status 200) within `timeout`: the time it took.
fn get_within(addr: SocketAddr, path: &str, timeout: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout.checked_sub(t0.elapsed())?))
        .ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).ok()?;
    // The answer is whole when the server closes (Connection: close).
    r.read_to_end(&mut Vec::new()).ok()?;
    let took = t0.elapsed();
    (status.starts_with("HTTP/1.1 200") && took <= timeout).then_some(took)
}

/// The server under test.
enum Served {
    Corelocal(Running),
    Multithread(thread::JoinHandle<()>, tokio::sync::oneshot::Sender<()>),
}

/// Starts the server: it, its address and its steering.
fn start(
    a: &Args,
    cpus: [usize; 2],
    app: axum::Router,
) -> Result<(Served, SocketAddr, String), String> {
    if a.multithread {
        let std = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = std.local_addr().map_err(|e| e.to_string())?;
        std.set_nonblocking(true).map_err(|e| e.to_string())?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let t = thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("tokio runtime");
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(std).expect("listener");
                let stop = async move {
                    let _ = rx.await;
                };
                let _ = axum::serve(l, app).with_graceful_shutdown(stop).await;
            });
        });
        return Ok((Served::Multithread(t, tx), addr, "kernel".into()));
    }
    let mut b = Server::builder()
        .cpus(cpus.iter().copied().collect::<CpuSet>())
        .balance(a.balance);
    if let Some(s) = a.steering {
        b = b.steering(s);
    }
    let server = b.listen("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = server.local_addrs()[0];
    let steering = server.steering().to_string();
    let running = server
        .start_tower(move |_| app.clone())
        .map_err(|e| e.to_string())?;
    Ok((Served::Corelocal(running), addr, steering))
}

/// The `q` quantile of `v` (sorted), failures (`None`) last.
fn quantile(v: &[Option<Duration>], q: f64) -> Option<f64> {
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i].map(|d| d.as_secs_f64() * 1e3)
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("blocked: {e}");
            return ExitCode::from(2);
        }
    };
    let cpus = a.cpus.unwrap_or_else(|| {
        let all: Vec<usize> = current_affinity().expect("affinity").iter().collect();
        [all[0], all[1 % all.len()]]
    });
    let blocking = Arc::new(AtomicBool::new(false));
    let (served, addr, steering) = match start(&a, cpus, router(blocking.clone(), a.block)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("blocked: {e}");
            return ExitCode::FAILURE;
        }
    };
    let on_cpu = CpuSet::single(cpus[0]);
    let (block, blocker_cpus) = (a.block, on_cpu.clone());
    let blocker = thread::spawn(move || {
        pin_current_thread(&blocker_cpus).expect("pin");
        get_within(addr, "/block", block + Duration::from_secs(10))
    });
    let t0 = Instant::now();
    while !blocking.load(Ordering::SeqCst) {
        if t0.elapsed() > Duration::from_secs(5) {
            eprintln!("blocked: /block never started");
            return ExitCode::FAILURE;
        }
        thread::sleep(Duration::from_millis(1));
    }
    let clients: Vec<_> = (0..a.clients)
        .map(|_| {
            let (c, timeout) = (on_cpu.clone(), a.timeout);
            thread::spawn(move || {
                pin_current_thread(&c).expect("pin");
                get_within(addr, "/cpu", timeout)
            })
        })
        .collect();
    let mut took: Vec<Option<Duration>> = clients.into_iter().map(|t| t.join().unwrap()).collect();
    took.sort_by_key(|t| t.unwrap_or(Duration::MAX));
    let answered = took.iter().flatten().count();
    let _ = blocker.join();
    let (stolen, redirects, not_running) = match served {
        Served::Corelocal(r) => {
            let (snap, bal) = (r.stats().snapshot(), r.stats().balance());
            r.stop();
            let _ = r.join();
            (
                Some(snap.total.stolen),
                Some(bal.redirects()),
                Some(bal.busy(BusyReason::NotRunning)),
            )
        }
        Served::Multithread(t, stop) => {
            let _ = stop.send(());
            let _ = t.join();
            (None, None, None)
        }
    };
    let ms = |v: Option<f64>| v.map_or("null".to_string(), |x| format!("{x:.2}"));
    println!(
        "{{\"server\":\"{}\",\"balance\":{},\"steering\":\"{steering}\",\"cpu\":{},\"clients\":{},\
         \"block_ms\":{},\"timeout_ms\":{},\"answered\":{answered},\"failed\":{},\"p50_ms\":{},\
         \"p99_ms\":{},\"max_answered_ms\":{},\"stolen\":{},\"redirects\":{},\"busy_not_running\":{}}}",
        if a.multithread { "multithread" } else { "corelocal" },
        !a.multithread && a.balance,
        cpus[0],
        a.clients,
        a.block.as_millis(),
        a.timeout.as_millis(),
        a.clients - answered,
        ms(quantile(&took, 0.5)),
        ms(quantile(&took, 0.99)),
        ms(took.iter().flatten().max().map(|d| d.as_secs_f64() * 1e3)),
        stolen.map_or("null".into(), |v| v.to_string()),
        redirects.map_or("null".into(), |v| v.to_string()),
        not_running.map_or("null".into(), |v| v.to_string()),
    );
    ExitCode::SUCCESS
}
