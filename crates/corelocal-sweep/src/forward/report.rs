//! `sweep forward` results: JSON, a text line per layout, a markdown page, and an SVG bar
//! chart (forwarded pps per layout, and below it where the CPU time went on each CPU).

use crate::forward::layout::Layout;
use crate::forward::sample::{CpuWork, ThreadBusy, Window};
use crate::report::{esc, median, HostNote};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// Format tag of the JSON file.
pub const FORMAT: &str = "corelocal-sweep-forward/1";
/// A round is quiet when none of our threads waited longer than this share of the window,
/// percent, for a CPU.
pub const QUIET_WAIT_PCT: f64 = 10.0;

/// How the run was set up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForwardConfig {
    /// `netns` (the testbed) or `observe` (real interfaces, measure only).
    pub mode: String,
    /// The generator's CPU.
    pub gen_cpu: Option<usize>,
    /// Datagrams per second asked for (0 = as fast as it goes).
    pub rate: u64,
    /// Nice value of the generator and NAPI threads (0 = unchanged).
    pub nice: i32,
    /// Frame size (bytes on a wire, FCS included).
    pub frame: usize,
    /// Flows.
    pub flows: usize,
    /// Datagrams per `sendmmsg`.
    pub batch: usize,
    /// Queues per veth direction.
    pub queues: usize,
    /// Warm-up per cell, ms.
    pub warmup_ms: u64,
    /// Measured window per cell, ms.
    pub duration_ms: u64,
    /// Rounds.
    pub rounds: usize,
    /// `ip_forward` in the router.
    pub forwarding: bool,
    /// Real interfaces observed (`observe` mode): in, out.
    pub real_ifaces: Option<(String, String)>,
}

/// One round of one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Round (0-based).
    pub round: usize,
    /// Position in the run (0-based), to see drift.
    pub seq: usize,
    /// The measured window.
    pub window: Window,
    /// Packets the router sent on its egress over the cell's whole life.
    pub router_sent: u64,
    /// Packets that reached the sink's IP layer over the cell's whole life.
    pub sink_received: u64,
    /// ICMP messages the sink sent (must be 0).
    pub sink_icmp_out: u64,
    /// Packets the firewall's final rule accepted (its nft counter; `None` without firewall).
    pub firewall_accepted: Option<u64>,
    /// Run time of each NAPI thread over the cell's whole life, ns (a thread starved for the
    /// whole window still shows its work here).
    pub thread_ns: Vec<(String, u64)>,
    /// Values read back from the router's sysfs after applying the layout.
    pub applied: Vec<String>,
    /// Values read back after reverting.
    pub reverted: Vec<String>,
    /// Why reverting failed, if it did.
    pub revert_error: Option<String>,
}

/// One (layout, firewall) cell over its rounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellResult {
    /// The layout (`None` in observe mode).
    pub layout: Option<Layout>,
    /// Its name (`as-is` in observe mode).
    pub name: String,
    /// What it sets.
    pub describe: String,
    /// Firewall rules (0 = no firewall, no conntrack).
    pub firewall_rules: usize,
    /// Median forwarded pps over the rounds.
    pub forwarded_pps: Option<f64>,
    /// Lowest round.
    pub min_pps: Option<f64>,
    /// Highest round.
    pub max_pps: Option<f64>,
    /// Median offered pps (the generator's veth).
    pub offered_pps: Option<f64>,
    /// Median drops per second (all points).
    pub drops_per_s: Option<f64>,
    /// Rounds in which none of our threads waited more than [`QUIET_WAIT_PCT`] of the window
    /// for a CPU (other load on the machine barely touched them).
    pub quiet_rounds: usize,
    /// Median forwarded pps over the quiet rounds.
    pub quiet_pps: Option<f64>,
    /// Median of forwarded pps ÷ the generator's busy share: packets forwarded per second
    /// of generator CPU time. Where the generator's CPU is the bottleneck (a 2-CPU testbed)
    /// this takes out how much of that CPU other processes took, and ranks layouts by how
    /// much work they leave on the sending CPU.
    #[serde(default)]
    pub per_gen_cpu_s: Option<f64>,
    /// Per-CPU work of the median round.
    pub cpus: Vec<CpuWork>,
    /// Generator / NAPI threads of the median round.
    pub threads: Vec<ThreadBusy>,
    /// Rounds.
    pub samples: Vec<Sample>,
    /// Failed rounds.
    pub errors: Vec<String>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardReport {
    /// [`FORMAT`].
    pub format: String,
    /// The command line.
    pub command: String,
    /// Kernel, load before and after, online CPUs.
    pub host: HostNote,
    /// Setup.
    pub config: ForwardConfig,
    /// Cells, firewall-major, layouts in the order given.
    pub cells: Vec<CellResult>,
    /// Host network settings that changed during the run (must be empty).
    pub host_changed: Vec<String>,
    /// Host settings compared.
    pub host_checked: usize,
    /// The best layout per firewall load, with why.
    pub verdicts: Vec<String>,
    /// Caveats.
    pub notes: Vec<String>,
}

