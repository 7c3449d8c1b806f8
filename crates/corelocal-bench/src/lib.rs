//! `corelocal bench`: the load generator.
//!
//! Workloads (`rpc`, `crr`, `http`, `kv`) run on pinned client threads, each driving many
//! connections through io_uring (linked connect → send → recv, one submit per loop turn) or
//! epoll. Reports carry HDR latency percentiles, a per-second timeline, errors by kind and
//! errno, and — what compares servers on a shared loopback host — the server's CPU time per
//! operation (`--server-pid`) and its locality counters (`--server-stats`).
//!
//! Layout: [`proto`] and [`workload`] are sans-IO protocol clients and session scripts;
//! [`engine`] is the per-thread state machine over `corelocal::sys::client` (the client I/O,
//! with every syscall); [`stats`], [`procstat`], [`serverstats`], [`ratesearch`] and
//! [`report`] are the measurement and output; [`runner`] ties them; [`compare`] runs A/B rounds against peers; [`cli`] parses the
//! command line and dispatches. Imports run one way: [`options`] (flag values, the common
//! options, target resolution) and [`runspec`] (a resolved run and its raw results) are leaves
//! that `cli`, `runner`, `report` and `compare` share, and `compare` runs a round's bench
//! command through the executor `cli` hands it rather than calling back into `cli`.

use std::process::ExitCode;

pub mod cli;
pub mod compare;
pub mod engine;
pub mod options;
pub mod procstat;
pub mod proto;
pub mod ratesearch;
pub mod report;
pub mod runner;
pub mod runspec;
pub mod serverstats;
pub mod stats;
pub mod workload;

pub use cli::Command;

/// Runs `corelocal bench`.
pub fn run(cmd: Command) -> ExitCode {
    match cli::execute(cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("corelocal bench: {e}");
            ExitCode::from(2)
        }
    }
}
