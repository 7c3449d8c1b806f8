//! `corelocal sweep`: the flow × application affinity matrix of seed 003 for a bulk TCP
//! transfer, on this host; and `corelocal sweep forward` ([`forward`]): seed 002's forwarded
//! packets per second under RPS / XPS / threaded-NAPI layouts.
//!
//! For every (flow CPU, application CPU) pair of a CPU set, receive protocol processing is
//! placed on the flow CPU — RPS on the receiving end of a veth pair between two private
//! network namespaces, or the RX IRQs' affinity of a real NIC with `--iface` — the receiver is
//! pinned to the application CPU, and a fixed-duration transfer is measured: throughput, the
//! CPU split, receiver run time, retransmits. The result is a JSON matrix, an SVG heatmap like
//! the seed's Figure 4, and the placement it recommends for this host.
//!
//! Layout: [`placement`] is pure (topology → relations, order, recommendation); [`netns`],
//! [`place`], [`transfer`] and [`cell`] do the I/O; [`report`] renders; [`sys`] holds the
//! system calls (setns, unshare, mount, signals, ethtool), on `rustix` and `corelocal::sys`.

pub mod cell;
pub mod forward;
pub mod netns;
pub mod place;
pub mod placement;
pub mod report;
pub mod sys;
pub mod transfer;

use crate::cell::{CellConfig, Sample};
use crate::placement::{Cell, Recommendation};
use crate::report::{CellResult, HostNote, Report};
use corelocal::cpu::{CpuSet, Topology};
use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// The most CPUs in a matrix (16 × 16 = 256 cells).
pub const MATRIX_CPUS_MAX: usize = 16;
/// The longest measured window or warm-up.
pub const DURATION_MAX: Duration = Duration::from_secs(600);
/// The most rounds.
pub const ROUNDS_MAX: usize = 20;
/// The most flows.
pub const FLOWS_MAX: usize = 64;
/// The largest read or write size.
pub const IO_SIZE_MAX: usize = 16 << 20;
/// The longest `--send-to` session.
pub const SEND_FOR_MAX: Duration = Duration::from_secs(24 * 3600);

const EXAMPLES: &str = "\
Examples:
  corelocal sweep                                  # every online CPU (at most 16), 1 flow
  corelocal sweep --cpus 0-1 --duration 3s --rounds 3 -o results/sweep/sweep-2x2
  corelocal sweep --cpus 0-3,8-11 --flows 4        # 8 × 8 cells, 4 parallel flows
  corelocal sweep --cpus 0-1 --json > sweep.json   # JSON on stdout
  # A real NIC: move its RX IRQs instead of RPS; data from another host:
  corelocal sweep --iface eth0 --listen 0.0.0.0:5201 --cpus 0-7      # on the receiver
  corelocal sweep --send-to 192.0.2.10:5201 --for 30m                # on the sender

Needs root (network namespaces, sysfs, /proc/irq). Namespaces are named clsweep-PID-N-{s,r}
and deleted after each cell, also on errors and SIGINT/SIGTERM.
Exit codes: 0 every cell measured; 1 a cell failed, was stopped, or the host refused;
2 bad flags.";

