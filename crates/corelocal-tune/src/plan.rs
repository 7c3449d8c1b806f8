//! Pure planning: (topology, NIC state, options) → the desired value of each knob.
//!
//! Profiles (Documentation/networking/scaling.rst; seeds 002 and 003):
//! - `spread`: one queue per physical core, cores on the NIC's NUMA node first, SMT siblings
//!   left out; each queue's IRQs on its core; XPS maps every CPU to one TX queue (its core's
//!   queue, else a queue whose core shares its last-level cache, else round-robin).
//! - `rps`: `spread`, plus each RX queue's `rps_cpus` = the network cores in the memory domain
//!   (NUMA node) of the queue's interrupt CPU, for NICs with fewer queues than cores.
//! - `rfs`: `rps`, plus `rps_sock_flow_entries` (32768) and `rps_flow_cnt` = entries / queues.
//! - `bulk`: one high-rate flow: every queue IRQ on one core F (NIC-local), RPS off, and the
//!   application on a different core of F's socket (seed 003).
//!
//! `--housekeeping N` keeps the N lowest-numbered physical cores (and their SMT siblings) free
//! of network work for userland (seed 002).

use crate::error::{Result, TuneError};
use crate::knob::{Knob, Value, NUMBER_MAX};
use crate::state::{HostState, IrqRole, NicState};
use corelocal::cpu::{CpuSet, Topology};
use serde::{Deserialize, Serialize};

/// The plan file format tag.
pub const PLAN_FORMAT: &str = "corelocal-tune-plan/1";
/// Default RFS socket flow table size (scaling.rst: "32768 works fairly well").
pub const DEFAULT_FLOW_ENTRIES: u64 = 32_768;
/// The most settings a plan may hold.
pub const SETTINGS_MAX: usize = 65_536;

/// A tuning profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// One queue per physical core, NIC-local cores first, IRQs and XPS per queue.
    Spread,
    /// `spread` plus RPS to same-node network cores (fewer queues than cores).
    Rps,
    /// `rps` plus RFS flow tables.
    Rfs,
    /// One high-rate flow: all queue IRQs on one core, the application on another core of
    /// the same socket.
    Bulk,
}

impl Profile {
    /// The profile's name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Spread => "spread",
            Profile::Rps => "rps",
            Profile::Rfs => "rfs",
            Profile::Bulk => "bulk",
        }
    }
}

/// Planning options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanOptions {
    /// The profile.
    pub profile: Profile,
    /// Physical cores kept free of network work.
    pub housekeeping: usize,
    /// `rps_sock_flow_entries` for `rfs` (a power of two).
    pub flow_entries: u64,
}

/// One knob and its desired value; in JSON `{"path": …, "value": {"cpus": "0-3"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawSetting", into = "RawSetting")]
pub struct Setting {
    /// The knob.
    pub knob: Knob,
    /// Its desired value.
    pub value: Value,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSetting {
    path: String,
    value: Value,
}

impl TryFrom<RawSetting> for Setting {
    type Error = String;
    fn try_from(raw: RawSetting) -> std::result::Result<Self, String> {
        let knob = Knob::parse(&raw.path)?;
        if knob.kind() != raw.value.kind() {
            return Err(format!("{}: wrong kind of value {}", raw.path, raw.value));
        }
        if matches!(raw.value, Value::Number(n) if n > NUMBER_MAX) {
            return Err(format!(
                "{}: value {} above {NUMBER_MAX}",
                raw.path, raw.value
            ));
        }
        Ok(Setting {
            knob,
            value: raw.value,
        })
    }
}

impl From<Setting> for RawSetting {
    fn from(s: Setting) -> Self {
        RawSetting {
            path: s.knob.path(),
            value: s.value,
        }
    }
}

/// A plan: what to write, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// [`PLAN_FORMAT`].
    pub format: String,
    /// The profile that produced it.
    pub profile: Profile,
    /// Interfaces planned.
    pub nics: Vec<String>,
    /// CPUs kept free of network work (for userland).
    pub housekeeping_cpus: CpuSet,
    /// Cores that take network work, in placement order.
    pub network_cores: Vec<usize>,
    /// Where to pin the application (`bulk`).
    pub app_cpus: Option<CpuSet>,
    /// Knob values, in write order.
    pub settings: Vec<Setting>,
    /// Explanations and warnings.
    pub notes: Vec<String>,
}

