//! Steering inside a reuseport group: attaching the eBPF or classic BPF program, each
//! CPU's run of workers, and moving flow groups (eBPF steering).

use super::error::io_context;
use super::{AddrGroup, GroupConfig, ListenError, ListenerGroup};
use crate::bpf::{programs, ReuseportSelect};
use crate::sys::socket;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

impl ListenerGroup {
    /// Whether flow groups can be moved ([`ListenerGroup::set_flow_group`]): eBPF steering.
    pub fn supports_flow_groups(&self) -> bool {
        self.groups.iter().all(|g| g.ebpf.is_some())
    }

    /// Moves flow group `group` (`hash & (G-1)`) to `worker`, or back to CPU steering with
    /// `None`. Only with eBPF steering.
    pub fn set_flow_group(&self, group: u32, worker: Option<usize>) -> Result<(), ListenError> {
        if worker.is_some_and(|w| w >= self.workers()) {
            return Err(ListenError::Config("no such worker".into()));
        }
        for g in &self.groups {
            let Some(sel) = &g.ebpf else {
                return Err(ListenError::Config(
                    "flow-group overrides need eBPF steering".into(),
                ));
            };
            sel.set_group_override(group, worker.map(|w| w as u32))?;
        }
        Ok(())
    }

    /// Number of flow groups.
    pub fn flow_groups(&self) -> u32 {
        self.config.flow_groups
    }

    /// Sends the SYNs processed on `cpu` to the `count` consecutive workers from `first`
    /// (`Some((first, count))`: a busy worker's CPU redirected, see
    /// [`crate::balance::redirect`]), or back to the CPU's own live workers (`None`). Only
    /// with eBPF steering; flow-group overrides still come first.
    pub fn redirect_cpu(&self, cpu: usize, to: Option<(usize, usize)>) -> Result<(), ListenError> {
        if let Some((first, count)) = to {
            if count == 0 || first + count > self.workers() {
                return Err(ListenError::Config("no such workers".into()));
            }
        }
        for g in &self.groups {
            let Some(sel) = &g.ebpf else {
                return Err(ListenError::Config(
                    "redirecting a CPU's SYNs needs eBPF steering".into(),
                ));
            };
            let run = match to {
                Some((first, count)) => Some((first as u32, count as u32)),
                None => {
                    let live: Vec<bool> = g.listeners.iter().map(Option::is_some).collect();
                    cpu_worker_runs(&self.config.worker_cpus, &live)
                        .into_iter()
                        .find(|r| r.cpu == cpu)
                        .map(|r| (r.first as u32, r.count as u32))
                }
            };
            sel.map_cpu(cpu as u32, run)?;
        }
        Ok(())
    }
}

pub(super) fn first_listener(group: &AddrGroup) -> Option<RawFd> {
    group
        .listeners
        .iter()
        .flatten()
        .next()
        .map(|fd| fd.as_raw_fd())
}

pub(super) fn attach_ebpf(group: &mut AddrGroup, config: &GroupConfig) -> Result<(), ListenError> {
    let workers = config.worker_cpus.len() as u32;
    let cpu_slots = config.worker_cpus.iter().max().map_or(1, |&m| m as u32 + 1);
    let sel = ReuseportSelect::load(workers, cpu_slots.max(256), config.flow_groups)?;
    for (w, fd) in group.listeners.iter().enumerate() {
        let fd = fd.as_ref().expect("fresh group").as_raw_fd();
        set_listener_patiently(&sel, w as u32, fd)?;
    }
    let live = vec![true; config.worker_cpus.len()];
    for run in cpu_worker_runs(&config.worker_cpus, &live) {
        sel.map_cpu(run.cpu as u32, Some((run.first as u32, run.count as u32)))?;
    }
    let first = first_listener(group).expect("fresh group");
    socket::attach_reuseport_ebpf(first, sel.program_fd())
        .map_err(io_context("SO_ATTACH_REUSEPORT_EBPF"))?;
    group.ebpf = Some(sel);
    Ok(())
}

/// A CPU's workers for CPU steering: `count` consecutive live workers from `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuWorkers {
    /// The CPU.
    pub cpu: usize,
    /// Its first worker.
    pub first: usize,
    /// How many consecutive workers from `first` run on it (≥ 1).
    pub count: usize,
}

/// For every CPU with a live worker, its longest run of consecutive live workers (the first
/// such run on ties). Workers of a CPU are consecutive when built by
/// `ServerConfig::workers_per_cpu`; a run is what the steering program can spread over.
pub fn cpu_worker_runs(worker_cpus: &[usize], live: &[bool]) -> Vec<CpuWorkers> {
    assert_eq!(
        worker_cpus.len(),
        live.len(),
        "one liveness flag per worker"
    );
    let mut best: Vec<CpuWorkers> = Vec::new();
    let mut w = 0;
    while w < worker_cpus.len() {
        if !live[w] {
            w += 1;
            continue;
        }
        let cpu = worker_cpus[w];
        let count = (w..worker_cpus.len())
            .take_while(|&i| worker_cpus[i] == cpu && live[i])
            .count();
        let run = CpuWorkers {
            cpu,
            first: w,
            count,
        };
        match best.iter_mut().find(|r| r.cpu == cpu) {
            Some(r) if r.count < count => *r = run,
            Some(_) => {}
            None => best.push(run),
        }
        w += count;
    }
    best
}

pub(super) fn attach_cbpf(group: &AddrGroup, worker_cpus: &[usize]) -> Result<(), ListenError> {
    let table: Vec<(u32, u32)> = group
        .kernel_order
        .iter()
        .enumerate()
        .map(|(index, &w)| (worker_cpus[w] as u32, index as u32))
        .collect();
    let Some(first) = first_listener(group) else {
        return Ok(());
    };
    socket::attach_reuseport_cbpf(first, &programs::cbpf_cpu_select(&table))
        .map_err(io_context("SO_ATTACH_REUSEPORT_CBPF"))
}

/// How long a listener may stay in another process's sockarray (EBUSY) before adopting or
/// restoring gives up: the old map is freed shortly after its program is replaced.
const SOCKARRAY_BUSY_WAIT: Duration = Duration::from_secs(2);
const SOCKARRAY_BUSY_POLL: Duration = Duration::from_millis(10);

/// Puts `worker`'s listener into the sockarray, waiting out EBUSY (the socket still belongs to
/// another map that is being freed) for at most [`SOCKARRAY_BUSY_WAIT`].
pub(super) fn set_listener_patiently(
    sel: &ReuseportSelect,
    worker: u32,
    fd: RawFd,
) -> Result<(), ListenError> {
    let until = Instant::now() + SOCKARRAY_BUSY_WAIT;
    loop {
        match sel.set_listener(worker, fd) {
            Err(e) if e.source.raw_os_error() == Some(libc::EBUSY) && Instant::now() < until => {
                std::thread::sleep(SOCKARRAY_BUSY_POLL);
            }
            Err(e) if e.source.raw_os_error() == Some(libc::EBUSY) => {
                return Err(ListenError::Config(format!(
                    "worker {worker}'s listener is still in another process's eBPF sockarray \
                     (EBUSY after {SOCKARRAY_BUSY_WAIT:?}): the running server did not release \
                     its steering"
                )));
            }
            other => return other.map_err(ListenError::Bpf),
        }
    }
}