impl CellResult {
    /// An empty cell.
    pub fn new(layout: Option<Layout>, firewall_rules: usize) -> CellResult {
        CellResult {
            layout,
            name: layout.map_or("as-is".into(), |l| l.name().into()),
            describe: layout.map_or("the host's layout, unchanged (observe mode)".into(), |l| {
                l.describe().into()
            }),
            firewall_rules,
            forwarded_pps: None,
            min_pps: None,
            max_pps: None,
            offered_pps: None,
            drops_per_s: None,
            quiet_rounds: 0,
            quiet_pps: None,
            per_gen_cpu_s: None,
            cpus: Vec::new(),
            threads: Vec::new(),
            samples: Vec::new(),
            errors: Vec::new(),
        }
    }

    /// Fills in the medians; the per-CPU split is the median round's.
    pub fn finish(&mut self) {
        let f: Vec<f64> = self
            .samples
            .iter()
            .map(|s| s.window.forwarded_pps)
            .collect();
        self.forwarded_pps = median(&f);
        self.min_pps = f.iter().copied().reduce(f64::min);
        self.max_pps = f.iter().copied().reduce(f64::max);
        let o: Vec<f64> = self.samples.iter().map(|s| s.window.offered_pps).collect();
        self.offered_pps = median(&o);
        let dr: Vec<f64> = self
            .samples
            .iter()
            .map(|s| s.window.drops.total() as f64 / s.window.secs.max(1e-6))
            .collect();
        self.drops_per_s = median(&dr);
        let quiet: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| is_quiet(&s.window))
            .map(|s| s.window.forwarded_pps)
            .collect();
        self.quiet_rounds = quiet.len();
        self.quiet_pps = median(&quiet);
        let norm: Vec<f64> = self
            .samples
            .iter()
            .filter_map(|s| {
                let g = s.window.threads.iter().find(|t| t.name == "generator")?;
                (g.busy_pct > 5.0).then(|| s.window.forwarded_pps * 100.0 / g.busy_pct)
            })
            .collect();
        self.per_gen_cpu_s = median(&norm);
        if let Some(m) = self.forwarded_pps {
            if let Some(s) = self.samples.iter().min_by(|a, b| {
                (a.window.forwarded_pps - m)
                    .abs()
                    .total_cmp(&(b.window.forwarded_pps - m).abs())
            }) {
                self.cpus = s.window.cpus.clone();
                self.threads = s.window.threads.clone();
            }
        }
    }
}

/// Whether no thread of ours waited more than [`QUIET_WAIT_PCT`] for a CPU in `w`.
pub fn is_quiet(w: &Window) -> bool {
    w.threads.iter().all(|t| t.wait_pct <= QUIET_WAIT_PCT)
}

fn kpps(v: Option<f64>) -> String {
    v.map_or("-".into(), |p| format!("{:.1}", p / 1000.0))
}

