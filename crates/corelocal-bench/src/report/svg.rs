//! SVG plots: throughput over time, the latency CDF and the latency percentile spectrum.

use super::Report;
use std::fmt::Write as _;

/// Latency-by-percentile plot (request→response, and the corrected and session series when
/// the run has them).
pub fn svg_percentiles(r: &Report) -> String {
    let series: Vec<(String, Vec<(f64, f64)>)> = r
        .latency_percentiles
        .iter()
        .map(|s| (s.name.clone(), s.points.clone()))
        .collect();
    percentile_plot(
        &format!("{} → {}: latency by percentile", r.workload, r.target),
        &series,
    )
}

/// A latency-by-percentile plot of (quantile, µs) series, to 99.999%.
pub fn percentile_plot(title: &str, series: &[(String, Vec<(f64, f64)>)]) -> String {
    svg_plot(
        title,
        "percentile (log scale of 1/(1−p))",
        "latency (µs)",
        series,
        XAxis::Percentile {
            decades: crate::stats::SPECTRUM_DECADES,
        },
        YAxis::Auto,
    )
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// How a plot places x values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAxis {
    /// Linear, ticks at sixths of the range.
    Linear,
    /// log10, ticks at the powers of ten.
    Log10,
    /// x is a quantile p in [0, 1] drawn at log10(1/(1−p)) from 0 to `decades` (HdrHistogram and
    /// wrk2's percentile plots): 90%, 99%, 99.9%, … are evenly spaced, so the tail, which a
    /// linear axis squeezes into its last pixel, gets as much room as the body. Ticks at 50%,
    /// 90%, 99%, …; quantiles past the last decade (p = 1, the maximum) sit on the right edge.
    Percentile {
        /// Decades of 1/(1−p) shown: 5 reaches 99.999%.
        decades: u32,
    },
}

/// Where a quantile `q` lies on a [`XAxis::Percentile`] axis of `decades` decades:
/// log10(1/(1−q)), clamped to [0, decades] (so q = 1 gives `decades`, never infinity).
pub fn percentile_x(q: f64, decades: u32) -> f64 {
    let d = f64::from(decades);
    if q.is_nan() {
        return 0.0;
    }
    if q >= 1.0 {
        return d;
    }
    (-(1.0 - q.max(0.0)).log10()).clamp(0.0, d)
}

/// The label of the percentile 1 − 10^−d: "90%", "99%", "99.9%", …
fn nines(d: u32) -> String {
    let p = 100.0 * (1.0 - 10f64.powi(-(d as i32)));
    format!("{p:.*}%", d.saturating_sub(2) as usize)
}

/// How a plot scales y values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum YAxis {
    /// From 0 to a round number at or above the largest value, ticks at round steps.
    Auto,
    /// A fraction of samples: always 0..1, ticks every 0.25. A CDF must not be scaled by its
    /// largest point (1.0) plus headroom, or its axis ends at 1.05 with ticks at 0.21, 0.42, …
    Fraction,
}

/// The y ticks of an axis whose data reach `max`: round steps (1, 2, 2.5 or 5 × 10^k) from 0
/// to the first step at or above `max`, about five of them.
pub fn y_ticks(y: YAxis, max: f64) -> Vec<f64> {
    if y == YAxis::Fraction {
        return vec![0.0, 0.25, 0.5, 0.75, 1.0];
    }
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let step = nice_step(max / 5.0);
    let n = (max / step - 1e-9).ceil().max(1.0) as usize;
    // Multiplying (not accumulating) keeps 0.1 × 3 from printing as 0.30000000000000004.
    (0..=n).map(|k| k as f64 * step).collect()
}

/// The smallest round step (1, 2, 2.5 or 5 × 10^k) at or above `raw` (> 0).
fn nice_step(raw: f64) -> f64 {
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * mag)
}

