//! `corelocal sim`: the many-core balancer simulation (seed 000 §6.5). The simulator itself
//! is `corelocal::balance::sim`; this file parses arguments and writes files.

use corelocal::balance::sim::{self, BalancerMode, SimConfig};
use std::process::ExitCode;

/// `corelocal sim` arguments.
#[derive(Debug, clap::Args)]
pub struct Command {
    /// Number of simulated cores (one server worker each).
    #[arg(long, default_value_t = 48)]
    cores: usize,
    /// Number of cores running a CPU hog (cores 0..HOG).
    #[arg(long, default_value_t = 0)]
    hog: usize,
    /// CPU share (%) the server gets on a hogged core (0: none, a starved core).
    #[arg(long, default_value_t = 10)]
    hog_share: u32,
    /// Who computes busy state: watch (corelocal's runtime: only running servers observe
    /// queues, non-busy ones also those nobody observed for 1 ms) or packet-path (the paper's).
    #[arg(long, default_value = "watch", value_parser = ["watch", "packet-path"])]
    busy_detection: String,
    /// When the hog starts, seconds.
    #[arg(long, default_value_t = 0.0)]
    hog_start: f64,
    /// When the hog stops, seconds (default: never).
    #[arg(long)]
    hog_end: Option<f64>,
    /// Balancer: on (stealing + migration), steal (stealing only) or off.
    #[arg(long, default_value = "on")]
    balancer: String,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Seconds of connection arrivals (the run continues until every connection finished or
    /// timed out).
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// Offered load, % of the CPU time of all cores.
    #[arg(long, default_value_t = 50)]
    load: u32,
    /// Accept-queue capacity per core.
    #[arg(long, default_value_t = 128)]
    queue_cap: u32,
    /// Most open connections per core (what the server admits beyond its accept queue).
    #[arg(long, default_value_t = 256)]
    inflight_max: u32,
    /// Number of flow groups (a power of two).
    #[arg(long, default_value_t = 4096)]
    groups: u32,
    /// Write the JSON report here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Write an SVG plot here.
    #[arg(long)]
    svg: Option<std::path::PathBuf>,
}

fn seconds_to_ms(what: &str, s: f64) -> Result<u64, String> {
    if !s.is_finite() || !(0.0..=86_400.0).contains(&s) {
        return Err(format!("{what} must be 0..=86400 seconds"));
    }
    Ok((s * 1000.0).round() as u64)
}

fn config(cmd: &Command) -> Result<SimConfig, String> {
    let mode: BalancerMode = cmd.balancer.parse()?;
    let mut c = SimConfig::new(cmd.cores, cmd.hog, mode, cmd.seed);
    c.hog_share_pct = cmd.hog_share;
    c.busy_detection = cmd.busy_detection.parse()?;
    c.hog_start_ms = seconds_to_ms("--hog-start", cmd.hog_start)?;
    c.hog_end_ms = cmd
        .hog_end
        .map(|s| seconds_to_ms("--hog-end", s))
        .transpose()?;
    c.duration_ms = seconds_to_ms("--duration", cmd.duration)?;
    c.load_pct = cmd.load;
    c.queue_cap = cmd.queue_cap;
    c.flow_groups = cmd.groups;
    c.inflight_max = cmd.inflight_max;
    Ok(c)
}

/// Runs `corelocal sim`.
pub fn run(cmd: Command) -> ExitCode {
    let report = match config(&cmd).and_then(|c| sim::run(&c)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("corelocal sim: {e}");
            return ExitCode::from(2);
        }
    };
    let s = &report.summary;
    println!(
        "cores {} hog {} balancer {} seed {}: {} connections, p50 {:.1} ms, p90 {:.1} ms, \
         p99 {:.1} ms, {} timed out ({:.2}%), {} SYN drops, {} steals, {} migrations, \
         hogged groups {} -> {}, hogged packet share {:.1}%",
        cmd.cores,
        cmd.hog,
        cmd.balancer,
        cmd.seed,
        s.connections,
        s.latency_p50_ms,
        s.latency_p90_ms,
        s.latency_p99_ms,
        s.timeouts,
        s.timeout_pct,
        s.syn_drops,
        s.steals,
        s.migrations,
        s.hogged_groups_start,
        s.hogged_groups_end,
        s.hogged_packet_share_pct
    );
    let writes = [
        (cmd.json.as_ref(), report.to_json()),
        (cmd.svg.as_ref(), sim::render_svg(&report)),
    ];
    for (path, text) in writes {
        if let Some(path) = path {
            if let Err(e) = std::fs::write(path, text) {
                eprintln!("corelocal sim: writing {}: {e}", path.display());
                return ExitCode::from(1);
            }
        }
    }
    ExitCode::SUCCESS
}
