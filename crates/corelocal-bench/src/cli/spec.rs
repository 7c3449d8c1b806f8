//! Running a parsed command: validation of the arguments and their resolution into a
//! [`RunSpec`].

use super::{load_urls, resolve, Command, Common, CrrProto, Dur, RpcProto, Workload};
use crate::runner::{self, RunSpec, ScriptKind};
use crate::workload::CloseBy;
use std::process::ExitCode;

fn validate(c: &Common) -> Result<(), String> {
    if c.cpus.is_empty() {
        return Err("--cpus is empty".into());
    }
    if let Some(r) = c.rate {
        if !(r.is_finite() && r > 0.0) {
            return Err(format!("--rate must be positive, got {r}"));
        }
    }
    if c.conns == Some(0) {
        return Err("--conns must be at least 1".into());
    }
    if c.duration.map(Dur::ns) == Some(0) {
        return Err("--duration must be positive".into());
    }
    if c.requests == Some(0) {
        return Err("--requests must be positive".into());
    }
    if c.recv_buf < 64 || c.recv_buf > 16 << 20 {
        return Err("--recv-buf must be in 64..16M".into());
    }
    Ok(())
}

/// Runs a parsed command.
pub fn execute(cmd: Command) -> Result<ExitCode, String> {
    match cmd.workload {
        Workload::Compare(a) => crate::compare::run(a),
        Workload::Round(a) => crate::compare::round(a),
        w => runner::main(to_spec(w)?),
    }
}

/// Validates a workload's arguments and resolves them into a [`RunSpec`].
pub fn to_spec(w: Workload) -> Result<RunSpec, String> {
    let spec = match w {
        Workload::Compare(_) | Workload::Round(_) => return Err("not a load workload".into()),
        Workload::Rpc(a) => {
            validate(&a.common)?;
            if a.msg_size == 0 {
                return Err("--msg-size must be at least 1".into());
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
                return Err("--bursts needs positive sizes, e.g. 1,2,3".into());
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
                return Err("--get-ratio must be within 0..1".into());
            }
            if a.key_prefix.contains(char::is_whitespace) || a.key_prefix.len() > 200 {
                return Err("--key-prefix must be short and without spaces".into());
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
