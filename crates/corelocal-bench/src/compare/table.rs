//! Medians, spreads and ratios over rounds, and the markdown table.

use super::{CompareArgs, RunFig, ServerDef};
use serde::Serialize;
use std::fmt::Write as _;

/// Median, min, max and spread ((max − min) / median) of some values.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// (max − min) / median.
    pub spread: f64,
    /// Samples.
    pub n: usize,
}

/// Statistics of `v` (None when empty).
pub fn spread(v: &[f64]) -> Option<Spread> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    let (min, max) = (s[0], s[n - 1]);
    Some(Spread {
        median,
        min,
        max,
        spread: if median != 0.0 {
            (max - min) / median
        } else {
            0.0
        },
        n,
    })
}

/// One server's summary.
#[derive(Debug, Clone, Serialize)]
pub struct ServerSummary {
    /// The server.
    pub server: ServerDef,
    /// Each run.
    pub runs: Vec<RunFig>,
    /// Throughput.
    pub txns_per_s: Option<Spread>,
    /// Server CPU µs per transaction (schedstat).
    pub server_us_per_txn: Option<Spread>,
    /// Server CPU µs per transaction (utime+stime).
    pub server_us_per_txn_utime: Option<Spread>,
    /// Median request→response latency (µs) over the runs.
    pub p50_us: Option<Spread>,
    /// 99th percentile request→response latency (µs) over the runs.
    pub p99_us: Option<Spread>,
    /// 99.9th percentile request→response latency (µs) over the runs.
    pub p999_us: Option<Spread>,
    /// Median server µs/txn ÷ the baseline's.
    pub cpu_ratio_vs_baseline: Option<f64>,
    /// Median throughput ÷ the baseline's.
    pub throughput_ratio_vs_baseline: Option<f64>,
    /// Failed runs.
    pub failures: Vec<String>,
}

/// The servers' summaries at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct ConnsSummary {
    /// Client connections.
    pub conns: usize,
    /// The server the ratios are taken against.
    pub baseline: String,
    /// Per server, in the order they ran.
    pub servers: Vec<ServerSummary>,
}

/// Summarises runs per server; `servers[baseline]` is the baseline of the ratios.
pub fn summarize(
    servers: &[ServerDef],
    runs: &[Vec<RunFig>],
    failures: &[Vec<String>],
    baseline: usize,
) -> Vec<ServerSummary> {
    let mut out: Vec<ServerSummary> = servers
        .iter()
        .zip(runs)
        .zip(failures)
        .map(|((s, r), f)| {
            let col = |get: &dyn Fn(&RunFig) -> Option<f64>| {
                spread(&r.iter().filter_map(get).collect::<Vec<_>>())
            };
            ServerSummary {
                server: s.clone(),
                runs: r.clone(),
                txns_per_s: col(&|x| Some(x.txns_per_s)),
                server_us_per_txn: col(&|x| x.server_us_per_txn),
                server_us_per_txn_utime: col(&|x| x.server_us_per_txn_utime),
                p50_us: col(&|x| Some(x.p50_us)),
                p99_us: col(&|x| Some(x.p99_us)),
                p999_us: col(&|x| Some(x.p999_us)),
                cpu_ratio_vs_baseline: None,
                throughput_ratio_vs_baseline: None,
                failures: f.clone(),
            }
        })
        .collect();
    let base = out.get(baseline);
    let base_cpu = base.and_then(|b| b.server_us_per_txn.map(|s| s.median));
    let base_tp = base.and_then(|b| b.txns_per_s.map(|s| s.median));
    for s in &mut out {
        s.cpu_ratio_vs_baseline = match (s.server_us_per_txn, base_cpu) {
            (Some(x), Some(b)) if b > 0.0 => Some(x.median / b),
            _ => None,
        };
        s.throughput_ratio_vs_baseline = match (s.txns_per_s, base_tp) {
            (Some(x), Some(b)) if b > 0.0 => Some(x.median / b),
            _ => None,
        };
    }
    out
}

