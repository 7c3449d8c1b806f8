//! `corelocal bench compare`: A B A B rounds against several servers, each run in a fresh
//! network namespace (`unshare -n`, lo up) so TIME_WAIT and other state of the last run cannot
//! skew the next, client and server pinned; medians, spread and ratios of the server's CPU
//! time per operation. Not run by CI (needs root and minutes); people run it.
//!
//! Layout: this module holds the arguments and [`run`], the loop over rounds; `peers` knows the
//! preset servers and their configurations, `rounds` builds one run's bench arguments, runs it
//! inside the namespace ([`round`]) and reads its figures back, `table` summarises and writes
//! the markdown. Their public items are re-exported here, so `compare::…` paths stay.

use crate::options::Dur;
use serde::Serialize;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command as Proc, ExitCode, Stdio};

mod peers;
mod rounds;
mod table;
#[cfg(test)]
mod tests;

pub use peers::{h2o_conf, lighttpd_conf, nginx_conf, parse_server, sockperf_feed, ServerDef};
use peers::{preset, which};
pub use rounds::{bench_args, figures, round, RunFig};
pub use table::{
    markdown, median_spectrum, percentile_svg, spread, summarize, utc_date, ConnsSummary,
    ServerSummary, Spread,
};

/// Which comparison to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum CmpWorkload {
    /// One request per connection (HTTP `GET /hello` with `Connection: close`, or one RPC).
    Crr,
    /// Keep-alive request/response: 1,000 sequential requests per connection (sockperf peers:
    /// 64-byte ping-pong messages).
    Ka,
    /// memcached gets over keep-alive connections.
    Kv,
    /// One request per connection for the paper's 64-byte `/64.txt` (nginx and lighttpd serve
    /// the file set written by `corelocal files gen`; corelocal-http its built-in copy).
    File64,
    /// The paper's session workload over its 30,000 files: `bench http --urls paper`, bursts
    /// 1,2,3 with 100 ms think time, closed loop (default 1,000 connections).
    Sessions,
    /// memcached gets, one transaction per connection.
    Kv1,
    /// memcached gets, 100 transactions per connection.
    Kv100,
    /// memcached text-protocol sets (100-byte values over 1,000 keys) on keep-alive
    /// connections: the text row beside `kv-meta-set`.
    KvSet,
    /// Meta-protocol gets (`mg <key> v`) on keep-alive connections, as `kv` (1,000 keys, no
    /// sets: every get misses, `EN`).
    KvMeta,
    /// Meta-protocol sets (`ms <key> 100`, answered `HD`) on keep-alive connections.
    KvMetaSet,
    /// Meta-protocol 90% gets / 10% sets over 1,000 keys (the gets hit once the sets filled
    /// the keys, within the warm-up).
    KvMetaMix,
    /// Text-protocol 90% gets / 10% sets over 1,000 keys: the text row beside `kv-meta-mix`.
    KvMix,
}

impl CmpWorkload {
    /// Short name used in file names.
    pub fn name(self) -> &'static str {
        match self {
            CmpWorkload::Crr => "crr",
            CmpWorkload::Ka => "ka",
            CmpWorkload::Kv => "kv",
            CmpWorkload::File64 => "file64",
            CmpWorkload::Sessions => "sessions",
            CmpWorkload::Kv1 => "kv1",
            CmpWorkload::Kv100 => "kv100",
            CmpWorkload::KvSet => "kv-set",
            CmpWorkload::KvMeta => "kv-meta",
            CmpWorkload::KvMetaSet => "kv-meta-set",
            CmpWorkload::KvMetaMix => "kv-meta-mix",
            CmpWorkload::KvMix => "kv-mix",
        }
    }

    /// Whether HTTP peers must serve the paper's file set (rather than `/hello`).
    pub fn needs_fileset(self) -> bool {
        matches!(self, CmpWorkload::File64 | CmpWorkload::Sessions)
    }
}

