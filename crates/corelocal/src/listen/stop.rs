//! Closing one worker's listeners (the others keep their traffic) and stopping the whole
//! group: refusing new SYNs, how long connections past the handshake may take to reach the
//! accept queues, whether queued connections survive a close, and how many are queued.

use super::error::io_context;
use super::steering::{attach_cbpf, cpu_worker_runs};
use super::{ActiveSteering, ListenError, ListenerGroup, Migration, Mode, Steering};
use crate::sys::socket;
use std::os::fd::AsRawFd;
use std::time::Duration;

impl ListenerGroup {
    /// Closes `worker`'s listeners and re-steers so the other workers keep their traffic; the
    /// connections queued in them move to live siblings when [`ListenerGroup::migration`]
    /// allows (eBPF SELECT_OR_MIGRATE or the netns sysctl), else they are reset:
    /// the eBPF sockarray slot empties itself (its CPU falls back to the hash), SO_INCOMING_CPU
    /// needs nothing, and the cBPF program is rebuilt for the kernel's new `socks[]` order.
    pub fn close_worker(&mut self, worker: usize) -> Result<(), ListenError> {
        if worker >= self.workers() {
            return Err(ListenError::Config(format!("no worker {worker}")));
        }
        if self.config.mode == Mode::Stock {
            return Err(ListenError::Config(
                "stock mode shares one listener; close the whole group instead".into(),
            ));
        }
        for g in &mut self.groups {
            if g.listeners[worker].take().is_none() {
                continue;
            }
            if let Some(pos) = g.kernel_order.iter().position(|&w| w == worker) {
                // Mirror __reuseport_detach_sock(): the last member moves into the hole.
                g.kernel_order.swap_remove(pos);
            }
            if let Some(sel) = &g.ebpf {
                // The CPU's SYNs go to its longest run of live workers (the hash without any).
                let cpu = self.config.worker_cpus[worker];
                let live: Vec<bool> = g.listeners.iter().map(Option::is_some).collect();
                let run = cpu_worker_runs(&self.config.worker_cpus, &live)
                    .into_iter()
                    .find(|r| r.cpu == cpu);
                sel.map_cpu(cpu as u32, run.map(|r| (r.first as u32, r.count as u32)))?;
            }
            if self.steering == ActiveSteering::Local(Steering::Cbpf) {
                attach_cbpf(g, &self.config.worker_cpus)?;
            }
        }
        Ok(())
    }

    /// Starts stopping the whole group: with eBPF steering, new SYNs are refused from now on
    /// (`SK_DROP`) while queued children and handshakes in progress are kept, so the queues
    /// only shrink and can be drained by accept. Returns whether new SYNs are now refused
    /// (false without eBPF: the queues keep filling until the listeners close).
    pub fn begin_stop(&self) -> Result<bool, ListenError> {
        let mut refusing = !self.groups.is_empty();
        if self.config.defer_accept_s.is_some() {
            // Connections held for their first data are queued at their next SYN-ACK's ACK
            // rather than after the whole period (see `stop_quiesce`).
            for fd in self
                .groups
                .iter()
                .flat_map(|g| g.listeners.iter().flatten())
            {
                socket::set_defer_accept(fd.as_raw_fd(), 0)
                    .map_err(io_context("TCP_DEFER_ACCEPT off"))?;
            }
        }
        for g in &self.groups {
            match &g.ebpf {
                Some(sel) => sel.set_stopping(true)?,
                None => refusing = false,
            }
        }
        Ok(refusing)
    }

    /// Undoes [`ListenerGroup::begin_stop`] and takes the steering back
    /// ([`ListenerGroup::restore_steering`]): a successor that took the group failed, this
    /// process serves on. New SYNs reach this group's sockets again, `TCP_DEFER_ACCEPT` as
    /// configured.
    pub fn end_stop(&self) -> Result<(), ListenError> {
        for g in &self.groups {
            if let Some(sel) = &g.ebpf {
                sel.set_stopping(false)?;
            }
        }
        if let Some(secs) = self.config.defer_accept_s {
            for fd in self
                .groups
                .iter()
                .flat_map(|g| g.listeners.iter().flatten())
            {
                socket::set_defer_accept(fd.as_raw_fd(), secs)
                    .map_err(io_context("TCP_DEFER_ACCEPT"))?;
            }
        }
        self.restore_steering()
    }

    /// On stop, how long connections whose handshake is done may take to reach the accept
    /// queues: with `TCP_DEFER_ACCEPT`, one held for its first data is queued when that data
    /// comes or when the kernel sends its SYN-ACK again (within the period) and the ACK
    /// returns; `None` without it (the runtime's own short quiesce applies).
    pub fn stop_quiesce(&self) -> Option<Duration> {
        let secs = self.config.defer_accept_s?;
        Some(Duration::from_secs(secs.into()) + Duration::from_millis(500))
    }

    /// How a closing listener's queued connections survive (see [`Migration`]).
    pub fn migration(&self) -> Migration {
        if self.groups.iter().all(|g| g.ebpf.is_some()) {
            return Migration::Ebpf;
        }
        let sysctl = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_migrate_req");
        if sysctl.is_ok_and(|v| v.trim() == "1") {
            return Migration::Sysctl;
        }
        Migration::None
    }

    /// Connections waiting in all open listeners' accept queues (each socket counted once).
    pub fn queued_total(&self) -> u64 {
        let mut seen = Vec::new();
        let mut total = 0u64;
        for g in &self.groups {
            for fd in g.listeners.iter().flatten() {
                let raw = fd.as_raw_fd();
                if seen.contains(&raw) {
                    continue;
                }
                seen.push(raw);
                total += socket::listen_queue(raw).map_or(0, |d| d.len as u64);
            }
        }
        total
    }
}
