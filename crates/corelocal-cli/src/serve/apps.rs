//! Per-app launch: [`run`] gives each app its default address, turns its arguments into its
//! service's config and serves it.

use super::args::{App, Command, HttpArgs, KvArgs};
use super::common::CommonArgs;
use super::{fail, serve, serve_with};
use crate::check;
use corelocal_apps::http::{AccessLog, HttpConfig, HttpService};
use corelocal_apps::kv::{KvConfig, KvService, Report, ShutdownHook};
use corelocal_apps::rpc::{RpcConfig, RpcService};
use corelocal_apps::sockperf::{SockperfConfig, SockperfService};
use corelocal_proto::memcache;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// kv's default --input-limit: the longest multiget key list (a get line is the only request
/// kept whole in the input; storage data streams into the item) is one byte less, and above
/// memcached's own test's 128 KiB.
const KV_INPUT_LIMIT_DEFAULT: u64 = memcache::GET_LINE_BYTES_MAX_DEFAULT as u64 + 1;

/// Runs `corelocal serve`.
pub fn run(cmd: Command) -> ExitCode {
    // Before the app is built (the built-in site takes a while): a SIGTERM during start-up then
    // waits and stops the server once it serves, instead of killing it half-started.
    if let Err(e) = corelocal::sys::signal::block_termination_signals() {
        return fail(&format!("blocking signals: {e}"));
    }
    match cmd.app {
        App::Http(mut args) => {
            default_listen(&mut args.common, "127.0.0.1:8080");
            let access_log = match args.access_log.as_str() {
                "off" => AccessLog::Off,
                "stderr" => AccessLog::Stderr,
                path => AccessLog::File(PathBuf::from(path)),
            };
            if let Err(e) = check_http(&args, &access_log) {
                return fail(&e);
            }
            let config = HttpConfig {
                root: args.root,
                cache_bytes_max: args.cache_mb.saturating_mul(1 << 20),
                access_log,
                header_timeout_ms: u64::try_from(args.header_timeout.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1),
                ..HttpConfig::default()
            };
            match HttpService::new(config) {
                Ok(service) => serve(&args.common, Arc::new(service)),
                Err(e) => fail(&format!("http: {e}")),
            }
        }
        App::Kv(mut args) => {
            default_listen(&mut args.common, "127.0.0.1:11211");
            let input_limit = *args
                .common
                .input_limit
                .get_or_insert(KV_INPUT_LIMIT_DEFAULT);
            // One byte under the runtime's limit, so that kv sees an over-long multiget (and
            // answers it) before the runtime closes the connection silently.
            let get_line_bytes_max =
                usize::try_from(input_limit.saturating_sub(1).max(1)).unwrap_or(usize::MAX);
            let config = match kv_config(&mut args, get_line_bytes_max) {
                Ok(c) => c,
                Err(e) => return fail(&format!("kv: {e}")),
            };
            match KvService::new(config) {
                Ok(service) => {
                    let shared = service.clone();
                    serve_with(&args.common, Arc::new(service), move |addrs| {
                        shared.set_listening(addrs)
                    })
                }
                Err(e) => fail(&format!("kv: {e}")),
            }
        }
        App::Rpc(mut args) => {
            default_listen(&mut args.common, "127.0.0.1:7000");
            let config = RpcConfig {
                request_bytes: args.req_size as usize,
                response_bytes: args.resp_size as usize,
                one_shot: args.one_shot,
            };
            match RpcService::new(config) {
                Ok(service) => serve(&args.common, Arc::new(service)),
                Err(e) => fail(&e),
            }
        }
        App::Sockperf(mut args) => {
            default_listen(&mut args.common, "127.0.0.1:11111");
            let config = SockperfConfig {
                max_message_bytes: args.msg_size_max as usize,
            };
            match SockperfService::new(config) {
                Ok(service) => serve(&args.common, Arc::new(service)),
                Err(e) => fail(&format!("sockperf: {e}")),
            }
        }
    }
}