/// `compare` arguments.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct CompareArgs {
    /// A preset server: floor (shared/tools/floor_server), http-uring-floor (its io_uring
    /// counterpart: multishot accept into direct descriptors, DEFER_TASKRUN, TCP_DEFER_ACCEPT,
    /// the answer linked to the close as `serve` does it), kv-floor (its memcached-protocol
    /// counterpart, for kv1/kv100), kv-uring-floor (the same with io_uring: multishot accept
    /// into direct descriptors, DEFER_TASKRUN, TCP_DEFER_ACCEPT as `serve` sets it), nginx,
    /// h2o, lighttpd, corelocal-rpc, corelocal-http, memcached, corelocal-kv,
    /// corelocal-kv-example (the library's `kv` example, built beside the binary with `cargo
    /// build --release -p corelocal --example kv`; kv workloads in its line protocol), sockperf,
    /// corelocal-sockperf (Debian peers are installed when missing). Repeat; the first is the baseline of the ratios.
    #[arg(long)]
    pub peer: Vec<String>,
    /// A custom server: NAME=PROTO:COMMAND with PROTO http|rpc|kv|sockperf and {port} {cpu} in COMMAND,
    /// e.g. 'mine=http:./srv {port} {cpu}'. The command must stay in the foreground.
    #[arg(long)]
    pub server: Vec<String>,
    /// Workload.
    #[arg(long, value_enum, default_value = "crr")]
    pub workload: CmpWorkload,
    /// Rounds (each runs every server once, in order).
    #[arg(long, default_value = "3")]
    pub rounds: usize,
    /// Measured length of each run.
    #[arg(long, default_value = "5s")]
    pub duration: Dur,
    /// Warm-up of each run.
    #[arg(long, default_value = "1s")]
    pub warmup: Dur,
    /// Client connections (default 64; 1,000 for `sessions`, whose clients mostly think). A
    /// list (`16,64,256,1024`) runs every concurrency in turn, all rounds of one before the
    /// next, the servers alternating within each round, and tables them side by side.
    #[arg(long, value_delimiter = ',')]
    pub conns: Vec<usize>,
    /// The server the ratios are taken against (default: the first given).
    #[arg(long)]
    pub baseline: Option<String>,
    /// CPU of the server (one worker / process).
    #[arg(long, default_value = "1")]
    pub server_cpu: usize,
    /// CPUs of the client.
    #[arg(long, default_value = "0")]
    pub client_cpus: String,
    /// Port the servers listen on (inside each namespace).
    #[arg(long, default_value = "8080")]
    pub port: u16,
    /// Output directory.
    #[arg(long, default_value = "results/compare")]
    pub out: PathBuf,
    /// The corelocal binary (default: `corelocal` next to this program, else on PATH).
    #[arg(long)]
    pub corelocal_bin: Option<PathBuf>,
    /// floor_server binary (default: built with gcc from shared/tools/floor_server.c).
    #[arg(long)]
    pub floor_bin: Option<PathBuf>,
    /// Run without network namespaces (no root needed; state carries over between runs).
    #[arg(long)]
    pub no_netns: bool,
    /// Extra arguments for every `bench` run (after --), e.g. -- --engine epoll.
    #[arg(last = true)]
    pub extra: Vec<String>,
}

/// The hidden per-run command executed inside the namespace.
#[derive(Debug, Clone, clap::Args)]
pub struct RoundArgs {
    /// Server command (run with `sh -c exec …`, pinned with taskset).
    #[arg(long)]
    pub server_cmd: String,
    /// Port to wait for.
    #[arg(long)]
    pub port: u16,
    /// Server CPU.
    #[arg(long)]
    pub server_cpu: usize,
    /// The bench arguments.
    #[arg(last = true)]
    pub bench: Vec<String>,
}

/// The most concurrencies one comparison runs (each costs rounds × servers runs).
pub const MAX_CONNS_LIST: usize = 16;

impl CompareArgs {
    /// The concurrencies to run, in the order given (default: one, 64; 1,000 for `sessions`).
    pub fn conns_list(&self) -> Result<Vec<usize>, String> {
        if self.conns.is_empty() {
            return Ok(vec![match self.workload {
                CmpWorkload::Sessions => 1000,
                _ => 64,
            }]);
        }
        if self.conns.len() > MAX_CONNS_LIST {
            return Err(format!(
                "--conns: at most {MAX_CONNS_LIST} concurrencies per comparison"
            ));
        }
        let mut seen = Vec::new();
        for &c in &self.conns {
            if c == 0 {
                return Err("--conns: each concurrency must be at least 1".into());
            }
            if seen.contains(&c) {
                return Err(format!("--conns: {c} given twice"));
            }
            seen.push(c);
        }
        Ok(seen)
    }

