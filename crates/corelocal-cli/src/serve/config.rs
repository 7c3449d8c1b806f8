//! The runtime's [`ServerConfig`] from the options every server shares: CPUs, mode, steering,
//! backend, limits, XDP and the balancer.

use super::common::CommonArgs;
use corelocal::cpu::current_affinity;
use corelocal::listen::{Mode, Steering};
use corelocal::runtime::{BackendKind, ServerConfig};
use std::time::Duration;

/// --input-limit of every server but kv (see `KV_INPUT_LIMIT_DEFAULT`).
const INPUT_LIMIT_DEFAULT: u64 = 64 << 10;

pub(super) fn server_config(common: &CommonArgs) -> Result<ServerConfig, String> {
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
    config.listen.backlog_total = common.backlog.max(1);
    config.listen.defer_accept_s = (common.defer_accept > 0).then_some(common.defer_accept);
    config.backend = common.backend.parse::<BackendKind>()?;
    config.limits.idle_timeout = common.idle_timeout.max(Duration::from_millis(1));
    config.limits.drain_timeout = common.drain_timeout;
    config.limits.linger_time = common.linger_time;
    config.limits.linger_timeout = common.linger_timeout.max(Duration::from_millis(1));
    config.limits.linger_bytes_max = common.linger_bytes;
    config.limits.conns_per_worker_max = common.conns_per_worker as usize;
    config.limits.accept_batch_max = common.accept_batch as usize;
    config.limits.output_bytes_max = usize::try_from(common.output_limit).unwrap_or(usize::MAX);
    let input_limit = common.input_limit.unwrap_or(INPUT_LIMIT_DEFAULT);
    config.limits.input_bytes_max = usize::try_from(input_limit).unwrap_or(usize::MAX);
    if let Some(iface) = &common.xdp_iface {
        match corelocal::steer::RssSteering::detect(iface) {
            Err(unsupported) => {
                eprintln!("corelocal serve: {unsupported}; steering flow groups with XDP + CPUMAP")
            }
            Ok(_) => eprintln!(
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
        b.migrate_interval_ns = common.migrate_interval.as_nanos().max(1) as u64;
        b.flow_groups = config.listen.flow_groups;
        b.validate().map_err(|e| e.to_string())?;
        config.balance = Some(b);
    }
    Ok(config)
}
