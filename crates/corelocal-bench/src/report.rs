//! The report: JSON (echoing the full configuration), a markdown summary, SVG plots
//! (throughput over time, latency CDF) and the progress line.

use crate::cli::Common;
use crate::engine::Unit;
use crate::procstat::CpuCost;
use crate::runner::{RunSpec, Snapshots, ThreadResult};
use crate::serverstats::Locality;
use crate::stats::{errno_name, LatSummary, Stats};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

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
    /// Latency CDFs for plotting (µs, fraction).
    #[serde(skip)]
    pub cdfs: Vec<(String, Vec<(f64, f64)>)>,
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
        || matches!(spec.kind, crate::runner::ScriptKind::CrrHttp { .. }))
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
                crate::sys::clk_tck(),
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
    let mut cdfs = vec![("request→response".to_string(), st.lat_txn.cdf())];
    if !st.lat_txn_co.0.is_empty() {
        cdfs.push(("corrected (intended→response)".into(), st.lat_txn_co.cdf()));
    }
    if spec.workload == "http" && !st.lat_session.0.is_empty() {
        cdfs.push(("session".into(), st.lat_session.cdf()));
        if !st.lat_session_co.0.is_empty() {
            cdfs.push(("session corrected".into(), st.lat_session_co.cdf()));
        }
    }
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

fn f(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".to_string(), |x| format!("{x:.digits$}"))
}

