//! `attach`: choosing the method, loading `cl_cpu_pick` and attaching it to each group (or
//! setting SO_INCOMING_CPU), or updating the program already attached.

use super::incoming::set_incoming;
use super::maps::{find_attached, sync_maps};
use super::{err, Dups, Method, SteerError};
use crate::discover;
use crate::plan::Plan;
use corelocal::bpf::cpu_pick::CpuPick;
use corelocal::sys::socket;
use serde::Serialize;
use std::os::fd::AsRawFd;

/// Sockarray slots: room for listeners created later (reloads) without a new program.
const SLOTS_MIN: u32 = 64;

/// What attach did to one group.
#[derive(Debug, Clone, Serialize)]
pub struct Attached {
    /// The group.
    pub addr: String,
    /// `ebpf` or `incoming-cpu`.
    pub method: &'static str,
    /// The program id (eBPF).
    pub prog_id: Option<u32>,
    /// Whether an already attached `cl_cpu_pick` was updated instead of a new one attached.
    pub updated: bool,
    /// Map or socket-option writes done.
    pub writes: usize,
}

/// Why eBPF is unavailable, if it is (tries to load the program).
fn load_pick(slots: u32) -> Result<CpuPick, corelocal::bpf::BpfError> {
    CpuPick::load(slots, discover::possible_cpus() as u32)
}

/// Attaches (or updates) steering for every group of the plan. Nothing changes unless every
/// group can be steered.
pub fn attach(
    plan: &Plan,
    dups: &Dups,
    method: Method,
    log: &mut dyn FnMut(String),
) -> Result<Vec<Attached>, SteerError> {
    if plan.groups.is_empty() {
        return err(format!(
            "pid {}: no listening TCP socket (matching --listen) in its process tree",
            plan.pid
        ));
    }
    let refusals = plan.refusals();
    if !refusals.is_empty() {
        return err(format!(
            "refused, nothing changed:\n  {}",
            refusals.join("\n  ")
        ));
    }
    let method = resolve_method(method, log)?;
    let mut out = Vec::new();
    if method == Method::IncomingCpu {
        for g in &plan.groups {
            let writes = set_incoming(g, dups, true)?;
            out.push(Attached {
                addr: g.addr.to_string(),
                method: "incoming-cpu",
                prog_id: None,
                updated: false,
                writes,
            });
        }
        return Ok(out);
    }
    // Load every new program before touching any group, so a failure changes nothing.
    let mut work = Vec::new();
    for g in &plan.groups {
        match find_attached(g)? {
            Some(pick) => work.push((g, pick, true)),
            None => {
                let slots = (4 * g.listeners.len() as u32).max(SLOTS_MIN);
                let pick = load_pick(slots).map_err(|e| SteerError(e.to_string()))?;
                work.push((g, pick, false));
            }
        }
    }
    for (g, pick, updated) in work {
        let writes = sync_maps(&pick, g, dups)?;
        if !updated {
            log(format!(
                "warning: {}: attaching replaces any reuseport program the server attached \
                 itself (the kernel cannot show one; nginx attaches none to TCP listeners)",
                g.addr
            ));
            let first = g
                .listeners
                .iter()
                .find_map(|l| dups.get(l.inode))
                .ok_or_else(|| SteerError(format!("{}: no listener left to attach to", g.addr)))?;
            socket::attach_reuseport_ebpf(first.as_raw_fd(), pick.program_fd())
                .map_err(|e| SteerError(format!("{}: SO_ATTACH_REUSEPORT_EBPF: {e}", g.addr)))?;
        }
        out.push(Attached {
            addr: g.addr.to_string(),
            method: "ebpf",
            prog_id: Some(pick.prog_id()),
            updated,
            writes,
        });
    }
    Ok(out)
}

fn resolve_method(method: Method, log: &mut dyn FnMut(String)) -> Result<Method, SteerError> {
    let incoming_ok = socket::kernel_version().is_none_or(|v| v >= (6, 2));
    match method {
        Method::IncomingCpu if !incoming_ok => err(
            "SO_INCOMING_CPU steering needs Linux ≥ 6.2 (broken in 4.6–6.1); what would work: \
             --method ebpf with CAP_BPF",
        ),
        Method::IncomingCpu => Ok(method),
        Method::Ebpf | Method::Auto => match load_pick(1) {
            Ok(_) => Ok(Method::Ebpf),
            Err(e) if e.is_permission() && method == Method::Auto && incoming_ok => {
                log(format!(
                    "no CAP_BPF ({}): using the unprivileged path, SO_INCOMING_CPU on each \
                     listener (Linux ≥ 6.2; O(listeners) per SYN, no counters)",
                    e.source
                ));
                Ok(Method::IncomingCpu)
            }
            Err(e) if e.is_permission() => err(format!(
                "eBPF steering needs CAP_BPF ({}); what would work: run as root or with \
                 CAP_BPF, or --method incoming-cpu (unprivileged, Linux ≥ 6.2)",
                e.source
            )),
            Err(e) => err(e.to_string()),
        },
    }
}