fn cpu_brief(c: &CpuWork) -> String {
    format!(
        "CPU{} si {:.0}% sy {:.0}% us {:.0}%",
        c.cpu, c.softirq, c.sys, c.user
    )
}

/// One line per cell: forwarded pps (median, min–max), offered, drops, per-CPU split.
pub fn text(r: &ForwardReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<12} {:>5} {:>9} {:>13} {:>10} {:>8} {:>8} {:>8}  where (median round)",
        "layout", "fw", "fwd kpps", "min-max", "quiet (n)", "/gen-cpu", "offered", "drops/s"
    );
    for c in &r.cells {
        let range = match (c.min_pps, c.max_pps) {
            (Some(a), Some(b)) => format!("{:.1}-{:.1}", a / 1000.0, b / 1000.0),
            _ => "-".into(),
        };
        let cpus: Vec<String> = c.cpus.iter().map(cpu_brief).collect();
        let _ = writeln!(
            s,
            "{:<12} {:>5} {:>9} {:>13} {:>10} {:>8} {:>8} {:>8}  {}",
            c.name,
            c.firewall_rules,
            kpps(c.forwarded_pps),
            range,
            format!("{} ({})", kpps(c.quiet_pps), c.quiet_rounds),
            kpps(c.per_gen_cpu_s),
            kpps(c.offered_pps),
            c.drops_per_s.map_or("-".into(), |d| format!("{d:.0}")),
            if c.errors.is_empty() || !c.samples.is_empty() {
                cpus.join(", ")
            } else {
                format!("failed: {}", c.errors[0])
            }
        );
    }
    for v in &r.verdicts {
        let _ = writeln!(s, "{v}");
    }
    if r.host_changed.is_empty() {
        let _ = writeln!(
            s,
            "host network settings unchanged ({} sysctls and interface knobs compared)",
            r.host_checked
        );
    } else {
        let _ = writeln!(
            s,
            "WARNING: host settings changed: {}",
            r.host_changed.join("; ")
        );
    }
    for n in &r.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}

/// Where the work of a cell ran, in words.
pub fn where_it_ran(c: &CellResult) -> String {
    let busy: Vec<String> = c
        .cpus
        .iter()
        .map(|p| {
            format!(
                "CPU{}: softirq {:.0}%, sys {:.0}%, user {:.0}%, {:.0} kpps through softnet, {:.0} RPS IPIs/s",
                p.cpu,
                p.softirq,
                p.sys,
                p.user,
                p.softnet_pps / 1000.0,
                p.rps_ipis_per_s
            )
        })
        .collect();
    let threads: Vec<String> = c
        .threads
        .iter()
        .map(|t| {
            format!(
                "{} (CPU {}) {:.0}% busy, {:.0}% waiting for a CPU",
                t.name, t.cpus, t.busy_pct, t.wait_pct
            )
        })
        .collect();
    format!("{}; {}", busy.join("; "), threads.join(", "))
}