    /// The index of the baseline among `servers` (the first unless `--baseline` names another).
    pub fn baseline_index(&self, servers: &[ServerDef]) -> Result<usize, String> {
        match &self.baseline {
            None => Ok(0),
            Some(b) => servers.iter().position(|s| &s.name == b).ok_or_else(|| {
                let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
                format!(
                    "--baseline {b:?} is none of the servers: {}",
                    names.join(", ")
                )
            }),
        }
    }
}

/// The file name (without extension) of one run: `r2-nginx`, or `c256-r2-nginx` when the
/// comparison runs several concurrencies (one name per run, none overwritten).
pub fn run_name(conns: usize, several: bool, round: usize, server: &str) -> String {
    if several {
        format!("c{conns}-r{round}-{server}")
    } else {
        format!("r{round}-{server}")
    }
}

/// Checks the flags a comparison cannot run with, before any round: each error names the flag,
/// its value and what would be right.
pub fn check_args(a: &CompareArgs) -> Result<(), String> {
    use corelocal::cpu::{unavailable, CpuSet};
    if a.rounds == 0 || a.rounds > 50 {
        return Err(format!("--rounds {}: must be 1 to 50", a.rounds));
    }
    if let Some(u) = unavailable(&CpuSet::single(a.server_cpu)) {
        return Err(format!("--server-cpu {}: {u}", a.server_cpu));
    }
    let client: CpuSet = a.client_cpus.parse().map_err(|e| {
        format!(
            "--client-cpus {}: {e} (a cpulist like 0 or 0-1)",
            a.client_cpus
        )
    })?;
    if client.is_empty() {
        return Err("--client-cpus: empty CPU set; give a cpulist like 0 or 0-1".into());
    }
    if let Some(u) = unavailable(&client) {
        return Err(format!("--client-cpus {}: {u}", a.client_cpus));
    }
    for (flag, bin) in [
        ("--corelocal-bin", &a.corelocal_bin),
        ("--floor-bin", &a.floor_bin),
    ] {
        if let Some(b) = bin {
            if !b.is_file() {
                return Err(format!(
                    "{flag} {}: no such file; give the path of the built binary",
                    b.display()
                ));
            }
        }
    }
    if a.out.exists() && !a.out.is_dir() {
        return Err(format!(
            "--out {}: is a file, not a directory; give the directory the results go into \
             (created if missing)",
            a.out.display()
        ));
    }
    Ok(())
}

