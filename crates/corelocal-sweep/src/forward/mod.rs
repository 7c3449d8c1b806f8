//! `corelocal sweep forward`: seed 002's own workload — packets forwarded per second by a
//! Linux router under different RPS / XPS / IRQ (threaded NAPI) layouts.
//!
//! Each cell builds a fresh testbed in namespaces this process creates ([`testbed`]), applies
//! one layout to the router namespace with corelocal-tune and reads it back ([`layout`]),
//! sends small UDP datagrams from a pinned `sendmmsg` thread ([`gen`]), samples counters once
//! a second like the seed's ifstat2 ([`sample`]), reverts the layout and reads that back,
//! and deletes the testbed. Rounds alternate the layouts, so other load on the host falls on
//! all of them alike; each layout's result is the median of its rounds ([`report`]).
//!
//! `--real-ifaces IN,OUT` measures a real router's interfaces instead: nothing is generated
//! and nothing is changed.

pub mod gen;
pub mod layout;
pub mod report;
pub mod sample;
pub mod testbed;

use crate::forward::layout::{Layout, NapiThread};
use crate::forward::report::{CellResult, ForwardConfig, ForwardReport, Sample};
use crate::forward::sample::{Names, NsFiles, Point, Reader, Window};
use crate::forward::testbed::{HostNet, Testbed, TestbedSpec};
use crate::report::HostNote;
use crate::{parse_duration, sys, SweepError};
use corelocal::cpu::{CpuSet, Topology};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The most rounds.
pub const ROUNDS_MAX: u16 = 50;
/// The longest warm-up or window.
pub const WINDOW_MAX: Duration = Duration::from_secs(600);

const EXAMPLES: &str = "\
Examples:
  corelocal sweep forward                              # 6 layouts × 3 rounds, ~1.5 min
  corelocal sweep forward --firewall 0,200 --rounds 5 -o results/sweep/sweep-forward
  corelocal sweep forward --layouts default,rps-other --duration 5s --rate 400k
  corelocal sweep forward --gen-cpu 1 --flows 1024 --frame 128
  # A real router (measure only: no traffic generated, nothing changed):
  corelocal sweep forward --real-ifaces eth1,eth2 --duration 10s --rounds 3

