//! `status`: what is attached to each group, its per-CPU counters and whether it is stale;
//! and every `cl_cpu_pick` program loaded on the host.

use super::attach::foreign_on;
use super::foreign::ForeignProgram;
use super::incoming::incoming_state;
use super::maps::{find_attached, installed_map, wanted_map};
use super::{Dups, SteerError};
use crate::discover;
use crate::plan::{GroupPlan, Plan};
use corelocal::bpf::cpu_pick::{CpuPick, PickCounts};
use serde::Serialize;
use std::collections::BTreeMap;

/// One CPU's counters in `status`.
#[derive(Debug, Clone, Serialize)]
pub struct CpuCounts {
    /// The CPU.
    pub cpu: usize,
    /// SYNs steered to the listener of the worker pinned there.
    pub steered: u64,
    /// SYNs that fell back to the kernel's hash.
    pub fallback: u64,
    /// Of those: no worker mapped to this CPU.
    pub no_worker: u64,
    /// Of those: the mapped listener was closed.
    pub listener_gone: u64,
    /// SYNs sent to another CPU's worker while this CPU's were busy (the balancer).
    pub redirected: u64,
    /// Whether this CPU's SYNs go to other CPUs' workers now.
    pub redirected_now: bool,
}

/// `status` of one group.
#[derive(Debug, Clone, Serialize)]
pub struct GroupStatus {
    /// The plan (listeners, workers, CPU map, notes) as discovered now.
    pub group: GroupPlan,
    /// `ebpf`, `incoming-cpu`, `foreign` (a reuseport program steer did not attach) or
    /// `hash` (nothing attached).
    pub method: &'static str,
    /// The program id (eBPF).
    pub prog_id: Option<u32>,
    /// Per-CPU counters (eBPF).
    pub counts: Vec<CpuCounts>,
    /// Whether the installed CPU map differs from what the server looks like now.
    pub stale: bool,
    /// What differs, when stale.
    pub stale_detail: Vec<String>,
    /// Why an eBPF attachment could not be looked for (no CAP_SYS_ADMIN).
    pub ebpf_unreadable: Option<String>,
    /// Reuseport programs on the group that steer did not attach (method `foreign`).
    pub foreign: Vec<ForeignProgram>,
    /// Share of the SYNs seen since attach that were steered (each one accepted by the
    /// worker pinned to the CPU that processed it); `None` without counters (SO_INCOMING_CPU,
    /// nothing attached) or before the first SYN.
    pub steered_share: Option<f64>,
}

impl GroupStatus {
    /// SYNs seen by the program since attach: (steered, fell back).
    pub fn totals(&self) -> (u64, u64) {
        (
            self.counts.iter().map(|c| c.steered).sum(),
            self.counts.iter().map(|c| c.fallback).sum(),
        )
    }
}

/// Steered share of `steered` + `fallback` SYNs (`None` when there were none).
pub fn share(steered: u64, fallback: u64) -> Option<f64> {
    let total = steered + fallback;
    (total > 0).then(|| steered as f64 / total as f64)
}

/// Reads back what is attached to each group of the plan.
pub fn status(plan: &Plan, dups: &Dups) -> Result<Vec<GroupStatus>, SteerError> {
    let mut out = Vec::new();
    for g in &plan.groups {
        let want = wanted_map(g);
        let cookie_inode: BTreeMap<u64, u64> =
            g.listeners.iter().map(|l| (l.cookie, l.inode)).collect();
        let describe = |m: &BTreeMap<usize, Vec<u64>>| -> String {
            m.iter()
                .map(|(c, ks)| {
                    let inodes: Vec<String> = ks
                        .iter()
                        .map(|k| {
                            cookie_inode
                                .get(k)
                                .map_or("?".to_string(), |i| i.to_string())
                        })
                        .collect();
                    format!("cpu {c}→inode {}", inodes.join("+"))
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (pick, unreadable) = match find_attached(g) {
            Ok(p) => (p, None),
            Err(e) => (None, Some(e.0)),
        };
        let mut st = GroupStatus {
            group: g.clone(),
            method: "hash",
            prog_id: None,
            counts: Vec::new(),
            stale: false,
            stale_detail: Vec::new(),
            ebpf_unreadable: unreadable,
            foreign: Vec::new(),
            steered_share: None,
        };
        if let Some(pick) = pick {
            st.method = "ebpf";
            st.prog_id = Some(pick.prog_id());
            let counts = pick
                .counts(discover::possible_cpus())
                .map_err(|e| SteerError(e.to_string()))?;
            let now_redirected = |cpu: usize| pick.cpu_redirected(cpu as u32).unwrap_or(false);
            st.counts = counts
                .iter()
                .enumerate()
                .filter(|&(cpu, c)| *c != PickCounts::default() || now_redirected(cpu))
                .map(|(cpu, c)| CpuCounts {
                    cpu,
                    steered: c.steered,
                    fallback: c.fallback(),
                    no_worker: c.no_worker,
                    listener_gone: c.listener_gone,
                    redirected: c.redirected,
                    redirected_now: now_redirected(cpu),
                })
                .collect();
            let (steered, fallback) = st.totals();
            st.steered_share = share(steered, fallback);
            let mut have = installed_map(&pick);
            // A row the balancer redirected is where it should be for now.
            for c in st.counts.iter().filter(|c| c.redirected_now) {
                match want.get(&c.cpu) {
                    Some(w) => have.insert(c.cpu, w.clone()),
                    None => have.remove(&c.cpu),
                };
            }
            if have != want {
                st.stale = true;
                st.stale_detail.push(format!(
                    "installed: {}; the server now: {} (run `corelocal steer attach` again, or \
                     keep `corelocal steer watch` running)",
                    describe(&have),
                    describe(&want)
                ));
            }
        } else {
            st.foreign = foreign_on(plan, g);
            if !st.foreign.is_empty() {
                st.method = "foreign";
            }
            let inc = incoming_state(g, dups);
            if st.foreign.is_empty() && inc.iter().any(|&(_, now, _)| now >= 0) {
                st.method = "incoming-cpu";
                let bad: Vec<String> = inc
                    .iter()
                    .filter(|&&(_, now, want)| now != want)
                    .map(|(i, now, want)| format!("inode {i}: set {now}, worker cpu {want}"))
                    .collect();
                if !bad.is_empty() {
                    st.stale = true;
                    st.stale_detail = bad;
                }
            }
        }
        out.push(st);
    }
    Ok(out)
}

/// A loaded `cl_cpu_pick` program: (program id, cookies of the listeners in its sockarray,
/// per-CPU counters).
pub type LoadedProgram = (u32, Vec<u64>, Vec<PickCounts>);

/// All `cl_cpu_pick` programs loaded on the host with their counters (for `status` without
/// `--pid`).
pub fn programs() -> Result<Vec<LoadedProgram>, SteerError> {
    let ids = CpuPick::find().map_err(|e| SteerError(format!("listing programs: {e}")))?;
    let mut out = Vec::new();
    for id in ids {
        let Ok(pick) = CpuPick::open(id) else {
            continue;
        };
        let cookies = (0..pick.slots())
            .filter_map(|s| pick.listener_cookie(s).ok().flatten())
            .collect();
        let counts = pick
            .counts(discover::possible_cpus())
            .map_err(|e| SteerError(e.to_string()))?;
        out.push((id, cookies, counts));
    }
    Ok(out)
}