/// SVG line plot: series of (x, y) points.
pub fn svg_plot(
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[(String, Vec<(f64, f64)>)],
    xaxis: XAxis,
    yaxis: YAxis,
) -> String {
    // The right margin holds half of the last x label ("99.999%" is wide).
    let (w, h, ml, mr, mt, mb) = (720.0, 420.0, 70.0, 35.0, 40.0, 50.0);
    let pw = w - ml - mr;
    let ph = h - mt - mb;
    let logx = xaxis == XAxis::Log10;
    let tx = |x: f64| match xaxis {
        XAxis::Linear => x,
        XAxis::Log10 => x.max(1e-3).log10(),
        XAxis::Percentile { decades } => percentile_x(x, decades),
    };
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.1.iter().map(|&(x, y)| (tx(x), y)))
        .filter(|p| p.0.is_finite() && p.1.is_finite())
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
    let yticks = y_ticks(yaxis, pts.iter().fold(0.0f64, |a, p| a.max(p.1)));
    let y1 = yticks.last().copied().unwrap_or(1.0);
    if logx {
        x0 = x0.floor();
        x1 = x1.ceil();
    }
    if let XAxis::Percentile { decades } = xaxis {
        // A fixed range, so plots of different runs line up tick for tick.
        (x0, x1) = (0.0, f64::from(decades));
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    // Linear: widen to whole round steps, about six, so ticks read 0, 2, 4 … not 0.833, 1.167 …
    let xstep = nice_step((x1 - x0) / 6.0);
    if xaxis == XAxis::Linear {
        x0 = (x0 / xstep + 1e-9).floor() * xstep;
        x1 = (x1 / xstep - 1e-9).ceil() * xstep;
    }
    let sx = |x: f64| ml + (x - x0) / (x1 - x0) * pw;
    let sy = |y: f64| mt + ph - y / y1 * ph;
    let _ = writeln!(
        s,
        r##"<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##
    );
    for &yv in &yticks {
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
    let xticks: Vec<(f64, String)> = match xaxis {
        XAxis::Log10 => (x0 as i64..=x1 as i64)
            .map(|e| (e as f64, tick(10f64.powi(e as i32))))
            .collect(),
        XAxis::Linear => (0..=((x1 - x0) / xstep).round() as usize)
            .map(|k| x0 + k as f64 * xstep)
            .map(|x| (x, tick(x)))
            .collect(),
        XAxis::Percentile { decades } => {
            std::iter::once((percentile_x(0.5, decades), "50%".into()))
                .chain((1..=decades).map(|d| (f64::from(d), nines(d))))
                .collect()
        }
    };
    for (xv, label) in xticks {
        let x = sx(xv);
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
            .map(|&(x, y)| (tx(x), y))
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
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

/// A tick label: the shortest decimal that shows the value (ticks are round numbers, so
/// 0.25 reads "0.25", 0.5 "0.5", 1 "1"), with k/M above a thousand.
fn tick(v: f64) -> String {
    fn short(v: f64) -> String {
        let s = format!("{v:.3}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s == "-0" {
            "0".into()
        } else {
            s.into()
        }
    }
    if v.abs() >= 1e6 {
        format!("{}M", short(v / 1e6))
    } else if v.abs() >= 1e3 {
        format!("{}k", short(v / 1e3))
    } else {
        short(v)
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
            "{} → {}: throughput (warm-up {}s included)",
            r.workload,
            r.target,
            tick(r.warmup_s)
        ),
        "time (s)",
        "per second",
        &series,
        XAxis::Linear,
        YAxis::Auto,
    )
}

/// Latency CDF plot.
pub fn svg_latency(r: &Report) -> String {
    cdf_plot(
        &format!("{} → {}: latency CDF", r.workload, r.target),
        &r.cdfs,
    )
}

/// A CDF plot of (µs, fraction ≤) series: log latency, the fraction on a fixed 0..1 axis.
fn cdf_plot(title: &str, cdfs: &[(String, Vec<(f64, f64)>)]) -> String {
    svg_plot(
        title,
        "latency (µs, log)",
        "fraction ≤",
        cdfs,
        XAxis::Log10,
        YAxis::Fraction,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Lat;

    /// The labels of the y ticks (right-aligned texts left of the plot) with their y.
    fn y_labels(svg: &str) -> Vec<(f64, String)> {
        svg.lines()
            .filter(|l| l.contains(r#"text-anchor="end""#))
            .map(|l| {
                let y = l
                    .split(r#" y=""#)
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap();
                let label = l.split('>').nth(1).unwrap().split('<').next().unwrap();
                (y.parse().unwrap(), label.to_string())
            })
            .collect()
    }

    /// The (x, y) pixels of each polyline.
    fn polylines(svg: &str) -> Vec<Vec<(f64, f64)>> {
        svg.lines()
            .filter(|l| l.starts_with("<polyline"))
            .map(|l| {
                let pts = l
                    .split(r#"points=""#)
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap();
                pts.split(' ')
                    .map(|p| {
                        let (x, y) = p.split_once(',').unwrap();
                        (x.parse().unwrap(), y.parse().unwrap())
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn cdf_axis_is_zero_to_one_with_round_ticks() {
        // Two client threads merged, one with a slow tail, plus an open-loop corrected
        // histogram: the shapes a real run's CDFs have.
        let (mut a, mut b, mut co) = (Lat::default(), Lat::default(), Lat::default());
        for i in 0..5_000u64 {
            a.record(20_000 + i * 7);
            b.record(25_000 + (i % 97) * 1_000);
            co.record_corrected(30_000 + i * 13, 50_000);
        }
        a.merge(&b);
        let svg = cdf_plot(
            "t",
            &[("merged".into(), a.cdf()), ("corrected".into(), co.cdf())],
        );
        let labels = y_labels(&svg);
        let text: Vec<&str> = labels.iter().map(|l| l.1.as_str()).collect();
        assert_eq!(text, ["0", "0.25", "0.5", "0.75", "1"], "{svg}");
        // The plot area spans y 40 (top) to 370 (bottom): tick 1 sits on the top edge, and
        // each series ends exactly there — fraction 1.0, never above it — rising monotonically.
        let top = 40.0;
        assert_eq!(labels[4].0, top + 4.0);
        for line in polylines(&svg) {
            assert_eq!(line.last().unwrap().1, top, "{line:?}");
            assert!(
                line.iter().all(|p| (top..=370.0).contains(&p.1)),
                "{line:?}"
            );
            assert!(line
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 >= w[1].1));
        }
    }

    /// The x of each bottom tick label.
    fn x_labels(svg: &str) -> Vec<(f64, String)> {
        svg.lines()
            .filter(|l| l.contains(r#"y="386" text-anchor="middle">"#))
            .map(|l| {
                let x = l
                    .split(r#" x=""#)
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap();
                let label = l.split('>').nth(1).unwrap().split('<').next().unwrap();
                (x.parse().unwrap(), label.to_string())
            })
            .collect()
    }

    #[test]
    fn percentile_plot_spaces_the_nines_evenly() {
        let (mut fast, mut slow) = (Lat::default(), Lat::default());
        for i in 1..=200_000u64 {
            fast.record(10_000 + i % 1_000);
            // A heavy tail: 1% of samples 100× slower.
            slow.record(if i % 100 == 0 {
                2_000_000
            } else {
                20_000 + i % 5_000
            });
        }
        let mut tiny = Lat::default();
        tiny.record(50_000);
        let mut series = vec![
            ("fast".to_string(), fast.spectrum()),
            ("slow".to_string(), slow.spectrum()),
            // A run with one sample: flat at its value. The maximum (p = 1) belongs on the
            // right edge, not at infinity.
            ("one".to_string(), tiny.spectrum()),
        ];
        series[2].1.push((1.0, 50.0));
        let svg = percentile_plot("t", &series);
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        let xs = x_labels(&svg);
        let text: Vec<&str> = xs.iter().map(|l| l.1.as_str()).collect();
        assert_eq!(
            text,
            ["50%", "90%", "99%", "99.9%", "99.99%", "99.999%"],
            "{svg}"
        );
        let gaps: Vec<f64> = xs[1..].windows(2).map(|w| w[1].0 - w[0].0).collect();
        assert!(gaps[0] > 100.0, "{gaps:?}");
        assert!(gaps.iter().all(|g| (g - gaps[0]).abs() < 0.15), "{gaps:?}");
        // 50% lies at log10(2) ≈ 0.30 of the first decade.
        let first = (xs[0].0 - 70.0) / gaps[0];
        assert!((first - 2f64.log10()).abs() < 0.01, "{first}");
        let lines = polylines(&svg);
        assert_eq!(lines.len(), 3);
        for line in &lines {
            // Latency never falls as the percentile rises (y pixels grow downwards).
            assert!(line
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 >= w[1].1));
            assert!(
                line.iter().all(|p| (70.0..=685.0).contains(&p.0)),
                "{line:?}"
            );
        }
        assert_eq!(lines[2].last().unwrap().0, 685.0);
        // The slow series' tail: below 99% it is ~20–25 µs, from 99% on it is 2,000 µs.
        let s = slow.spectrum();
        let at = |q: f64| s.iter().find(|p| (p.0 - q).abs() < 1e-9).unwrap().1;
        assert!(at(0.9) < 30.0 && at(0.999) > 1_900.0, "{s:?}");
        assert_eq!(percentile_x(1.0, 5), 5.0);
        assert_eq!(percentile_x(f64::NAN, 5), 0.0);
        assert!((percentile_x(0.999, 5) - 3.0).abs() < 1e-9);
    }

    #[test]
    fn linear_x_ticks_are_round() {
        let labels = |pts: Vec<(f64, f64)>| -> Vec<String> {
            let svg = svg_plot(
                "t",
                "x",
                "y",
                &[("s".into(), pts)],
                XAxis::Linear,
                YAxis::Auto,
            );
            x_labels(&svg).into_iter().map(|l| l.1).collect()
        };
        // A throughput timeline: one point per second, at its middle.
        let sec = |n: usize| (0..n).map(|t| (t as f64 + 0.5, 1.0)).collect::<Vec<_>>();
        assert_eq!(labels(sec(3)), ["0.5", "1", "1.5", "2", "2.5"]);
        assert_eq!(labels(sec(11)), ["0", "2", "4", "6", "8", "10", "12"]);
        assert_eq!(
            labels(vec![(3.0, 1.0)]),
            ["3", "3.2", "3.4", "3.6", "3.8", "4"]
        );
    }

    #[test]
    fn auto_ticks_are_round() {
        let labels =
            |max: f64| -> Vec<String> { y_ticks(YAxis::Auto, max).into_iter().map(tick).collect() };
        assert_eq!(labels(73_000.0), ["0", "20k", "40k", "60k", "80k"]);
        assert_eq!(labels(1.0), ["0", "0.2", "0.4", "0.6", "0.8", "1"]);
        assert_eq!(labels(9.0), ["0", "2", "4", "6", "8", "10"]);
        assert_eq!(labels(120.0), ["0", "25", "50", "75", "100", "125"]);
        assert_eq!(labels(2.5e6), ["0", "500k", "1M", "1.5M", "2M", "2.5M"]);
        assert_eq!(labels(0.0), labels(1.0));
        assert_eq!(labels(f64::NAN), labels(1.0));
    }

    #[test]
    fn svg_is_well_formed_and_escaped() {
        let s = svg_plot(
            "a<b",
            "x",
            "y",
            &[("s&1".into(), vec![(1.0, 0.1), (10.0, 0.5), (100.0, 1.0)])],
            XAxis::Log10,
            YAxis::Fraction,
        );
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains("a&lt;b") && s.contains("s&amp;1"));
        assert_eq!(s.matches("<polyline").count(), 1);
        let empty = svg_plot("t", "x", "y", &[], XAxis::Linear, YAxis::Auto);
        assert!(empty.contains("no data") && empty.trim_end().ends_with("</svg>"));
    }
}
