//! The report: JSON (echoing the full configuration), a markdown summary, SVG plots
//! (throughput over time, latency CDF) and the progress line.
//!
//! Layout: this module holds the report's types and [`build`]; `markdown` writes the summary
//! table, `svg` the plots, `files` puts them on disk, `progress` draws the live line. Their
//! public items are re-exported here, so `report::markdown` etc. keep their paths.

use crate::engine::Unit;
use crate::procstat::CpuCost;
use crate::runspec::{RunSpec, Snapshots, ThreadResult};
use crate::serverstats::Locality;
use crate::stats::{errno_name, LatSummary, Stats};
use serde::Serialize;
use std::collections::BTreeMap;

mod files;
mod markdown;
mod progress;
mod svg;

pub use files::write_outputs;
pub use markdown::{human, markdown};
pub use progress::{clear_progress, draw_progress, progress_line};
pub use svg::{
    percentile_plot, svg_latency, svg_percentiles, svg_plot, svg_throughput, XAxis, YAxis,
};

/// Throughput over the measurement window.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Throughput {
    /// What a unit is: "txn" or "session".
    pub unit: &'static str,
    /// Units completed.
    pub units: u64,
    /// Units per second.
    pub units_per_s: f64,
    /// Transactions.
    pub txns: u64,
    /// Transactions per second.
    pub txns_per_s: f64,
    /// Sessions.
    pub sessions: u64,
    /// Sessions per second.
    pub sessions_per_s: f64,
    /// Connections established.
    pub conns: u64,
    /// Connections per second.
    pub conns_per_s: f64,
    /// Connections per second per client core.
    pub conns_per_s_per_client_core: f64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Bytes sent.
    pub bytes_out: u64,
}

/// Latency summaries.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Latencies {
    /// Request sent → response complete (crr: includes connect).
    pub txn: LatSummary,
    /// Intended start → response complete (open loop, coordinated omission corrected).
    pub txn_corrected: Option<LatSummary>,
    /// Session start → end.
    pub session: Option<LatSummary>,
    /// Intended session start → end (open loop).
    pub session_corrected: Option<LatSummary>,
    /// connect() → established.
    pub connect: LatSummary,
}

impl Latencies {
    /// The corrected latency of the unit of work, if open loop.
    pub fn corrected(&self) -> Option<LatSummary> {
        self.session_corrected.or(self.txn_corrected)
    }
}

/// One error row.
#[derive(Debug, Clone, Serialize)]
pub struct ErrRow {
    /// Kind.
    pub kind: crate::stats::ErrKind,
    /// errno (HTTP status for http_status).
    pub errno: i32,
    /// errno name.
    pub name: String,
    /// Count.
    pub count: u64,
}

/// Errors.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Errors {
    /// Over the whole run.
    pub total: u64,
    /// In the window.
    pub in_window: u64,
    /// In-window errors per unit (errors / (units + errors)).
    pub rate: f64,
    /// By kind and errno.
    pub by_kind: Vec<ErrRow>,
}

/// A timeline row.
#[derive(Debug, Clone, Serialize)]
pub struct TimelineRow {
    /// Second since start.
    pub t_s: usize,
    /// Transactions.
    pub txns: u64,
    /// Sessions.
    pub sessions: u64,
    /// Errors.
    pub errors: u64,
    /// Inside the warm-up.
    pub warmup: bool,
}

/// A client thread.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadInfo {
    /// CPU.
    pub cpu: usize,
    /// Engine.
    pub engine: &'static str,
    /// Connection slots.
    pub conns: usize,
    /// Units it completed in the window.
    pub units: u64,
}

/// memcached counts.
#[derive(Debug, Clone, Serialize)]
pub struct KvCounts {
    /// get hits.
    pub hits: u64,
    /// get misses.
    pub misses: u64,
    /// stores.
    pub stores: u64,
}

/// The client's own CPU.
#[derive(Debug, Clone, Serialize)]
pub struct ClientCpu {
    /// Client CPU µs per unit (the client threads' CPU time over the window).
    pub us_per_unit: Option<f64>,
    /// Client CPU use in cores.
    pub cores_busy: Option<f64>,
}

/// Host facts at report time.
#[derive(Debug, Clone, Serialize)]
pub struct HostInfo {
    /// /proc/loadavg.
    pub loadavg: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Kernel release.
    pub kernel: String,
}