/// The best layout of each firewall load, compared with `default`.
pub fn verdicts(cells: &[CellResult]) -> Vec<String> {
    let mut loads: Vec<usize> = cells.iter().map(|c| c.firewall_rules).collect();
    loads.dedup();
    let mut out = Vec::new();
    for fw in loads {
        let group: Vec<&CellResult> = cells.iter().filter(|c| c.firewall_rules == fw).collect();
        let Some(best) = group
            .iter()
            .filter(|c| c.forwarded_pps.is_some())
            .max_by(|a, b| {
                a.forwarded_pps
                    .unwrap()
                    .total_cmp(&b.forwarded_pps.unwrap())
            })
        else {
            continue;
        };
        let bp = best.forwarded_pps.unwrap_or(0.0);
        let load = if fw == 0 {
            "no firewall".to_string()
        } else {
            format!("conntrack + {fw} nft rules")
        };
        if bp <= 0.0 {
            out.push(format!(
                "{load}: nothing was forwarded (in the testbed: ip_forward off in the router, \
                 or the generator could not send)"
            ));
            continue;
        }
        let vs = group
            .iter()
            .find(|c| c.layout == Some(Layout::Default))
            .and_then(|c| c.forwarded_pps)
            .filter(|d| *d > 0.0)
            .map_or(String::new(), |d| format!(", {:.2}x default", bp / d));
        let second = group
            .iter()
            .filter(|c| c.name != best.name)
            .filter_map(|c| c.forwarded_pps.map(|p| (c, p)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let margin = match second {
            Some((c, p)) => {
                let overlap = best.min_pps.unwrap_or(bp) <= c.max_pps.unwrap_or(p);
                format!(
                    "; next {} at {:.1} kpps{}",
                    c.name,
                    p / 1000.0,
                    if overlap {
                        " (their round ranges overlap: not a clear win)"
                    } else {
                        ""
                    }
                )
            }
            None => String::new(),
        };
        out.push(format!(
            "{load}: best {} at {:.1} kpps{vs}{margin}. Where it ran: {}",
            best.name,
            bp / 1000.0,
            where_it_ran(best)
        ));
        let mut g: Vec<(&str, f64)> = group
            .iter()
            .filter_map(|c| Some((c.name.as_str(), c.per_gen_cpu_s?)))
            .collect();
        if g.len() > 1 {
            g.sort_by(|a, b| b.1.total_cmp(&a.1));
            let list: Vec<String> = g
                .iter()
                .map(|(n, p)| format!("{n} {:.0}", p / 1000.0))
                .collect();
            out.push(format!(
                "{load}, forwarded kpps per second of generator CPU time (what each layout \
                 leaves on the sending CPU, with other processes' share taken out): {}",
                list.join(", ")
            ));
        }
        if group.iter().all(|c| c.quiet_rounds > 0) {
            let mut q: Vec<(&str, f64)> = group
                .iter()
                .filter_map(|c| Some((c.name.as_str(), c.quiet_pps?)))
                .collect();
            q.sort_by(|a, b| b.1.total_cmp(&a.1));
            let list: Vec<String> = q
                .iter()
                .map(|(n, p)| format!("{n} {:.1}", p / 1000.0))
                .collect();
            out.push(format!(
                "{load}, quiet rounds only (no thread of ours waited over {QUIET_WAIT_PCT:.0}% \
                 of the window for a CPU): {} kpps",
                list.join(", ")
            ));
        }
    }
    out
}

/// The markdown page.
pub fn markdown(r: &ForwardReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Forwarded packets per second under RPS / XPS / NAPI layouts (seed 002)\n"
    );
    let _ = writeln!(s, "Command: `{}`\n", r.command);
    let c = &r.config;
    let _ = writeln!(
        s,
        "Host: kernel {}, online CPUs {}. /proc/loadavg before: `{}`; after: `{}`.\n",
        r.host.kernel, r.host.online, r.host.load_before, r.host.load_after
    );
    if c.mode == "observe" {
        let (i, o) = c.real_ifaces.clone().unwrap_or_default();
        let _ = writeln!(
            s,
            "Observe mode: real interfaces {i} → {o}, measured only (no traffic generated, \
             nothing changed), {} round(s) × {} ms.\n",
            c.rounds, c.duration_ms
        );
    } else {
        let _ = writeln!(
            s,
            "Testbed: generator ns → router ns (ip_forward={}) → sink ns, two veth pairs of {} \
             queue(s) each, static neighbours, IPv6 off. Generator: one thread {}, sendmmsg \
             batches of {}, {} flows (destination address and port vary), {}-byte frames, {}. \
             Each cell: a fresh testbed, the layout applied and read back, {} ms warm-up, {} ms \
             measured (per-second samples), the layout reverted and read back, the testbed \
             deleted. Rounds: {}; within each round every layout runs once, the order rotated \
             by one each round, so other load on the machine falls on all layouts alike.{}\n",
            u8::from(c.forwarding),
            c.queues,
            c.gen_cpu
                .map_or("unpinned".into(), |g| format!("pinned to CPU {g}")),
            c.batch,
            c.flows,
            c.frame,
            if c.rate == 0 {
                "as fast as it goes".to_string()
            } else {
                format!("paced to {} pps", c.rate)
            },
            c.warmup_ms,
            c.duration_ms,
            c.rounds,
            if c.nice == 0 {
                String::new()
            } else {
                format!(
                    " The generator and the NAPI threads ran at nice {} (with scheduler \
                     autogroups on, this favours the NAPI kernel threads only).",
                    c.nice
                )
            }
        );
    }
    let mut loads: Vec<usize> = r.cells.iter().map(|c| c.firewall_rules).collect();
    loads.dedup();
    for fw in loads {
        let _ = writeln!(
            s,
            "## {}\n",
            if fw == 0 {
                "No firewall".to_string()
            } else {
                format!("Firewall load: conntrack + {fw} non-matching nftables rules")
            }
        );
        let _ = writeln!(
            s,
            "| layout | forwarded kpps (median) | min–max | quiet rounds: median (n) | kpps per generator CPU-second | offered kpps | drops/s | per CPU: softirq / sys / user % | softnet kpps per CPU | RPS IPIs/s, squeezes | threads: busy / waiting % |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---|---|---|---|");
        for c in r.cells.iter().filter(|c| c.firewall_rules == fw) {
            let split: Vec<String> = c
                .cpus
                .iter()
                .map(|p| format!("CPU{} {:.0}/{:.0}/{:.0}", p.cpu, p.softirq, p.sys, p.user))
                .collect();
            let sn: Vec<String> = c
                .cpus
                .iter()
                .map(|p| format!("CPU{} {:.0}", p.cpu, p.softnet_pps / 1000.0))
                .collect();
            let th: Vec<String> = c
                .threads
                .iter()
                .map(|t| {
                    format!(
                        "{} (CPU {}) {:.0}/{:.0}",
                        t.name, t.cpus, t.busy_pct, t.wait_pct
                    )
                })
                .collect();
            let ipis: Vec<String> = c
                .cpus
                .iter()
                .map(|p| format!("CPU{} {:.0}, {}", p.cpu, p.rps_ipis_per_s, p.time_squeeze))
                .collect();
            let _ = writeln!(
                s,
                "| {} | {} | {}–{} | {} ({}) | {} | {} | {} | {} | {} | {} | {} |",
                c.name,
                kpps(c.forwarded_pps),
                kpps(c.min_pps),
                kpps(c.max_pps),
                kpps(c.quiet_pps),
                c.quiet_rounds,
                kpps(c.per_gen_cpu_s),
                kpps(c.offered_pps),
                c.drops_per_s.map_or("-".into(), |d| format!("{d:.0}")),
                split.join(", "),
                sn.join(", "),
                ipis.join("; "),
                th.join(", ")
            );
        }
        let _ = writeln!(s);
        for c in r.cells.iter().filter(|c| c.firewall_rules == fw) {
            if !c.errors.is_empty() {
                let _ = writeln!(s, "- {} failed: {}", c.name, c.errors.join("; "));
            }
        }
    }
    let _ = writeln!(s, "## Verdict\n");
    for v in &r.verdicts {
        let _ = writeln!(s, "- {v}");
    }
    let _ = writeln!(s, "\n## Layouts\n");
    let mut seen = Vec::new();
    for c in &r.cells {
        if !seen.contains(&c.name) {
            let _ = writeln!(s, "- `{}`: {}", c.name, c.describe);
            seen.push(c.name.clone());
        }
    }
    let _ = writeln!(s, "\n## Checks\n");
    if r.host_changed.is_empty() {
        let _ = writeln!(
            s,
            "- Host network settings unchanged ({} sysctls under /proc/sys/net and interface \
             rps_cpus/xps_cpus/threaded values compared before and after).",
            r.host_checked
        );
    } else {
        let _ = writeln!(s, "- HOST SETTINGS CHANGED: {}", r.host_changed.join("; "));
    }
    let sent: u64 = r
        .cells
        .iter()
        .flat_map(|c| &c.samples)
        .map(|x| x.router_sent)
        .sum();
    let got: u64 = r
        .cells
        .iter()
        .flat_map(|c| &c.samples)
        .map(|x| x.sink_received)
        .sum();
    let icmp: u64 = r
        .cells
        .iter()
        .flat_map(|c| &c.samples)
        .map(|x| x.sink_icmp_out)
        .sum();
    if c.mode != "observe" {
        let _ = writeln!(
            s,
            "- The router sent {sent} packets in all; the sink's IP layer received {got}; the \
             sink sent {icmp} ICMP messages."
        );
        let bad = r
            .cells
            .iter()
            .flat_map(|c| &c.samples)
            .filter(|x| x.revert_error.is_some())
            .count();
        let _ = writeln!(
            s,
            "- Every layout was read back from the router's sysfs after applying; {} revert(s) \
             failed to read back as before.",
            bad
        );
    }
    for n in &r.notes {
        let _ = writeln!(s, "- {n}");
    }
    s
}

const COLORS: [(&str, &str); 3] = [
    ("softirq", "#c0392b"),
    ("sys", "#e67e22"),
    ("user", "#2980b9"),
];

/// The bar chart: top, forwarded kpps per cell (median bar, min–max whisker); bottom, for each
/// cell one stacked bar per CPU (softirq, sys, user % of that CPU).
pub fn svg(r: &ForwardReport) -> String {
    let cells: Vec<&CellResult> = r.cells.iter().collect();
    let ncpu = cells.iter().map(|c| c.cpus.len()).max().unwrap_or(1).max(1);
    let slot = (24.0 * ncpu as f64 + 30.0).max(70.0);
    let (ml, mr, mt) = (70.0, 20.0, 50.0);
    let (top_h, gap, bot_h, mb) = (240.0, 120.0, 140.0, 90.0);
    let w = (ml + mr + slot * cells.len() as f64).max(640.0);
    let h = mt + top_h + gap + bot_h + mb;
    let best = cells
        .iter()
        .flat_map(|c| [c.max_pps, c.per_gen_cpu_s])
        .flatten()
        .fold(0.0_f64, f64::max)
        .max(1.0);
    let scale = nice_ceiling(best / 1000.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="{w:.0}" height="{h:.0}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{:.0}" y="22" text-anchor="middle" font-size="15">Forwarded packets/s by router layout (median of rounds, whisker = min–max)</text>"#,
        w / 2.0
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.0}" y="40" text-anchor="middle" font-size="11">dashed outline: forwarded kpps per second of generator CPU time (other processes' share taken out)</text>"#,
        w / 2.0
    );
    // Top axis.
    let y0 = mt + top_h;
    for i in 0..=4 {
        let v = scale * i as f64 / 4.0;
        let y = y0 - top_h * i as f64 / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{ml}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
            w - mr,
            ml - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.1}" transform="rotate(-90 16 {:.1})" text-anchor="middle">kpps forwarded</text>"#,
        mt + top_h / 2.0,
        mt + top_h / 2.0
    );
    let y_of = |kp: f64| y0 - top_h * (kp / scale).min(1.0);
    for (i, c) in cells.iter().enumerate() {
        let x = ml + slot * i as f64;
        let bw = slot * 0.6;
        let bx = x + (slot - bw) / 2.0;
        if let Some(g) = c.per_gen_cpu_s {
            let y = y_of(g / 1000.0);
            let _ = writeln!(
                s,
                r##"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#555" stroke-dasharray="4 3"><title>{:.0} kpps per second of generator CPU</title></rect>"##,
                bx - 3.0,
                bw + 6.0,
                y0 - y,
                g / 1000.0
            );
        }
        if let Some(p) = c.forwarded_pps {
            let y = y_of(p / 1000.0);
            let fill = if c.firewall_rules == 0 {
                "#4292c6"
            } else {
                "#807dba"
            };
            let _ = writeln!(
                s,
                r#"<rect x="{bx:.1}" y="{y:.1}" width="{bw:.1}" height="{:.1}" fill="{fill}"/>"#,
                y0 - y
            );
            let top = c.max_pps.map_or(y, |m| y_of(m / 1000.0));
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{:.0}</text>"#,
                x + slot / 2.0,
                top - 4.0,
                p / 1000.0
            );
        }
        if let (Some(a), Some(b)) = (c.min_pps, c.max_pps) {
            let (ya, yb) = (y_of(a / 1000.0), y_of(b / 1000.0));
            let cx = x + slot / 2.0;
            let _ = writeln!(
                s,
                r##"<path d="M{cx:.1} {ya:.1}V{yb:.1}M{:.1} {ya:.1}h8M{:.1} {yb:.1}h8" stroke="#222" fill="none"/>"##,
                cx - 4.0,
                cx - 4.0
            );
        }
        let label = if c.firewall_rules == 0 {
            c.name.clone()
        } else {
            format!("{} fw{}", c.name, c.firewall_rules)
        };
        let ly = y0 + 14.0;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{ly:.1}" text-anchor="end" transform="rotate(-30 {:.1} {ly:.1})">{}</text>"#,
            x + slot / 2.0 + 4.0,
            x + slot / 2.0 + 4.0,
            esc(&label)
        );
        // Bottom: per-CPU stacked busy.
        let by0 = y0 + gap + bot_h;
        let cw = ((slot - 10.0) / ncpu as f64).min(22.0);
        for (k, p) in c.cpus.iter().enumerate() {
            let cx = x + 5.0 + cw * k as f64 + (slot - 10.0 - cw * ncpu as f64) / 2.0;
            let mut top = by0;
            for (name, color) in COLORS {
                let v = match name {
                    "softirq" => p.softirq,
                    "sys" => p.sys,
                    _ => p.user,
                }
                .clamp(0.0, 100.0);
                let hh = bot_h * v / 100.0;
                top -= hh;
                let _ = writeln!(
                    s,
                    r#"<rect x="{cx:.1}" y="{top:.1}" width="{:.1}" height="{hh:.1}" fill="{color}"><title>CPU{} {name} {v:.0}%</title></rect>"#,
                    cw - 2.0,
                    p.cpu
                );
            }
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="9">{}</text>"#,
                cx + (cw - 2.0) / 2.0,
                by0 + 11.0,
                p.cpu
            );
        }
    }
    let by0 = y0 + gap + bot_h;
    let _ = writeln!(
        s,
        r##"<line x1="{ml}" y1="{by0:.1}" x2="{:.1}" y2="{by0:.1}" stroke="#999"/><line x1="{ml}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">100%</text><text x="{:.1}" y="{:.1}" text-anchor="end">0%</text>"##,
        w - mr,
        by0 - bot_h,
        w - mr,
        by0 - bot_h,
        ml - 6.0,
        by0 - bot_h + 4.0,
        ml - 6.0,
        by0 + 4.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.1}" transform="rotate(-90 16 {:.1})" text-anchor="middle">busy per CPU</text>"#,
        by0 - bot_h / 2.0,
        by0 - bot_h / 2.0
    );
    let mut lx = ml;
    let ly = by0 + 34.0;
    for (name, color) in COLORS {
        let _ = writeln!(
            s,
            r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="12" fill="{color}"/><text x="{:.1}" y="{ly:.1}">{name}</text>"#,
            ly - 10.0,
            lx + 16.0
        );
        lx += 80.0;
    }
    let _ = writeln!(
        s,
        r#"<text x="{lx:.1}" y="{ly:.1}">per CPU (number under each bar), /proc/stat of the median round; threaded NAPI polls count as sys</text>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{ml}" y="{:.1}" font-size="10">{}</text>"#,
        ly + 20.0,
        esc(&format!(
            "{} round(s) × {} ms, {}-byte frames, {} flows, load before {}",
            r.config.rounds,
            r.config.duration_ms,
            r.config.frame,
            r.config.flows,
            r.host.load_before
        ))
    );
    s.push_str("</svg>\n");
    s
}

