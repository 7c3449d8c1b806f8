//! Binding a group (trying the steering methods in turn), checking its config, and what
//! it holds: its mode and steering, the workers, their listeners and queue depths.

use super::error::io_context;
use super::steering::{attach_cbpf, attach_ebpf};
use super::{
    ActiveSteering, AddrGroup, GroupConfig, ListenError, ListenerGroup, Mode, QueueDepth, Steering,
    INCOMING_CPU_MIN_KERNEL,
};
use crate::sys::socket::{self, ListenOptions};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

impl ListenerGroup {
    /// Binds every worker's listeners. In `local` mode without a forced method, tries eBPF,
    /// then SO_INCOMING_CPU (kernel ≥ 6.2), then cBPF.
    pub fn bind(config: GroupConfig) -> Result<ListenerGroup, ListenError> {
        validate(&config)?;
        if !config.join_existing {
            refuse_addrs_in_use(&config.addrs)?;
        }
        let candidates: Vec<Option<Steering>> = match (config.mode, config.steering) {
            (Mode::Local, Some(forced)) => vec![Some(forced)],
            (Mode::Local, None) => {
                let mut c = vec![Some(Steering::Ebpf)];
                if socket::kernel_version().is_some_and(|v| v >= INCOMING_CPU_MIN_KERNEL) {
                    c.push(Some(Steering::IncomingCpu));
                }
                c.push(Some(Steering::Cbpf));
                c
            }
            (_, _) => vec![None],
        };
        let mut last_error = None;
        for method in &candidates {
            match Self::bind_with(&config, *method) {
                Ok(group) => return Ok(group),
                Err(ListenError::Bpf(e)) if e.is_permission() && candidates.len() > 1 => {
                    last_error = Some(ListenError::Bpf(e));
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| ListenError::Config("no steering method".into())))
    }

    fn bind_with(config: &GroupConfig, method: Option<Steering>) -> Result<Self, ListenError> {
        let steering = match (config.mode, method) {
            (Mode::Stock, _) => ActiveSteering::Shared,
            (Mode::Fine, _) => ActiveSteering::KernelHash,
            (Mode::Local, Some(m)) => ActiveSteering::Local(m),
            (Mode::Local, None) => unreachable!("local mode always has a method"),
        };
        let mut groups = Vec::with_capacity(config.addrs.len());
        for &addr in &config.addrs {
            groups.push(bind_addr(config, addr, steering)?);
        }
        Ok(ListenerGroup {
            config: config.clone(),
            steering,
            groups,
            adopted: false,
        })
    }

    /// The steering in force.
    pub fn steering(&self) -> ActiveSteering {
        self.steering
    }

    /// Whether the sockets were received from a running server ([`ListenerGroup::adopt`]):
    /// until that server confirmed the handover, they are shared with it.
    pub fn is_adopted(&self) -> bool {
        self.adopted
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.config.mode
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.config.worker_cpus.len()
    }

    /// The CPU of `worker`.
    pub fn worker_cpu(&self, worker: usize) -> usize {
        self.config.worker_cpus[worker]
    }

    /// The bound addresses (ports resolved).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.groups.iter().map(|g| g.local_addr).collect()
    }

    /// The open listeners of `worker`, one per address (the shared ones in `stock` mode).
    pub fn listeners(&self, worker: usize) -> Vec<RawFd> {
        self.groups
            .iter()
            .filter_map(|g| g.listeners[worker].as_ref().map(|fd| fd.as_raw_fd()))
            .collect()
    }

    /// Duplicates (`F_DUPFD_CLOEXEC`) the open listeners of `worker`, one per address, in the
    /// order of [`ListenerGroup::listeners`]: for a runtime that wants to own its listener
    /// (e.g. a tokio `TcpListener`). A duplicate refers to the same socket, so it stays in the
    /// reuseport group and the steering still picks it; closing the duplicate leaves the
    /// socket open as long as the group (or another duplicate) holds it.
    pub fn try_clone_listeners(&self, worker: usize) -> io::Result<Vec<OwnedFd>> {
        self.groups
            .iter()
            .filter_map(|g| g.listeners[worker].as_ref())
            .map(|fd| fd.try_clone())
            .collect()
    }

    /// Accept-queue depth of `worker`'s listeners, summed over addresses.
    pub fn queue_depth(&self, worker: usize) -> io::Result<QueueDepth> {
        let mut total = QueueDepth { len: 0, cap: 0 };
        for fd in self.listeners(worker) {
            let d = socket::listen_queue(fd)?;
            total.len += d.len;
            total.cap += d.cap;
        }
        Ok(total)
    }
}

pub(super) fn validate(config: &GroupConfig) -> Result<(), ListenError> {
    let bad = |m: &str| Err(ListenError::Config(m.to_string()));
    if config.addrs.is_empty() {
        return bad("no listen address");
    }
    if config.worker_cpus.is_empty() {
        return bad("no workers (empty CPU set)");
    }
    if !config.flow_groups.is_power_of_two() {
        return bad("flow groups must be a power of two");
    }
    if config.backlog_total == 0 {
        return bad("backlog must be at least 1");
    }
    Ok(())
}

/// Refuses an address another socket listens on: with `SO_REUSEPORT` our listeners would
/// join its group (same user) and take part of its connections, or part of ours would go to
/// it. Checked before anything is bound.
fn refuse_addrs_in_use(addrs: &[SocketAddr]) -> Result<(), ListenError> {
    for &addr in addrs {
        // A bind that fails otherwise (not an address of this host, a privileged port) fails
        // the same way when the listeners bind: reported as theirs.
        let free = socket::tcp_addr_free(addr).map_err(io_context(format!("listen on {addr}")))?;
        if !free {
            return Err(ListenError::AddrInUse(addr));
        }
    }
    Ok(())
}

fn bind_addr(
    config: &GroupConfig,
    addr: SocketAddr,
    steering: ActiveSteering,
) -> Result<AddrGroup, ListenError> {
    let workers = config.worker_cpus.len();
    let shared = steering == ActiveSteering::Shared;
    let sockets = if shared { 1 } else { workers };
    let backlog = (config.backlog_total / sockets as u32).max(1);
    let mut bound = addr;
    let mut fds: Vec<Arc<OwnedFd>> = Vec::with_capacity(sockets);
    for w in 0..sockets {
        let incoming_cpu = (steering == ActiveSteering::Local(Steering::IncomingCpu))
            .then(|| config.worker_cpus[w]);
        let opts = ListenOptions {
            reuseport: !shared,
            incoming_cpu,
            backlog,
            defer_accept_s: config.defer_accept_s,
        };
        let fd = socket::listen(bound, opts).map_err(io_context(format!("listen on {bound}")))?;
        if bound.port() == 0 {
            bound = socket::local_addr(fd.as_raw_fd()).map_err(io_context("getsockname"))?;
        }
        fds.push(Arc::new(fd));
    }
    let listeners = (0..workers)
        .map(|w| Some(fds[if shared { 0 } else { w }].clone()))
        .collect();
    let mut group = AddrGroup {
        local_addr: bound,
        listeners,
        kernel_order: (0..sockets).collect(),
        ebpf: None,
    };
    match steering {
        ActiveSteering::Local(Steering::Ebpf) => attach_ebpf(&mut group, config)?,
        ActiveSteering::Local(Steering::Cbpf) => attach_cbpf(&group, &config.worker_cpus)?,
        _ => {}
    }
    Ok(group)
}