Layouts: default (nothing set), rps-other (RPS to the CPUs other than the generator's),
rps-spread (RPS to all CPUs), xps (rps-spread + XPS per CPU on the egress), napi-other
(threaded NAPI on the ingress veth, threads on the other CPUs: the veth's IRQ affinity),
napi-spread (RX queue q's NAPI thread on CPU q).

Needs root. Namespaces clfwd-PID-N-{g,r,s} are deleted after each cell, also on errors
and SIGINT/SIGTERM; the host's network sysctls and interface knobs are compared before and
after. Exit codes: 0 every cell measured, something forwarded, everything restored; 1
otherwise; 2 bad flags.";

/// `corelocal sweep forward` arguments.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct Command {
    /// Layouts, comma-separated, or `all`: default, rps-other, rps-spread, xps, napi-other,
    /// napi-spread.
    #[arg(long, default_value = "all", value_name = "LIST")]
    pub layouts: String,
    /// Firewall loads, comma-separated rule counts: 0 = none; N = conntrack plus N
    /// non-matching nftables rules in the router's forward hook (needs nft).
    #[arg(long, default_value = "0", value_name = "LIST")]
    pub firewall: String,
    /// Rounds; each layout's result is the median of its rounds.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=ROUNDS_MAX as i64))]
    pub rounds: u16,
    /// Measured window per cell (e.g. 3s, 500ms).
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Unmeasured ramp-up per cell.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Generator CPU: a number, `auto` (the first online CPU) or `none` (not pinned).
    #[arg(long, default_value = "auto", value_name = "CPU|auto|none")]
    pub gen_cpu: String,
    /// Datagrams per second (e.g. 300k, 1.5M); 0 = as fast as the generator goes.
    #[arg(long, default_value = "0", value_parser = parse_rate)]
    pub rate: u64,
    /// Flows (distinct destination address and port).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=gen::FLOWS_MAX as i64))]
    pub flows: u32,
    /// Frame size in bytes as on a wire, FCS included (64 = 18 bytes of UDP payload).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(gen::FRAME_MIN as i64..=gen::FRAME_MAX as i64))]
    pub frame: u16,
    /// Datagrams per sendmmsg call.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=gen::BATCH_MAX as i64))]
    pub batch: u16,
    /// Nice value (-20..19) of the generator and NAPI threads (0 leaves them as they are).
    /// With kernel.sched_autogroup_enabled=1 a nice value only counts inside its session, so
    /// it helps the NAPI kernel threads against other sessions but not the generator: the
    /// layouts are then no longer compared on equal terms.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(-20..=19))]
    pub nice: i32,
    /// Queues per direction of each veth (default: the number of online CPUs).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=testbed::QUEUES_MAX as i64))]
    pub queues: Option<u16>,
    /// Output prefix: writes PREFIX.json, PREFIX.md and PREFIX.svg.
    #[arg(short, long, default_value = "sweep-forward", value_name = "PREFIX")]
    pub out: PathBuf,
    /// Print the JSON report on stdout instead of the lines.
    #[arg(long)]
    pub json: bool,
    /// Measure a real router's interfaces IN,OUT instead of the testbed: forwarded pps (OUT
    /// tx_packets), drops, per-CPU softirq and softnet. Generates no traffic and changes no
    /// setting; apply layouts with `corelocal tune` between runs.
    #[arg(long, value_name = "IN,OUT")]
    pub real_ifaces: Option<String>,
    /// Re-render a saved run: read FILE (a PREFIX.json written before), recompute the
    /// medians and the verdict, write PREFIX.{json,md,svg} for -o; nothing is measured.
    #[arg(long, value_name = "FILE")]
    pub from_json: Option<PathBuf>,
    /// Test hook: leave ip_forward off in the router (nothing must be forwarded).
    #[arg(long, hide = true)]
    pub no_ip_forward: bool,
}

/// Parses a rate: a number with an optional k or M suffix (powers of 1000).
pub fn parse_rate(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1e3),
        Some((i, 'm' | 'M')) => (&t[..i], 1e6),
        _ => (t, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("bad rate {text:?} (e.g. 0, 250000, 300k, 1.5M)"))?;
    let r = v * mult;
    if !r.is_finite() || !(0.0..=1e9).contains(&r) {
        return Err(format!("rate {text:?} out of range (0 to 1G)"));
    }
    Ok(r.round() as u64)
}

/// Parses the firewall list (`0,200`).
pub fn parse_firewall(text: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for p in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let n: usize = p
            .parse()
            .map_err(|_| format!("--firewall: {p:?} is not a rule count"))?;
        if n > testbed::FIREWALL_RULES_MAX {
            return Err(format!(
                "--firewall: at most {} rules",
                testbed::FIREWALL_RULES_MAX
            ));
        }
        if !out.contains(&n) {
            out.push(n);
        }
    }
    if out.is_empty() {
        return Err("--firewall: give at least one count (0 = no firewall)".into());
    }
    Ok(out)
}

/// Everything a run needs, checked.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Layouts in order.
    pub layouts: Vec<Layout>,
    /// Firewall loads.
    pub firewall: Vec<usize>,
    /// Online CPUs (the router's).
    pub cpus: CpuSet,
    /// The report's configuration block.
    pub config: ForwardConfig,
}

