//! One run: its bench arguments, the in-namespace runner, and its figures read back from JSON.

use super::{CmpWorkload, CompareArgs, RoundArgs};
use serde::Serialize;
use serde_json::Value;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command as Proc, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// The bench arguments of one run with `conns` connections against a server speaking `proto`.
pub fn bench_args(
    a: &CompareArgs,
    proto: &str,
    conns: usize,
    json: &Path,
) -> Result<Vec<String>, String> {
    let t = format!("127.0.0.1:{}", a.port);
    // `kv-line`: the kv workloads in the `kv` example's line protocol.
    let (proto, line) = match proto {
        "kv-line" => ("kv", true),
        p => (p, false),
    };
    let mut v: Vec<String> = match (a.workload, proto) {
        (CmpWorkload::Crr, "http") => vec![
            "crr".into(),
            "--proto".into(),
            "http".into(),
            "--path".into(),
            "/hello".into(),
        ],
        (CmpWorkload::Crr, "rpc") => vec![
            "crr".into(),
            "--proto".into(),
            "rpc".into(),
            "--msg-size".into(),
            "64".into(),
        ],
        (CmpWorkload::Ka, "http") => {
            vec![
                "http".into(),
                "--bursts".into(),
                "1000".into(),
                "--think".into(),
                "0".into(),
                "--urls".into(),
                "-".into(),
            ]
        }
        (CmpWorkload::Ka, "rpc") => vec![
            "rpc".into(),
            "--msg-size".into(),
            "64".into(),
            "--txns-per-conn".into(),
            "1000".into(),
        ],
        (CmpWorkload::Crr, "sockperf") => vec![
            "crr".into(),
            "--proto".into(),
            "sockperf".into(),
            "--msg-size".into(),
            "64".into(),
        ],
        (CmpWorkload::Ka, "sockperf") => vec![
            "rpc".into(),
            "--proto".into(),
            "sockperf".into(),
            "--msg-size".into(),
            "64".into(),
            "--txns-per-conn".into(),
            "1000".into(),
        ],
        (CmpWorkload::Kv, "kv") => vec![
            "kv".into(),
            "--keys".into(),
            "1000".into(),
            "--get-ratio".into(),
            "1".into(),
        ],
        (
            CmpWorkload::KvSet
            | CmpWorkload::KvMeta
            | CmpWorkload::KvMetaSet
            | CmpWorkload::KvMetaMix
            | CmpWorkload::KvMix,
            "kv",
        ) => {
            let ratio = match a.workload {
                CmpWorkload::KvMeta => "1",
                CmpWorkload::KvSet | CmpWorkload::KvMetaSet => "0",
                _ => "0.9",
            };
            let mut v: Vec<String> = ["kv", "--keys", "1000", "--get-ratio", ratio]
                .map(String::from)
                .into();
            if matches!(
                a.workload,
                CmpWorkload::KvMeta | CmpWorkload::KvMetaSet | CmpWorkload::KvMetaMix
            ) {
                v.push("--meta".into());
            }
            v
        }
        (CmpWorkload::File64, "http") => vec![
            "crr".into(),
            "--proto".into(),
            "http".into(),
            "--path".into(),
            corelocal_proto::http::fileset::SMALL_PATH.into(),
        ],
        (CmpWorkload::Sessions, "http") => vec![
            "http".into(),
            "--urls".into(),
            "paper".into(),
            "--bursts".into(),
            "1,2,3".into(),
            "--think".into(),
            "100ms".into(),
            "--target".into(),
            format!("http://{t}/"),
        ],
        (CmpWorkload::Kv1 | CmpWorkload::Kv100, "kv") => vec![
            "kv".into(),
            "--keys".into(),
            "1000".into(),
            "--get-ratio".into(),
            "1".into(),
            "--txns-per-conn".into(),
            if a.workload == CmpWorkload::Kv1 {
                "1"
            } else {
                "100"
            }
            .into(),
        ],
        (w, p) => return Err(format!("workload {w:?} does not apply to a {p} server")),
    };
    if v.last().map(String::as_str) == Some("-") {
        // http: the path comes from the target URL.
        v.truncate(v.len() - 2);
        v.extend(["--target".into(), format!("http://{t}/hello")]);
    } else if !v.iter().any(|x| x == "--target") {
        v.extend(["--target".into(), t]);
    }
    if line {
        if v.iter().any(|x| x == "--meta") {
            return Err(format!(
                "workload {:?} has no line-protocol form",
                a.workload
            ));
        }
        v.push("--line".into());
    }
    v.extend([
        "--cpus".into(),
        a.client_cpus.clone(),
        "--conns".into(),
        conns.to_string(),
        "--duration".into(),
        a.duration.to_string(),
        "--warmup".into(),
        a.warmup.to_string(),
        "--progress".into(),
        "never".into(),
        "--json".into(),
        json.display().to_string(),
    ]);
    v.extend(a.extra.iter().cloned());
    Ok(v)
}

