//! corelocal: process every TCP connection on one core.
//!
//! The library is laid out by layer; nothing reaches upward:
//!
//! - [`cpu`]: CPU sets (cpulists and hex masks), topology from sysfs, pinning.
//! - [`bpf`]: a classic and extended BPF instruction encoder, the `bpf(2)` wrappers and the
//!   steering programs (SK_REUSEPORT select by flow group / CPU; cBPF `return cpu`).
//! - [`listen`]: [`listen::ListenerGroup`], one SO_REUSEPORT listener per worker, steered by the
//!   kernel in mode `stock`, `fine` or `local` (Affinity-Accept §3.1–3.2, MegaPipe §3.4.1).
//! - [`balance`]: pure Affinity-Accept policy (busy tracking, stealing, flow-group migration)
//!   and the deterministic simulator that drives it; time is an input.
//! - [`steer`]: packet-level flow-group migration — XDP + CPUMAP (software, any interface)
//!   and the NIC's RSS indirection table (ethtool), with detection.
//! - [`backend`]: the operations and completions between the runtime's worker and the
//!   backends, and the accept policy both follow (a pure leaf both import).
//! - [`runtime`]: one pinned worker per CPU, the sans-IO [`runtime::Handler`] API, stats, and
//!   the backends behind one submit / reap / wait interface.
//! - [`procfs`]: pure parsers for `/proc` files (`stat`, `net/*`, `PID/stat`, `schedstat`),
//!   plus a bounded reader.
//! - [`sys`]: every syscall and `unsafe` block of the crate.
//!
//! # Serving a protocol
//!
//! A server is a [`runtime::Service`] (one for the server, or one per worker:
//! [`runtime::Service::for_worker`]) that makes a [`runtime::Handler`] for each connection.
//! The handler is sans-IO: it gets the bytes received and not yet consumed, appends its
//! answers to an [`runtime::Output`] and says in a [`runtime::Step`] how much it consumed and
//! what comes next; the runtime does all the I/O, pipelining, back-pressure, limits, timeouts
//! and closing. [`runtime::Server::run_until_signal`] serves it until SIGINT or SIGTERM with
//! `corelocal serve`'s defaults ([`runtime::ServerConfig::recommended`]):
//!
//! ```no_run
//! use corelocal::cpu::current_affinity;
//! use corelocal::runtime::{ConnInfo, Handler, Output, Server, ServerConfig, Service, Step};
//! use std::sync::Arc;
//! use std::time::Instant;
//!
//! /// Answers `PING` with `PONG`, one line at a time.
//! struct Ping;
//! struct PingConn;
//!
//! impl Service for Ping {
//!     type Conn = PingConn;
//!     fn name(&self) -> &'static str {
//!         "ping"
//!     }
//!     fn connect(&self, _info: &ConnInfo) -> PingConn {
//!         PingConn
//!     }
//! }
//!
//! impl Handler for PingConn {
//!     fn on_input(&mut self, input: &[u8], out: &mut Output, _now: Instant) -> Step {
//!         match input.iter().position(|&b| b == b'\n') {
//!             Some(end) => {
//!                 out.write(b"PONG\n");
//!                 Step::read(end + 1, 1) // called again while input is left
//!             }
//!             None => Step::read(0, 0), // a partial line: wait for more
//!         }
//!     }
//! }
//!
//! fn main() -> std::io::Result<()> {
//!     let addrs = vec!["127.0.0.1:7000".parse().unwrap()];
//!     let config = ServerConfig::recommended(addrs, &current_affinity()?);
//!     let report = Server::run_until_signal(config, Arc::new(Ping), |server| {
//!         println!("listening on {:?}", server.local_addrs());
//!     })?;
//!     println!("served {} requests", report.stats.total.requests);
//!     Ok(())
//! }
//! ```
//!
//! Complete servers, each with its integration test (`tests/examples.rs`):
//! `cargo run -p corelocal --example echo` and `cargo run -p corelocal --example kv` (a
//! line-protocol key-value server: per-worker stores, pipelining, a size limit answered with
//! an error line).

pub mod backend;
pub mod balance;
pub mod bpf;
pub mod cpu;
pub mod listen;
pub mod procfs;
pub mod runtime;
pub mod steer;
pub mod sys;
#[doc(hidden)]
pub mod testing;