/// Cores for network work and the housekeeping CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreChoice {
    /// One CPU per physical core, NIC-local node first, then by id.
    pub cores: Vec<usize>,
    /// Housekeeping cores with their SMT siblings.
    pub housekeeping: CpuSet,
    /// Every usable primary thread (including housekeeping cores), by id.
    pub primaries: Vec<usize>,
}

fn node_of(topo: &Topology, cpu: usize) -> Option<u32> {
    topo.cpu(cpu).and_then(|c| c.numa_node)
}

fn siblings_of(topo: &Topology, cpu: usize) -> CpuSet {
    topo.cpu(cpu)
        .map_or_else(|| CpuSet::single(cpu), |c| c.siblings.clone())
}

/// Picks network cores: online − isolated − nohz_full, one thread per core, minus the
/// `housekeeping` lowest-numbered cores, ordered NIC node first.
pub fn choose_cores(
    topo: &Topology,
    nic_node: Option<u32>,
    housekeeping: usize,
) -> Result<CoreChoice> {
    let allowed = topo
        .online
        .difference(&topo.isolated)
        .difference(&topo.nohz_full);
    let primaries: Vec<usize> = topo.primary_threads(&allowed).iter().collect();
    if housekeeping >= primaries.len() {
        return Err(TuneError::input(format!(
            "--housekeeping {housekeeping} leaves no core for network work: {} usable physical \
             cores (online, not isolated, not nohz_full); use at most {}",
            primaries.len(),
            primaries.len().saturating_sub(1)
        )));
    }
    let mut hk = CpuSet::new();
    for &c in &primaries[..housekeeping] {
        hk = hk.union(&siblings_of(topo, c).intersection(&topo.online));
    }
    let mut cores: Vec<usize> = primaries[housekeeping..].to_vec();
    // Stable: NIC-local cores first, each group in id order.
    cores.sort_by_key(|&c| nic_node.is_some() && node_of(topo, c) != nic_node);
    Ok(CoreChoice {
        cores,
        housekeeping: hk,
        primaries,
    })
}

/// Queue `q` → core `cores[q % K]`.
pub fn place_queues(slots: u32, cores: &[usize]) -> Vec<usize> {
    (0..slots as usize)
        .map(|q| cores[q % cores.len()])
        .collect()
}

fn irq_settings(nic: &NicState, core_of: impl Fn(u32) -> usize) -> Vec<Setting> {
    nic.irqs
        .iter()
        .filter_map(|irq| {
            let q = irq.role.queue()?;
            Some(Setting {
                knob: Knob::IrqAffinity { irq: irq.irq },
                value: Value::Cpus(CpuSet::single(core_of(q))),
            })
        })
        .collect()
}

/// The TX queue each online CPU should use: its core's queue; else a queue whose core shares
/// its last-level cache (round-robin); else round-robin over all queues. A queue left with no
/// CPU gets its own interrupt CPU, so no queue ends with an empty set.
pub fn xps_map(topo: &Topology, placement: &[usize], tx_queues: usize) -> Vec<CpuSet> {
    let n = tx_queues.min(placement.len());
    let mut maps = vec![CpuSet::new(); n];
    if n == 0 {
        return maps;
    }
    let mut llc_turn: Vec<(CpuSet, usize)> = Vec::new();
    let mut any_turn = 0usize;
    for info in &topo.cpus {
        let own = (0..n).find(|&q| info.siblings.contains(placement[q]));
        let q = own.unwrap_or_else(|| {
            let near: Vec<usize> = (0..n)
                .filter(|&q| info.llc_shared.contains(placement[q]))
                .collect();
            if near.is_empty() {
                any_turn += 1;
                (any_turn - 1) % n
            } else {
                next_turn(&mut llc_turn, &info.llc_shared, &near)
            }
        });
        maps[q].insert(info.cpu);
    }
    for (q, map) in maps.iter_mut().enumerate() {
        if map.is_empty() {
            map.insert(placement[q]);
        }
    }
    maps
}

