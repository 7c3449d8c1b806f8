//! `corelocal steer`: CPU-local accept for process-per-core servers we did not write.
//!
//! nginx with `listen … reuseport` and `worker_cpu_affinity` has one listener per pinned
//! worker in one SO_REUSEPORT group, but the kernel picks the listener by a hash of the
//! 4-tuple, so on N workers (N−1)/N of the connections are accepted on a CPU other than the
//! one that processed the SYN. `steer attach --pid PID` finds the server's reuseport groups
//! and which worker polls which listener ([`discover`], [`plan`]: `/proc/PID/fd`, the epoll
//! instances' `fdinfo` `tfd:`/`ino:` lines, `/proc/PID/net/tcp[6]`, `sched_getaffinity`),
//! takes duplicates of the listeners with `pidfd_getfd(2)`, fills a REUSEPORT_SOCKARRAY keyed
//! so that the SYN's CPU picks the listener of the worker pinned there, attaches the
//! `cl_cpu_pick` SK_REUSEPORT program (`corelocal::bpf::cpu_pick`) to the group and closes
//! the duplicates ([`apply`]). Without CAP_BPF it sets SO_INCOMING_CPU on each listener
//! instead (Linux ≥ 6.2). `status` reads it back (per-CPU counts of SYNs steered vs fallen
//! back), `watch` re-syncs across reloads, respawns and affinity changes, `detach` restores
//! the kernel's hash.

pub mod apply;
pub mod background;
pub mod balance;
pub mod discover;
pub mod measure;
pub mod metrics;
pub mod plan;
pub mod procscan;
pub mod target;
pub mod watch;

use apply::{Method, SteerError};
use target::PidSource;
use watch::WatchConfig;

/// `println!` that ignores a closed stdout (`corelocal steer status | head` must not panic).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// `corelocal steer`.
#[derive(Debug, Args)]
pub struct Command {
    #[command(subcommand)]
    action: Action,
}

/// Which server: exactly one of `--pid`, `--pid-file`, `--unit`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct Server {
    /// The server's PID (its master); its children are found from /proc.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pid: Option<u32>,
    /// A PID file naming the server's master (nginx's `pid`, HAProxy's `-p`); `watch`
    /// re-reads it, so it follows binary upgrades and restarts.
    #[arg(long)]
    pid_file: Option<PathBuf>,
    /// A systemd unit: its MainPID (`systemctl show -p MainPID`); `watch` looks again after
    /// a restart.
    #[arg(long)]
    unit: Option<String>,
}

impl Server {
    fn source(&self) -> PidSource {
        match (&self.pid, &self.pid_file, &self.unit) {
            (Some(p), _, _) => PidSource::Pid(*p),
            (_, Some(f), _) => PidSource::PidFile(f.clone()),
            (_, _, Some(u)) => PidSource::unit(u),
            _ => unreachable!("clap requires one of --pid, --pid-file, --unit"),
        }
    }
}

/// The same, optional (`status` without one lists every loaded program).
#[derive(Debug, Args)]
#[group(required = false, multiple = false)]
struct MaybeServer {
    /// The server's PID; without a server, every loaded cl_cpu_pick program is listed.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pid: Option<u32>,
    /// A PID file naming the server's master.
    #[arg(long)]
    pid_file: Option<PathBuf>,
    /// A systemd unit (its MainPID).
    #[arg(long)]
    unit: Option<String>,
}

impl MaybeServer {
    fn source(&self) -> Option<PidSource> {
        match (&self.pid, &self.pid_file, &self.unit) {
            (Some(p), _, _) => Some(PidSource::Pid(*p)),
            (_, Some(f), _) => Some(PidSource::PidFile(f.clone())),
            (_, _, Some(u)) => Some(PidSource::unit(u)),
            _ => None,
        }
    }
}

#[derive(Debug, Args)]
struct Target {
    #[command(flatten)]
    server: Server,
    /// Only these groups: ADDR:PORT, or PORT for every address (repeatable).
    #[arg(long = "listen", value_parser = parse_listen_filter)]
    listen: Vec<String>,
}

impl Target {
    /// The server's PID now.
    fn pid(&self) -> Result<u32, SteerError> {
        resolve(&self.server.source())
    }
}

