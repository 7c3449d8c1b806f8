//! SVG plots: throughput over time and the latency CDF.

use super::{human, Report};
use std::fmt::Write as _;

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
}
