//! The sweep's result: JSON matrix, a text table, and an SVG heatmap in the style of seed
//! 003's Figure 4 (flow CPU across, application CPU up, bubble area ∝ throughput, boxes
//! around the socket quadrants).

use crate::cell::{CellConfig, Sample};
use crate::placement::{self, Cell, ClassSummary, Recommendation, Relation};
use corelocal::cpu::Topology;
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// Format tag of the JSON file.
pub const FORMAT: &str = "corelocal-sweep/1";

/// One cell's results.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CellResult {
    /// Flow (protocol processing) CPU.
    pub flow_cpu: usize,
    /// Application CPU.
    pub app_cpu: usize,
    /// How they relate.
    pub relation: Relation,
    /// Median over the samples, Gbit/s (None: every sample failed).
    pub gbps: Option<f64>,
    /// Each round's measurement.
    pub samples: Vec<Sample>,
    /// Errors of failed rounds.
    pub errors: Vec<String>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// [`FORMAT`].
    pub format: String,
    /// The command line.
    pub command: String,
    /// `veth-rps` or `nic-irq`.
    pub mode: String,
    /// Kernel release, load averages before and after.
    pub host: HostNote,
    /// The matrix CPUs in axis order.
    pub cpus: Vec<usize>,
    /// (package, CPUs) of the axis.
    pub packages: Vec<(u32, Vec<usize>)>,
    /// Rounds per cell.
    pub rounds: usize,
    /// Transfer parameters.
    pub config: CellConfig,
    /// Cells, flow-major in axis order.
    pub cells: Vec<CellResult>,
    /// Throughput per relation class.
    pub classes: Vec<ClassSummary>,
    /// What it recommends.
    pub recommendation: Recommendation,
    /// Caveats about this run (e.g. the sender shared the matrix CPUs).
    pub notes: Vec<String>,
}

/// Facts about the host at run time.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostNote {
    /// `uname -r`.
    pub kernel: String,
    /// /proc/loadavg before the first cell.
    pub load_before: String,
    /// /proc/loadavg after the last cell.
    pub load_after: String,
    /// Online CPUs.
    pub online: String,
}

/// Median of `v` (None when empty).
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Fills in each cell's median, the class summary and the recommendation.
pub fn finish(topo: &Topology, report: &mut Report) {
    for c in &mut report.cells {
        let g: Vec<f64> = c.samples.iter().map(|s| s.gbps).collect();
        c.gbps = median(&g);
    }
    let done: Vec<(Cell, f64)> = report
        .cells
        .iter()
        .filter_map(|c| {
            Some((
                Cell {
                    flow: c.flow_cpu,
                    app: c.app_cpu,
                },
                c.gbps?,
            ))
        })
        .collect();
    report.classes = placement::summarize(topo, &done);
    report.recommendation = placement::recommend(topo, &done);
}

fn cell(r: &Report, flow: usize, app: usize) -> Option<&CellResult> {
    r.cells
        .iter()
        .find(|c| c.flow_cpu == flow && c.app_cpu == app)
}

