//! Our `cl_cpu_pick` program and its maps: finding it again on a group, reading its CPU map,
//! the CPU map a plan wants, and syncing the sockarray and CPU map with a plan.

use super::{err, Dups, SteerError};
use crate::discover;
use crate::plan::GroupPlan;
use corelocal::bpf::cpu_pick::{CpuPick, WORKERS_PER_CPU_MAX};
use std::collections::BTreeMap;
use std::os::fd::AsRawFd;

/// Our program attached to a group, found again by cookie.
pub(super) fn find_attached(group: &GroupPlan) -> Result<Option<CpuPick>, SteerError> {
    let cookies: Vec<u64> = group.listeners.iter().map(|l| l.cookie).collect();
    let ids = CpuPick::find().map_err(|e| {
        SteerError(format!(
            "cannot list BPF programs ({e}): reading another process's attachment needs \
             CAP_SYS_ADMIN"
        ))
    })?;
    for id in ids {
        let Ok(pick) = CpuPick::open(id) else {
            continue;
        };
        for slot in 0..pick.slots() {
            if let Ok(Some(c)) = pick.listener_cookie(slot) {
                if cookies.contains(&c) {
                    return Ok(Some(pick));
                }
            }
        }
    }
    Ok(None)
}

/// The CPU → listeners map a program holds, as CPU → cookies.
pub(super) fn installed_map(pick: &CpuPick) -> BTreeMap<usize, Vec<u64>> {
    let mut out = BTreeMap::new();
    for cpu in 0..pick.cpu_slots().min(discover::possible_cpus() as u32) {
        let cookies: Vec<u64> = pick
            .cpu_slots_of(cpu)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|slot| pick.listener_cookie(slot).ok().flatten())
            .collect();
        if !cookies.is_empty() {
            out.insert(cpu as usize, cookies);
        }
    }
    out
}

/// The CPU → cookies map a plan wants.
pub fn wanted_map(group: &GroupPlan) -> BTreeMap<usize, Vec<u64>> {
    group
        .cpu_map
        .iter()
        .map(|(&cpu, ls)| {
            let cookies = ls
                .iter()
                .take(WORKERS_PER_CPU_MAX as usize)
                .map(|&i| group.listeners[i].cookie)
                .collect();
            (cpu, cookies)
        })
        .collect()
}

/// Makes `pick`'s maps match `group`: listener slots (kept where already placed) and the CPU
/// map. Returns the number of entries written.
pub(super) fn sync_maps(
    pick: &CpuPick,
    group: &GroupPlan,
    dups: &Dups,
) -> Result<usize, SteerError> {
    let bpf = |e: corelocal::bpf::BpfError| SteerError(format!("{}: {e}", group.addr));
    let mut writes = 0;
    let mut slot_of: BTreeMap<u64, u32> = BTreeMap::new();
    let mut free = Vec::new();
    for slot in 0..pick.slots() {
        match pick.listener_cookie(slot).map_err(bpf)? {
            Some(c) if group.listeners.iter().any(|l| l.cookie == c) => {
                slot_of.insert(c, slot);
            }
            Some(_) => {
                // A socket no longer in the server's tree (held elsewhere): drop it.
                pick.clear_listener(slot).map_err(bpf)?;
                writes += 1;
                free.push(slot);
            }
            None => free.push(slot),
        }
    }
    free.reverse();
    for l in &group.listeners {
        if slot_of.contains_key(&l.cookie) {
            continue;
        }
        let Some(slot) = free.pop() else {
            return err(format!(
                "{}: more listeners than the {} sockarray slots; detach and attach again",
                group.addr,
                pick.slots()
            ));
        };
        let Some(fd) = dups.get(l.inode) else {
            continue;
        };
        pick.set_listener(slot, fd.as_raw_fd()).map_err(|e| {
            SteerError(format!(
                "{}: listener inode {} cannot enter our sockarray ({e}); EBUSY means it \
                 already sits in another program's sockarray",
                group.addr, l.inode
            ))
        })?;
        writes += 1;
        slot_of.insert(l.cookie, slot);
    }
    let cpus = pick.cpu_slots().min(discover::possible_cpus() as u32);
    for cpu in 0..cpus {
        let want: Vec<u32> = group
            .cpu_map
            .get(&(cpu as usize))
            .map(|ls| {
                ls.iter()
                    .take(WORKERS_PER_CPU_MAX as usize)
                    .filter_map(|&i| slot_of.get(&group.listeners[i].cookie).copied())
                    .collect()
            })
            .unwrap_or_default();
        if pick.cpu_slots_of(cpu).map_err(bpf)? != want {
            pick.map_cpu(cpu, &want).map_err(bpf)?;
            writes += 1;
        }
    }
    Ok(writes)
}
