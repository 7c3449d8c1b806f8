//! The baseline for the comparison in results/tokio/tokio-vs-multithread.md: the same axum app as
//! the `axum` example, served the way most services are — `axum::serve` on tokio's default
//! multi-thread runtime (`#[tokio::main]`, here with an explicit worker-thread count).
//!
//! ```sh
//! cargo run --release -p corelocal-tokio --example axum-multithread -- --listen 127.0.0.1:8080 --threads 2
//! ```

#[path = "common/app.rs"]
mod app;

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut listen = "127.0.0.1:8080".to_string();
    let mut threads: Option<usize> = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next();
        match (flag.as_str(), value) {
            ("--listen", Some(v)) => listen = v,
            ("--threads", Some(v)) => match v.parse() {
                Ok(n) if n > 0 => threads = Some(n),
                _ => {
                    eprintln!("axum-multithread: --threads {v}: not a positive number");
                    return ExitCode::from(2);
                }
            },
            _ => {
                eprintln!("usage: axum-multithread [--listen ADDR] [--threads N]");
                return ExitCode::from(2);
            }
        }
    }
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Some(n) = threads {
        rt.worker_threads(n);
    }
    let rt = rt.build().expect("building the tokio runtime");
    rt.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(&listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("axum-multithread: bind {listen}: {e}");
                return ExitCode::FAILURE;
            }
        };
        eprintln!(
            "axum on tokio multi-thread: listening on {:?}",
            listener.local_addr()
        );
        let shutdown = async {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
            let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        };
        match axum::serve(listener, app::router())
            .with_graceful_shutdown(shutdown)
            .await
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("axum-multithread: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