/// 1, 2, 2.5, 5 × 10^k at or above `v`.
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::sample::Drops;

    fn sample(pps: f64, cpus: usize) -> Sample {
        Sample {
            round: 0,
            seq: 0,
            window: Window {
                secs: 2.0,
                forwarded_pps: pps,
                per_second: vec![pps, pps],
                offered_pps: pps * 1.1,
                received_pps: pps,
                generated_pps: pps * 1.1,
                sink_pps: pps,
                conntrack_entries: 0,
                drops: Drops {
                    gen_tx_dropped: 10,
                    ..Default::default()
                },
                cpus: (0..cpus)
                    .map(|c| CpuWork {
                        cpu: c,
                        softirq: 30.0,
                        sys: 20.0,
                        user: 10.0,
                        ..Default::default()
                    })
                    .collect(),
                threads: vec![],
            },
            router_sent: 100,
            sink_received: 100,
            sink_icmp_out: 0,
            firewall_accepted: None,
            thread_ns: vec![],
            applied: vec![],
            reverted: vec![],
            revert_error: None,
        }
    }

    fn report() -> ForwardReport {
        let mut cells = Vec::new();
        for (l, p) in [(Layout::Default, 300e3), (Layout::RpsOther, 600e3)] {
            let mut c = CellResult::new(Some(l), 0);
            c.samples = vec![sample(p, 2), sample(p * 1.02, 2), sample(p * 0.98, 2)];
            c.finish();
            cells.push(c);
        }
        let mut failed = CellResult::new(Some(Layout::Xps), 0);
        failed.errors.push("boom".into());
        failed.finish();
        cells.push(failed);
        ForwardReport {
            format: FORMAT.into(),
            command: "corelocal sweep forward".into(),
            host: HostNote {
                kernel: "6.18".into(),
                load_before: "1.00 1.00 1.00 1/100 1".into(),
                load_after: String::new(),
                online: "0-1".into(),
            },
            config: ForwardConfig {
                mode: "netns".into(),
                gen_cpu: Some(0),
                rate: 0,
                nice: 0,
                frame: 64,
                flows: 256,
                batch: 64,
                queues: 2,
                warmup_ms: 1000,
                duration_ms: 3000,
                rounds: 3,
                forwarding: true,
                real_ifaces: None,
            },
            verdicts: verdicts(&cells),
            cells,
            host_changed: vec![],
            host_checked: 10,
            notes: vec![],
        }
    }

    #[test]
    fn medians_range_and_verdict() {
        let r = report();
        let c = &r.cells[1];
        assert_eq!(c.forwarded_pps, Some(600e3));
        assert_eq!(c.min_pps, Some(588e3));
        assert_eq!(c.max_pps, Some(612e3));
        assert_eq!(c.drops_per_s, Some(5.0));
        assert_eq!(c.cpus.len(), 2);
        assert!(r.verdicts[0].contains("best rps-other at 600.0 kpps, 2.00x default"));
        let t = text(&r);
        assert_eq!(t.lines().filter(|l| l.starts_with("rps-other")).count(), 1);
        assert!(t.contains("failed: boom"), "{t}");
        assert!(t.contains("host network settings unchanged"));
        let md = markdown(&r);
        assert!(md.contains("| rps-other | 600.0 | 588.0–612.0 |"), "{md}");
        assert!(md.contains("1.00 1.00 1.00"));
    }

    #[test]
    fn svg_has_a_bar_per_cell_and_a_stack_per_cpu() {
        let r = report();
        let s = svg(&r);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(
            s.matches("fill=\"#4292c6\"").count(),
            2,
            "two measured cells"
        );
        assert_eq!(
            s.matches("<title>CPU").count(),
            2 * 2 * 3,
            "cells × CPUs × parts"
        );
        assert_eq!(nice_ceiling(612.0), 1000.0);
        assert_eq!(nice_ceiling(180.0), 200.0);
    }
}