/// The full report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Tool and version.
    pub tool: String,
    /// Workload.
    pub workload: String,
    /// The command line.
    pub command_line: String,
    /// Arguments as parsed (the full configuration).
    pub config: serde_json::Value,
    /// Server address.
    pub target: String,
    /// Source addresses used.
    pub src_addrs: usize,
    /// Total connection slots.
    pub conns: usize,
    /// Open-loop rate (units/s), if any.
    pub rate: Option<f64>,
    /// Client threads.
    pub client_threads: Vec<ThreadInfo>,
    /// Unix time of the start.
    pub started_unix: u64,
    /// Warm-up excluded (s).
    pub warmup_s: f64,
    /// Measurement window (s).
    pub window_s: f64,
    /// Throughput.
    pub throughput: Throughput,
    /// Latency.
    pub latency: Latencies,
    /// Errors.
    pub errors: Errors,
    /// HTTP status classes.
    pub http_status: Option<BTreeMap<String, u64>>,
    /// memcached counts.
    pub kv: Option<KvCounts>,
    /// Server CPU per operation.
    pub server_cpu: Option<CpuCost>,
    /// Client CPU.
    pub client_cpu: ClientCpu,
    /// Server locality counters.
    pub server_stats: Option<Locality>,
    /// Server stats error, if fetching failed.
    pub server_stats_error: Option<String>,
    /// Rate search.
    pub rate_search: Option<crate::ratesearch::RateSearch>,
    /// Per-second timeline.
    pub timeline: Vec<TimelineRow>,
    /// Host.
    pub host: HostInfo,
    /// Notes.
    pub notes: Vec<String>,
    /// Latency by percentile (the HdrHistogram / wrk2 spectrum), the same series as `cdfs`:
    /// kept in the JSON so `compare` can plot servers against each other.
    pub latency_percentiles: Vec<Spectrum>,
    /// Latency CDFs for plotting (µs, fraction).
    #[serde(skip)]
    pub cdfs: Vec<(String, Vec<(f64, f64)>)>,
}

/// One latency series by percentile.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Spectrum {
    /// What is measured ("request→response", "corrected (intended→response)", …).
    pub name: String,
    /// (quantile 0..1, latency µs) at [`crate::stats::spectrum_quantiles`].
    pub points: Vec<(f64, f64)>,
}

/// What [`build`] needs.
pub struct Inputs<'a> {
    /// The run.
    pub spec: &'a RunSpec,
    /// Per thread.
    pub results: Vec<ThreadResult>,
    /// Window length.
    pub window_s: f64,
    /// Warm-up length.
    pub warmup_s: f64,
    /// Open-loop rate.
    pub rate: Option<f64>,
    /// Snapshots at the window start.
    pub snap0: Snapshots,
    /// … and end.
    pub snap1: Snapshots,
    /// Start time.
    pub started_unix: u64,
}

fn opt(l: &crate::stats::Lat) -> Option<LatSummary> {
    let s = l.summary();
    (s.count > 0).then_some(s)
}

