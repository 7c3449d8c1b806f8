//! `corelocal tune`: inspect, plan, diff, apply, verify and revert NIC steering — IRQ
//! affinity, RPS, RFS, XPS — and show RSS (issue 7).
//!
//! Layout: I/O only at the edges ([`fs`] for `/proc` + `/sys` under a root, [`sys`] for the
//! ethtool probes, over `corelocal::sys::ethtool`); [`state`] reads the host into plain data;
//! [`plan`] is pure (topology + NIC state + options → knob values); [`check`], [`apply`] and
//! [`verify`] validate, write, read back and restore through [`fs::Fs`], so every step runs on
//! fixture trees ([`fixture`]) with the test doubles in [`fakes`].

pub mod apply;
pub mod check;
pub mod error;
pub mod fakes;
pub mod fixture;
pub mod fs;
pub mod knob;
pub mod plan;
pub mod render;
pub mod state;
pub mod sys;
pub mod verify;

use crate::apply::{ApplyOptions, OnError, Snapshot};
use crate::error::{Result, TuneError};
use crate::fs::{Fs, RootFs};
use crate::plan::{Plan, PlanOptions, Profile};
use crate::state::{HostState, Probe};
use corelocal::cpu::Topology;
use serde::de::DeserializeOwned;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The most bytes read from a plan or snapshot file.
const FILE_LIMIT: u64 = 16 << 20;

const EXAMPLES: &str = "\
Examples:
  corelocal tune show                               # NICs, queues, IRQs, RPS/XPS/RFS, RSS
  corelocal tune show --json --nic eth0
  corelocal tune plan --profile spread --housekeeping 1 -o spread.json
  corelocal tune plan --profile rfs --nic eth0 -o rfs.json
  corelocal tune plan --profile bulk -o bulk.json   # prints where to pin the application
  corelocal tune diff spread.json                   # current vs planned (--json too)
  corelocal tune apply spread.json                  # dry run: what would change
  corelocal tune apply spread.json --yes            # snapshot first, then write
  corelocal tune verify spread.json                 # read back, effective_affinity too
  corelocal tune revert spread.json.snapshot.json   # byte-exact restore
  corelocal tune --root /tmp/fake show              # a fake /proc + /sys tree

Exit codes: 0 done; 1 the host refused, differs from the plan (verify) or lacks a planned
knob (diff); 2 bad flags or input (nothing changed).";

/// `corelocal tune` arguments.
#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct Command {
    /// Root of the /proc and /sys trees read and written (a fixture directory in tests).
    #[arg(long, global = true, default_value = "/", value_name = "DIR")]
    root: PathBuf,
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Per NIC: driver, NUMA node, queues, IRQs with smp_affinity and effective_affinity,
    /// rps_cpus, rps_flow_cnt, xps_cpus, xps_rxqs, channels, RSS; host: CPUs, SMT, NUMA,
    /// isolated, rps_sock_flow_entries, irqbalance.
    Show(ShowArgs),
    /// Compute a desired layout and write it to a plan file (nothing on the host changes).
    Plan(PlanArgs),
    /// Current vs planned values.
    Diff(DiffArgs),
    /// Write a plan (a dry run unless --yes); a snapshot of every changed value is saved first.
    Apply(ApplyArgs),
    /// Read every planned value back; IRQs must also be delivered within the plan
    /// (effective_affinity).
    Verify(DiffArgs),
    /// Restore a snapshot written by apply, byte for byte.
    Revert(RevertArgs),
    /// Write a fake /proc + /sys tree (vm, two-socket, large) for tests and demos.
    #[command(hide = true)]
    Fixture(FixtureArgs),
}

#[derive(Debug, clap::Args)]
struct ShowArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Only these interfaces (default: every interface with a device).
    #[arg(long = "nic", value_name = "IF")]
    nics: Vec<String>,
}

#[derive(Debug, clap::Args)]
struct PlanArgs {
    /// spread: one queue per physical core, NIC node first; rps: + RPS to same-node cores;
    /// rfs: + RFS flow tables; bulk: one high-rate flow, the application on another core of
    /// the same socket.
    #[arg(long, value_enum)]
    profile: Profile,
    /// Keep this many physical cores (the lowest-numbered, with SMT siblings) free of network
    /// work for userland.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16))]
    housekeeping: u16,
    /// rps_sock_flow_entries for --profile rfs (a power of two).
    #[arg(long, default_value_t = plan::DEFAULT_FLOW_ENTRIES)]
    flow_entries: u64,
    /// Only these interfaces (default: every interface with a device).
    #[arg(long = "nic", value_name = "IF")]
    nics: Vec<String>,
    /// Where to write the plan ('-' for stdout).
    #[arg(short, long, default_value = "tune-plan.json", value_name = "FILE")]
    output: PathBuf,
}