/// Checks the flags against the host (nothing is changed).
pub fn setup(cmd: &Command, topo: &Topology) -> Result<Setup, SweepError> {
    let input = SweepError::Input;
    let layouts =
        layout::parse_layouts(&cmd.layouts).map_err(|e| input(format!("--layouts: {e}")))?;
    let firewall = parse_firewall(&cmd.firewall).map_err(input)?;
    for (name, d) in [("--duration", cmd.duration), ("--warmup", cmd.warmup)] {
        if d > WINDOW_MAX {
            return Err(input(format!("{name} is at most 600s")));
        }
    }
    let cpus = topo.online.clone();
    let gen_cpu = match cmd.gen_cpu.as_str() {
        "auto" => cpus.iter().next(),
        "none" => None,
        n => {
            let c: usize = n
                .parse()
                .map_err(|_| input(format!("--gen-cpu {n:?}: a CPU, auto or none")))?;
            if !cpus.contains(c) {
                return Err(input(format!("--gen-cpu {c} is not online")));
            }
            Some(c)
        }
    };
    let real = match &cmd.real_ifaces {
        Some(s) => {
            let (i, o) = s
                .split_once(',')
                .ok_or_else(|| input("--real-ifaces IN,OUT".into()))?;
            for n in [i, o] {
                corelocal_tune::knob::check_ifname(n)
                    .map_err(|e| input(format!("--real-ifaces: {e}")))?;
            }
            Some((i.to_string(), o.to_string()))
        }
        None => None,
    };
    let queues = cmd
        .queues
        .map_or(cpus.len().clamp(1, testbed::QUEUES_MAX), usize::from);
    Ok(Setup {
        layouts,
        firewall,
        cpus,
        config: ForwardConfig {
            mode: if real.is_some() { "observe" } else { "netns" }.into(),
            gen_cpu,
            rate: cmd.rate,
            nice: cmd.nice,
            frame: usize::from(cmd.frame),
            flows: cmd.flows as usize,
            batch: usize::from(cmd.batch),
            queues,
            warmup_ms: cmd.warmup.as_millis() as u64,
            duration_ms: cmd.duration.as_millis() as u64,
            rounds: usize::from(cmd.rounds),
            forwarding: !cmd.no_ip_forward,
            real_ifaces: real,
        },
    })
}

/// Runs `corelocal sweep forward`.
pub fn run(cmd: Command) -> ExitCode {
    if let Some(path) = &cmd.from_json {
        return match rerender(path).and_then(|r| write_outputs(&cmd, &r).map(|_| r)) {
            Ok(r) if complete(&r) => ExitCode::SUCCESS,
            Ok(_) => ExitCode::from(1),
            Err(e) => {
                eprintln!("corelocal sweep forward: {e}");
                ExitCode::from(2)
            }
        };
    }
    let result = sys::install_stop_handler()
        .map_err(|e| SweepError::Failed(format!("signals: {e}")))
        .and_then(|_| {
            Topology::read(Path::new("/")).map_err(|e| SweepError::Failed(format!("topology: {e}")))
        })
        .and_then(|topo| forward(&cmd, &topo))
        .and_then(|r| write_outputs(&cmd, &r).map(|_| r));
    match result {
        Ok(r) => {
            if complete(&r) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("corelocal sweep forward: {e}");
            match e {
                SweepError::Input(_) => ExitCode::from(2),
                SweepError::Failed(_) => ExitCode::from(1),
            }
        }
    }
}

/// Reads a saved report and recomputes its summaries (medians, quiet rounds, verdicts).
pub fn rerender(path: &Path) -> Result<ForwardReport, SweepError> {
    let mut r: ForwardReport = corelocal_tune::load_json(path, "sweep forward report")
        .map_err(|e| SweepError::Input(e.to_string()))?;
    if r.format != report::FORMAT {
        return Err(SweepError::Input(format!(
            "{}: format {:?}, not {:?}",
            path.display(),
            r.format,
            report::FORMAT
        )));
    }
    for c in &mut r.cells {
        c.finish();
    }
    r.verdicts = report::verdicts(&r.cells);
    Ok(r)
}

/// Whether every cell was measured, forwarded something, and was restored.
pub fn complete(r: &ForwardReport) -> bool {
    r.host_changed.is_empty()
        && r.cells.iter().all(|c| {
            c.errors.is_empty()
                && c.forwarded_pps.is_some_and(|p| p > 0.0)
                && c.samples.iter().all(|s| s.revert_error.is_none())
        })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or(String::new(), |s| s.trim().to_string())
}