/// `corelocal sweep` arguments.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct Command {
    /// CPUs of the matrix (cpulist, e.g. 0-3,8); default: every online CPU.
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
    /// Parallel TCP flows per cell (each with its own receiver thread on the app CPU).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=FLOWS_MAX as i64))]
    pub flows: u16,
    /// Measured window per cell (e.g. 3s, 500ms, 1m).
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Ramp-up per cell, not measured.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Passes over the matrix; a cell's throughput is the median of its rounds.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=ROUNDS_MAX as i64))]
    pub rounds: u16,
    /// Bytes per send() call.
    #[arg(long, default_value = "262144", value_parser = parse_size)]
    pub write_size: usize,
    /// Bytes per recv() call.
    #[arg(long, default_value = "262144", value_parser = parse_size)]
    pub read_size: usize,
    /// Sender CPU: a number, `auto` (a CPU outside the matrix, else the scheduler's choice) or
    /// `none` (never pinned).
    #[arg(long, default_value = "auto", value_name = "CPU|auto|none")]
    pub sender_cpu: String,
    /// First TCP port (flow i uses port + i).
    #[arg(long, default_value_t = 5201)]
    pub port: u16,
    /// Output prefix: writes PREFIX.json and PREFIX.svg.
    #[arg(short, long, default_value = "sweep", value_name = "PREFIX")]
    pub out: PathBuf,
    /// Print the JSON report on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Real NIC mode: place its RX IRQs (restored afterwards); receive on --listen from a
    /// remote `corelocal sweep --send-to`.
    #[arg(long, value_name = "IF")]
    pub iface: Option<String>,
    /// Address to receive on in --iface mode.
    #[arg(long, default_value = "0.0.0.0:5201", value_name = "ADDR:PORT")]
    pub listen: SocketAddrV4,
    /// Move IRQs although irqbalance runs.
    #[arg(long)]
    pub force: bool,
    /// Sender role for --iface on another host: connect to ADDR:PORT (and the next --flows-1
    /// ports), send until each flow closes, reconnect.
    #[arg(long, value_name = "ADDR:PORT", conflicts_with = "iface")]
    pub send_to: Option<SocketAddrV4>,
    /// How long the --send-to role runs at most.
    #[arg(long = "for", default_value = "1h", value_parser = parse_duration, value_name = "DUR")]
    pub send_for: Duration,
    /// Root of the /proc and /sys trees for topology and IRQs (a fixture in tests).
    #[arg(long, default_value = "/", value_name = "DIR", hide = true)]
    pub root: PathBuf,
}

/// `corelocal sweep`: the matrix (flags below), or a subcommand.
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true, after_help = EXAMPLES)]
pub struct SweepCommand {
    /// A sweep other than the matrix.
    #[command(subcommand)]
    pub action: Option<SweepAction>,
    /// The matrix's flags.
    #[command(flatten)]
    pub matrix: Command,
}

/// Sweeps other than the flow × application matrix.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SweepAction {
    /// Forwarded packets per second of a router in namespaces under RPS / XPS / threaded
    /// NAPI layouts (seed 002).
    Forward(forward::Command),
}

/// Runs `corelocal sweep [forward]`.
pub fn run_sweep(cmd: SweepCommand) -> ExitCode {
    match cmd.action {
        Some(SweepAction::Forward(f)) => forward::run(f),
        None => run(cmd.matrix),
    }
}

/// Parses `500ms`, `3s`, `2m`, `1h` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("bad duration {text:?} (e.g. 3s, 500ms)"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "" | "s" => v,
        "m" => v * 60.0,
        "h" => v * 3600.0,
        _ => return Err(format!("bad duration unit in {text:?} (ms, s, m, h)")),
    };
    if !secs.is_finite() || secs <= 0.0 || secs > SEND_FOR_MAX.as_secs_f64() {
        return Err(format!("duration {text:?} out of range (0, 24h]"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a byte size: a number with an optional k/K/m/M suffix (powers of 1024).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1024),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        _ => (t, 1),
    };
    let n: usize = num.parse().map_err(|_| format!("bad size {text:?}"))?;
    let n = n.checked_mul(mult).ok_or("size overflows")?;
    if n == 0 || n > IO_SIZE_MAX {
        return Err(format!("size {text:?} out of range (1 .. 16M)"));
    }
    Ok(n)
}

/// A failure: bad input (exit 2) or the run failed (exit 1).
#[derive(Debug)]
pub enum SweepError {
    /// Bad flags or input; nothing was changed.
    Input(String),
    /// The host refused or a step failed.
    Failed(String),
}

impl SweepError {
    fn code(&self) -> ExitCode {
        match self {
            SweepError::Input(_) => ExitCode::from(2),
            SweepError::Failed(_) => ExitCode::from(1),
        }
    }
}

impl std::fmt::Display for SweepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SweepError::Input(m) | SweepError::Failed(m) => f.write_str(m),
        }
    }
}

/// Runs `corelocal sweep`.
pub fn run(cmd: Command) -> ExitCode {
    match dispatch(&cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("corelocal sweep: {e}");
            e.code()
        }
    }
}

