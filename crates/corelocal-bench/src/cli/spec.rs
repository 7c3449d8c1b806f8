//! Running a parsed command: validation of the arguments and their resolution into a
//! [`RunSpec`].

use super::{load_urls, resolve, Command, Common, CrrProto, Dur, RpcProto, SrcSpec, Workload};
use crate::runner::{self, RunSpec, ScriptKind};
use crate::workload::{CloseBy, KvDialect};
use std::path::Path;
use std::process::ExitCode;

/// Most concurrent connections (each holds a receive buffer and a descriptor).
const CONNS_MAX: usize = 1_000_000;

/// Largest RPC message or kv value (bytes): the request is built in memory once per thread.
const MSG_BYTES_MAX: usize = 16 << 20;

/// Largest kv value (bytes), `serve kv --item-max`'s ceiling.
const VALUE_BYTES_MAX: usize = 1 << 30;

/// A file to write (created with its missing directories): not a directory, and the deepest
/// part of its path that exists is a directory.
fn check_output(flag: &str, path: &Path, example: &str) -> Result<(), String> {
    let shown = path.display();
    if path.is_dir() {
        return Err(format!(
            "{flag} {shown}: is a directory; give a file path such as {}",
            path.join(example).display()
        ));
    }
    let mut dir = path.parent();
    while let Some(d) = dir {
        let d = if d.as_os_str().is_empty() {
            Path::new(".")
        } else {
            d
        };
        match std::fs::metadata(d) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) => {
                return Err(format!(
                    "{flag} {shown}: {} is a file, not a directory; give a path under a directory",
                    d.display()
                ))
            }
            Err(_) => dir = d.parent(),
        }
    }
    Ok(())
}

/// Each end of a `--src` range is an address of this host.
fn check_src(src: &SrcSpec) -> Result<(), String> {
    let SrcSpec::Range(a, b) = src else {
        return Ok(());
    };
    for ip in [a, b] {
        if let Err(e) = std::net::UdpSocket::bind((*ip, 0)) {
            return Err(format!(
                "--src {src}: {ip} is not an address of this host ({e}); use addresses `ip addr` \
                 lists (on loopback any of 127.0.0.0/8), or --src auto"
            ));
        }
    }
    Ok(())
}

fn positive(flag: &str, d: Dur, example: &str) -> Result<(), String> {
    if d.ns() == 0 {
        return Err(format!("{flag} 0: must be positive, e.g. {flag} {example}"));
    }
    Ok(())
}

fn validate(c: &Common) -> Result<(), String> {
    if c.cpus.is_empty() {
        return Err("--cpus: empty CPU set; give a cpulist such as 0 or 0-1,3".into());
    }
    if let Some(u) = corelocal::cpu::unavailable(&c.cpus) {
        return Err(format!(
            "--cpus {}: {u} (one client thread is pinned to each)",
            c.cpus
        ));
    }
    if let Some(r) = c.rate {
        if !(r.is_finite() && r > 0.0) {
            return Err(format!(
                "--rate {r}: must be a positive number of units per second, e.g. --rate 10000"
            ));
        }
    }
    match c.conns {
        Some(0) => return Err("--conns 0: at least 1 connection, e.g. --conns 64".into()),
        Some(n) if n > CONNS_MAX => {
            return Err(format!(
                "--conns {n}: at most {CONNS_MAX} connections (each holds a descriptor and a \
                 --recv-buf buffer)"
            ))
        }
        _ => {}
    }
    if let Some(d) = c.duration {
        positive("--duration", d, "10s")?;
    }
    if c.requests == Some(0) {
        return Err(
            "--requests 0: must be at least 1 (or leave it out to run for --duration)".into(),
        );
    }
    positive("--timeout", c.timeout, "5s")?;
    if c.recv_buf < 64 || c.recv_buf > 16 << 20 {
        return Err(format!(
            "--recv-buf {}: must be 64 to 16777216 bytes (default 16384)",
            c.recv_buf
        ));
    }
    if !(0.0..=1.0).contains(&c.max_error_rate) {
        return Err(format!(
            "--max-error-rate {}: a fraction from 0 to 1 (0.01 = 1% of units)",
            c.max_error_rate
        ));
    }
    if c.rate_search {
        if c.search_probes == 0 {
            return Err(
                "--search-probes 0: the rate search needs at least 1 probe (default 12)".into(),
            );
        }
        if !(c.search_start.is_finite() && c.search_start > 0.0) {
            return Err(format!(
                "--search-start {}: must be a positive rate in units per second (default 1000)",
                c.search_start
            ));
        }
        positive("--search-duration", c.search_duration, "2s")?;
    }
    if let Some(pid) = c.server_pid {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(format!(
                "--server-pid {pid}: no process {pid} is running; give the server's process id \
                 (e.g. `pgrep -n nginx`)"
            ));
        }
    }
    if let Some(s) = &c.server_stats {
        if !s.starts_with("http://") && !Path::new(s).is_file() {
            let what = if Path::new(s).exists() {
                "not a file"
            } else {
                "no such file"
            };
            return Err(format!(
                "--server-stats {s}: {what}; give the file the server appends to (corelocal \
                 serve … --stats-file FILE) or its http://ADDR/metrics.json"
            ));
        }
    }
    if let Some(p) = &c.json {
        check_output("--json", p, "bench.json")?;
    }
    if let Some(p) = &c.md {
        check_output("--md", p, "bench.md")?;
    }
    if let Some(p) = &c.svg {
        check_output("--svg", p, "bench")?;
    }
    check_src(&c.src)
}

