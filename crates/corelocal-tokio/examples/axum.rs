//! An axum app on every core with corelocal-tokio:
//!
//! ```sh
//! cargo run --release -p corelocal-tokio --example axum -- --listen 127.0.0.1:8080 --cpus 0-1
//! curl http://127.0.0.1:8080/cpu     # the CPU of the worker that served the request
//! curl http://127.0.0.1:8080/metrics # per-worker counters, Prometheus text
//! ```
//!
//! Flags: `--listen ADDR` (default 127.0.0.1:8080), `--cpus LIST` (default: all allowed),
//! `--mode local|fine|stock` (default local), `--steering ebpf|incoming-cpu|cbpf` (default:
//! best available), `--drain-timeout SECS` (default 5), `--defer-accept SECS` (default 0: off;
//! `TCP_DEFER_ACCEPT`, see `Builder::defer_accept`), `--balance on|off` (default on: stealing
//! from and redirecting around a worker that stops serving, see `Builder::balance`).
//! SIGINT/SIGTERM stop it without losing a queued connection; the final counters are printed as
//! one JSON line on stderr.

#[path = "common/app.rs"]
mod app;

use axum::routing::get;
use corelocal_tokio::{CpuSet, Mode, Server, Steering};
use std::process::ExitCode;
use std::time::Duration;

struct Args {
    listen: String,
    cpus: Option<CpuSet>,
    mode: Mode,
    steering: Option<Steering>,
    drain_timeout: Duration,
    defer_accept_s: u32,
    balance: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        listen: "127.0.0.1:8080".into(),
        cpus: None,
        mode: Mode::Local,
        steering: None,
        drain_timeout: Duration::from_secs(5),
        defer_accept_s: 0,
        balance: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => args.listen = value()?,
            "--cpus" => {
                let v = value()?;
                args.cpus = Some(CpuSet::parse_list(&v).map_err(|e| format!("--cpus {v}: {e}"))?)
            }
            "--mode" => args.mode = value()?.parse()?,
            "--steering" => args.steering = Some(value()?.parse()?),
            "--drain-timeout" => {
                let v = value()?;
                let secs: f64 = v
                    .parse()
                    .map_err(|_| format!("--drain-timeout {v}: not a number of seconds"))?;
                args.drain_timeout = Duration::try_from_secs_f64(secs)
                    .map_err(|e| format!("--drain-timeout {v}: {e}"))?;
            }
            "--defer-accept" => {
                let v = value()?;
                args.defer_accept_s = v
                    .parse()
                    .map_err(|_| format!("--defer-accept {v}: not a whole number of seconds"))?;
            }
            "--balance" => {
                args.balance = match value()?.as_str() {
                    "on" => true,
                    "off" => false,
                    v => return Err(format!("--balance {v}: on or off")),
                }
            }
            "-h" | "--help" => {
                println!(
                    "usage: axum [--listen ADDR] [--cpus LIST] [--mode local|fine|stock] \
                     [--steering ebpf|incoming-cpu|cbpf] [--drain-timeout SECS] \
                     [--defer-accept SECS] [--balance on|off]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown flag {other:?} (try --help)")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("axum: {e}");
            return ExitCode::from(2);
        }
    };
    let mut builder = Server::builder()
        .mode(args.mode)
        .drain_timeout(args.drain_timeout)
        .defer_accept(args.defer_accept_s)
        .balance(args.balance);
    if let Some(cpus) = args.cpus {
        builder = builder.cpus(cpus);
    }
    if let Some(s) = args.steering {
        builder = builder.steering(s);
    }
    let server = match builder.listen(args.listen.as_str()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("axum: {e}");
            return ExitCode::FAILURE;
        }
    };
    let stats = server.stats();
    let json = stats.clone();
    let router = app::router()
        .route("/metrics", get(move || async move { stats.prometheus() }))
        .route(
            "/metrics.json",
            get(move || async move {
                json.sample_net();
                json.snapshot().to_json()
            }),
        );
    eprintln!(
        "axum on corelocal-tokio: listening on {:?}, {} workers on CPUs {:?}, mode {}, steering {}",
        server.local_addrs(),
        server.workers(),
        server.worker_cpus(),
        server.mode(),
        server.steering()
    );
    match server.serve_tower(move |_worker| router.clone()) {
        Ok(report) => {
            eprintln!(
                "{}",
                serde_json::to_string(&report).expect("report serialises")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("axum: {e}");
            ExitCode::FAILURE
        }
    }
}
