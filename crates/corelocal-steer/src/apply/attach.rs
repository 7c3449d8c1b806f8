//! `attach`: choosing the method, loading `cl_cpu_pick` and attaching it to each group (or
//! setting SO_INCOMING_CPU), or updating the program already attached.

use super::foreign::{self, ForeignProgram};
use super::incoming::set_incoming;
use super::maps::{find_attached, sync_maps};
use super::{err, Dups, Method, SteerError};
use crate::discover;
use crate::plan::{GroupPlan, Plan};
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

/// Reuseport programs on `g` that steer did not attach: all loaded programs when they can
/// be listed, else (no CAP_SYS_ADMIN) those of a reuseport type the server holds open.
pub fn foreign_on(plan: &Plan, g: &GroupPlan) -> Vec<ForeignProgram> {
    match foreign::foreign_programs(g, &plan.held_progs) {
        Ok(found) => found,
        Err(_) => plan
            .held_progs
            .iter()
            .filter(|h| h.prog_type == corelocal::sys::bpf::ProgType::SkReuseport as u32)
            .map(|h| ForeignProgram {
                prog_id: h.prog_id,
                name: String::new(),
                prog_type: "sk_reuseport",
                held_by: vec![(h.pid, h.fd)],
                listeners_in_maps: 0,
                attached_seen: false,
            })
            .collect(),
    }
}

/// Attaches (or updates) steering for every group of the plan. Nothing changes unless every
/// group can be steered. A group with a reuseport program steer did not attach
/// ([`foreign_on`]) is refused unless `force`.
pub fn attach(
    plan: &Plan,
    dups: &Dups,
    method: Method,
    force: bool,
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
    // Knowing when not to act: a program someone else put on the group.
    let mut foreign_refusals = Vec::new();
    let mut replaced: Vec<(usize, String)> = Vec::new();
    for (i, g) in plan.groups.iter().enumerate() {
        if method == Method::Ebpf && find_attached(g)?.is_some() {
            continue;
        }
        let found = foreign_on(plan, g);
        if found.is_empty() {
            continue;
        }
        let kept = found
            .iter()
            .find(|f| !f.held_by.is_empty() && f.listeners_in_maps > 0);
        if let (true, Some(f)) = (force, kept) {
            foreign_refusals.push(format!(
                "{}: cannot replace {} even with --force: the server holds it open, so its \
                 sockarray keeps the listeners and a socket can sit in one sockarray only; \
                 nothing changed",
                g.addr,
                f.describe(g.listeners.len())
            ));
        } else if force {
            replaced.push((i, foreign::summary(g, &found)));
        } else {
            foreign_refusals.push(foreign::refusal(g, &found));
        }
    }
    if !foreign_refusals.is_empty() {
        return err(format!(
            "refused, nothing changed:\n  {}",
            foreign_refusals.join("\n  ")
        ));
    }
    for (_, why) in &replaced {
        log(format!("warning: --force: replacing it: {why}"));
    }
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
        let forced = replaced.iter().any(|(i, _)| plan.groups[*i].addr == g.addr);
        let writes = if forced {
            replace_foreign(&pick, g, dups, log)?
        } else {
            sync_maps(&pick, g, dups)?
        };
        if !updated {
            if !forced && super::iter::listener_progs().is_err() {
                log(format!(
                    "{}: no reuseport program of anyone else found by its socket maps or held \
                     by the server; the kernel's own view of the group (a BPF iterator: needs \
                     BTF and CAP_BPF + CAP_PERFMON or CAP_SYS_ADMIN) could not be read, so a \
                     classic BPF one (SO_ATTACH_REUSEPORT_CBPF) would not be seen and would be \
                     replaced",
                    g.addr
                ));
            }
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
                "eBPF steering needs CAP_BPF ({}) to load its program, and CAP_SYS_ADMIN to \
                 find it again (CAP_SYS_ADMIN alone passes both checks); what would work: run \
                 as root or with CAP_SYS_ADMIN, or --method incoming-cpu (unprivileged, Linux \
                 ≥ 6.2)",
                e.source
            )),
            Err(e) => err(e.to_string()),
        },
    }
}

/// How long `--force` waits for a replaced program's sockarray to let go of the listeners
/// (the kernel frees a detached program and its maps after an RCU grace period).
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// `--force` on a group with a foreign program: detach it, then fill our maps, retrying
/// while its sockarray still holds the listeners (EBUSY). A program the server still holds
/// keeps its sockarray, and then this fails saying so.
fn replace_foreign(
    pick: &CpuPick,
    g: &GroupPlan,
    dups: &Dups,
    log: &mut dyn FnMut(String),
) -> Result<usize, SteerError> {
    let fd = g
        .listeners
        .iter()
        .find_map(|l| dups.get(l.inode))
        .ok_or_else(|| SteerError(format!("{}: no listener left to attach to", g.addr)))?;
    match socket::detach_reuseport_bpf(fd.as_raw_fd()) {
        Ok(()) => log(format!(
            "{}: --force: detached the program that was on the group",
            g.addr
        )),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => return err(format!("{}: SO_DETACH_REUSEPORT_BPF: {e}", g.addr)),
    }
    let deadline = std::time::Instant::now() + RELEASE_WAIT;
    loop {
        match sync_maps(pick, g, dups) {
            Ok(w) => return Ok(w),
            Err(e) if e.0.contains("os error 16") && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}
