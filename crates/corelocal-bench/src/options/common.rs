//! Options every workload takes ([`Common`]) and their enums (engine, arrivals, progress).

use super::{Dur, SrcSpec};
use corelocal::cpu::CpuSet;
use serde::Serialize;
use std::path::PathBuf;

/// Client engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// io_uring with direct descriptors when available, else plain io_uring, else epoll.
    Auto,
    /// io_uring (direct descriptors when the kernel has them; fails if io_uring is unavailable).
    Uring,
    /// io_uring with ordinary file descriptors (socket/bind as syscalls).
    UringFd,
    /// epoll.
    Epoll,
}

/// Open-loop arrival process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ArrivalKind {
    /// Evenly spaced.
    Det,
    /// Poisson (exponential gaps).
    Exp,
}

/// Progress display.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ProgressKind {
    /// On a terminal only.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// Options every workload takes.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct Common {
    /// Server: HOST:PORT (or http://HOST:PORT/PATH for http).
    #[arg(long, short = 't')]
    pub target: String,
    /// Client CPUs: one pinned thread per CPU (cpulist, e.g. 0 or 0-1,3).
    #[arg(long, default_value = "0")]
    pub cpus: CpuSet,
    /// Run length after warm-up (default 10s; with --requests it is only a time limit, default 300s).
    #[arg(long, short = 'd')]
    pub duration: Option<Dur>,
    /// Stop after this many units (rpc/kv: transactions; crr: connections; http: sessions).
    #[arg(long, short = 'n')]
    pub requests: Option<u64>,
    /// Warm-up excluded from results (default 1s, 0 with --requests).
    #[arg(long)]
    pub warmup: Option<Dur>,
    /// Concurrent connections in total (closed loop: each runs back to back).
    #[arg(long, short = 'c')]
    pub conns: Option<usize>,
    /// Open loop: units per second in total (crr: connections/s, http: sessions/s, rpc/kv: txns/s).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Open-loop arrivals.
    #[arg(long, value_enum, default_value = "det")]
    pub arrivals: ArrivalKind,
    /// Client engine.
    #[arg(long, value_enum, default_value = "auto")]
    pub engine: EngineKind,
    /// Source addresses (each gives ~28k ports): auto, none, 127.0.0.0/8, A-B. `auto` on
    /// loopback: the kernel's choice until ephemeral ports run out, then 127.0.0.2–201 (the
    /// connect that found no port is retried from one; binding costs two operations per
    /// connection, so it is done only when needed).
    #[arg(long, default_value = "auto")]
    pub src: SrcSpec,
    /// A session with no progress for this long fails (timeout error).
    #[arg(long, default_value = "5s")]
    pub timeout: Dur,
    /// Server process to charge CPU to (utime+stime and per-thread schedstat over the window).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// corelocal server stats: a FILE (last JSON line) or http:// URL.
    #[arg(long)]
    pub server_stats: Option<String>,
    /// Search the saturating open-loop rate first, then run at it.
    #[arg(long)]
    pub rate_search: bool,
    /// Rate search: first rate (units/s).
    #[arg(long, default_value = "1000")]
    pub search_start: f64,
    /// Rate search: length of each probe.
    #[arg(long, default_value = "2s")]
    pub search_duration: Dur,
    /// Rate search: most probes.
    #[arg(long, default_value = "12")]
    pub search_probes: usize,
    /// Rate search: a probe fails when corrected p99 exceeds this.
    #[arg(long)]
    pub search_p99: Option<Dur>,
    /// Write the JSON report here (markdown and SVG plots go next to it).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the markdown summary here (default: next to --json, and always to stdout).
    #[arg(long)]
    pub md: Option<PathBuf>,
    /// SVG plot prefix (PREFIX-throughput.svg, PREFIX-latency.svg with the CDF,
    /// PREFIX-latency-percentiles.svg; default: next to --json).
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Progress bar.
    #[arg(long, value_enum, default_value = "auto")]
    pub progress: ProgressKind,
    /// Receive buffer per connection (bytes).
    #[arg(long, default_value = "16384")]
    pub recv_buf: usize,
    /// Random seed.
    #[arg(long, default_value = "1")]
    pub seed: u64,
    /// Exit non-zero when errors exceed this fraction of units.
    #[arg(long, default_value = "0.01")]
    pub max_error_rate: f64,
    /// Disable TCP_NODELAY.
    #[arg(long)]
    pub no_nodelay: bool,
}