fn next_turn(turns: &mut Vec<(CpuSet, usize)>, group: &CpuSet, candidates: &[usize]) -> usize {
    let slot = match turns.iter().position(|(g, _)| g == group) {
        Some(i) => i,
        None => {
            turns.push((group.clone(), 0));
            turns.len() - 1
        }
    };
    let pick = candidates[turns[slot].1 % candidates.len()];
    turns[slot].1 += 1;
    pick
}

fn xps_settings(
    topo: &Topology,
    nic: &NicState,
    placement: &[usize],
    notes: &mut Vec<String>,
) -> Vec<Setting> {
    let writable: Vec<u32> = nic
        .tx
        .iter()
        .filter(|t| t.xps_cpus.is_some())
        .map(|t| t.index)
        .collect();
    if nic.tx.len() < 2 || writable.len() != nic.tx.len() {
        notes.push(format!(
            "{}: XPS not planned ({} TX queue(s); xps_cpus unreadable on single-queue devices)",
            nic.name,
            nic.tx.len()
        ));
        return Vec::new();
    }
    xps_map(topo, placement, nic.tx.len())
        .into_iter()
        .enumerate()
        .map(|(q, cpus)| Setting {
            knob: Knob::XpsCpus {
                nic: nic.name.clone(),
                queue: q as u32,
            },
            value: Value::Cpus(cpus),
        })
        .collect()
}

/// The memory domain of `cpu`: its NUMA node's CPUs, else its package's.
fn domain_of(topo: &Topology, cpu: usize) -> CpuSet {
    match node_of(topo, cpu) {
        Some(node) => topo.node_cpus(node),
        None => {
            let pkg = topo.cpu(cpu).map(|c| c.package);
            topo.cpus
                .iter()
                .filter(|c| Some(c.package) == pkg)
                .map(|c| c.cpu)
                .collect()
        }
    }
}

fn rps_settings(
    topo: &Topology,
    nic: &NicState,
    placement: &[usize],
    cores: &[usize],
) -> Vec<Setting> {
    let network: CpuSet = cores.iter().copied().collect();
    nic.rx
        .iter()
        .filter(|rx| rx.rps_cpus.is_some())
        .map(|rx| {
            let irq_cpu = placement[rx.index as usize % placement.len()];
            Setting {
                knob: Knob::RpsCpus {
                    nic: nic.name.clone(),
                    queue: rx.index,
                },
                value: Value::Cpus(domain_of(topo, irq_cpu).intersection(&network)),
            }
        })
        .collect()
}

fn rps_off(nic: &NicState) -> Vec<Setting> {
    nic.rx
        .iter()
        .filter(|rx| rx.rps_cpus.is_some())
        .map(|rx| Setting {
            knob: Knob::RpsCpus {
                nic: nic.name.clone(),
                queue: rx.index,
            },
            value: Value::Cpus(CpuSet::new()),
        })
        .collect()
}

/// The largest power of two ≤ `n` (0 for 0).
pub fn floor_pow2(n: u64) -> u64 {
    if n == 0 {
        0
    } else {
        1 << (63 - n.leading_zeros())
    }
}

fn rfs_settings(nic: &NicState, entries: u64) -> Vec<Setting> {
    let queues = nic.rx.len().max(1) as u64;
    nic.rx
        .iter()
        .filter(|rx| rx.rps_flow_cnt.is_some())
        .map(|rx| Setting {
            knob: Knob::RpsFlowCnt {
                nic: nic.name.clone(),
                queue: rx.index,
            },
            value: Value::Number(floor_pow2(entries / queues)),
        })
        .collect()
}