/// Runs the comparison.
pub fn run(a: CompareArgs) -> Result<ExitCode, String> {
    check_args(&a)?;
    let conns_list = a.conns_list()?;
    let stamp_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let wl = a.workload.name();
    let base = format!("bench-compare-{}-{wl}", utc_date(stamp_unix));
    let rundir = a.out.join(&base);
    std::fs::create_dir_all(&rundir).map_err(|e| {
        format!(
            "--out {}: cannot create {}: {e}",
            a.out.display(),
            rundir.display()
        )
    })?;
    let work = std::env::temp_dir().join(format!("corelocal-compare-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let mut servers = Vec::new();
    for p in &a.peer {
        servers.push(preset(p, &a, &work)?);
    }
    for s in &a.server {
        servers.push(parse_server(s)?);
    }
    if servers.is_empty() {
        return Err("nothing to compare: give --peer and/or --server".into());
    }
    let baseline = a.baseline_index(&servers)?;
    let unshare = which("unshare");
    if !a.no_netns && unshare.is_none() {
        return Err("unshare not found (util-linux); or pass --no-netns".into());
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let via_corelocal = std::env::args().nth(1).as_deref() == Some("bench");
    let load_before = crate::report::host_info().loadavg;
    let mut by_conns = Vec::new();
    for &conns in &conns_list {
        let mut runs: Vec<Vec<RunFig>> = vec![Vec::new(); servers.len()];
        let mut failures: Vec<Vec<String>> = vec![Vec::new(); servers.len()];
        for round in 1..=a.rounds {
            for (k, s) in servers.iter().enumerate() {
                let name = run_name(conns, conns_list.len() > 1, round, &s.name);
                let json = rundir.join(format!("{name}.json"));
                let bench = bench_args(&a, &s.proto, conns, &json)?;
                let server_cmd = s
                    .cmd
                    .replace("{port}", &a.port.to_string())
                    .replace("{cpu}", &a.server_cpu.to_string());
                let mut round_args: Vec<String> = Vec::new();
                if via_corelocal {
                    round_args.push("bench".into());
                }
                round_args.extend([
                    "__round".into(),
                    "--server-cmd".into(),
                    server_cmd,
                    "--port".into(),
                    a.port.to_string(),
                    "--server-cpu".into(),
                    a.server_cpu.to_string(),
                    "--".into(),
                ]);
                round_args.extend(bench);
                let mut cmd = if a.no_netns {
                    let mut c = Proc::new(&exe);
                    c.args(&round_args);
                    c
                } else {
                    let mut c = Proc::new(unshare.as_ref().expect("checked above"));
                    c.args([
                        "-n",
                        "--",
                        "sh",
                        "-c",
                        "ip link set lo up && exec \"$@\"",
                        "sh",
                    ])
                    .arg(&exe)
                    .args(&round_args);
                    c
                };
                eprintln!(
                    "compare: {conns} conns, round {round}/{} {} ...",
                    a.rounds, s.name
                );
                let out = cmd
                    .stdout(Stdio::null())
                    .output()
                    .map_err(|e| format!("running a round: {e}"))?;
                let text = std::fs::read_to_string(&json).ok();
                match (out.status.success(), text) {
                    (true, Some(t)) | (false, Some(t)) => {
                        let v: Value = serde_json::from_str(&t)
                            .map_err(|e| format!("{}: {e}", json.display()))?;
                        let fig = figures(&v, round, &json.display().to_string());
                        eprintln!(
                            "compare:   {:.0} ops/s, server {} µs/op, errors {}",
                            fig.txns_per_s,
                            fig.server_us_per_txn
                                .map_or("–".into(), |x| format!("{x:.2}")),
                            fig.errors
                        );
                        if !out.status.success() {
                            failures[k].push(format!(
                                "round {round}: exit {:?}: {}",
                                out.status.code(),
                                String::from_utf8_lossy(&out.stderr).trim()
                            ));
                        }
                        runs[k].push(fig);
                    }
                    (_, None) => {
                        let msg = format!(
                            "round {round}: no report ({})",
                            String::from_utf8_lossy(&out.stderr).trim()
                        );
                        eprintln!("compare:   FAILED {msg}");
                        failures[k].push(msg);
                    }
                }
            }
        }
        by_conns.push(ConnsSummary {
            conns,
            baseline: servers[baseline].name.clone(),
            servers: summarize(&servers, &runs, &failures, baseline),
        });
    }
    let cmdline = std::env::args().collect::<Vec<_>>().join(" ");
    let md = markdown(&a, &by_conns, &cmdline, &load_before);
    let report = serde_json::json!({
        "tool": format!("corelocal bench compare {}", env!("CARGO_PKG_VERSION")),
        "command_line": cmdline,
        "config": a,
        "started_unix": stamp_unix,
        "load_before": load_before,
        "load_after": crate::report::host_info().loadavg,
        "host": crate::report::host_info(),
        "baseline": servers[baseline].name,
        "by_conns": by_conns,
        // Files from before --conns took a list have only this key: keep it for one concurrency.
        "servers": (by_conns.len() == 1).then(|| &by_conns[0].servers),
    });
    let jp = a.out.join(format!("{base}.json"));
    let mp = a.out.join(format!("{base}.md"));
    std::fs::write(
        &jp,
        serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    std::fs::write(&mp, &md).map_err(|e| e.to_string())?;
    let mut plots = Vec::new();
    for c in &by_conns {
        let tag = if by_conns.len() > 1 {
            format!("-c{}", c.conns)
        } else {
            String::new()
        };
        let p = a.out.join(format!("{base}{tag}-latency-percentiles.svg"));
        std::fs::write(&p, percentile_svg(&a, c)).map_err(|e| format!("{}: {e}", p.display()))?;
        plots.push(p.display().to_string());
    }
    let _ = std::fs::remove_dir_all(&work);
    print!("{md}");
    eprintln!(
        "compare: wrote {}, {} and {}",
        jp.display(),
        mp.display(),
        plots.join(", ")
    );
    Ok(
        if by_conns
            .iter()
            .flat_map(|c| &c.servers)
            .all(|s| s.failures.is_empty())
        {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        },
    )
}