/// Runs the sweep (or the observation) and returns the report.
pub fn forward(cmd: &Command, topo: &Topology) -> Result<ForwardReport, SweepError> {
    let s = setup(cmd, topo)?;
    if !corelocal::sys::process::is_root() {
        return Err(SweepError::Failed(
            "needs root: it creates network namespaces and writes their sysfs".into(),
        ));
    }
    if s.config.mode == "netns" && s.firewall.iter().any(|&n| n > 0) && !testbed::nft_available() {
        return Err(SweepError::Failed(
            "--firewall needs nft (apt-get install nftables)".into(),
        ));
    }
    for name in crate::netns::remove_stale_with(testbed::PREFIX) {
        eprintln!("corelocal sweep forward: removed stale namespace {name}");
    }
    let host_before = HostNet::read();
    let mut report = ForwardReport {
        format: report::FORMAT.into(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        host: HostNote {
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map_or(String::new(), |x| x.trim().into()),
            load_before: loadavg(),
            load_after: String::new(),
            online: topo.online.to_list(),
        },
        config: s.config.clone(),
        cells: Vec::new(),
        host_changed: Vec::new(),
        host_checked: host_before.values.len(),
        verdicts: Vec::new(),
        notes: Vec::new(),
    };
    if s.config.mode == "observe" {
        observe(&s, &mut report)?;
    } else {
        sweep_netns(&s, topo, &mut report);
    }
    report.host.load_after = loadavg();
    report.host_changed = host_before.changed(&HostNet::read());
    for c in &mut report.cells {
        c.finish();
    }
    report.verdicts = report::verdicts(&report.cells);
    report.notes.extend(notes(&s, &report));
    Ok(report)
}

/// Caveats that follow from the setup and the numbers.
fn notes(s: &Setup, r: &ForwardReport) -> Vec<String> {
    let mut n = Vec::new();
    if s.config.mode == "netns" {
        n.push(
            "the generator, the router and the sink share this host's CPUs: without NAPI a \
             veth delivers on the sending CPU, so in `default` the router (and the sink's \
             drop) run inside the generator's sendmmsg; forwarded pps is bounded by whichever \
             CPU saturates first"
                .into(),
        );
        n.push(
            "the sink's cheap drop (forwarding off, no route: Ip:InAddrErrors, no ICMP) still \
             runs ip_rcv on the CPU that transmitted on the router's egress; the seed's router \
             sent to a nonexistent gateway on a real wire instead"
                .into(),
        );
        let none: Vec<&str> = r
            .cells
            .iter()
            .filter(|c| !c.samples.is_empty() && c.forwarded_pps == Some(0.0))
            .map(|c| c.name.as_str())
            .collect();
        if !none.is_empty() {
            let fwd = r
                .cells
                .iter()
                .flat_map(|c| &c.samples)
                .map(|x| x.window.drops.router_not_forwarded)
                .sum::<u64>();
            n.push(format!(
                "NOTHING WAS FORWARDED in {}: the router's ip_forward was {} and it counted {fwd} \
                 packet(s) as not for it (Ip:InAddrErrors/InNoRoutes) in the windows",
                none.join(", "),
                u8::from(s.config.forwarding)
            ));
        }
    }
    if s.cpus.len() <= 2 && s.config.mode == "netns" {
        n.push(
            "a 2-CPU guest: one CPU for the generator and one for the router is the whole \
             machine; seed 002's router had 6 cores and a separate packet generator"
                .into(),
        );
    }
    n
}

/// The order of layouts in round `round`: rotated by one each round.
pub fn round_order(layouts: &[Layout], round: usize) -> Vec<Layout> {
    let n = layouts.len().max(1);
    (0..layouts.len())
        .map(|i| layouts[(i + round) % n])
        .collect()
}

fn sweep_netns(s: &Setup, topo: &Topology, report: &mut ForwardReport) {
    for &fw in &s.firewall {
        for &l in &s.layouts {
            report.cells.push(CellResult::new(Some(l), fw));
        }
    }
    let total = s.layouts.len() * s.firewall.len() * s.config.rounds;
    let per = Duration::from_millis(s.config.warmup_ms + s.config.duration_ms + 900);
    eprintln!(
        "corelocal sweep forward: {} layout(s) × {} firewall load(s) × {} round(s), about {:.0} s; \
         generator on CPU {}; load {}",
        s.layouts.len(),
        s.firewall.len(),
        s.config.rounds,
        per.as_secs_f64() * total as f64,
        s.config
            .gen_cpu
            .map_or("(unpinned)".into(), |c| c.to_string()),
        report.host.load_before
    );
    let mut seq = 0;
    'rounds: for round in 0..s.config.rounds {
        for &fw in &s.firewall {
            for l in round_order(&s.layouts, round) {
                if sys::stop_requested() {
                    eprintln!("corelocal sweep forward: stopped; reporting what was measured");
                    break 'rounds;
                }
                let result = run_cell(s, topo, l, fw, round, seq);
                let Some(cell) = report
                    .cells
                    .iter_mut()
                    .find(|c| c.layout == Some(l) && c.firewall_rules == fw)
                else {
                    continue;
                };
                seq += 1;
                match result {
                    Ok(x) => {
                        let each: Vec<String> = x
                            .window
                            .per_second
                            .iter()
                            .map(|p| format!("{:.0}", p / 1000.0))
                            .collect();
                        eprintln!(
                            "[{seq}/{total}] round {} {:<11} fw {:<5} forwarded {:>7.1} kpps ({}), offered {:>7.1}, drops {:.0}/s{}",
                            round + 1,
                            l.name(),
                            fw,
                            x.window.forwarded_pps / 1000.0,
                            each.join(" "),
                            x.window.offered_pps / 1000.0,
                            x.window.drops.total() as f64 / x.window.secs,
                            x.revert_error
                                .as_ref()
                                .map_or(String::new(), |e| format!("; REVERT FAILED: {e}"))
                        );
                        cell.samples.push(x);
                    }
                    Err(e) => {
                        eprintln!(
                            "[{seq}/{total}] round {} {} fw {fw}: failed: {e}",
                            round + 1,
                            l.name()
                        );
                        cell.errors.push(e);
                    }
                }
            }
        }
    }
}