/// Flow core F and application core A for `bulk` (seed 003: a different core of the same
/// socket as the flow's IRQ core).
pub fn bulk_cores(topo: &Topology, choice: &CoreChoice) -> Result<(usize, usize, Option<String>)> {
    let flow = choice.cores[0];
    let pkg = topo.cpu(flow).map(|c| c.package);
    let same_pkg = |c: &usize| topo.cpu(*c).map(|i| i.package) == pkg && *c != flow;
    if let Some(app) = choice
        .cores
        .iter()
        .chain(&choice.primaries)
        .copied()
        .find(same_pkg)
    {
        return Ok((flow, app, None));
    }
    let sibling = siblings_of(topo, flow)
        .iter()
        .find(|&c| c != flow && topo.online.contains(c));
    match sibling {
        Some(app) => Ok((
            flow,
            app,
            Some(format!(
            "only one core on the flow core's socket: the application uses its SMT sibling {app} \
             (seed 003 ran with SMT off)"
        )),
        )),
        None => Err(TuneError::input(format!(
            "bulk needs a second core on the socket of CPU {flow}; none is usable"
        ))),
    }
}

struct NicPlan {
    settings: Vec<Setting>,
    network_cores: Vec<usize>,
    housekeeping: CpuSet,
    app: Option<CpuSet>,
}

fn plan_nic(
    topo: &Topology,
    nic: &NicState,
    opts: &PlanOptions,
    notes: &mut Vec<String>,
) -> Result<NicPlan> {
    let choice = choose_cores(topo, nic.numa_node, opts.housekeeping)?;
    let slots = nic.queue_slots().max(1);
    queue_notes(nic, slots, choice.cores.len(), opts.profile, notes);
    if opts.profile == Profile::Bulk {
        return plan_bulk(topo, nic, &choice, notes);
    }
    let placement = place_queues(slots, &choice.cores);
    let mut settings = irq_settings(nic, |q| placement[q as usize % placement.len()]);
    settings.extend(xps_settings(topo, nic, &placement, notes));
    if matches!(opts.profile, Profile::Rps | Profile::Rfs) {
        settings.extend(rps_settings(topo, nic, &placement, &choice.cores));
    }
    if opts.profile == Profile::Rfs {
        settings.extend(rfs_settings(nic, opts.flow_entries));
    }
    let used = match opts.profile {
        Profile::Rps | Profile::Rfs => choice.cores.len(),
        _ => choice.cores.len().min(slots as usize),
    };
    Ok(NicPlan {
        settings,
        network_cores: choice.cores[..used].to_vec(),
        housekeeping: choice.housekeeping,
        app: None,
    })
}

fn plan_bulk(
    topo: &Topology,
    nic: &NicState,
    choice: &CoreChoice,
    notes: &mut Vec<String>,
) -> Result<NicPlan> {
    let (flow, app, note) = bulk_cores(topo, choice)?;
    notes.extend(note);
    notes.push(format!(
        "{}: all queue IRQs on CPU {flow}; pin the receiving application to CPU {app} \
         (taskset -c {app} CMD), a different core of the same socket (seed 003)",
        nic.name
    ));
    let mut settings = irq_settings(nic, |_| flow);
    settings.extend(rps_off(nic));
    Ok(NicPlan {
        settings,
        network_cores: vec![flow],
        housekeeping: choice.housekeeping.clone(),
        app: Some(CpuSet::single(app)),
    })
}