/// The matrix as text: rows = application CPU (top row highest, as in the figure), columns =
/// flow CPU, Gbit/s; then per-cell details and the classes.
pub fn text(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Gbit/s   (rows: application CPU, columns: flow CPU)");
    let _ = write!(s, "app\\flow");
    for f in &r.cpus {
        let _ = write!(s, "{f:>9}");
    }
    let _ = writeln!(s);
    for a in r.cpus.iter().rev() {
        let _ = write!(s, "{a:>8}");
        for f in &r.cpus {
            let v = cell(r, *f, *a).and_then(|c| c.gbps);
            let _ = write!(s, "{:>9}", v.map_or("-".into(), |g| format!("{g:.2}")));
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "\nflow app relation      Gbit/s  recv-busy% softirq%(flow) sys%(app) retrans drops"
    );
    for c in &r.cells {
        let last = c.samples.last();
        let soft = last
            .and_then(|x| x.cpus.iter().find(|p| p.cpu == c.flow_cpu))
            .map_or(0.0, |p| p.softirq);
        let sys = last
            .and_then(|x| x.cpus.iter().find(|p| p.cpu == c.app_cpu))
            .map_or(0.0, |p| p.sys);
        let _ = writeln!(
            s,
            "{:>4} {:>3} {:<13} {:>7} {:>10.0} {:>14.0} {:>9.0} {:>7} {:>5}",
            c.flow_cpu,
            c.app_cpu,
            format!("{:?}", c.relation),
            c.gbps.map_or("-".into(), |g| format!("{g:.2}")),
            last.map_or(0.0, |x| x.receiver_busy_pct),
            soft,
            sys,
            c.samples.iter().map(|x| x.retrans_segs).sum::<u64>(),
            c.samples
                .iter()
                .flat_map(|x| x.cpus.iter().map(|p| p.softnet_drops))
                .sum::<u64>()
        );
    }
    let _ = writeln!(
        s,
        "\nclass                          cells  mean Gbit/s  vs best"
    );
    for c in &r.classes {
        let _ = writeln!(
            s,
            "{:<30} {:>5} {:>12.2} {:>8.2}",
            c.relation.describe(),
            c.cells,
            c.mean_gbps,
            c.ratio_to_best
        );
    }
    let _ = writeln!(s, "\n{}", r.recommendation.text);
    for n in &r.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}

/// `t` escaped for SVG/XML text.
pub fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Fill colour for a fraction of the best throughput (white → dark blue).
fn shade(frac: f64) -> String {
    let f = frac.clamp(0.0, 1.0);
    let lerp = |a: f64, b: f64| (a + (b - a) * f).round() as u8;
    format!(
        "#{:02x}{:02x}{:02x}",
        lerp(247.0, 8.0),
        lerp(251.0, 69.0),
        lerp(255.0, 148.0)
    )
}

/// The heatmap: a square per cell shaded by throughput, a bubble of area ∝ throughput, the
/// value, the diagonal (same CPU) outlined, and dashed boxes for each (flow socket, app
/// socket) quadrant when there are several sockets.
pub fn svg(r: &Report) -> String {
    let n = r.cpus.len().max(1);
    let cs = (480.0 / n as f64).clamp(28.0, 130.0);
    let (ml, mt, mb, mr) = (80.0, 60.0, 110.0, 30.0);
    let w = (ml + cs * n as f64 + mr).max(680.0);
    let h = mt + cs * n as f64 + mb;
    let best = r
        .cells
        .iter()
        .filter_map(|c| c.gbps)
        .fold(0.0_f64, f64::max);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w:.0}" height="{h:.0}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{:.0}" y="24" text-anchor="middle" font-size="15">Throughput (Gbit/s) by flow and application affinity</text>"#,
        w / 2.0
    );
    let x = |i: usize| ml + cs * i as f64;
    let y = |i: usize| mt + cs * (n - 1 - i) as f64;
    for (fi, f) in r.cpus.iter().enumerate() {
        for (ai, a) in r.cpus.iter().enumerate() {
            cell_svg(&mut s, cell(r, *f, *a), (x(fi), y(ai)), cs, best);
        }
    }
    for i in 0..n {
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{cs:.1}" height="{cs:.1}" fill="none" stroke="#c0392b" stroke-width="2"/>"##,
            x(i),
            y(i)
        );
    }
    axes_svg(&mut s, r, cs, (ml, mt), n);
    quadrants_svg(&mut s, r, cs, (ml, mt), n);
    let _ = writeln!(
        s,
        r#"<text x="{ml}" y="{:.0}" font-size="11">{}</text>"#,
        h - 38.0,
        esc(&format!(
            "best {best:.2} Gbit/s; bubble area ∝ throughput; outlined: same CPU; {} round(s) × {:.1} s, {} flow(s)",
            r.rounds,
            r.config.duration_ms as f64 / 1000.0,
            r.config.flows
        ))
    );
    let rec = r
        .recommendation
        .relation
        .map_or("none".to_string(), |x| x.describe().to_string());
    let _ = writeln!(
        s,
        r#"<text x="{ml}" y="{:.0}" font-size="11">{}</text>"#,
        h - 20.0,
        esc(&format!(
            "recommendation: application on {rec}{}",
            if r.recommendation.clear {
                ""
            } else {
                " (within noise)"
            }
        ))
    );
    s.push_str("</svg>\n");
    s
}

fn cell_svg(s: &mut String, c: Option<&CellResult>, (x, y): (f64, f64), cs: f64, best: f64) {
    let g = c.and_then(|c| c.gbps);
    let frac = g.map_or(0.0, |g| if best > 0.0 { g / best } else { 0.0 });
    let _ = writeln!(
        s,
        r##"<rect x="{x:.1}" y="{y:.1}" width="{cs:.1}" height="{cs:.1}" fill="{}" stroke="#999" stroke-width="1"/>"##,
        shade(frac * 0.35)
    );
    let Some(g) = g else {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">–</text>"#,
            x + cs / 2.0,
            y + cs / 2.0 + 4.0
        );
        return;
    };
    let radius = (cs * 0.42) * frac.sqrt();
    let _ = writeln!(
        s,
        r##"<circle cx="{:.1}" cy="{:.1}" r="{radius:.1}" fill="#4292c6" fill-opacity="0.75"/>"##,
        x + cs / 2.0,
        y + cs / 2.0
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="{:.0}">{g:.1}</text>"#,
        x + cs / 2.0,
        y + cs / 2.0 + 4.0,
        (cs / 4.0).clamp(9.0, 13.0)
    );
}