fn resolve(source: &PidSource) -> Result<u32, SteerError> {
    match source.current() {
        Ok(Some(p)) => Ok(p),
        Ok(None) => Err(SteerError(format!(
            "no server: {} names no running process",
            source.describe()
        ))),
        Err(e) => Err(SteerError(format!("no server: {e}"))),
    }
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Steer each SYN to the listener of the worker pinned to the CPU that processed it.
    Attach {
        #[command(flatten)]
        target: Target,
        /// ebpf (CAP_BPF), incoming-cpu (unprivileged, Linux ≥ 6.2) or auto.
        #[arg(long, value_enum, default_value = "auto")]
        method: Method,
        /// Attach even when a reuseport program that steer did not attach is on the group
        /// (the server's own, or another tool's): it is replaced.
        #[arg(long)]
        force: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        /// on: leave a balancer running (`steer watch` in the background, until the server
        /// exits or `detach`): a stopped, starved, blocked or overloaded worker's CPU sends
        /// its SYNs to the closest workers that can serve them until it drains. off: steering
        /// only (and a balancer `attach` started is stopped).
        #[arg(long, value_enum, default_value = "on")]
        balance: OnOff,
    },
    /// Per group: listeners, worker PID → CPU, method, per-CPU steered vs fallback counts
    /// and the locality they give.
    Status {
        #[command(flatten)]
        server: MaybeServer,
        /// Only these groups: ADDR:PORT or PORT (repeatable).
        #[arg(long = "listen", value_parser = parse_listen_filter)]
        listen: Vec<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
        /// Also inspect the workers' open connections: how many were processed on the
        /// worker's CPU (SO_INCOMING_CPU of a duplicate; at most 20,000).
        #[arg(long)]
        connections: bool,
        /// Also sample the counters over this many milliseconds: SYNs per second per CPU
        /// and the steered share now (not since attach).
        #[arg(long, value_parser = clap::value_parser!(u64).range(100..=60_000))]
        live_ms: Option<u64>,
    },
    /// Restore the kernel's hash (removes only what steer attached).
    Detach {
        #[command(flatten)]
        target: Target,
    },
    /// Attach, then keep the mapping right across reloads, respawns, affinity changes,
    /// binary upgrades and restarts. Exit status: 0 stopped (signal, --duration-s), 3 the
    /// server exited (--pid, no new master), 4 refused at start, 5 missing privilege, 6 no
    /// server within --start-timeout-s, 1 anything else.
    Watch {
        #[command(flatten)]
        target: Target,
        /// ebpf, incoming-cpu or auto.
        #[arg(long, value_enum, default_value = "auto")]
        method: Method,
        /// Re-scan period in milliseconds (10..=60000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(10..=60_000))]
        interval_ms: u64,
        /// Stop after this many seconds (default: until a signal, or the server exits for
        /// good).
        #[arg(long)]
        duration_s: Option<u64>,
        /// Replace a reuseport program steer did not attach.
        #[arg(long)]
        force: bool,
        /// One JSON object per event on stdout (ts, event, pid, group, message).
        #[arg(long)]
        json: bool,
        /// On SIGTERM/SIGINT, detach before exiting (the kernel's hash picks again).
        #[arg(long)]
        detach_on_exit: bool,
        /// How long to wait for the PID file or unit to name a running server at start.
        #[arg(long, default_value_t = 30)]
        start_timeout_s: u64,
        /// Serve Prometheus metrics on ADDR:PORT (GET /metrics): per-CPU steered/fallback
        /// SYN counts, steered share, what watch did.
        #[arg(long)]
        metrics: Option<String>,
        /// on: a worker that is stopped, starved, blocked or not draining its queue is busy,
        /// and its CPU's SYNs go to the closest workers that are not until it drains (eBPF
        /// groups); off: every SYN to its CPU's worker, whatever state that worker is in.
        #[arg(long, value_enum, default_value = "on")]
        balance: OnOff,
        /// Marks the balancer `attach` starts (found again by `detach` and `status`).
        #[arg(long = "started-by-attach", hide = true)]
        started_by_attach: bool,
    },
    /// What steering saves on the live server, from the traffic it has (none is generated):
    /// windows alternate steering on and off (ABBA); each reads the server's CPU time
    /// (schedstat of its threads), the connections accepted (PassiveOpens of its network
    /// namespace) and the host's IPIs (RES, CAL in /proc/interrupts); prints CPU and IPIs
    /// per connection on and off, and the on ÷ off ratio with its spread over the pairs.
    /// Restores what it found (attached or not). Stop `steer watch` on the server first.
    Measure {
        #[command(flatten)]
        target: Target,
        /// Total length: 10s, 500ms, 2m.
        #[arg(long, default_value = "10s", value_parser = duration_arg)]
        duration: Duration,
        /// Length of each window.
        #[arg(long, default_value = "1s", value_parser = duration_arg)]
        window: Duration,
        /// Pause after each switch before the window starts, in milliseconds.
        #[arg(long, default_value_t = 200)]
        settle_ms: u64,
        /// Method for the on windows when nothing is attached (else the one found).
        #[arg(long, value_enum, default_value = "auto")]
        method: Method,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `--balance on|off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OnOff {
    On,
    Off,
}

/// `--duration` / `--window` values.
fn duration_arg(s: &str) -> Result<Duration, String> {
    measure::parse_duration(s)
}

/// Exit statuses of `corelocal steer` (usage errors exit 2, from the argument parser).
pub mod exit {
    /// Done; for `watch`: stopped by a signal or `--duration-s`.
    pub const OK: u8 = 0;
    /// Any other failure.
    pub const FAILED: u8 = 1;
    /// `watch`: the server exited and nothing names another (`--pid` without a new master).
    pub const TARGET_EXITED: u8 = 3;
    /// Refused, nothing changed (not reuseport, no worker pinned, someone else's program…).
    pub const REFUSED: u8 = 4;
    /// A privilege is missing (ptrace access, CAP_BPF, CAP_SYS_ADMIN).
    pub const NO_PRIVILEGE: u8 = 5;
    /// No server: the PID, PID file or unit names no running process.
    pub const NO_SERVER: u8 = 6;
}

/// The exit status for an error, by what it says.
pub fn exit_code(e: &SteerError) -> u8 {
    let m = e.0.as_str();
    if m.starts_with("refused") {
        exit::REFUSED
    } else if m.contains("no ptrace access") || m.contains("needs CAP_") {
        exit::NO_PRIVILEGE
    } else if m.starts_with("no server") || m.starts_with("process ") {
        exit::NO_SERVER
    } else {
        exit::FAILED
    }
}

/// A `--listen` filter: `ADDR:PORT` (`0.0.0.0:80`, `[::]:80`) or `PORT` (1 to 65535).
fn parse_listen_filter(text: &str) -> Result<String, String> {
    let t = text.trim();
    match t.parse::<u16>() {
        Ok(0) => {
            Err("port 0 is never a listening port; give the port the server listens on".into())
        }
        Ok(_) => Ok(t.to_string()),
        Err(_) if t.parse::<std::net::SocketAddr>().is_ok() => Ok(t.to_string()),
        Err(_) => Err(format!(
            "expected ADDR:PORT (e.g. 0.0.0.0:80 or [::]:80) or a PORT alone for every address \
             (e.g. 80), got {t:?}"
        )),
    }
}

/// The process `--pid` names is running.
fn check_pid(pid: u32) -> Result<(), SteerError> {
    if std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return Ok(());
    }
    Err(SteerError(format!(
        "--pid {pid}: no process {pid} is running; give the PID of the server's master process \
         (e.g. `pgrep -o nginx`)"
    )))
}

/// Runs `corelocal steer`.
pub fn run(cmd: Command) -> ExitCode {
    // `watch` has its own answer to a missing server (it waits, or exits with its code).
    let pid = match &cmd.action {
        Action::Attach { target, .. }
        | Action::Detach { target }
        | Action::Measure { target, .. } => target.server.pid,
        Action::Watch { .. } => None,
        Action::Status { server, .. } => server.pid,
    };
    if let Some(Err(e)) = pid.map(check_pid) {
        eprintln!("corelocal steer: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cmd.action {
        Action::Attach {
            target,
            method,
            force,
            json,
            balance,
        } => attach_cmd(&target, method, force, json, balance == OnOff::On),
        Action::Status {
            server,
            listen,
            json,
            connections,
            live_ms,
        } => status_cmd(server.source(), &listen, json, connections, live_ms),
        Action::Detach { target } => detach_cmd(&target),
        Action::Measure {
            target,
            duration,
            window,
            settle_ms,
            method,
            json,
        } => measure_cmd(&target, duration, window, settle_ms, method, json),
        Action::Watch {
            target,
            method,
            interval_ms,
            duration_s,
            force,
            json,
            detach_on_exit,
            start_timeout_s,
            metrics,
            balance,
            started_by_attach: _,
        } => {
            let mut cfg = WatchConfig::new(target.server.source());
            cfg.balance = balance == OnOff::On;
            cfg.filters = target.listen.clone();
            cfg.method = method;
            cfg.interval = Duration::from_millis(interval_ms);
            cfg.force = force;
            cfg.detach_on_exit = detach_on_exit;
            cfg.start_timeout = Duration::from_secs(start_timeout_s);
            match watch_cmd(&cfg, duration_s, json, metrics.as_deref()) {
                Ok(watch::Stopped::Asked) => Ok(()),
                Ok(watch::Stopped::TargetExited) => return ExitCode::from(exit::TARGET_EXITED),
                Err(e) => Err(e),
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corelocal steer: {e}");
            ExitCode::from(exit_code(&e))
        }
    }
}

fn log_line(msg: String) {
    eprintln!("{msg}");
}

fn attach_cmd(
    t: &Target,
    method: Method,
    force: bool,
    json: bool,
    balance: bool,
) -> Result<(), SteerError> {
    let pid = t.pid()?;
    let (plan, dups) = apply::discover(pid, &t.listen)?;
    let done = apply::attach(&plan, &dups, method, force, &mut log_line)?;
    drop(dups);
    let balancer = attach_balancer(pid, &t.listen, balance, &done)?;
    if json {
        out!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "plan": plan, "attached": done, "balancer_pid": balancer
            }))
            .expect("serialisable")
        );
        return Ok(());
    }
    match balancer {
        Some(b) => out!(
            "balancer: pid {b} (`corelocal steer watch --pid {pid}` in the background): a busy \
             worker's CPU sends its SYNs to other workers until it drains; stops with the server \
             or `steer detach`; events in {}",
            background::log_path(pid).display()
        ),
        None if balance => out!(
            "balancer: none (needs eBPF steering; SO_INCOMING_CPU cannot route around a busy \
             worker)"
        ),
        None => out!("balancer: off (steering only)"),
    }
    for (a, g) in done.iter().zip(&plan.groups) {
        let how = match a.prog_id {
            Some(id) if a.updated => format!("ebpf, updated program {id}"),
            Some(id) => format!("ebpf, program {id} attached"),
            None => "incoming-cpu (SO_INCOMING_CPU on each listener)".to_string(),
        };
        out!("{}: {how}; {}", a.addr, describe_map(g));
        for n in &g.notes {
            out!("  note: {n}");
        }
    }
    Ok(())
}

/// Starts (or, with `balance` off, stops) the background balancer for server `pid`. Only
/// eBPF groups can be balanced.
fn attach_balancer(
    pid: u32,
    listen: &[String],
    balance: bool,
    done: &[apply::Attached],
) -> Result<Option<u32>, SteerError> {
    if !balance {
        background::stop(pid);
        return Ok(None);
    }
    if !done.iter().any(|a| a.prog_id.is_some()) {
        return Ok(None);
    }
    background::start(pid, listen)
        .map(Some)
        .map_err(|e| SteerError(format!("attached, but the balancer did not start: {e}")))
}

pub(crate) fn describe_map(g: &plan::GroupPlan) -> String {
    g.cpu_map
        .iter()
        .map(|(cpu, ls)| {
            let each: Vec<String> = ls
                .iter()
                .map(|&i| {
                    let l = &g.listeners[i];
                    let who = l
                        .workers
                        .first()
                        .map_or(String::new(), |w| format!(" (pid {} {})", w.pid, w.comm));
                    format!("listener {}{who}", l.inode)
                })
                .collect();
            format!("cpu {cpu} → {}", each.join(" + "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn status_cmd(
    source: Option<PidSource>,
    listen: &[String],
    json: bool,
    connections: bool,
    live_ms: Option<u64>,
) -> Result<(), SteerError> {
    let pid = source.as_ref().map(resolve).transpose()?;
    let Some(pid) = pid else {
        let progs = apply::programs()?;
        if json {
            let v: Vec<_> = progs
                .iter()
                .map(|(id, cookies, counts)| {
                    serde_json::json!({
                        "prog_id": id,
                        "listener_cookies": cookies,
                        "steered": counts.iter().map(|c| c.steered).sum::<u64>(),
                        "fallback": counts.iter().map(|c| c.fallback()).sum::<u64>(),
                    })
                })
                .collect();
            out!(
                "{}",
                serde_json::to_string_pretty(&v).expect("serialisable")
            );
        } else if progs.is_empty() {
            out!("no cl_cpu_pick program is loaded (nothing attached by corelocal steer)");
        } else {
            for (id, cookies, counts) in progs {
                out!(
                    "program {id}: {} listeners, {} SYNs steered, {} fell back (give --pid \
                     for the server's view)",
                    cookies.len(),
                    counts.iter().map(|c| c.steered).sum::<u64>(),
                    counts.iter().map(|c| c.fallback()).sum::<u64>()
                );
            }
        }
        return Ok(());
    };
    let (plan, dups) = apply::discover(pid, listen)?;
    let st = apply::status(&plan, &dups)?;
    drop(dups);
    let live: Vec<Option<LiveRates>> = match live_ms {
        None => Vec::new(),
        Some(ms) => {
            let secs = ms as f64 / 1000.0;
            std::thread::sleep(Duration::from_millis(ms));
            let (plan2, dups2) = apply::discover(pid, listen)?;
            let st2 = apply::status(&plan2, &dups2)?;
            drop(dups2);
            st.iter()
                .map(|a| {
                    let b = st2
                        .iter()
                        .find(|b| b.group.addr == a.group.addr && b.prog_id == a.prog_id)?;
                    a.prog_id?;
                    Some(live_rates(a, b, secs))
                })
                .collect()
        }
    };
    let conns = if connections {
        Some(apply::connection_locality(&plan)?)
    } else {
        None
    };
    if json {
        let v = serde_json::json!({
            "groups": st, "connections": conns, "live": live,
            "balancer_pid": background::find(pid).first(),
        });
        out!(
            "{}",
            serde_json::to_string_pretty(&v).expect("serialisable")
        );
        return Ok(());
    }
    if st.is_empty() {
        out!("pid {pid}: no listening TCP socket in its process tree");
    }
    match background::find(pid).first() {
        Some(b) => out!("balancer: running (pid {b}, started by `steer attach`)"),
        None => out!(
            "balancer: none started by `steer attach` (a `steer watch` balances while it runs)"
        ),
    }
    for (i, s) in st.iter().enumerate() {
        print_status(s);
        if let Some(Some(l)) = live.get(i) {
            for c in &l.cpus {
                out!(
                    "  live, cpu {}: {:.0} SYNs/s steered, {:.0} fell back",
                    c.cpu,
                    c.steered_per_s,
                    c.fallback_per_s
                );
            }
            match l.steered_share {
                Some(x) => out!(
                    "  live: {:.1}% of {:.0} SYNs/s steered over the last {:.1} s",
                    100.0 * x,
                    l.syns_per_s,
                    l.seconds
                ),
                None => out!("  live: no SYN in the last {:.1} s", l.seconds),
            }
        }
    }
    for c in conns.unwrap_or_default() {
        out!(
            "worker pid {} (cpu {}): {} of {} open connections processed on its CPU",
            c.pid,
            c.cpu,
            c.local,
            c.conns
        );
    }
    Ok(())
}

fn print_status(s: &apply::GroupStatus) {
    let g = &s.group;
    let method = match (s.method, s.prog_id) {
        ("ebpf", Some(id)) => format!("ebpf (cl_cpu_pick, program {id})"),
        ("incoming-cpu", _) => "incoming-cpu (SO_INCOMING_CPU, unprivileged)".to_string(),
        ("foreign", _) => "foreign (a reuseport program steer did not attach)".to_string(),
        _ => "kernel hash (nothing attached by steer)".to_string(),
    };
    out!(
        "group {}: {} listeners, method {method}",
        g.addr,
        g.listeners.len()
    );
    for l in &g.listeners {
        let workers: Vec<String> = l
            .workers
            .iter()
            .map(|w| {
                let tid = w.tid.map_or(String::new(), |t| format!(" thread {t}"));
                match w.cpu {
                    Some(c) => format!("pid {}{tid} ({}) → cpu {c}", w.pid, w.comm),
                    None => format!(
                        "pid {}{tid} ({}) → not pinned (cpus {})",
                        w.pid, w.comm, w.affinity
                    ),
                }
            })
            .collect();
        out!(
            "  listener inode {} (fd {} of pid {}): {}",
            l.inode,
            l.holder_fd,
            l.holder_pid,
            if workers.is_empty() {
                "no worker polls it".to_string()
            } else {
                workers.join(", ")
            }
        );
    }
    for f in &s.foreign {
        out!("  not ours: {}", f.describe(g.listeners.len()));
    }
    for n in &g.notes {
        out!("  note: {n}");
    }
    if let Some(r) = &g.refusal {
        out!("  cannot steer: {r}");
    }
    for c in &s.counts {
        out!(
            "  cpu {}: {} SYNs steered, {} redirected to another CPU's worker{}, {} fell back to \
             the hash ({} no worker, {} listener gone)",
            c.cpu,
            c.steered,
            c.redirected,
            if c.redirected_now {
                " (now: its worker is busy)"
            } else {
                ""
            },
            c.fallback,
            c.no_worker,
            c.listener_gone
        );
    }
    match (s.method, s.steered_share) {
        ("ebpf", Some(x)) => {
            let (steered, fallback) = s.totals();
            out!(
                "  locality: {:.2}% of {} SYNs since attach steered to the worker on their \
                 CPU ({fallback} fell back to the hash)",
                100.0 * x,
                steered + fallback
            );
        }
        ("ebpf", None) => out!("  locality: no SYN since attach"),
        ("incoming-cpu", _) => out!(
            "  locality: no counters with SO_INCOMING_CPU (use --connections, or CAP_BPF for \
             the eBPF method)"
        ),
        _ => {}
    }
    if let Some(u) = &s.ebpf_unreadable {
        out!("  eBPF state unknown: {u}");
    }
    for d in &s.stale_detail {
        out!("  stale: {d}");
    }
}

/// One CPU's counters as rates between two `status` samples.
#[derive(Debug, serde::Serialize)]
struct LiveCpu {
    cpu: usize,
    steered_per_s: f64,
    fallback_per_s: f64,
}

/// A group's counters between two samples.
#[derive(Debug, serde::Serialize)]
struct LiveRates {
    seconds: f64,
    syns_per_s: f64,
    steered_share: Option<f64>,
    cpus: Vec<LiveCpu>,
}

fn live_rates(a: &apply::GroupStatus, b: &apply::GroupStatus, secs: f64) -> LiveRates {
    let before = |cpu: usize| a.counts.iter().find(|c| c.cpu == cpu);
    let cpus: Vec<LiveCpu> = b
        .counts
        .iter()
        .map(|c| {
            let (s0, f0) = before(c.cpu).map_or((0, 0), |p| (p.steered, p.fallback));
            LiveCpu {
                cpu: c.cpu,
                steered_per_s: c.steered.saturating_sub(s0) as f64 / secs,
                fallback_per_s: c.fallback.saturating_sub(f0) as f64 / secs,
            }
        })
        .filter(|c| c.steered_per_s + c.fallback_per_s > 0.0)
        .collect();
    let steered: f64 = cpus.iter().map(|c| c.steered_per_s).sum();
    let fallback: f64 = cpus.iter().map(|c| c.fallback_per_s).sum();
    LiveRates {
        seconds: secs,
        syns_per_s: steered + fallback,
        steered_share: (steered + fallback > 0.0).then(|| steered / (steered + fallback)),
        cpus,
    }
}

fn measure_cmd(
    t: &Target,
    duration: Duration,
    window: Duration,
    settle_ms: u64,
    method: Method,
    json: bool,
) -> Result<(), SteerError> {
    if window > duration {
        return Err(SteerError(format!(
            "--window {window:?} is longer than --duration {duration:?}"
        )));
    }
    let cfg = measure::MeasureConfig {
        window,
        windows: ((duration.as_secs_f64() / window.as_secs_f64()).round() as usize).max(2),
        settle: Duration::from_millis(settle_ms),
        method,
        filters: t.listen.clone(),
    };
    // A signal ends the run early; what was found is restored either way.
    corelocal::sys::signal::block_termination_signals()
        .map_err(|e| SteerError(format!("blocking SIGTERM/SIGINT: {e}")))?;
    let mut pause = |d: Duration| corelocal::sys::signal::wait_termination(d).is_some();
    let mut progress = |w: &measure::Window| {
        if !json {
            eprintln!(
                "{} window {} ({}): {} connections",
                watch::clock(),
                w.index,
                if w.steered { "on" } else { "off" },
                w.accepted
            );
        }
    };
    let pid = t.pid()?;
    // A balancer `attach` left would attach again in the off windows: paused meanwhile.
    let had_balancer = !background::stop(pid).is_empty();
    let report = measure::measure(pid, &cfg, &mut pause, &mut progress);
    if had_balancer {
        if let Err(e) = background::start(pid, &t.listen) {
            eprintln!("corelocal steer: the balancer did not restart: {e}");
        }
    }
    let report = report?;
    if json {
        out!(
            "{}",
            serde_json::to_string_pretty(&report).expect("serialisable")
        );
    } else {
        out!("{}", measure::render(&report).trim_end());
    }
    Ok(())
}

fn detach_cmd(t: &Target) -> Result<(), SteerError> {
    let pid = t.pid()?;
    // The balancer first: it would attach again.
    for b in background::stop(pid) {
        out!("stopped the balancer (pid {b})");
    }
    let (plan, dups) = apply::discover(pid, &t.listen)?;
    let done = apply::detach(&plan, &dups)?;
    drop(dups);
    for d in done {
        match d.removed {
            "nothing" => out!(
                "{}: nothing attached by steer (the kernel's hash already picks)",
                d.addr
            ),
            what => out!("{}: removed {what}; the kernel's hash picks again", d.addr),
        }
    }
    Ok(())
}

fn watch_cmd(
    cfg: &WatchConfig,
    duration_s: Option<u64>,
    json: bool,
    metrics: Option<&str>,
) -> Result<watch::Stopped, SteerError> {
    // SIGTERM / SIGINT are waited for between ticks (and every thread started from here
    // on inherits the mask).
    corelocal::sys::signal::block_termination_signals()
        .map_err(|e| SteerError(format!("blocking SIGTERM/SIGINT: {e}")))?;
    let state = std::sync::Arc::new(std::sync::Mutex::new(watch::WatchState::default()));
    if let Some(addr) = metrics {
        let bound = metrics::serve(addr, state.clone())
            .map_err(|e| SteerError(format!("--metrics {addr}: {e}")))?;
        eprintln!("{} metrics on http://{bound}/metrics", watch::clock());
    }
    let start = Instant::now();
    let limit = duration_s.map(Duration::from_secs);
    let mut pause = |d: Duration| -> bool {
        let d = limit.map_or(d, |l| d.min(l.saturating_sub(start.elapsed())));
        if corelocal::sys::signal::wait_termination(d).is_some() {
            return true;
        }
        limit.is_some_and(|l| start.elapsed() >= l)
    };
    let print = move |e: &watch::Event| {
        if json {
            out!("{}", serde_json::to_string(e).expect("serialisable"));
        } else {
            eprintln!("{} {}", watch::clock(), e.message);
        }
    };
    let balancer = if cfg.balance {
        Some(
            balance::Handle::start(Box::new(print))
                .map_err(|e| SteerError(format!("starting the balancer thread: {e}")))?,
        )
    } else {
        None
    };
    let mut log = print;
    let stopped = watch::watch(cfg, &mut pause, &mut log, &state, balancer.as_deref());
    if let Some(b) = balancer {
        b.stop();
    }
    stopped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_say_why() {
        let code = |m: &str| exit_code(&SteerError(m.to_string()));
        assert_eq!(code("refused, nothing changed:\n  x"), exit::REFUSED);
        assert_eq!(code("no ptrace access to pid 1 (…)"), exit::NO_PRIVILEGE);
        assert_eq!(code("eBPF steering needs CAP_BPF (…)"), exit::NO_PRIVILEGE);
        assert_eq!(
            code("no server: pid file /run/x.pid names no …"),
            exit::NO_SERVER
        );
        assert_eq!(code("process 99: No such file"), exit::NO_SERVER);
        assert_eq!(code("bpf map update: …"), exit::FAILED);
    }
}

#[cfg(test)]
mod flag_tests {
    use super::*;

    #[test]
    fn listen_filters_and_pids_say_what_is_right() {
        assert_eq!(parse_listen_filter("80"), Ok("80".into()));
        assert_eq!(parse_listen_filter("0.0.0.0:80"), Ok("0.0.0.0:80".into()));
        let e = parse_listen_filter("foo").unwrap_err();
        assert!(
            e.contains("expected ADDR:PORT") && e.contains("\"foo\""),
            "{e}"
        );
        assert!(parse_listen_filter("0").unwrap_err().contains("port 0"));
        assert!(check_pid(std::process::id()).is_ok());
        let e = check_pid(u32::MAX).unwrap_err().to_string();
        assert!(
            e.contains("--pid 4294967295: no process 4294967295 is running"),
            "{e}"
        );
    }
}