fn queue_notes(
    nic: &NicState,
    slots: u32,
    cores: usize,
    profile: Profile,
    notes: &mut Vec<String>,
) {
    let name = &nic.name;
    if !nic.irqs.iter().any(|i| i.role != IrqRole::Other) {
        notes.push(format!(
            "{name}: no queue interrupts found (virtual device?): no IRQ affinity planned"
        ));
    }
    let cores_u32 = cores as u32;
    if profile == Profile::Spread && slots < cores_u32 {
        notes.push(format!(
            "{name}: {slots} queue(s) for {cores} network cores: cores without a queue get no \
             receive work; consider --profile rps"
        ));
    }
    if matches!(profile, Profile::Rps | Profile::Rfs) && slots >= cores_u32 {
        notes.push(format!(
            "{name}: one queue per core already; RPS is probably redundant (scaling.rst)"
        ));
    }
    if profile != Profile::Bulk && slots > cores_u32 {
        notes.push(format!(
            "{name}: {slots} queues for {cores} cores: queues share cores"
        ));
    }
}

fn check_options(opts: &PlanOptions) -> Result<()> {
    let e = opts.flow_entries;
    if opts.profile == Profile::Rfs && (!e.is_power_of_two() || e > NUMBER_MAX) {
        return Err(TuneError::input(format!(
            "--flow-entries {e}: must be a power of two up to {NUMBER_MAX} (the kernel rounds up)"
        )));
    }
    Ok(())
}

fn merge(plan: &mut Plan, p: NicPlan) {
    plan.settings.extend(p.settings);
    plan.housekeeping_cpus = p.housekeeping;
    for c in p.network_cores {
        if !plan.network_cores.contains(&c) {
            plan.network_cores.push(c);
        }
    }
    plan.app_cpus = plan.app_cpus.take().or(p.app);
}

/// Plans every NIC of `host`.
pub fn plan(topo: &Topology, host: &HostState, opts: &PlanOptions) -> Result<Plan> {
    check_options(opts)?;
    if host.nics.is_empty() {
        return Err(TuneError::input("no NIC to plan (pass --nic IF)"));
    }
    let mut notes = Vec::new();
    if let Some(pid) = host.irqbalance_pid {
        notes.push(format!(
            "irqbalance is running (pid {pid}) and would undo IRQ affinity: stop it before apply"
        ));
    }
    let mut plan = Plan {
        format: PLAN_FORMAT.to_string(),
        profile: opts.profile,
        nics: host.nics.iter().map(|n| n.name.clone()).collect(),
        housekeeping_cpus: CpuSet::new(),
        network_cores: Vec::new(),
        app_cpus: None,
        settings: Vec::new(),
        notes: Vec::new(),
    };
    for nic in &host.nics {
        merge(&mut plan, plan_nic(topo, nic, opts, &mut notes)?);
    }
    if opts.profile == Profile::Rfs {
        plan.settings.push(Setting {
            knob: Knob::SockFlowEntries,
            value: Value::Number(opts.flow_entries),
        });
    }
    plan.notes = notes;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_pow2_rounds_down() {
        assert_eq!(floor_pow2(0), 0);
        assert_eq!(floor_pow2(1), 1);
        assert_eq!(floor_pow2(2048), 2048);
        assert_eq!(floor_pow2(32768 / 3), 8192);
    }

    #[test]
    fn queues_wrap_over_cores() {
        assert_eq!(place_queues(5, &[2, 3, 1]), vec![2, 3, 1, 2, 3]);
    }

    #[test]
    fn settings_reject_mismatched_values() {
        let bad = r#"{"path":"proc/irq/3/smp_affinity","value":{"number":3}}"#;
        assert!(serde_json::from_str::<Setting>(bad).is_err());
        let bad = r#"{"path":"etc/passwd","value":{"number":3}}"#;
        assert!(serde_json::from_str::<Setting>(bad).is_err());
        let ok = r#"{"path":"proc/irq/3/smp_affinity","value":{"cpus":"0-1"}}"#;
        let s: Setting = serde_json::from_str(ok).unwrap();
        assert_eq!(s.knob, Knob::IrqAffinity { irq: 3 });
        assert_eq!(serde_json::to_string(&s).unwrap(), ok);
    }
}
