//! `corelocal sim`: the many-core balancer simulation (seed 000 §6.5). The simulator itself
//! is `corelocal::balance::sim`; this file parses arguments and writes files.

use crate::check;
use corelocal::balance::sim::{self, BalancerMode, SimConfig, CORES_MAX};
use corelocal::balance::FLOW_GROUPS_MAX;
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
    #[arg(long, default_value = "on", value_parser = ["on", "steal", "off"])]
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

fn seconds_to_ms(s: f64) -> u64 {
    (s * 1000.0).round() as u64
}

/// Checks every flag before the run, naming the flag, its value and the accepted range.
fn check_args(cmd: &Command) -> Result<(), String> {
    let range = |flag: &str, value: u64, lo: u64, hi: u64, what: &str| {
        if (lo..=hi).contains(&value) {
            Ok(())
        } else {
            Err(format!("{flag} {value}: {what} from {lo} to {hi}"))
        }
    };
    range(
        "--cores",
        cmd.cores as u64,
        1,
        CORES_MAX as u64,
        "a number of cores",
    )?;
    if cmd.hog > cmd.cores {
        return Err(format!(
            "--hog {}: more hogged cores than --cores {}; at most {}",
            cmd.hog, cmd.cores, cmd.cores
        ));
    }
    range("--hog-share", cmd.hog_share.into(), 0, 100, "a percentage")?;
    range(
        "--load",
        cmd.load.into(),
        1,
        100,
        "a percentage of all cores' CPU time",
    )?;
    range(
        "--queue-cap",
        cmd.queue_cap.into(),
        1,
        65_536,
        "a queue length",
    )?;
    range(
        "--inflight-max",
        cmd.inflight_max.into(),
        1,
        1_000_000,
        "a connection count",
    )?;
    if !cmd.groups.is_power_of_two() || cmd.groups > FLOW_GROUPS_MAX {
        return Err(format!(
            "--groups {}: must be a power of two from 1 to {FLOW_GROUPS_MAX}, e.g. 4096",
            cmd.groups
        ));
    }
    let seconds = |flag: &str, s: f64, hi: f64| {
        if s.is_finite() && (0.0..=hi).contains(&s) {
            Ok(())
        } else {
            Err(format!("{flag} {s}: seconds from 0 to {hi}"))
        }
    };
    seconds("--duration", cmd.duration, 3600.0)?;
    if seconds_to_ms(cmd.duration) == 0 {
        return Err(format!(
            "--duration {}: must be at least 0.001 seconds, e.g. --duration 60",
            cmd.duration
        ));
    }
    seconds("--hog-start", cmd.hog_start, 86_400.0)?;
    if let Some(end) = cmd.hog_end {
        seconds("--hog-end", end, 86_400.0)?;
        if end < cmd.hog_start {
            return Err(format!(
                "--hog-end {end}: before --hog-start {}; the hog must end after it starts",
                cmd.hog_start
            ));
        }
    }
    for (flag, path, example) in [
        ("--json", &cmd.json, "sim.json"),
        ("--svg", &cmd.svg, "sim.svg"),
    ] {
        if let Some(p) = path {
            check::output_file(flag, p, example)?;
        }
    }
    Ok(())
}

fn config(cmd: &Command) -> Result<SimConfig, String> {
    let mode: BalancerMode = cmd.balancer.parse()?;
    let mut c = SimConfig::new(cmd.cores, cmd.hog, mode, cmd.seed);
    c.hog_share_pct = cmd.hog_share;
    c.busy_detection = cmd.busy_detection.parse()?;
    c.hog_start_ms = seconds_to_ms(cmd.hog_start);
    c.hog_end_ms = cmd.hog_end.map(seconds_to_ms);
    c.duration_ms = seconds_to_ms(cmd.duration);
    c.load_pct = cmd.load;
    c.queue_cap = cmd.queue_cap;
    c.flow_groups = cmd.groups;
    c.inflight_max = cmd.inflight_max;
    Ok(c)
}

/// Runs `corelocal sim`.
pub fn run(cmd: Command) -> ExitCode {
    let report = match check_args(&cmd)
        .and_then(|()| config(&cmd))
        .and_then(|c| sim::run(&c))
    {
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[command(flatten)]
        c: Command,
    }

    fn error(args: &[&str]) -> String {
        let mut v = vec!["sim"];
        v.extend_from_slice(args);
        check_args(&T::try_parse_from(v).unwrap().c).unwrap_err()
    }

    #[test]
    fn each_bad_value_is_named_with_its_range() {
        assert_eq!(check_args(&T::try_parse_from(["sim"]).unwrap().c), Ok(()));
        for (args, want) in [
            (
                &["--cores", "0"][..],
                "--cores 0: a number of cores from 1 to 1024",
            ),
            (
                &["--cores", "4", "--hog", "5"][..],
                "--hog 5: more hogged cores than --cores 4",
            ),
            (
                &["--hog-share", "101"][..],
                "--hog-share 101: a percentage from 0 to 100",
            ),
            (&["--load", "0"][..], "--load 0: a percentage"),
            (
                &["--queue-cap", "0"][..],
                "--queue-cap 0: a queue length from 1 to 65536",
            ),
            (&["--inflight-max", "0"][..], "--inflight-max 0"),
            (
                &["--groups", "1000"][..],
                "--groups 1000: must be a power of two",
            ),
            (
                &["--duration", "7200"][..],
                "--duration 7200: seconds from 0 to 3600",
            ),
            (
                &["--duration", "0"][..],
                "--duration 0: must be at least 0.001 seconds",
            ),
            (
                &["--hog-start", "5", "--hog-end", "1"][..],
                "--hog-end 1: before --hog-start 5",
            ),
            (&["--json", "/"][..], "--json /: is a directory"),
        ] {
            let e = error(args);
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }
}
