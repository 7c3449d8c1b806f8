//! Where a CPU's new connections go while its workers are busy: the kernel-side half of
//! Affinity-Accept for listeners we cannot steal from (the steering program reads the result).
//!
//! A SYN goes to a worker on its own CPU unless every one there is busy; then to the non-busy
//! workers closest to it — sharing its last-level cache, else its NUMA node, else any — spread
//! over all of that tier (the program picks among them by the flow's hash), never all onto one.
//! When every worker is busy, its own CPU's workers: a connection is never refused for balance.
//! As soon as one of the CPU's own workers is non-busy again, its SYNs go back to it.

use super::BusySet;
use crate::cpu::Topology;

/// Where one worker runs, as far as choosing a neighbour goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerPlace {
    /// The CPU it is pinned to.
    pub cpu: usize,
    /// An id shared by the CPUs of one last-level cache (its lowest CPU).
    pub llc: usize,
    /// Its NUMA node (0 where the host has none).
    pub node: usize,
}

impl WorkerPlace {
    /// The place of a worker pinned to `cpu`, from the host's topology (a CPU it does not
    /// list shares nothing with anyone).
    pub fn of_cpu(topology: &Topology, cpu: usize) -> WorkerPlace {
        match topology.cpu(cpu) {
            Some(info) => WorkerPlace {
                cpu,
                llc: info.llc_shared.iter().next().unwrap_or(cpu),
                node: info.numa_node.map_or(0, |n| n as usize),
            },
            None => WorkerPlace {
                cpu,
                llc: cpu,
                node: usize::MAX - cpu,
            },
        }
    }
}

/// The places of workers pinned to `cpus` (worker `w` on `cpus[w]`), from the host's
/// topology; where it cannot be read, each CPU is its own LLC on node 0.
pub fn places_of(cpus: &[usize]) -> Vec<WorkerPlace> {
    let topology = Topology::host().ok();
    cpus.iter()
        .map(|&cpu| match &topology {
            Some(t) => WorkerPlace::of_cpu(t, cpu),
            None => WorkerPlace {
                cpu,
                llc: cpu,
                node: 0,
            },
        })
        .collect()
}

/// Where SYNs processed on one CPU go now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuTargets {
    /// The workers, spread over by the flow's hash (empty: the CPU has no worker).
    pub workers: Vec<usize>,
    /// Whether they are not the CPU's own workers.
    pub redirected: bool,
}

/// The workers SYNs processed on `cpu` should go to, at most `max` (≥ 1) of them. `places[w]`
/// is worker `w`'s place; `busy` has one bit per worker.
pub fn cpu_targets(places: &[WorkerPlace], busy: &BusySet, cpu: usize, max: usize) -> CpuTargets {
    assert!(max >= 1, "at least one target");
    assert_eq!(places.len(), busy.workers(), "one place per worker");
    let own: Vec<usize> = (0..places.len())
        .filter(|&w| places[w].cpu == cpu)
        .collect();
    let own_free: Vec<usize> = own.iter().copied().filter(|&w| !busy.is_busy(w)).collect();
    if own.is_empty() || !own_free.is_empty() {
        let workers = if own.is_empty() { own } else { own_free };
        return CpuTargets {
            workers: workers.into_iter().take(max).collect(),
            redirected: false,
        };
    }
    let neighbours = closest_free(places, busy, own[0], max);
    if neighbours.is_empty() {
        return CpuTargets {
            workers: own.into_iter().take(max).collect(),
            redirected: false,
        };
    }
    CpuTargets {
        workers: neighbours,
        redirected: true,
    }
}

/// [`cpu_targets`] over sets of decreasing strictness: the first set under which the CPU's
/// SYNs have somewhere to go decides. With `[busy, not_running]`, a CPU whose worker is not
/// running sends its SYNs to workers that are merely busy (a queue above the watermark, a
/// slow drain) when every worker is busy, rather than home to a worker that will not serve.
pub fn cpu_targets_tiered(
    places: &[WorkerPlace],
    tiers: &[&BusySet],
    cpu: usize,
    max: usize,
) -> CpuTargets {
    let mut last = None;
    for busy in tiers {
        let t = cpu_targets(places, busy, cpu, max);
        let own_free = (0..places.len()).any(|w| places[w].cpu == cpu && !busy.is_busy(w));
        if t.redirected || own_free || t.workers.is_empty() {
            return t;
        }
        last = Some(t);
    }
    last.unwrap_or(CpuTargets {
        workers: Vec::new(),
        redirected: false,
    })
}

/// The non-busy workers of the closest tier to worker `from` (same LLC, same node, any),
/// starting one past `from` so that different busy workers lean on different neighbours.
pub fn closest_free(places: &[WorkerPlace], busy: &BusySet, from: usize, max: usize) -> Vec<usize> {
    let home = places[from];
    let tiers: [&dyn Fn(&WorkerPlace) -> bool; 3] =
        [&|p| p.llc == home.llc, &|p| p.node == home.node, &|_| true];
    let n = places.len();
    for in_tier in tiers {
        let found: Vec<usize> = (1..n)
            .map(|i| (from + i) % n)
            .filter(|&w| places[w].cpu != home.cpu && !busy.is_busy(w) && in_tier(&places[w]))
            .take(max)
            .collect();
        if !found.is_empty() {
            return found;
        }
    }
    Vec::new()
}

/// The longest run of consecutive worker indexes in `workers` (the first on ties), as
/// `(first, count)`: what a program that spreads over a run of workers can express.
pub fn longest_run(workers: &[usize]) -> Option<(usize, usize)> {
    let mut sorted = workers.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut best: Option<(usize, usize)> = None;
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i + 1;
        while j < sorted.len() && sorted[j] == sorted[j - 1] + 1 {
            j += 1;
        }
        if best.is_none_or(|(_, count)| j - i > count) {
            best = Some((sorted[i], j - i));
        }
        i = j;
    }
    best
}
