//! A hand-written SVG of a run: latency, throughput, and the hogged cores' packet share over
//! time.

use super::{BalancerMode, SimReport};
use std::fmt::Write;

const WIDTH: f64 = 960.0;
const PANEL_H: f64 = 190.0;
const GAP: f64 = 60.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 50.0;

/// A plotted counter: colour, label, dashed, value.
type Line = (&'static str, &'static str, bool, fn(&super::Second) -> u64);

struct Panel {
    y0: f64,
    secs: f64,
}

impl Panel {
    fn x(&self, t_s: f64) -> f64 {
        LEFT + t_s / self.secs.max(1.0) * (WIDTH - LEFT - RIGHT)
    }
    /// `frac` in 0..=1, 0 at the bottom.
    fn y(&self, frac: f64) -> f64 {
        self.y0 + PANEL_H - frac.clamp(0.0, 1.0) * PANEL_H
    }
}

fn polyline(out: &mut String, pts: &[(f64, f64)], color: &str, dash: bool) {
    if pts.is_empty() {
        return;
    }
    let mut d = String::new();
    for (x, y) in pts {
        let _ = write!(d, "{x:.1},{y:.1} ");
    }
    let dash = if dash {
        " stroke-dasharray=\"5,3\""
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.6\"{dash} points=\"{}\"/>",
        d.trim_end()
    );
}

fn legend(out: &mut String, p: &Panel, row: usize, color: &str, label: &str, dash: bool) {
    let x = WIDTH - RIGHT + 12.0;
    let y = p.y0 + 14.0 + row as f64 * 18.0;
    let dash = if dash {
        " stroke-dasharray=\"5,3\""
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "<line x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{color}\" stroke-width=\"2\"{dash}/>\
         <text x=\"{:.1}\" y=\"{:.1}\">{label}</text>",
        x + 22.0,
        x + 28.0,
        y + 4.0
    );
}

fn frame(out: &mut String, p: &Panel, title: &str, yticks: &[(f64, String)]) {
    let (x0, x1) = (LEFT, WIDTH - RIGHT);
    let _ = writeln!(
        out,
        "<rect x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{PANEL_H:.1}\" fill=\"none\" stroke=\"#888\"/>\
         <text x=\"{x0:.1}\" y=\"{:.1}\" font-weight=\"bold\">{title}</text>",
        p.y0,
        x1 - x0,
        p.y0 - 8.0
    );
    for (frac, label) in yticks {
        let y = p.y(*frac);
        let _ = writeln!(
            out,
            "<line x1=\"{x0:.1}\" y1=\"{y:.1}\" x2=\"{x1:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>",
            x0 - 6.0,
            y + 4.0
        );
    }
    let step = nice_step(p.secs);
    let mut t = 0.0;
    while t <= p.secs + 1e-9 {
        let x = p.x(t);
        let _ = writeln!(
            out,
            "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{t:.0}</text>",
            p.y0 + PANEL_H + 16.0
        );
        t += step;
    }
}

/// The smallest 1, 2, 2.5 or 5 × 10^k at or above `x` (> 0).
fn nice_ceil(x: f64) -> f64 {
    let mut base = 1.0;
    while base * 10.0 < x {
        base *= 10.0;
    }
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if base * m >= x {
            return base * m;
        }
    }
    base * 10.0
}

fn nice_step(span: f64) -> f64 {
    for s in [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0] {
        if span / s <= 12.0 {
            return s;
        }
    }
    1200.0
}