/// Human-friendly rate.
pub fn human(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// The markdown summary.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let t = &r.throughput;
    let _ = writeln!(s, "## corelocal bench {} → {}\n", r.workload, r.target);
    let _ = writeln!(s, "`{}`\n", r.command_line);
    let engines: Vec<String> = r
        .client_threads
        .iter()
        .map(|t| format!("CPU{} {} ({} conns)", t.cpu, t.engine, t.conns))
        .collect();
    let _ = writeln!(
        s,
        "client: {} · {} · window {:.1}s after {:.1}s warm-up · load {}\n",
        engines.join(", "),
        match r.rate {
            Some(x) => format!("open loop {}/s", human(x)),
            None => "closed loop".into(),
        },
        r.window_s,
        r.warmup_s,
        r.host.loadavg
    );
    let _ = writeln!(s, "| metric | value |\n|---|---|");
    let _ = writeln!(
        s,
        "| {}s/s | **{}** ({} in window) |",
        t.unit,
        human(t.units_per_s),
        t.units
    );
    if t.unit != "txn" || t.txns != t.units {
        let _ = writeln!(s, "| txns/s | {} |", human(t.txns_per_s));
    }
    let _ = writeln!(
        s,
        "| connections/s | {} ({} per client core) |",
        human(t.conns_per_s),
        human(t.conns_per_s_per_client_core)
    );
    if let Some(c) = &r.server_cpu {
        let _ = writeln!(
            s,
            "| server CPU µs/{} | **{}** (schedstat) · {} (utime+stime) · {} cores busy |",
            t.unit,
            f(c.schedstat_us_per_op, 2),
            f(c.utime_stime_us_per_op, 2),
            f(c.cores_busy, 2)
        );
        for p in &c.per_cpu {
            let _ = writeln!(
                s,
                "| CPU{} (/proc/stat) | user {:.0}% · sys {:.0}% · softirq {:.0}% · idle {:.0}% |",
                p.cpu, p.user_pct, p.sys_pct, p.softirq_pct, p.idle_pct
            );
        }
    }
    let _ = writeln!(
        s,
        "| client CPU µs/{} | {} |",
        t.unit,
        f(r.client_cpu.us_per_unit, 2)
    );
    if let Some(l) = &r.server_stats {
        let _ = writeln!(
            s,
            "| server locality | {} local · {} stolen of {} accepted |",
            f(l.locality.map(|x| x * 100.0), 1) + "%",
            f(l.stolen_share.map(|x| x * 100.0), 1) + "%",
            l.total.accepted
        );
    }
    if let Some(e) = &r.server_stats_error {
        let _ = writeln!(s, "| server stats | error: {e} |");
    }
    let _ = writeln!(
        s,
        "| errors | {} in window, {} total ({:.3}%) |",
        r.errors.in_window,
        r.errors.total,
        r.errors.rate * 100.0
    );
    for e in &r.errors.by_kind {
        let _ = writeln!(s, "| · {:?} {} | {} |", e.kind, e.name, e.count);
    }
    if let Some(kv) = &r.kv {
        let _ = writeln!(
            s,
            "| kv | {} hits · {} misses · {} stores |",
            kv.hits, kv.misses, kv.stores
        );
    }
    if let Some(h) = &r.http_status {
        let parts: Vec<String> = h.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(s, "| HTTP status | {} |", parts.join(" · "));
    }
    let _ = writeln!(
        s,
        "\n| latency (µs) | p50 | p90 | p99 | p99.9 | max | n |\n|---|---|---|---|---|---|---|"
    );
    let mut row = |name: &str, l: &LatSummary| {
        let _ = writeln!(
            s,
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
            l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us, l.count
        );
    };
    row("request→response", &r.latency.txn);
    if let Some(l) = &r.latency.txn_corrected {
        row("corrected (from intended)", l);
    }
    if let Some(l) = &r.latency.session {
        row("session", l);
    }
    if let Some(l) = &r.latency.session_corrected {
        row("session corrected", l);
    }
    row("connect", &r.latency.connect);
    if let Some(rs) = &r.rate_search {
        let _ = writeln!(
            s,
            "\nrate search: saturating ≈ {}/s after {} probes",
            f(rs.result(), 0),
            rs.probes.len()
        );
    }
    for n in &r.notes {
        let _ = writeln!(s, "\nnote: {n}");
    }
    s.push('\n');
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// SVG line plot: series of (x, y) points.
pub fn svg_plot(
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[(String, Vec<(f64, f64)>)],
    logx: bool,
) -> String {
    let (w, h, ml, mr, mt, mb) = (720.0, 420.0, 70.0, 20.0, 40.0, 50.0);
    let pw = w - ml - mr;
    let ph = h - mt - mb;
    let tx = |x: f64| if logx { x.max(1e-3).log10() } else { x };
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.1.iter().map(|&(x, y)| (tx(x), y)))
        .collect();
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    if pts.is_empty() {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">no data</text></svg>"#,
            w / 2.0,
            h / 2.0
        );
        return s;
    }
    let (mut x0, mut x1) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.0), a.1.max(p.0)));
    let y1 = pts.iter().fold(0.0f64, |a, p| a.max(p.1)).max(1e-9) * 1.05;
    if logx {
        x0 = x0.floor();
        x1 = x1.ceil();
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let sx = |x: f64| ml + (x - x0) / (x1 - x0) * pw;
    let sy = |y: f64| mt + ph - y / y1 * ph;
    let _ = writeln!(
        s,
        r##"<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##
    );
    for k in 0..=5 {
        let yv = y1 * k as f64 / 5.0;
        let y = sy(yv);
        let _ = writeln!(
            s,
            r##"<line x1="{ml}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#eee"/>"##,
            ml + pw
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            ml - 5.0,
            y + 4.0,
            tick(yv)
        );
    }
    let xticks: Vec<f64> = if logx {
        (x0 as i64..=x1 as i64).map(|e| e as f64).collect()
    } else {
        (0..=6).map(|k| x0 + (x1 - x0) * k as f64 / 6.0).collect()
    };
    for xv in xticks {
        let x = sx(xv);
        let label = if logx { tick(10f64.powf(xv)) } else { tick(xv) };
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{mt}" x2="{x:.1}" y2="{}" stroke="#eee"/>"##,
            mt + ph
        );
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{}" text-anchor="middle">{label}</text>"#,
            mt + ph + 16.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        ml + pw / 2.0,
        h - 10.0,
        esc(xlabel)
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
        mt + ph / 2.0,
        mt + ph / 2.0,
        esc(ylabel)
    );
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"];
    for (i, (name, data)) in series.iter().enumerate() {
        let c = colors[i % colors.len()];
        let path: Vec<String> = data
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(tx(x)), sy(y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        let ly = mt + 16.0 + i as f64 * 16.0;
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="3"/>"#,
            ml + 10.0,
            ml + 30.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{}</text>"#,
            ml + 35.0,
            ly + 4.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1000.0 {
        human(v)
    } else if v.abs() >= 10.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Throughput-over-time plot.
pub fn svg_throughput(r: &Report) -> String {
    let txn: Vec<(f64, f64)> = r
        .timeline
        .iter()
        .map(|t| (t.t_s as f64 + 0.5, t.txns as f64))
        .collect();
    let mut series = vec![("txns/s".to_string(), txn)];
    if r.throughput.unit == "session" {
        series.push((
            "sessions/s".into(),
            r.timeline
                .iter()
                .map(|t| (t.t_s as f64 + 0.5, t.sessions as f64))
                .collect(),
        ));
    }
    if r.timeline.iter().any(|t| t.errors > 0) {
        series.push((
            "errors/s".into(),
            r.timeline
                .iter()
                .map(|t| (t.t_s as f64 + 0.5, t.errors as f64))
                .collect(),
        ));
    }
    svg_plot(
        &format!(
            "{} → {}: throughput (warm-up {:.0}s included)",
            r.workload, r.target, r.warmup_s
        ),
        "time (s)",
        "per second",
        &series,
        false,
    )
}

/// Latency CDF plot.
pub fn svg_latency(r: &Report) -> String {
    svg_plot(
        &format!("{} → {}: latency CDF", r.workload, r.target),
        "latency (µs, log)",
        "fraction ≤",
        &r.cdfs,
        true,
    )
}

fn sibling(p: &Path, ext: &str) -> PathBuf {
    p.with_extension(ext)
}

/// Writes JSON / markdown / SVG where asked (markdown and SVG default to beside the JSON).
pub fn write_outputs(r: &Report, md: &str, c: &Common) -> Result<(), String> {
    let write = |p: &Path, data: &[u8]| -> Result<(), String> {
        if let Some(d) = p.parent() {
            if !d.as_os_str().is_empty() {
                std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            }
        }
        std::fs::write(p, data).map_err(|e| format!("{}: {e}", p.display()))
    };
    if let Some(j) = &c.json {
        let text = serde_json::to_string_pretty(r).map_err(|e| e.to_string())?;
        write(j, text.as_bytes())?;
    }
    let md_path =
        c.md.clone()
            .or_else(|| c.json.as_ref().map(|j| sibling(j, "md")));
    if let Some(p) = md_path {
        write(&p, md.as_bytes())?;
    }
    let svg_prefix = c
        .svg
        .clone()
        .or_else(|| c.json.as_ref().map(|j| j.with_extension("")));
    if let Some(p) = svg_prefix {
        let base = p.to_string_lossy().to_string();
        write(
            Path::new(&format!("{base}-throughput.svg")),
            svg_throughput(r).as_bytes(),
        )?;
        write(
            Path::new(&format!("{base}-latency.svg")),
            svg_latency(r).as_bytes(),
        )?;
    }
    Ok(())
}

/// The progress line text.
pub fn progress_line(
    now: u64,
    warmup_end: u64,
    end: u64,
    units: u64,
    quota: Option<u64>,
    rate: f64,
) -> String {
    let width = 30usize;
    let frac = match quota {
        Some(q) if q > 0 => units as f64 / q as f64,
        _ => now as f64 / end.max(1) as f64,
    }
    .clamp(0.0, 1.0);
    let filled = (frac * width as f64).round() as usize;
    let phase = if now < warmup_end {
        "warm-up"
    } else {
        "measuring"
    };
    format!(
        "[{}{}] {:>5.1}s {phase:<9} {} units  {}/s",
        "#".repeat(filled),
        "-".repeat(width - filled),
        now as f64 / 1e9,
        units,
        human(rate)
    )
}

/// Redraws the progress line on stderr.
pub fn draw_progress(
    now: u64,
    warmup_end: u64,
    end: u64,
    units: u64,
    quota: Option<u64>,
    rate: f64,
) {
    let mut e = std::io::stderr().lock();
    let _ = write!(
        e,
        "\r{}\x1b[K",
        progress_line(now, warmup_end, end, units, quota, rate)
    );
    let _ = e.flush();
}

/// Clears the progress line.
pub fn clear_progress() {
    let mut e = std::io::stderr().lock();
    let _ = write!(e, "\r\x1b[K");
    let _ = e.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_is_well_formed_and_escaped() {
        let s = svg_plot(
            "a<b",
            "x",
            "y",
            &[("s&1".into(), vec![(1.0, 0.1), (10.0, 0.5), (100.0, 1.0)])],
            true,
        );
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains("a&lt;b") && s.contains("s&amp;1"));
        assert_eq!(s.matches("<polyline").count(), 1);
        let empty = svg_plot("t", "x", "y", &[], false);
        assert!(empty.contains("no data") && empty.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn progress_and_human() {
        let l = progress_line(
            5_000_000_000,
            1_000_000_000,
            10_000_000_000,
            123,
            None,
            35_100.0,
        );
        assert!(
            l.contains("###############---------------")
                && l.contains("measuring")
                && l.contains("35.1k/s"),
            "{l}"
        );
        let l = progress_line(0, 1, 10, 50, Some(100), 0.0);
        assert!(l.contains("warm-up") && l.matches('#').count() == 15, "{l}");
        assert_eq!(human(1_500_000.0), "1.50M");
        assert_eq!(human(999.0), "999");
    }
}
