//! The runtime's [`ServerConfig`] from the options every server shares: CPUs, mode, steering,
//! backend, limits, XDP and the balancer.

use super::common::{CommonArgs, Takeover};
use crate::check;
use corelocal::cpu::current_affinity;
use corelocal::listen::{ListenError, Mode, Steering};
use corelocal::runtime::{BackendKind, ServerConfig, ServerError};

/// --input-limit of every server but kv (see `KV_INPUT_LIMIT_DEFAULT`).
const INPUT_LIMIT_DEFAULT: u64 = 64 << 10;

/// --idle-timeout of every server but kv (see `KV_IDLE_TIMEOUT_DEFAULT`).
const IDLE_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(60);

/// Checks the shared options before anything starts; each error names the flag and value.
fn check_common(common: &CommonArgs) -> Result<(), String> {
    if let Some(cpus) = &common.cpus {
        check::cpus("--cpus", cpus)?;
    }
    for (i, addr) in common.listen.iter().enumerate() {
        if addr.port() != 0 && common.listen[..i].contains(addr) {
            return Err(format!(
                "--listen {addr} is given twice; give each address once"
            ));
        }
    }
    if let Some(idle) = common.idle_timeout {
        check::positive("--idle-timeout", idle, "60s")?;
    }
    check::positive("--linger-timeout", common.linger_timeout, "5s")?;
    check::positive("--migrate-interval", common.migrate_interval, "100ms")?;
    check::positive("--takeover-timeout", common.takeover_timeout, "10s")?;
    if let Some(steering) = &common.steering {
        if common.mode != "local" {
            return Err(format!(
                "--steering {steering} applies to --mode local only (with --mode {} the kernel \
                 picks the listener); drop --steering or use --mode local",
                common.mode
            ));
        }
    }
    if let Some(iface) = &common.xdp_iface {
        check::interface("--xdp-iface", iface)?;
        if common.workers_per_cpu > 1 {
            return Err(format!(
                "--xdp-iface {iface} steers packets to CPUs, so it needs one worker per CPU \
                 (got --workers-per-cpu {}); drop one of the two",
                common.workers_per_cpu
            ));
        }
    }
    if let Some(path) = &common.stats_file {
        check::output_file("--stats-file", path, "stats.jsonl")?;
    }
    if let Some(path) = &common.upgrade_socket {
        check::output_file("--upgrade-socket", path, "corelocal.sock")?;
    }
    if let Some(addr) = common.metrics {
        check::bindable("--metrics", addr)?;
    }
    match &common.takeover {
        Some(Takeover::Pid(pid)) => {
            let steering = common.steering.as_deref().unwrap_or("ebpf");
            if common.mode != "local" || steering != "ebpf" {
                let got = match &common.steering {
                    Some(s) => format!("--mode {} --steering {s}", common.mode),
                    None => format!("--mode {}", common.mode),
                };
                return Err(format!(
                    "--takeover {pid} (a process id) joins the running server's reuseport group \
                     and steers its SYNs with this server's eBPF program, so it needs --mode \
                     local with eBPF steering (got {got}); use --takeover SOCKET (the old \
                     server's --upgrade-socket) in other modes"
                ));
            }
            check::process(
                "--takeover",
                *pid,
                "give the process id of the running corelocal server (e.g. `pgrep -n \
                 corelocal`) or the path of its --upgrade-socket",
            )?;
        }
        Some(Takeover::Socket(path)) => check::not_a_socket(
            "--takeover",
            path,
            "give the path the running server was started with as --upgrade-socket",
        )?,
        None => {}
    }
    Ok(())
}