#[derive(Debug, clap::Args)]
struct DiffArgs {
    /// The plan file.
    plan: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct ApplyArgs {
    /// The plan file.
    plan: PathBuf,
    /// Really write (otherwise only show what would change).
    #[arg(long)]
    yes: bool,
    /// Apply IRQ affinity although irqbalance runs (it will likely undo it).
    #[arg(long)]
    force: bool,
    /// On a failed write: restore everything written so far, or carry on.
    #[arg(long, value_enum, default_value = "rollback")]
    on_error: OnError,
    /// Snapshot file (default: PLAN.snapshot.json); never overwritten.
    #[arg(long, value_name = "FILE")]
    snapshot: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct RevertArgs {
    /// The snapshot file written by apply.
    snapshot: PathBuf,
    /// Only show what would be written.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, clap::Args)]
struct FixtureArgs {
    /// Which host.
    #[arg(value_enum)]
    kind: fixture::Kind,
    /// Directory to create (must not exist).
    dir: PathBuf,
}

/// Runs `corelocal tune`.
pub fn run(cmd: Command) -> ExitCode {
    match dispatch(cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("corelocal tune: {e}");
            e.exit_code()
        }
    }
}

fn dispatch(cmd: Command) -> Result<ExitCode> {
    let fs = RootFs::new(&cmd.root);
    match cmd.action {
        Action::Show(a) => show(&fs, &a),
        Action::Plan(a) => plan_cmd(&fs, &a),
        Action::Diff(a) => diff_cmd(&fs, &a),
        Action::Apply(a) => apply_cmd(&fs, &a),
        Action::Verify(a) => verify_cmd(&fs, &a),
        Action::Revert(a) => revert_cmd(&fs, &a),
        Action::Fixture(a) => fixture_cmd(&a),
    }
}

fn topology(fs: &RootFs) -> Result<Topology> {
    let root = fs.root();
    if !root.join("sys/devices/system/cpu").is_dir() {
        return Err(TuneError::input(format!(
            "--root {}: not the root of a /sys tree (no sys/devices/system/cpu under it); give / \
             for this host or a fixture directory (corelocal tune fixture KIND DIR)",
            root.display()
        )));
    }
    Topology::read(root).map_err(|e| TuneError::input(format!("reading CPU topology: {e}")))
}

/// `--output PATH` can be written: not a directory, in an existing directory.
fn check_output(path: &Path) -> Result<()> {
    let shown = path.display();
    if path.is_dir() {
        return Err(TuneError::input(format!(
            "--output {shown}: is a directory; give a file path such as {} (or - for stdout)",
            path.join("tune-plan.json").display()
        )));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(TuneError::input(format!(
            "--output {shown}: directory {} does not exist; create it or give a path in an \
             existing directory (or - for stdout)",
            dir.display()
        )));
    }
    Ok(())
}

fn live_probe(nic: &str) -> (Probe<state::Channels>, Probe<state::Rss>) {
    (sys::channels(nic), sys::rss(nic))
}

/// Reads the host under `fs` (the ethtool ioctl only when the root is `/`).
pub fn read_host(fs: &RootFs, topo: &Topology, nics: &[String]) -> Result<HostState> {
    if fs.is_live() {
        state::read_host(fs, topo, nics, &live_probe)
    } else {
        state::read_host(fs, topo, nics, &|_| state::no_probe("--root is not /"))
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string_pretty(value).map_err(|e| TuneError::failed(format!("JSON: {e}")))
}

fn show(fs: &RootFs, a: &ShowArgs) -> Result<ExitCode> {
    let topo = topology(fs)?;
    let host = read_host(fs, &topo, &a.nics)?;
    if a.json {
        println!("{}", to_json(&host)?);
    } else {
        print!("{}", render::show(&host));
    }
    Ok(ExitCode::SUCCESS)
}

fn plan_cmd(fs: &RootFs, a: &PlanArgs) -> Result<ExitCode> {
    if a.output != Path::new("-") {
        check_output(&a.output)?;
    }
    let topo = topology(fs)?;
    let host = read_host(fs, &topo, &a.nics)?;
    let opts = PlanOptions {
        profile: a.profile,
        housekeeping: usize::from(a.housekeeping),
        flow_entries: a.flow_entries,
    };
    let plan = plan::plan(&topo, &host, &opts)?;
    let json = to_json(&plan)? + "\n";
    if a.output == Path::new("-") {
        print!("{json}");
        eprint!("{}", render::plan(&plan));
        return Ok(ExitCode::SUCCESS);
    }
    std::fs::write(&a.output, json).map_err(|e| {
        TuneError::failed(format!(
            "--output {}: cannot write it: {e}",
            a.output.display()
        ))
    })?;
    print!("{}", render::plan(&plan));
    println!("plan written to {}", a.output.display());
    Ok(ExitCode::SUCCESS)
}

/// Reads a JSON file of at most 16 MiB.
pub fn load_json<T: DeserializeOwned>(path: &Path, what: &str) -> Result<T> {
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(FILE_LIMIT).read_to_string(&mut text))
        .map_err(|e| TuneError::input(format!("cannot read {what} {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| TuneError::input(format!("{what} {} is not valid: {e}", path.display())))
}

fn diff_cmd(fs: &RootFs, a: &DiffArgs) -> Result<ExitCode> {
    let plan: Plan = load_json(&a.plan, "plan")?;
    let rows = verify::diff(fs, &plan)?;
    let unreadable = rows.iter().filter(|r| r.status == "error").count();
    if a.json {
        println!("{}", to_json(&rows)?);
    } else {
        print!("{}", verify::render_table(&rows));
        let n = rows.iter().filter(|r| r.status == "change").count();
        println!(
            "{n} of {} value(s) differ from the plan, {unreadable} unreadable",
            rows.len()
        );
    }
    Ok(if unreadable == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn snapshot_path(a: &ApplyArgs) -> PathBuf {
    a.snapshot.clone().unwrap_or_else(|| {
        let mut p = a.plan.clone().into_os_string();
        p.push(".snapshot.json");
        PathBuf::from(p)
    })
}

fn apply_cmd(fs: &RootFs, a: &ApplyArgs) -> Result<ExitCode> {
    let plan: Plan = load_json(&a.plan, "plan")?;
    let topo = topology(fs)?;
    let snap = snapshot_path(a);
    let opts = ApplyOptions {
        yes: a.yes,
        force: a.force,
        on_error: a.on_error,
    };
    let report = apply::apply(fs, &topo.online, &plan, &opts, &snap)?;
    if !a.yes {
        return Ok(dry_run_report(fs, &plan, &report, &snap));
    }
    for f in &report.failures {
        eprintln!("write failed [{:?}]: {}", f.class, f.message);
    }
    if report.rolled_back {
        eprintln!(
            "rolled back: every value written was restored (snapshot {})",
            snap.display()
        );
        return Ok(ExitCode::from(1));
    }
    println!(
        "applied: {} changed, {} already as planned, {} failed{}",
        report.changed.len() - report.failures.len(),
        report.unchanged,
        report.failures.len(),
        if report.wrote {
            format!("; snapshot {}", snap.display())
        } else {
            String::new()
        }
    );
    Ok(if report.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn dry_run_report(fs: &RootFs, plan: &Plan, report: &apply::ApplyReport, snap: &Path) -> ExitCode {
    if let Ok(rows) = verify::diff(fs, plan) {
        let changes: Vec<verify::Row> = rows.into_iter().filter(|r| r.status == "change").collect();
        print!("{}", verify::render_table(&changes));
    }
    if let Some(pid) = state::irqbalance_pid(fs) {
        println!("warning: irqbalance runs (pid {pid}); apply --yes refuses without --force");
    }
    println!(
        "dry run: {} value(s) would change, {} already as planned; snapshot would go to {}; \
         re-run with --yes to write",
        report.changed.len(),
        report.unchanged,
        snap.display()
    );
    ExitCode::SUCCESS
}

fn verify_cmd(fs: &RootFs, a: &DiffArgs) -> Result<ExitCode> {
    let plan: Plan = load_json(&a.plan, "plan")?;
    let rows = verify::verify(fs, &plan)?;
    // A pending IRQ is not a failure: the kernel took the value and moves it at its next
    // interrupt (verify::PENDING_WINDOW); it is said, and counted apart.
    let pending = rows.iter().filter(|r| r.status == "pending").count();
    let bad = rows
        .iter()
        .filter(|r| r.status != "ok" && r.status != "pending")
        .count();
    if a.json {
        println!("{}", to_json(&rows)?);
    } else {
        print!("{}", verify::render_table(&rows));
        println!(
            "{} of {} value(s) verified{}",
            rows.len() - bad - pending,
            rows.len(),
            if pending > 0 {
                format!("; {pending} IRQ(s) pending: moved at their next interrupt")
            } else {
                String::new()
            }
        );
    }
    Ok(if bad == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn revert_cmd(fs: &RootFs, a: &RevertArgs) -> Result<ExitCode> {
    let snap: Snapshot = load_json(&a.snapshot, "snapshot")?;
    apply::check_snapshot(&snap)?;
    if a.dry_run {
        for e in &snap.entries {
            println!("would write {:?} to {}", e.content, e.path);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let report = apply::revert(fs, &snap)?;
    for f in &report.failures {
        eprintln!("restore failed [{:?}]: {}", f.class, f.message);
    }
    for (path, now) in &report.mismatches {
        eprintln!("{path}: reads {now:?} after restore, not the snapshot's value");
    }
    let ok = report.failures.is_empty() && report.mismatches.is_empty();
    if ok {
        println!(
            "restored {} value(s); all read back byte-exact",
            report.restored
        );
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn fixture_cmd(a: &FixtureArgs) -> Result<ExitCode> {
    if a.dir.exists() {
        return Err(TuneError::input(format!(
            "{} already exists",
            a.dir.display()
        )));
    }
    fixture::write(&a.dir, a.kind)
        .map_err(|e| TuneError::failed(format!("writing fixture {}: {e}", a.dir.display())))?;
    println!("wrote {:?} fixture to {}", a.kind, a.dir.display());
    Ok(ExitCode::SUCCESS)
}