/// The median latency spectrum of some runs, point by point: at each quantile of the fixed
/// grid, the median over runs of the latency there (the same statistic as the table's
/// medians). Runs without a spectrum, or with another grid, are left out.
pub fn median_spectrum(runs: &[RunFig]) -> Vec<(f64, f64)> {
    let Some(grid) = runs.iter().map(|r| &r.spectrum).find(|s| !s.is_empty()) else {
        return Vec::new();
    };
    let same: Vec<&Vec<(f64, f64)>> = runs
        .iter()
        .map(|r| &r.spectrum)
        .filter(|s| s.len() == grid.len() && s.iter().zip(grid).all(|(a, b)| a.0 == b.0))
        .collect();
    grid.iter()
        .enumerate()
        .filter_map(|(i, &(q, _))| {
            let v: Vec<f64> = same.iter().map(|s| s[i].1).collect();
            spread(&v).map(|m| (q, m.median))
        })
        .collect()
}

/// The servers' latency by percentile at one concurrency, one series per server.
pub fn percentile_svg(a: &CompareArgs, c: &ConnsSummary) -> String {
    let series: Vec<(String, Vec<(f64, f64)>)> = c
        .servers
        .iter()
        .map(|x| (x.server.name.clone(), median_spectrum(&x.runs)))
        .collect();
    crate::report::percentile_plot(
        &format!(
            "compare {}, {} connections: request→response latency (median of {} rounds)",
            a.workload.name(),
            c.conns,
            a.rounds
        ),
        &series,
    )
}