/// Explains why the server did not start, naming the flag where one is to blame.
pub(super) fn start_error(e: &ServerError, common: &CommonArgs) -> String {
    match e {
        ServerError::Listen(ListenError::Io { context, source }) => common
            .listen
            .iter()
            .find(|a| context.ends_with(&format!(" {a}")))
            .map_or_else(
                || e.to_string(),
                |addr| check::bind_error("--listen", *addr, source),
            ),
        ServerError::Listen(ListenError::AddrInUse(addr)) => format!(
            "{}; to replace a running corelocal server there, start with --takeover",
            check::bind_error("--listen", *addr, &std::io::ErrorKind::AddrInUse.into())
        ),
        ServerError::Limits(limit) => {
            let flag = match limit.field {
                "input_bytes_max" => "--input-limit",
                "output_bytes_max" => "--output-limit",
                "conns_per_worker_max" => "--conns-per-worker",
                "accept_batch_max" => "--accept-batch",
                "idle_timeout" => "--idle-timeout",
                "linger_timeout" => "--linger-timeout",
                _ => return limit.to_string(),
            };
            format!("{flag}: {limit}")
        }
        ServerError::Cpus(_) => match &common.cpus {
            Some(cpus) => format!("--cpus {cpus}: {e}"),
            None => e.to_string(),
        },
        _ => e.to_string(),
    }
}

pub(super) fn server_config(common: &CommonArgs) -> Result<ServerConfig, String> {
    check_common(common)?;
    let cpus = match &common.cpus {
        Some(c) => c.clone(),
        None => current_affinity().map_err(|e| format!("reading CPU affinity: {e}"))?,
    };
    let mode: Mode = common.mode.parse()?;
    let mut config = ServerConfig::new(common.listen.clone(), &cpus, mode)
        .workers_per_cpu(common.workers_per_cpu as usize);
    config.listen.steering = common
        .steering
        .as_deref()
        .map(str::parse::<Steering>)
        .transpose()?;
    config.listen.backlog_total = common.backlog;
    config.listen.defer_accept_s = (common.defer_accept > 0).then_some(common.defer_accept);
    config.listen.defer_accept_adaptive = common.defer_accept_adaptive == "on";
    config.backend = common.backend.parse::<BackendKind>()?;
    // A takeover starts behind the gate: the predecessor's connections and state come first.
    config.gated = common.takeover.is_some();
    // `--takeover PID` joins the running server's group (the socket form adopts its sockets).
    config.listen.join_existing = matches!(common.takeover, Some(Takeover::Pid(_)));
    config.limits.idle_timeout = common.idle_timeout.unwrap_or(IDLE_TIMEOUT_DEFAULT);
    config.limits.drain_timeout = common.drain_timeout;
    config.limits.linger_time = common.linger_time;
    config.limits.linger_timeout = common.linger_timeout;
    config.limits.linger_bytes_max = common.linger_bytes;
    config.limits.conns_per_worker_max = common.conns_per_worker as usize;
    config.limits.accept_batch_max = common.accept_batch as usize;
    config.limits.output_bytes_max = usize::try_from(common.output_limit).unwrap_or(usize::MAX);
    let input_limit = common.input_limit.unwrap_or(INPUT_LIMIT_DEFAULT);
    config.limits.input_bytes_max = usize::try_from(input_limit).unwrap_or(usize::MAX);
    if let Some(iface) = &common.xdp_iface {
        match corelocal::steer::RssSteering::detect(iface) {
            Err(unsupported) => {
                corelocal::log_line!(
                    "corelocal serve: {unsupported}; steering flow groups with XDP + CPUMAP"
                )
            }
            Ok(_) => corelocal::log_line!(
                "corelocal serve: {iface} has an RSS indirection table, but moving its buckets \
                 also needs queue → CPU IRQ affinity (corelocal tune); steering flow groups \
                 with XDP + CPUMAP"
            ),
        }
        config.xdp_iface = Some(iface.clone());
    }
    let balance_on = match common.balance.as_str() {
        "on" => true,
        "off" => false,
        // One worker has nobody to balance with: pacing its accepts would only cost.
        _ => mode == Mode::Local && config.listen.worker_cpus.len() > 1,
    };
    if balance_on {
        let mut b = corelocal::balance::BalanceConfig::new(config.listen.worker_cpus.len());
        (b.share_local, b.share_remote) = common.balance_share;
        (b.busy_high_pct, b.busy_low_pct) = common.busy_watermarks;
        b.migrate_interval_ns = u64::try_from(common.migrate_interval.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        b.flow_groups = config.listen.flow_groups;
        b.validate()
            .map_err(|e| format!("--balance-share/--busy-watermarks/--migrate-interval: {e}"))?;
        config.balance = Some(b);
    }
    Ok(config)
}