/// Sleeps `d` unless a stop is requested; false when stopped.
fn nap(d: Duration) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if sys::stop_requested() {
            return false;
        }
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(50)));
    }
    true
}

/// Runs one cell: testbed, layout, measurement, revert, teardown.
pub fn run_cell(
    s: &Setup,
    topo: &Topology,
    l: Layout,
    fw: usize,
    round: usize,
    seq: usize,
) -> Result<Sample, String> {
    let tb = Testbed::create(&TestbedSpec {
        queues: s.config.queues,
        forwarding: s.config.forwarding,
        firewall_rules: fw,
    })?;
    let lp = layout::plan_layout(
        l,
        topo,
        &s.cpus,
        s.config.gen_cpu,
        &tb.ifs,
        s.config.queues,
        s.config.nice,
    )?;
    let applied = layout::apply_layout(tb.router.name(), &tb.ifs, &lp, &s.cpus)?;
    let applied_lines = applied.readback.clone();
    let threads = applied.threads.clone();
    let measured = measure(s, &tb, &threads);
    let reverted = layout::revert_layout(tb.router.name(), &lp, applied);
    let (window, last, names) = measured?;
    let ifs = &tb.ifs;
    let dev = |ns: usize, name: &str| last.dev[ns].iter().find(|c| c.name == name).cloned();
    let snmp = |ns: usize, k: &str| last.snmp[ns].get(k).copied().unwrap_or(0);
    let (reverted, revert_error) = match reverted {
        Ok(lines) => (lines, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    let sample = Sample {
        round,
        seq,
        window,
        router_sent: dev(1, &ifs.router_out).map_or(0, |c| c.tx_packets),
        sink_received: snmp(2, "Ip:InReceives"),
        sink_icmp_out: snmp(2, "Icmp:OutMsgs"),
        firewall_accepted: (fw > 0)
            .then(|| testbed::firewall_accepted(tb.router.name()))
            .flatten(),
        thread_ns: names
            .into_iter()
            .zip(&last.threads)
            .filter(|((name, _), _)| name.starts_with("napi/"))
            .map(|((name, _), t)| (name, t.run_ns))
            .collect(),
        applied: applied_lines,
        reverted,
        revert_error,
    };
    drop(tb);
    Ok(sample)
}

fn thread_names(gen_cpu: Option<usize>, threads: &[NapiThread]) -> ThreadNames {
    let mut v = vec![(
        "generator".to_string(),
        gen_cpu.map_or("any".into(), |c| c.to_string()),
    )];
    v.extend(threads.iter().map(|t| (t.name.clone(), t.cpus.clone())));
    v
}

/// (name, CPUs) of each thread followed: the generator, then the NAPI threads.
type ThreadNames = Vec<(String, String)>;

/// Starts the generator, samples once a second, stops it; returns the window, the final
/// reading (after the generator stopped and the queues drained) and the followed threads'
/// names. Every proc file is closed on return, before the testbed can be deleted.
fn measure(
    s: &Setup,
    tb: &Testbed,
    threads: &[NapiThread],
) -> Result<(Window, Point, ThreadNames), String> {
    let [g, r, k] = tb.names();
    let mut reader = Reader {
        ns: [NsFiles::open(g)?, NsFiles::open(r)?, NsFiles::open(k)?],
        threads: Vec::new(),
    };
    let c = &s.config;
    let hard_end = Instant::now()
        + Duration::from_millis(c.warmup_ms + c.duration_ms)
        + Duration::from_secs(30);
    let mut generator = gen::Generator::start(
        &gen::GenSpec {
            netns: g.to_string(),
            cpu: c.gen_cpu,
            src: Ipv4Addr::from(testbed::GEN_ADDR),
            flows: c.flows,
            frame: c.frame,
            batch: c.batch,
            rate: c.rate,
            nice: c.nice,
        },
        hard_end,
    )?;
    reader.threads.push((
        generator.tid(),
        format!("/proc/self/task/{}/schedstat", generator.tid()),
    ));
    for t in threads {
        reader
            .threads
            .push((t.pid, format!("/proc/{}/schedstat", t.pid)));
    }
    let names = thread_names(c.gen_cpu, threads);
    if !nap(Duration::from_millis(c.warmup_ms)) {
        let _ = generator.stop();
        return Err("stopped".into());
    }
    let mut points = vec![reader.point(generator.sent(), generator.errors())];
    let start = points[0].at;
    let dur = Duration::from_millis(c.duration_ms);
    let mut tick = Duration::ZERO;
    while tick < dur {
        tick = (tick + Duration::from_secs(1)).min(dur);
        let due = start + tick;
        let now = Instant::now();
        if due > now && !nap(due - now) {
            let _ = generator.stop();
            return Err("stopped".into());
        }
        points.push(reader.point(generator.sent(), generator.errors()));
    }
    generator.stop()?;
    let last = drained(&mut reader, &generator, &tb.ifs.router_out);
    let n = Names {
        gen: &tb.ifs.gen,
        router_in: &tb.ifs.router_in,
        router_out: &tb.ifs.router_out,
    };
    let w = sample::window(&points, &n, &names).ok_or("empty window")?;
    drop(reader);
    Ok((w, last, names))
}

/// Reads until the router's egress and the sink's input stop moving (what was in flight when
/// the generator stopped has arrived), at most 3 s.
fn drained(reader: &mut Reader, generator: &gen::Generator, router_out: &str) -> Point {
    let key = |p: &Point| {
        (
            p.dev[1]
                .iter()
                .find(|c| c.name == router_out)
                .map_or(0, |c| c.tx_packets),
            p.snmp[2].get("Ip:InReceives").copied().unwrap_or(0),
        )
    };
    let end = Instant::now() + Duration::from_secs(3);
    let mut last = reader.point(generator.sent(), generator.errors());
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = reader.point(generator.sent(), generator.errors());
        let settled = key(&now) == key(&last) && key(&now).0 == key(&now).1;
        if settled || Instant::now() > end {
            return now;
        }
        last = now;
    }
}

/// `--real-ifaces`: reads the host's counters for IN and OUT, round after round; writes
/// nothing.
fn observe(s: &Setup, report: &mut ForwardReport) -> Result<(), SweepError> {
    let (i, o) = s.config.real_ifaces.clone().unwrap_or_default();
    for n in [&i, &o] {
        if !Path::new("/sys/class/net").join(n).exists() {
            return Err(SweepError::Input(format!(
                "--real-ifaces: no interface {n} on this host"
            )));
        }
    }
    let mut cell = CellResult::new(None, 0);
    let open = || NsFiles::open_here().map_err(SweepError::Failed);
    for round in 0..s.config.rounds {
        if sys::stop_requested() {
            break;
        }
        let mut reader = Reader {
            ns: [open()?, open()?, open()?],
            threads: Vec::new(),
        };
        let mut points = vec![reader.point(0, 0)];
        let start = points[0].at;
        let dur = Duration::from_millis(s.config.duration_ms);
        let mut tick = Duration::ZERO;
        while tick < dur && !sys::stop_requested() {
            tick = (tick + Duration::from_secs(1)).min(dur);
            let due = start + tick;
            let now = Instant::now();
            if due > now && !nap(due - now) {
                break;
            }
            points.push(reader.point(0, 0));
        }
        let names = Names {
            gen: "",
            router_in: &i,
            router_out: &o,
        };
        if let Some(mut w) = sample::window(&points, &names, &[]) {
            w.offered_pps = w.received_pps;
            eprintln!(
                "[{}/{}] {i} → {o}: forwarded {:.1} kpps, received {:.1} kpps, drops {:.0}/s",
                round + 1,
                s.config.rounds,
                w.forwarded_pps / 1000.0,
                w.received_pps / 1000.0,
                w.drops.total() as f64 / w.secs
            );
            cell.samples.push(Sample {
                round,
                seq: round,
                window: w,
                router_sent: 0,
                sink_received: 0,
                sink_icmp_out: 0,
                firewall_accepted: None,
                thread_ns: Vec::new(),
                applied: Vec::new(),
                reverted: Vec::new(),
                revert_error: None,
            });
        }
    }
    report.cells.push(cell);
    report.notes.push(format!(
        "observe mode: {i} → {o} on this host, measured only; forwarded = {o} tx_packets, \
         offered = {i} rx_packets; drops = {i} rx_dropped + softnet backlog + IP discards + \
         {o} tx_dropped"
    ));
    Ok(())
}

fn write_outputs(cmd: &Command, r: &ForwardReport) -> Result<(), SweepError> {
    let json =
        serde_json::to_string_pretty(r).map_err(|e| SweepError::Failed(e.to_string()))? + "\n";
    let path = |ext: &str| {
        let mut p = cmd.out.clone().into_os_string();
        p.push(ext);
        PathBuf::from(p)
    };
    for (p, text) in [
        (path(".json"), json.clone()),
        (path(".md"), report::markdown(r)),
        (path(".svg"), report::svg(r)),
    ] {
        std::fs::write(&p, text)
            .map_err(|e| SweepError::Failed(format!("writing {}: {e}", p.display())))?;
    }
    if cmd.json {
        print!("{json}");
    } else {
        print!("{}", report::text(r));
        println!(
            "wrote {}, {} and {}",
            path(".json").display(),
            path(".md").display(),
            path(".svg").display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_firewalls_and_orders() {
        assert_eq!(parse_rate("0").unwrap(), 0);
        assert_eq!(parse_rate("300k").unwrap(), 300_000);
        assert_eq!(parse_rate("1.5M").unwrap(), 1_500_000);
        for bad in ["x", "-1", "2G", "k"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_firewall("0, 200,0").unwrap(), vec![0, 200]);
        assert!(parse_firewall("").is_err());
        assert!(parse_firewall("1000000").is_err());
        let l = [Layout::Default, Layout::Xps, Layout::NapiOther];
        assert_eq!(round_order(&l, 0), l.to_vec());
        assert_eq!(
            round_order(&l, 1),
            vec![Layout::Xps, Layout::NapiOther, Layout::Default]
        );
    }
}
