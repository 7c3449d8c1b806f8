//! The markdown summary of one run.

use super::Report;
use crate::stats::LatSummary;
use std::fmt::Write as _;

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