/// Checks `serve http`'s own flags before anything starts.
fn check_http(args: &HttpArgs, access_log: &AccessLog) -> Result<(), String> {
    if let Some(root) = &args.root {
        check::existing_dir(
            "--root",
            root,
            "give the directory holding the files to serve, or leave --root out to serve the \
             built-in site",
        )?;
    }
    if let AccessLog::File(path) = access_log {
        check::output_file("--access-log", path, "access.log")
            .map_err(|e| format!("{e} (or --access-log off or stderr)"))?;
    }
    check::positive("--header-timeout", args.header_timeout, "10s")
}

/// kv's idle timeout when none is given: memcached closes no idle connection unless told to
/// (`-o idle_timeout`), and cache clients keep pooled connections idle for long.
const KV_IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30 * 24 * 3600);

/// Whether `--idle-timeout` was on the command line (clap's default cannot be told apart
/// from an explicit 60s here).
fn idle_timeout_given() -> bool {
    std::env::args_os().any(|a| {
        a.to_str()
            .is_some_and(|a| a == "--idle-timeout" || a.starts_with("--idle-timeout="))
    })
}

/// The kv service's configuration from its arguments (and what it reports of the common
/// ones, as memcached's `stats settings`).
fn kv_config(args: &mut KvArgs, get_line_bytes_max: usize) -> Result<KvConfig, String> {
    let common = &mut args.common;
    let idle_timeout_secs = if idle_timeout_given() {
        common.idle_timeout.as_secs().max(1)
    } else {
        common.idle_timeout = KV_IDLE_TIMEOUT_DEFAULT;
        0
    };
    let threads = common
        .cpus
        .as_ref()
        .map(|c| c.len())
        .or_else(|| corelocal::cpu::current_affinity().ok().map(|c| c.len()))
        .unwrap_or(1)
        * usize::from(common.workers_per_cpu);
    let auth = match &args.auth_file {
        None => Vec::new(),
        Some(path) => {
            let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            corelocal_apps::kv::parse_auth_file(&text)
                .map_err(|e| format!("{}: {e}", path.display()))?
        }
    };
    let delimiter = match args.detail_delimiter {
        None => None,
        Some(c) if c.is_ascii() && c != ' ' => Some(c as u8),
        Some(c) => {
            return Err(format!(
                "--detail-delimiter {c:?}: one ASCII byte, not a space"
            ))
        }
    };
    let first = common.listen.first();
    let report = Report {
        threads: u32::try_from(threads).unwrap_or(u32::MAX),
        max_connections: common.conns_per_worker.saturating_mul(threads as u64),
        tcp_port: first.map_or(0, |a| a.port()),
        interface: first.map(|a| a.ip().to_string()),
        backlog: common.backlog,
        idle_timeout_secs,
        listen: common.listen.clone(),
        ..Report::default()
    };
    let shutdown = ShutdownHook(Arc::new(|_graceful| {
        // Our SIGTERM is already graceful: requests in progress finish (--drain-timeout).
        if let Err(e) = corelocal::sys::signal::terminate(std::process::id() as i32) {
            eprintln!("corelocal serve kv: shutdown: {e}");
        }
    }));
    Ok(KvConfig {
        memory_bytes_max: args.memory_mb << 20,
        item_bytes_max: args.item_max,
        limits: memcache::Limits {
            get_line_bytes_max,
            ..memcache::Limits::default()
        },
        flush_enabled: !args.disable_flush_all,
        cas_enabled: !args.disable_cas,
        report,
        prefix_delimiter: delimiter.unwrap_or(b':'),
        detail: delimiter.is_some(),
        dump_enabled: !args.disable_dumping,
        lru_crawler: !args.no_lru_crawler,
        track_sizes: args.track_sizes,
        debug_time: args.debug_time,
        evictions: !args.disable_evictions,
        shutdown_enabled: args.enable_shutdown,
        shutdown: Some(shutdown),
        conn_limit: args.max_conns,
        auth,
        ..KvConfig::default()
    })
}

fn default_listen(common: &mut CommonArgs, addr: &str) {
    if common.listen.is_empty() {
        common.listen.push(addr.parse().expect("static address"));
    }
}