fn axes_svg(s: &mut String, r: &Report, cs: f64, (ml, mt): (f64, f64), n: usize) {
    for (i, c) in r.cpus.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{c}</text>"#,
            ml + cs * (i as f64 + 0.5),
            mt + cs * n as f64 + 16.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{c}</text>"#,
            ml - 8.0,
            mt + cs * ((n - 1 - i) as f64 + 0.5) + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">flow affinity (CPU doing receive protocol processing)</text>"#,
        ml + cs * n as f64 / 2.0,
        mt + cs * n as f64 + 36.0
    );
    let cy = mt + cs * n as f64 / 2.0;
    let _ = writeln!(
        s,
        r#"<text x="22" y="{cy:.1}" text-anchor="middle" transform="rotate(-90 22 {cy:.1})">application affinity (receiver CPU)</text>"#
    );
}

fn quadrants_svg(s: &mut String, r: &Report, cs: f64, (ml, mt): (f64, f64), n: usize) {
    if r.packages.len() < 2 {
        return;
    }
    let mut start = 0;
    let spans: Vec<(u32, usize, usize)> = r
        .packages
        .iter()
        .map(|(p, cpus)| {
            let span = (*p, start, cpus.len());
            start += cpus.len();
            span
        })
        .collect();
    for (fp, fs, fl) in &spans {
        for (ap, as_, al) in &spans {
            let x = ml + cs * *fs as f64;
            let y = mt + cs * (n - as_ - al) as f64;
            let _ = writeln!(
                s,
                r##"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#333" stroke-width="2" stroke-dasharray="6 3"/>"##,
                cs * *fl as f64,
                cs * *al as f64
            );
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#333">flow s{fp} / app s{ap}</text>"##,
                x + 3.0,
                y + 11.0
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(cpus: Vec<usize>, packages: Vec<(u32, Vec<usize>)>) -> Report {
        let cells = cpus
            .iter()
            .flat_map(|&f| {
                cpus.iter().map(move |&a| CellResult {
                    flow_cpu: f,
                    app_cpu: a,
                    relation: if f == a {
                        Relation::SameCpu
                    } else {
                        Relation::SameLlc
                    },
                    gbps: (f != 3).then_some(10.0 + (f * 4 + a) as f64),
                    samples: vec![],
                    errors: vec![],
                })
            })
            .collect();
        Report {
            format: FORMAT.into(),
            command: "corelocal sweep".into(),
            mode: "veth-rps".into(),
            host: HostNote {
                kernel: "6.18".into(),
                load_before: String::new(),
                load_after: String::new(),
                online: "0-3".into(),
            },
            cpus,
            packages,
            rounds: 1,
            config: CellConfig {
                duration_ms: 2000,
                warmup_ms: 500,
                flows: 1,
                write_size: 1 << 18,
                read_size: 1 << 18,
                sender_cpu: None,
                port: 5201,
            },
            cells,
            classes: vec![],
            recommendation: Recommendation {
                relation: Some(Relation::SameLlc),
                clear: true,
                example: None,
                untestable: vec![],
                text: "x".into(),
            },
            notes: vec![],
        }
    }

    #[test]
    fn svg_has_a_cell_per_pair_quadrants_and_balanced_tags() {
        let r = report(vec![0, 1, 2, 3], vec![(0, vec![0, 1]), (1, vec![2, 3])]);
        let s = svg(&r);
        assert_eq!(
            s.matches("<rect x=").count(),
            16 + 4 + 4,
            "16 cells + 4 diagonal outlines + 4 quadrant boxes"
        );
        assert_eq!(s.matches("<circle").count(), 12, "flow CPU 3 cells failed");
        assert_eq!(s.matches("stroke-width=\"2\" stroke-dasharray").count(), 4);
        assert!(s.contains("flow s1 / app s0"));
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        let one = report(vec![0, 1], vec![(0, vec![0, 1])]);
        assert!(
            !svg(&one).contains("stroke-dasharray"),
            "one socket: no quadrants"
        );
    }

    #[test]
    fn text_table_and_median() {
        let r = report(vec![0, 1], vec![(0, vec![0, 1])]);
        let t = text(&r);
        let rows: Vec<&str> = t.lines().collect();
        assert!(
            rows[2].trim_start().starts_with('1'),
            "top row is the highest app CPU: {t}"
        );
        assert!(
            rows[2].contains("11.00") && rows[2].contains("15.00"),
            "{t}"
        );
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(shade(0.0), "#f7fbff");
    }
}