/// Runs inside the namespace: start the server pinned, wait for its port, run the bench with
/// `--server-pid`, stop the server. `bench` runs the bench command line (`["bench", workload,
/// args…]`): the caller's parser and executor (`corelocal bench __round` passes the CLI's), so
/// this module does not import the command line that dispatches to it.
pub fn round(
    a: RoundArgs,
    bench: impl FnOnce(&[String]) -> Result<ExitCode, String>,
) -> Result<ExitCode, String> {
    let mut child = Proc::new("taskset")
        .args([
            "-c",
            &a.server_cpu.to_string(),
            "sh",
            "-c",
            &format!("exec {}", a.server_cmd),
        ])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting server {:?}: {e}", a.server_cmd))?;
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], a.port));
    let ready = loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            break true;
        }
        if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let result = if ready {
        // The readiness probe's connection is not part of the run: let it settle.
        std::thread::sleep(Duration::from_millis(200));
        let mut args = vec!["bench".to_string()];
        args.extend(a.bench.iter().cloned());
        args.extend(["--server-pid".into(), pid.to_string()]);
        bench(&args)
    } else {
        Err(format!(
            "server {:?} did not listen on {addr} within 10s",
            a.server_cmd
        ))
    };
    let _ = corelocal::sys::signal::terminate(pid as i32);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Ok(None) = child.try_wait() {
        let _ = corelocal::sys::signal::kill(pid as i32);
        let _ = child.wait();
    }
    result
}

/// One run's figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunFig {
    /// Round number.
    pub round: usize,
    /// Transactions per second.
    pub txns_per_s: f64,
    /// Connections per second.
    pub conns_per_s: f64,
    /// Server CPU µs per transaction (schedstat).
    pub server_us_per_txn: Option<f64>,
    /// Server CPU µs per transaction (utime+stime).
    pub server_us_per_txn_utime: Option<f64>,
    /// Times the server was scheduled in, per transaction (its wake-ups).
    pub server_runs_per_txn: Option<f64>,
    /// Server cores busy.
    pub server_cores: Option<f64>,
    /// Client CPU µs per transaction.
    pub client_us_per_txn: Option<f64>,
    /// p50 / p99 latency µs.
    pub p50_us: f64,
    /// p99.
    pub p99_us: f64,
    /// p99.9 (0 in reports written before it was read).
    pub p999_us: f64,
    /// Errors in window.
    pub errors: u64,
    /// Host load average at the end.
    pub load: String,
    /// The run's JSON report.
    pub json: String,
    /// Request→response latency by percentile: (quantile, µs) at the fixed grid of
    /// [`crate::stats::spectrum_quantiles`]; empty from reports written before it existed.
    /// Left out of the comparison's JSON: each run's own file has it.
    #[serde(skip)]
    pub spectrum: Vec<(f64, f64)>,
}

/// Extracts a run's figures from its JSON report.
pub fn figures(v: &Value, round: usize, json: &str) -> RunFig {
    let g = |p: &str| v.pointer(p).and_then(Value::as_f64);
    let txns = g("/throughput/txns").unwrap_or(0.0);
    let per = |p: &str| g(p).filter(|_| txns > 0.0).map(|us| us / txns);
    let client_units = g("/client_cpu/us_per_unit").zip(g("/throughput/units"));
    RunFig {
        round,
        txns_per_s: g("/throughput/txns_per_s").unwrap_or(0.0),
        conns_per_s: g("/throughput/conns_per_s").unwrap_or(0.0),
        server_us_per_txn: per("/server_cpu/schedstat_us"),
        server_us_per_txn_utime: per("/server_cpu/utime_stime_us"),
        server_runs_per_txn: per("/server_cpu/runs"),
        server_cores: g("/server_cpu/cores_busy"),
        client_us_per_txn: client_units
            .filter(|_| txns > 0.0)
            .map(|(u, n)| u * n / txns),
        p50_us: g("/latency/txn/p50_us").unwrap_or(0.0),
        p99_us: g("/latency/txn/p99_us").unwrap_or(0.0),
        p999_us: g("/latency/txn/p999_us").unwrap_or(0.0),
        errors: v
            .pointer("/errors/in_window")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        load: v
            .pointer("/host/loadavg")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        json: json.to_string(),
        spectrum: v
            .pointer("/latency_percentiles/0/points")
            .and_then(Value::as_array)
            .map(|pts| {
                pts.iter()
                    .filter_map(|p| Some((p.get(0)?.as_f64()?, p.get(1)?.as_f64()?)))
                    .collect()
            })
            .unwrap_or_default(),
    }
}