/// Builds the report from the threads' stats and the snapshots.
pub fn build(inp: Inputs<'_>) -> Report {
    let spec = inp.spec;
    let mut st = Stats::default();
    let mut notes = Vec::new();
    let mut threads = Vec::new();
    for r in &inp.results {
        st.merge(&r.stats);
        threads.push(ThreadInfo {
            cpu: r.cpu,
            engine: r.engine,
            conns: r.conns,
            units: if spec.unit == Unit::Txn {
                r.stats.txns
            } else {
                r.stats.sessions
            },
        });
        if let Some(n) = &r.note {
            if !notes.contains(n) {
                notes.push(n.clone());
            }
        }
    }
    let w = inp.window_s;
    let units = if spec.unit == Unit::Txn {
        st.txns
    } else {
        st.sessions
    };
    let ncores = threads.len().max(1) as f64;
    let throughput = Throughput {
        unit: if spec.unit == Unit::Txn {
            "txn"
        } else {
            "session"
        },
        units,
        units_per_s: units as f64 / w,
        txns: st.txns,
        txns_per_s: st.txns as f64 / w,
        sessions: st.sessions,
        sessions_per_s: st.sessions as f64 / w,
        conns: st.conns,
        conns_per_s: st.conns as f64 / w,
        conns_per_s_per_client_core: st.conns as f64 / w / ncores,
        bytes_in: st.bytes_in,
        bytes_out: st.bytes_out,
    };
    let latency = Latencies {
        txn: st.lat_txn.summary(),
        txn_corrected: opt(&st.lat_txn_co),
        session: if spec.workload == "http" {
            opt(&st.lat_session)
        } else {
            None
        },
        session_corrected: if spec.workload == "http" {
            opt(&st.lat_session_co)
        } else {
            None
        },
        connect: st.lat_connect.summary(),
    };
    let errors = Errors {
        total: st.error_total(),
        in_window: st.errors_window,
        rate: if units + st.errors_window > 0 {
            st.errors_window as f64 / (units + st.errors_window) as f64
        } else {
            0.0
        },
        by_kind: st
            .errors
            .iter()
            .map(|((k, e), n)| ErrRow {
                kind: *k,
                errno: *e,
                name: if *k == crate::stats::ErrKind::HttpStatus {
                    format!("HTTP {e}")
                } else {
                    errno_name(*e)
                },
                count: *n,
            })
            .collect(),
    };
    let http_status = (spec.workload == "http"
        || matches!(spec.kind, crate::runspec::ScriptKind::CrrHttp { .. }))
    .then(|| {
        let names = ["other", "1xx", "2xx", "3xx", "4xx", "5xx"];
        names
            .iter()
            .zip(st.status)
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| (k.to_string(), n))
            .collect()
    });
    let kv = (spec.workload == "kv").then_some(KvCounts {
        hits: st.hits,
        misses: st.misses,
        stores: st.stores,
    });
    let server_cpu = match (&inp.snap0.server, &inp.snap1.server) {
        (Some(a), Some(b)) => {
            if b.ticks.is_none() {
                notes.push(format!(
                    "server pid {:?} not readable at the window's end",
                    spec.common.server_pid
                ));
            }
            Some(crate::procstat::cost(
                spec.common.server_pid,
                a,
                b,
                units,
                w,
                corelocal::sys::process::clock_ticks_per_second(),
            ))
        }
        _ => None,
    };
    let client_cpu = ClientCpu {
        us_per_unit: (units > 0 && st.client_cpu_ns > 0)
            .then(|| st.client_cpu_ns as f64 / 1000.0 / units as f64),
        cores_busy: (st.client_cpu_ns > 0).then(|| st.client_cpu_ns as f64 / 1e9 / w),
    };
    let (server_stats, server_stats_error) = match (&inp.snap0.counters, &inp.snap1.counters) {
        (Some(Ok(a)), Some(Ok(b))) => (
            Some(crate::serverstats::delta(
                spec.common.server_stats.as_deref().unwrap_or(""),
                a,
                b,
            )),
            None,
        ),
        (Some(Err(e)), _) | (_, Some(Err(e))) => (None, Some(e.clone())),
        _ => (None, None),
    };
    let warm_secs = inp.warmup_s;
    let timeline = st
        .timeline
        .iter()
        .enumerate()
        .map(|(i, t)| TimelineRow {
            t_s: i,
            txns: t.txns,
            sessions: t.sessions,
            errors: t.errors,
            warmup: ((i + 1) as f64) <= warm_secs,
        })
        .collect();
    let mut plotted = vec![("request→response", &st.lat_txn)];
    if !st.lat_txn_co.0.is_empty() {
        plotted.push(("corrected (intended→response)", &st.lat_txn_co));
    }
    if spec.workload == "http" && !st.lat_session.0.is_empty() {
        plotted.push(("session", &st.lat_session));
        if !st.lat_session_co.0.is_empty() {
            plotted.push(("session corrected", &st.lat_session_co));
        }
    }
    let cdfs = plotted
        .iter()
        .map(|(n, l)| (n.to_string(), l.cdf()))
        .collect();
    let latency_percentiles = plotted
        .iter()
        .map(|(n, l)| Spectrum {
            name: n.to_string(),
            points: l.spectrum(),
        })
        .collect();
    if let Some(ns) = st.src_spread_at_ns {
        let at = ns as f64 / 1e9 - inp.warmup_s;
        notes.push(format!(
            "ephemeral ports ran out at {at:.1}s (from the window start): connections bound \
             source addresses {}–{} from then on",
            spec.src[0],
            spec.src[spec.src.len() - 1]
        ));
    }
    if spec.src.is_empty() && spec.target.ip().is_loopback() {
        notes.push("no source address spreading (--src none): ports may run out".into());
    }
    Report {
        tool: format!("corelocal bench {}", env!("CARGO_PKG_VERSION")),
        workload: spec.workload.to_string(),
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
        config: spec.config.clone(),
        target: spec.target.to_string(),
        src_addrs: spec.src.len(),
        conns: spec.conns,
        rate: inp.rate,
        client_threads: threads,
        started_unix: inp.started_unix,
        warmup_s: inp.warmup_s,
        window_s: w,
        throughput,
        latency,
        errors,
        http_status,
        kv,
        server_cpu,
        client_cpu,
        server_stats,
        server_stats_error,
        rate_search: None,
        timeline,
        host: host_info(),
        notes,
        latency_percentiles,
        cdfs,
    }
}

/// Load average, CPUs and kernel of this host.
pub fn host_info() -> HostInfo {
    HostInfo {
        loadavg: std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
    }
}