fn dispatch(cmd: &Command) -> Result<ExitCode, SweepError> {
    sys::install_stop_handler().map_err(|e| SweepError::Failed(format!("signals: {e}")))?;
    let topo =
        Topology::read(&cmd.root).map_err(|e| SweepError::Failed(format!("topology: {e}")))?;
    if let Some(dst) = cmd.send_to {
        let cfg = cell_config(cmd, &topo, &CpuSet::new())?;
        cell::send_forever(dst, &cfg, cmd.send_for).map_err(SweepError::Failed)?;
        return Ok(ExitCode::SUCCESS);
    }
    check_out(&cmd.out)?;
    let report = sweep(cmd, &topo)?;
    write_outputs(cmd, &report)?;
    let complete = report.cells.iter().all(|c| c.gbps.is_some());
    Ok(if complete {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `--out PREFIX`: PREFIX.json and PREFIX.svg go into an existing directory (checked before
/// the sweep, not after it).
fn check_out(prefix: &Path) -> Result<(), SweepError> {
    let dir = match prefix.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if prefix.is_dir() {
        return Err(SweepError::Input(format!(
            "--out {}: is a directory; give a file name prefix inside it (PREFIX.json and \
             PREFIX.svg are written), e.g. --out {}",
            prefix.display(),
            prefix.join("sweep").display()
        )));
    }
    if prefix.as_os_str().is_empty() || prefix.to_string_lossy().ends_with('/') {
        return Err(SweepError::Input(format!(
            "--out {:?}: a file name prefix, not a directory (PREFIX.json and PREFIX.svg are \
             written), e.g. --out {}sweep",
            prefix.display().to_string(),
            prefix.display()
        )));
    }
    if !dir.is_dir() {
        return Err(SweepError::Input(format!(
            "--out {}: directory {} does not exist; create it or give a prefix in an existing \
             directory (PREFIX.json and PREFIX.svg are written)",
            prefix.display(),
            dir.display()
        )));
    }
    Ok(())
}

/// The matrix CPUs: `--cpus` (must be online) or every online CPU.
pub fn matrix_cpus(spec: Option<&str>, topo: &Topology) -> Result<CpuSet, SweepError> {
    let set = match spec {
        Some(s) => CpuSet::parse_list(s).map_err(|e| SweepError::Input(format!("--cpus: {e}")))?,
        None => topo.online.clone(),
    };
    let offline = set.difference(&topo.online);
    if !offline.is_empty() {
        return Err(SweepError::Input(format!(
            "--cpus: CPU(s) {} not online (online: {})",
            offline.to_list(),
            topo.online.to_list()
        )));
    }
    if set.is_empty() || set.len() > MATRIX_CPUS_MAX {
        return Err(SweepError::Input(format!(
            "--cpus: {} CPU(s); pick 1 to {MATRIX_CPUS_MAX} (e.g. --cpus 0-3)",
            set.len()
        )));
    }
    Ok(set)
}

fn cell_config(cmd: &Command, topo: &Topology, matrix: &CpuSet) -> Result<CellConfig, SweepError> {
    for (name, d) in [("--duration", cmd.duration), ("--warmup", cmd.warmup)] {
        if d > DURATION_MAX {
            return Err(SweepError::Input(format!(
                "{name} {:?}: at most {}s",
                d,
                DURATION_MAX.as_secs()
            )));
        }
    }
    if usize::from(cmd.port) + usize::from(cmd.flows) > 65535 {
        return Err(SweepError::Input(format!(
            "--port {} with --flows {}: the flows use ports {}.., past 65535; use --port at most {}",
            cmd.port,
            cmd.flows,
            cmd.port,
            65535 - usize::from(cmd.flows)
        )));
    }
    let sender_cpu = match cmd.sender_cpu.as_str() {
        "auto" => placement::sender_cpu(topo, matrix, &topo.online),
        "none" => None,
        n => {
            let c: usize = n.parse().map_err(|_| {
                SweepError::Input(format!("--sender-cpu {n:?}: a CPU, auto or none"))
            })?;
            if !topo.online.contains(c) {
                return Err(SweepError::Input(format!(
                    "--sender-cpu {c}: CPU {c} is not online (online: {}); or auto, none",
                    topo.online.to_list()
                )));
            }
            Some(c)
        }
    };
    Ok(CellConfig {
        duration_ms: cmd.duration.as_millis() as u64,
        warmup_ms: cmd.warmup.as_millis() as u64,
        flows: usize::from(cmd.flows),
        write_size: cmd.write_size,
        read_size: cmd.read_size,
        sender_cpu,
        port: cmd.port,
    })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or(String::new(), |s| s.trim().to_string())
}

fn empty_report(cmd: &Command, topo: &Topology, axis: &[usize], cfg: CellConfig) -> Report {
    let packages = placement::package_spans(topo, axis)
        .into_iter()
        .map(|(p, start, n)| (p, axis[start..start + n].to_vec()))
        .collect();
    let cells = axis
        .iter()
        .flat_map(|&f| axis.iter().map(move |&a| (f, a)))
        .map(|(f, a)| CellResult {
            flow_cpu: f,
            app_cpu: a,
            relation: placement::relation(topo, f, a).unwrap_or(placement::Relation::OtherSocket),
            gbps: None,
            samples: Vec::new(),
            errors: Vec::new(),
        })
        .collect();
    Report {
        format: report::FORMAT.into(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        mode: if cmd.iface.is_some() {
            "nic-irq"
        } else {
            "veth-rps"
        }
        .into(),
        host: HostNote {
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map_or(String::new(), |s| s.trim().into()),
            load_before: loadavg(),
            load_after: String::new(),
            online: topo.online.to_list(),
        },
        cpus: axis.to_vec(),
        packages,
        rounds: usize::from(cmd.rounds),
        config: cfg,
        cells,
        classes: Vec::new(),
        recommendation: Recommendation {
            relation: None,
            clear: false,
            example: None,
            untestable: Vec::new(),
            text: String::new(),
        },
        notes: Vec::new(),
    }
}

/// Caveats that depend on how the run was set up.
fn notes(cfg: &CellConfig, topo: &Topology, axis: &[usize]) -> Vec<String> {
    let mut n = Vec::new();
    if cfg.sender_cpu.is_none() {
        let cpus: Vec<String> = axis.iter().map(|c| c.to_string()).collect();
        n.push(format!(
            "the sender was not pinned (no CPU outside the matrix): it shared CPUs {} with \
             receive processing and the receiver, so cells with flow != app CPU left it no idle \
             CPU while same-CPU cells left it one; on a bigger host keep a CPU out of --cpus",
            cpus.join(",")
        ));
    }
    if topo.online.len() <= 2 {
        n.push(
            "a 2-CPU guest: SMT, LLC and socket effects of the physical host are invisible".into(),
        );
    }
    n
}

/// Where the retransmits came from, summed over every sample (sender namespace counters).
fn retransmit_note(report: &Report) -> Option<String> {
    let sum = |k: &str| -> u64 {
        report
            .cells
            .iter()
            .flat_map(|c| &c.samples)
            .map(|s| s.counters.get(k).copied().unwrap_or(0))
            .sum()
    };
    let retrans = sum("s:Tcp:RetransSegs");
    if retrans == 0 {
        return None;
    }
    let drops: u64 = report
        .cells
        .iter()
        .flat_map(|c| &c.samples)
        .flat_map(|s| s.cpus.iter().map(|p| p.softnet_drops))
        .sum();
    Some(format!(
        "{retrans} segment(s) retransmitted in all: {} tail-loss probe(s), {} timeout(s), {} \
         spurious RTO(s), {} D-SACK(s) back; {drops} RPS backlog drop(s) in the windows — the \
         veth loses nothing by itself, so these are timers firing while the receiver side \
         waited for CPU, or backlog overflow",
        sum("s:TcpExt:TCPLossProbes"),
        sum("s:TcpExt:TCPTimeouts"),
        sum("s:TcpExt:TCPSpuriousRTOs"),
        sum("s:TcpExt:TCPDSACKRecv"),
    ))
}

/// Runs the whole matrix and returns the finished report (cells that failed carry errors).
pub fn sweep(cmd: &Command, topo: &Topology) -> Result<Report, SweepError> {
    let matrix = matrix_cpus(cmd.cpus.as_deref(), topo)?;
    let cfg = cell_config(cmd, topo, &matrix)?;
    let live = cmd.root == Path::new("/");
    if live && !corelocal::sys::process::is_root() {
        return Err(SweepError::Failed(
            "needs root: it creates network namespaces and writes rps_cpus / smp_affinity".into(),
        ));
    }
    for name in netns::remove_stale() {
        eprintln!("corelocal sweep: removed stale namespace {name}");
    }
    let placer = match &cmd.iface {
        Some(i) => {
            Some(place::IrqPlacer::new(&cmd.root, i, cmd.force).map_err(SweepError::Failed)?)
        }
        None => None,
    };
    let axis = placement::axis_order(topo, &matrix);
    let mut report = empty_report(cmd, topo, &axis, cfg.clone());
    let plan = placement::schedule(&axis, usize::from(cmd.rounds));
    let per = cfg.warmup() + cfg.duration() + Duration::from_millis(300);
    eprintln!(
        "corelocal sweep: {} cell(s) × {} round(s), about {:.0} s; sender CPU {}",
        axis.len() * axis.len(),
        cmd.rounds,
        per.as_secs_f64() * plan.len() as f64,
        cfg.sender_cpu
            .map_or("scheduler's choice".into(), |c| c.to_string())
    );
    for (seq, (round, cell)) in plan.iter().enumerate() {
        if sys::stop_requested() {
            eprintln!("corelocal sweep: stopped; writing what was measured");
            break;
        }
        let result = match &placer {
            Some(p) => cell::run_nic(p, cmd.listen, *cell, &cfg, *round),
            None => cell::run_netns(*cell, &cfg, *round),
        };
        record(&mut report, *cell, result, seq, plan.len());
    }
    drop(placer);
    report.host.load_after = loadavg();
    report.notes = notes(&cfg, topo, &axis);
    report::finish(topo, &mut report);
    report.notes.extend(retransmit_note(&report));
    Ok(report)
}

fn record(
    report: &mut Report,
    cell: Cell,
    result: Result<Sample, String>,
    seq: usize,
    total: usize,
) {
    let Some(c) = report
        .cells
        .iter_mut()
        .find(|c| c.flow_cpu == cell.flow && c.app_cpu == cell.app)
    else {
        return;
    };
    match result {
        Ok(s) => {
            eprintln!(
                "[{}/{total}] flow {} app {}: {:.2} Gbit/s, receiver busy {:.0}%, retrans {}",
                seq + 1,
                cell.flow,
                cell.app,
                s.gbps,
                s.receiver_busy_pct,
                s.retrans_segs
            );
            c.samples.push(s);
        }
        Err(e) => {
            eprintln!(
                "[{}/{total}] flow {} app {}: failed: {e}",
                seq + 1,
                cell.flow,
                cell.app
            );
            c.errors.push(e);
        }
    }
}

fn write_outputs(cmd: &Command, report: &Report) -> Result<(), SweepError> {
    let json =
        serde_json::to_string_pretty(report).map_err(|e| SweepError::Failed(e.to_string()))? + "\n";
    let path = |ext: &str| {
        let mut p = cmd.out.clone().into_os_string();
        p.push(ext);
        PathBuf::from(p)
    };
    for (p, text) in [(path(".json"), &json), (path(".svg"), &report::svg(report))] {
        std::fs::write(&p, text)
            .map_err(|e| SweepError::Failed(format!("writing {}: {e}", p.display())))?;
    }
    if cmd.json {
        print!("{json}");
    } else {
        print!("{}", report::text(report));
        println!(
            "wrote {} and {}",
            path(".json").display(),
            path(".svg").display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_prefix_must_be_in_an_existing_directory() {
        assert!(check_out(Path::new("sweep")).is_ok());
        assert!(check_out(&std::env::temp_dir().join("sweep")).is_ok());
        let e = check_out(Path::new("/nonexistent-sweep-dir/x"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "--out /nonexistent-sweep-dir/x: directory /nonexistent-sweep-dir does not exist"
            ),
            "{e}"
        );
        let e = check_out(Path::new("/tmp/")).unwrap_err().to_string();
        assert!(
            e.contains("is a directory; give a file name prefix inside it"),
            "{e}"
        );
        let e = check_out(Path::new("/nonexistent-sweep-dir/"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a file name prefix, not a directory"), "{e}");
    }

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        for bad in ["", "0s", "-1s", "3x", "25h", "s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_size("256k").unwrap(), 262144);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        for bad in ["0", "17M", "x", ""] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