/// UTC `YYYY-MM-DD` of a unix time (civil-from-days).
pub fn utc_date(unix: u64) -> String {
    let z = (unix / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

fn fmt_spread(s: &Option<Spread>, digits: usize) -> String {
    match s {
        Some(s) => format!(
            "{:.digits$} ({:.digits$}–{:.digits$}, ±{:.0}%)",
            s.median,
            s.min,
            s.max,
            s.spread * 50.0
        ),
        None => "–".into(),
    }
}

fn fmt_range(s: &Option<Spread>, digits: usize) -> String {
    match s {
        Some(s) => format!(
            "{:.digits$} ({:.digits$}–{:.digits$})",
            s.median, s.min, s.max
        ),
        None => "–".into(),
    }
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("–".into(), |r| format!("{r:.3}"))
}

/// The markdown tables: server CPU per op by concurrency (one column per server, the headline
/// for "corelocal vs nginx vs floor"), then per concurrency and server the medians and spreads,
/// ratios, throughput and latency, then every run.
pub fn markdown(
    a: &CompareArgs,
    by_conns: &[ConnsSummary],
    cmdline: &str,
    load_before: &str,
) -> String {
    let mut s = String::new();
    let names: Vec<&str> = by_conns
        .first()
        .map(|c| c.servers.iter().map(|x| x.server.name.as_str()).collect())
        .unwrap_or_default();
    let baseline = by_conns.first().map_or("-", |c| c.baseline.as_str());
    let conns: Vec<String> = by_conns.iter().map(|c| c.conns.to_string()).collect();
    let _ = writeln!(s, "# corelocal bench compare: {:?}\n", a.workload);
    let _ = writeln!(s, "`{cmdline}`\n");
    let _ = writeln!(
        s,
        "{} rounds{}, servers run in order each round ({}), each run {} after {} warm-up in a fresh network \
         namespace{}; server pinned to CPU{}, client on CPU {} ({} connections). Load average before: {load_before}.\n",
        a.rounds,
        if by_conns.len() > 1 { " per concurrency" } else { "" },
        names.join(" → "),
        a.duration,
        a.warmup,
        if a.no_netns { " (disabled: --no-netns)" } else { "" },
        a.server_cpu,
        a.client_cpus,
        conns.join(", ")
    );
    let busy = load_before
        .split_whitespace()
        .next()
        .and_then(|x| x.parse::<f64>().ok())
        .unwrap_or(0.0);
    if busy > 0.5 {
        let _ = writeln!(
            s,
            "**Taken under contention** (load average {busy:.2} before the runs; other work shared these CPUs): \
             absolute µs/op are inflated, compare the ratios of runs taken side by side.\n"
        );
    }
    let _ = writeln!(
        s,
        "Server CPU µs/op (schedstat), median over rounds (ratio vs {baseline}):\n"
    );
    let _ = writeln!(s, "| conns | {} |", names.join(" | "));
    let _ = writeln!(s, "|---|{}", "---|".repeat(names.len()));
    for c in by_conns {
        let cells: Vec<String> = c
            .servers
            .iter()
            .map(|x| match x.server_us_per_txn {
                Some(m) => format!("{:.2} ({})", m.median, fmt_ratio(x.cpu_ratio_vs_baseline)),
                None => "–".into(),
            })
            .collect();
        let _ = writeln!(s, "| {} | {} |", c.conns, cells.join(" | "));
    }
    let _ = writeln!(
        s,
        "\n| conns | server | server CPU µs/op (schedstat) median (min–max, ±half-spread) | µs/op utime+stime | ratio vs {baseline} | ops/s | ops/s ratio | p50 µs median (min–max) | p99 µs median (min–max) | p99.9 µs median (min–max) | failures |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for c in by_conns {
        for x in &c.servers {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                c.conns,
                x.server.name,
                fmt_spread(&x.server_us_per_txn, 2),
                fmt_spread(&x.server_us_per_txn_utime, 2),
                fmt_ratio(x.cpu_ratio_vs_baseline),
                fmt_spread(&x.txns_per_s, 0),
                fmt_ratio(x.throughput_ratio_vs_baseline),
                fmt_range(&x.p50_us, 1),
                fmt_range(&x.p99_us, 1),
                fmt_range(&x.p999_us, 1),
                x.failures.len()
            );
        }
    }
    let _ = writeln!(s, "\nPer run:\n\n| conns | server | round | ops/s | server µs/op | server runs/op | client µs/op | p50 µs | p99 µs | p99.9 µs | errors | load |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for c in by_conns {
        for x in &c.servers {
            for r in &x.runs {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {:.0} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {} |",
                    c.conns,
                    x.server.name,
                    r.round,
                    r.txns_per_s,
                    r.server_us_per_txn
                        .map_or("–".into(), |v| format!("{v:.2}")),
                    r.server_runs_per_txn
                        .map_or("–".into(), |v| format!("{v:.2}")),
                    r.client_us_per_txn
                        .map_or("–".into(), |v| format!("{v:.2}")),
                    r.p50_us,
                    r.p99_us,
                    r.p999_us,
                    r.errors,
                    r.load
                );
            }
            for f in &x.failures {
                let _ = writeln!(s, "\nfailure ({}, {} conns): {f}", x.server.name, c.conns);
            }
        }
    }
    let _ = writeln!(s, "\nServers:\n");
    for x in by_conns.first().map_or(&[][..], |c| &c.servers[..]) {
        let _ = writeln!(
            s,
            "- {} ({}): `{}`",
            x.server.name, x.server.proto, x.server.cmd
        );
    }
    let _ = writeln!(
        s,
        "\nop = one request/response (crr and file64: one connection each; sessions: one HTTP request \
         of a session, not the session; kv1/kv100: one get, 1 or 100 per connection; sockperf: one 64-byte message and its pong). Server CPU is the server process's threads' \
         schedstat run time over the measured window ÷ ops (server runs/op: the times its threads were \
         scheduled in ÷ ops, i.e. its wake-ups); on loopback the client's CPU also runs much of \
         the server's receive path, so throughput is client-bound and server CPU per op is the figure that \
         compares servers. Latency by percentile per server (median over rounds at each percentile): \
         the -latency-percentiles.svg plot{} beside this file."
        ,
        if by_conns.len() > 1 { "s, one per concurrency," } else { "" }
    );
    s
}