fn check_msg_size(flag: &str, n: usize) -> Result<(), String> {
    if n == 0 || n > MSG_BYTES_MAX {
        return Err(format!(
            "{flag} {n}: must be 1 to {MSG_BYTES_MAX} bytes (16 MiB)"
        ));
    }
    Ok(())
}

/// Runs a parsed command.
pub fn execute(cmd: Command) -> Result<ExitCode, String> {
    match cmd.workload {
        Workload::Compare(a) => crate::compare::run(a),
        Workload::Round(a) => crate::compare::round(a, |args| {
            super::Standalone::try_parse_args(args).and_then(execute)
        }),
        w => runner::main(to_spec(w)?),
    }
}

/// Validates a workload's arguments and resolves them into a [`RunSpec`].
pub fn to_spec(w: Workload) -> Result<RunSpec, String> {
    let spec = match w {
        Workload::Compare(_) | Workload::Round(_) => return Err("not a load workload".into()),
        Workload::Rpc(a) => {
            validate(&a.common)?;
            check_msg_size("--msg-size", a.msg_size)?;
            if let Some(r) = a.resp_size {
                check_msg_size("--resp-size", r)?;
            }
            let kind = match a.proto {
                RpcProto::Rpc => ScriptKind::Rpc {
                    msg: a.msg_size,
                    resp: a.resp_size.unwrap_or(a.msg_size),
                    txns: a.txns_per_conn,
                    close: CloseBy::Client,
                },
                RpcProto::Sockperf => ScriptKind::Sockperf {
                    msg: sockperf_size(a.msg_size, a.resp_size)?,
                    txns: a.txns_per_conn,
                    close: CloseBy::Client,
                },
            };
            RunSpec::new(
                "rpc",
                a.common.clone(),
                kind,
                a.linger0,
                serde_json::to_value(&a).map_err(|e| e.to_string())?,
            )?
        }
        Workload::Crr(a) => {
            validate(&a.common)?;
            if a.proto != CrrProto::Http {
                check_msg_size("--msg-size", a.msg_size)?;
                if let Some(r) = a.resp_size {
                    check_msg_size("--resp-size", r)?;
                }
            }
            let kind = match a.proto {
                CrrProto::Rpc => ScriptKind::Rpc {
                    msg: a.msg_size.max(1),
                    resp: a.resp_size.unwrap_or(a.msg_size),
                    txns: 1,
                    close: a.close,
                },
                CrrProto::Http => ScriptKind::CrrHttp {
                    path: a.path.clone(),
                    close: a.close,
                },
                CrrProto::Sockperf if a.close == CloseBy::Server => {
                    return Err(
                        "--proto sockperf: sockperf servers never close (use --close client)"
                            .into(),
                    )
                }
                CrrProto::Sockperf => ScriptKind::Sockperf {
                    msg: sockperf_size(a.msg_size, a.resp_size)?,
                    txns: 1,
                    close: CloseBy::Client,
                },
            };
            RunSpec::new(
                "crr",
                a.common.clone(),
                kind,
                a.linger0,
                serde_json::to_value(&a).map_err(|e| e.to_string())?,
            )?
        }
        Workload::Http(a) => {
            validate(&a.common)?;
            if a.bursts.is_empty() || a.bursts.contains(&0) {
                let given: Vec<String> = a.bursts.iter().map(u32::to_string).collect();
                return Err(format!(
                    "--bursts {}: every burst needs at least 1 request, e.g. --bursts 1,2,3",
                    given.join(",")
                ));
            }
            let (_, _, path) = resolve(&a.common.target)?;
            let urls = match &a.urls {
                Some(f) if f.as_os_str() == "paper" => (0
                    ..corelocal_proto::http::fileset::FILE_COUNT)
                    .map(corelocal_proto::http::fileset::path)
                    .collect(),
                Some(f) => load_urls(f)?,
                None => vec![path],
            };
            RunSpec::new(
                "http",
                a.common.clone(),
                ScriptKind::Http {
                    urls,
                    bursts: a.bursts.clone(),
                    think: a.think.ns(),
                    keep_alive: !a.close,
                    pipeline: a.pipeline,
                },
                false,
                serde_json::to_value(&a).map_err(|e| e.to_string())?,
            )?
        }
        Workload::Kv(a) => {
            validate(&a.common)?;
            if !(0.0..=1.0).contains(&a.get_ratio) {
                return Err(format!(
                    "--get-ratio {}: a fraction from 0 to 1 (0.9 = 90% gets, the rest sets)",
                    a.get_ratio
                ));
            }
            if a.key_prefix.contains(char::is_whitespace) || a.key_prefix.len() > 200 {
                return Err(format!(
                    "--key-prefix {:?}: memcached keys have no spaces and are at most 250 bytes; \
                     use at most 200 bytes without spaces, e.g. clb:",
                    a.key_prefix
                ));
            }
            if a.keys == 0 {
                return Err(
                    "--keys 0: the key space needs at least 1 key, e.g. --keys 10000".into(),
                );
            }
            if a.value_size > VALUE_BYTES_MAX {
                return Err(format!(
                    "--value-size {}: at most {VALUE_BYTES_MAX} bytes (1 GiB, memcached's largest item)",
                    a.value_size
                ));
            }
            RunSpec::new(
                "kv",
                a.common.clone(),
                ScriptKind::Kv {
                    keys: a.keys,
                    get_ratio: a.get_ratio,
                    value_size: a.value_size,
                    prefix: a.key_prefix.clone(),
                    txns: a.txns_per_conn,
                    dialect: match (a.meta, a.line) {
                        (true, _) => KvDialect::Meta,
                        (_, true) => KvDialect::Line,
                        _ => KvDialect::Text,
                    },
                },
                false,
                serde_json::to_value(&a).map_err(|e| e.to_string())?,
            )?
        }
    };
    Ok(spec)
}

/// Checks a sockperf message size: 14..=65,507 bytes, and the pong is the same size.
fn sockperf_size(msg: usize, resp: Option<usize>) -> Result<usize, String> {
    use corelocal_proto::sockperf::{HEADER_LEN, MAX_MESSAGE_LEN};
    if !(HEADER_LEN..=MAX_MESSAGE_LEN).contains(&msg) {
        return Err(format!(
            "--proto sockperf: --msg-size must be within {HEADER_LEN}..={MAX_MESSAGE_LEN} (the whole message, header included), got {msg}"
        ));
    }
    if resp.is_some_and(|r| r != msg) {
        return Err(
            "--proto sockperf: the pong is as long as the message; drop --resp-size".into(),
        );
    }
    Ok(msg)
}