/// Renders `r` as a standalone SVG document (deterministic text).
pub fn render_svg(r: &SimReport) -> String {
    let c = &r.config;
    let secs = r.series.len() as f64;
    let height = TOP + 3.0 * PANEL_H + 2.0 * GAP + 60.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH:.0}\" height=\"{height:.0}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>"
    );
    let mode = match c.balancer {
        BalancerMode::Off => "off",
        BalancerMode::Steal => "steal only",
        BalancerMode::On => "on",
    };
    let s = &r.summary;
    let _ = writeln!(
        out,
        "<text x=\"{LEFT:.0}\" y=\"20\" font-size=\"14\" font-weight=\"bold\">corelocal sim: {} cores, {} hogged \
         ({}% left to the server), balancer {mode}, load {}%, seed {}</text>\
         <text x=\"{LEFT:.0}\" y=\"36\">p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms; {} of {} connections timed out ({:.2}%); \
         {} steals, {} groups migrated</text>",
        c.cores,
        c.hog,
        c.hog_share_pct,
        c.load_pct,
        c.seed,
        s.latency_p50_ms,
        s.latency_p90_ms,
        s.latency_p99_ms,
        s.timeouts,
        s.connections,
        s.timeout_pct,
        s.steals,
        s.migrations
    );

    // Panel 1: latency of the connections started each second, log scale 10 ms .. 20 s.
    let p = Panel {
        y0: TOP + 10.0,
        secs,
    };
    let (lo, hi) = (10f64.log10(), 20_000f64.log10());
    let ly = |ms: f64| (ms.max(10.0).log10() - lo) / (hi - lo);
    let ticks: Vec<(f64, String)> = [10.0, 100.0, 1_000.0, 10_000.0]
        .iter()
        .map(|&ms| (ly(ms), format!("{ms:.0} ms")))
        .collect();
    frame(
        &mut out,
        &p,
        "connection latency by start second (log)",
        &ticks,
    );
    let started: Vec<_> = r.series.iter().filter(|x| x.arrivals > 0).collect();
    for (i, (color, label)) in [("#1f77b4", "p50"), ("#ff7f0e", "p90"), ("#999", "p99")]
        .iter()
        .enumerate()
    {
        let pts: Vec<(f64, f64)> = started
            .iter()
            .map(|x| {
                let v = [x.p50_ms, x.p90_ms, x.p99_ms][i];
                (p.x(x.t_s as f64 + 0.5), p.y(ly(v)))
            })
            .collect();
        polyline(&mut out, &pts, color, i == 2);
        legend(&mut out, &p, i, color, label, i == 2);
    }

    // Panel 2: throughput.
    let p = Panel {
        y0: TOP + 10.0 + PANEL_H + GAP,
        secs,
    };
    let ymax = nice_ceil(
        r.series
            .iter()
            .map(|x| x.arrivals.max(x.completed).max(x.timeouts))
            .max()
            .unwrap_or(1)
            .max(1) as f64
            * 1.05,
    );
    let ticks: Vec<(f64, String)> = (0..=4)
        .map(|k| {
            (
                f64::from(k) / 4.0,
                format!("{:.0}", ymax * f64::from(k) / 4.0),
            )
        })
        .collect();
    frame(&mut out, &p, "connections per second", &ticks);
    let series: [Line; 3] = [
        ("#2ca02c", "completed", false, |x| x.completed),
        ("#d62728", "timed out", false, |x| x.timeouts),
        ("#999", "started", true, |x| x.arrivals),
    ];
    for (i, (color, label, dash, f)) in series.iter().enumerate() {
        let pts: Vec<(f64, f64)> = r
            .series
            .iter()
            .map(|x| (p.x(x.t_s as f64 + 0.5), p.y(f(x) as f64 / ymax)))
            .collect();
        polyline(&mut out, &pts, color, *dash);
        legend(&mut out, &p, i, color, label, *dash);
    }

    // Panel 3: the hogged cores' share of packet processing and of the flow groups.
    let p = Panel {
        y0: TOP + 10.0 + 2.0 * (PANEL_H + GAP),
        secs,
    };
    let ticks: Vec<(f64, String)> = (0..=4)
        .map(|k| (f64::from(k) / 4.0, format!("{}%", k * 25)))
        .collect();
    frame(
        &mut out,
        &p,
        "hogged cores: share of all packet processing and of the flow groups",
        &ticks,
    );
    let groups = f64::from(c.flow_groups);
    let pkt: Vec<(f64, f64)> = r
        .series
        .iter()
        .filter(|x| x.arrivals > 0)
        .map(|x| {
            (
                p.x(x.t_s as f64 + 0.5),
                p.y(x.hogged_packet_share_pct / 100.0),
            )
        })
        .collect();
    polyline(&mut out, &pkt, "#9467bd", false);
    legend(&mut out, &p, 0, "#9467bd", "packet share", false);
    let grp: Vec<(f64, f64)> = r
        .series
        .iter()
        .filter(|x| x.arrivals > 0)
        .map(|x| {
            (
                p.x(x.t_s as f64 + 1.0),
                p.y(x.hogged_groups as f64 / groups),
            )
        })
        .collect();
    polyline(&mut out, &grp, "#8c564b", true);
    legend(&mut out, &p, 1, "#8c564b", "groups owned", true);
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">time (s)</text>\n</svg>",
        (LEFT + WIDTH - RIGHT) / 2.0,
        p.y0 + PANEL_H + 34.0
    );
    out
}
