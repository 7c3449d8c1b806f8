//! corelocal for tokio, hyper and axum services: one pinned thread per CPU, each running a
//! current-thread tokio runtime (with its [`tokio::task::LocalSet`]) that owns the listener the
//! corelocal [`ListenerGroup`](corelocal::listen::ListenerGroup) gives its worker — so a
//! connection is accepted, parsed, answered and closed on the CPU that processed its SYN.
//!
//! tokio's multi-thread runtime accepts on whichever thread polls the listener and moves tasks
//! between cores; actix-server accepts on one thread and hands each connection to a worker.
//! Here nothing moves: in `local` mode the kernel steers each SYN to the listener of the worker
//! pinned to the CPU that processed it, and that worker's runtime never runs anywhere else.
//!
//! ```no_run
//! use corelocal_tokio::{Server, Mode};
//! use axum::{routing::get, Router};
//!
//! let app = Router::new().route("/", get(|| async { "hello" }));
//! let server = Server::builder()
//!     .cpus("0-1".parse().unwrap())
//!     .mode(Mode::Local)
//!     .listen("127.0.0.1:8080")
//!     .unwrap();
//! // Serves on every worker until SIGINT/SIGTERM, then stops without losing a queued connection.
//! let report = server.serve_tower(move |_worker| app.clone()).unwrap();
//! println!("{}", report.stats.to_json());
//! ```
//!
//! Or take the accept loop yourself, tokio style; the closure runs once per worker:
//!
//! ```no_run
//! use corelocal_tokio::{Server, WorkerCtx};
//! use tokio::io::AsyncWriteExt;
//!
//! let server = Server::builder().listen("127.0.0.1:7000").unwrap();
//! server
//!     .serve(|ctx: WorkerCtx| async move {
//!         // `None` once a graceful stop drained this worker's accept queue.
//!         while let Some((mut conn, _peer)) = ctx.accept().await {
//!             let cpu = ctx.cpu();
//!             tokio::task::spawn_local(async move {
//!                 let _ = conn.write_all(format!("worker on CPU {cpu}\n").as_bytes()).await;
//!             });
//!         }
//!         Ok(())
//!     })
//!     .unwrap();
//! ```
//!
//! - [`Server`] / [`Builder`]: CPUs, mode, steering, limits; binding.
//! - [`WorkerCtx`]: what each worker's closure gets (listener, CPU, index, counted accepts, the
//!   stop signal).
//! - [`Stream`]: an accepted connection (tokio `AsyncRead`/`AsyncWrite`), counted while open.
//! - [`http`]: serve a hyper or tower (axum `Router`) service on every worker.
//! - [`Stats`]: per-worker counters (accepted, accepted on the SYN's CPU, open, requests,
//!   errors, stolen) as a [`Snapshot`] and as Prometheus text with corelocal's metric names;
//!   [`Stats::balance`] for the balancer's ([`BalanceSnapshot`]).
//!
//! # A worker that stops serving
//!
//! Locality alone strands connections: a handler that blocks its thread (`std::thread::sleep`
//! or a blocking call in an async handler), or a starved thread, keeps receiving its CPU's
//! SYNs. With [`Builder::balance`] (on by default) a monitor thread per server observes every
//! worker every 1–4 ms — accept-queue depth, accepts, and liveness from the worker
//! runtime's park/unpark hooks — through corelocal's policy
//! ([`corelocal::balance::WorkerHealth`]): a worker neither parked nor turning its loop for
//! 5 ms, or whose queue holds connections it does not accept, is busy. The other workers then
//! accept from its listener (stealing, 5:1 with their own queue) and, with eBPF steering, its
//! CPU's new SYNs go to the closest non-busy workers ([`corelocal::balance::cpu_targets`]) until
//! it drains. What the blocked worker had already accepted still waits for it.
//!
//! Connections and their tasks are `!Send` on purpose: they live and die on their worker's
//! thread (spawn them with [`tokio::task::spawn_local`]), which is what keeps them local and
//! lets the counters be written by their owner only.

#![deny(missing_docs)]

mod balance;
pub mod http;
pub mod metrics;
mod server;
mod worker;

pub use balance::{BalanceSnapshot, WorkerBalance};
pub use corelocal::balance::BusyReason;
pub use corelocal::cpu::CpuSet;
pub use corelocal::listen::{ActiveSteering, Migration, Mode, Steering};
pub use corelocal::runtime::{ErrorKind, ShutdownReport, Snapshot, WorkerSnapshot};
pub use server::{Builder, Error, Running, Server, Stats, StopHandle, INPUT_LIMIT_MIN};
pub use worker::{Stream, WorkerCtx, WorkerInfo};
