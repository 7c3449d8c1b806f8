//! What the host looks like now: NICs, their queues and IRQs, and the host-wide knobs.
//!
//! Reading happens here, through [`Fs`]; the parsing helpers ([`parse_interrupts`],
//! [`classify_irq_name`]) are pure and unit-tested.

use crate::error::{Result, TuneError};
use crate::fs::{trimmed, Fs, DIR_LIMIT};
use crate::knob::{check_ifname, QUEUE_MAX};
use corelocal::cpu::{CpuSet, Topology};
use serde::Serialize;

/// The most lines parsed from `/proc/interrupts`.
const INTERRUPT_LINES_MAX: usize = 65_536;
/// The most symlink hops followed when resolving a device path.
const LINK_DEPTH_MAX: usize = 8;

/// The result of asking the driver (ethtool ioctl) for something.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status", content = "value")]
pub enum Probe<T> {
    /// The driver answered.
    Ok(T),
    /// The driver or interface does not support it (the reason).
    Unsupported(String),
    /// Not asked (fake root, or not permitted).
    NotQueried(String),
}

/// `ETHTOOL_GCHANNELS` (the ioctl's own type).
pub use corelocal::sys::ethtool::Channels;

/// The RSS indirection table and hash key (`ETHTOOL_GRSSH`, or `ETHTOOL_GRXFHINDIR`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rss {
    /// Indirection table: bucket → RX queue.
    pub indirection: Vec<u32>,
    /// Hash key, hex (empty when only the table could be read).
    pub key: String,
    /// Hash function bits (`ETH_RSS_HASH_*`), when known.
    pub hfunc: Option<u8>,
}

/// What an IRQ serves, from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "queue")]
pub enum IrqRole {
    /// An RX queue's interrupt.
    Rx(u32),
    /// A TX queue's interrupt.
    Tx(u32),
    /// A combined RX/TX queue pair (`TxRx-N`, `mlx5_compN`).
    Combined(u32),
    /// Link, config, async or other control interrupt.
    Other,
}

impl IrqRole {
    /// The queue index, for queue interrupts.
    pub fn queue(&self) -> Option<u32> {
        match self {
            IrqRole::Rx(q) | IrqRole::Tx(q) | IrqRole::Combined(q) => Some(*q),
            IrqRole::Other => None,
        }
    }
}

/// One interrupt of a NIC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IrqState {
    /// IRQ number.
    pub irq: u32,
    /// Action name from `/proc/interrupts`.
    pub name: String,
    /// What it serves.
    pub role: IrqRole,
    /// `smp_affinity`, if readable.
    pub smp_affinity: Option<CpuSet>,
    /// `effective_affinity`: where it is really delivered.
    pub effective_affinity: Option<CpuSet>,
    /// `affinity_hint` from the driver.
    pub affinity_hint: Option<CpuSet>,
    /// Interrupts counted so far, all CPUs.
    pub count: u64,
}

/// One RX queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RxQueue {
    /// Queue index.
    pub index: u32,
    /// `rps_cpus` (empty = RPS off), if readable.
    pub rps_cpus: Option<CpuSet>,
    /// `rps_flow_cnt`, if readable.
    pub rps_flow_cnt: Option<u64>,
}

/// One TX queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TxQueue {
    /// Queue index.
    pub index: u32,
    /// `xps_cpus`; `None` when absent or unreadable (single-queue devices return ENOENT).
    pub xps_cpus: Option<CpuSet>,
    /// `xps_rxqs` as a set of RX queue indexes.
    pub xps_rxqs: Option<CpuSet>,
}

/// One network interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NicState {
    /// Interface name.
    pub name: String,
    /// Driver (`device/driver` link), if any.
    pub driver: Option<String>,
    /// The device's NUMA node (`None` for -1 or unknown).
    pub numa_node: Option<u32>,
    /// RX queues.
    pub rx: Vec<RxQueue>,
    /// TX queues.
    pub tx: Vec<TxQueue>,
    /// Interrupts of the device.
    pub irqs: Vec<IrqState>,
    /// Channel counts.
    pub channels: Probe<Channels>,
    /// RSS indirection table and key.
    pub rss: Probe<Rss>,
}

impl NicState {
    /// Queue slots to place: the larger of the RX, TX and IRQ queue counts.
    pub fn queue_slots(&self) -> u32 {
        let irq_max = self
            .irqs
            .iter()
            .filter_map(|i| i.role.queue())
            .max()
            .map_or(0, |q| q + 1);
        (self.rx.len() as u32)
            .max(self.tx.len() as u32)
            .max(irq_max)
    }
}

/// The whole host, as far as the tuner cares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostState {
    /// Online CPUs.
    pub online: CpuSet,
    /// Isolated CPUs.
    pub isolated: CpuSet,
    /// nohz_full CPUs.
    pub nohz_full: CpuSet,
    /// Packages (sockets) and their CPUs.
    pub packages: Vec<(u32, CpuSet)>,
    /// NUMA nodes and their CPUs.
    pub numa_nodes: Vec<(u32, CpuSet)>,
    /// SMT sibling groups with more than one CPU.
    pub smt_siblings: Vec<CpuSet>,
    /// `rps_sock_flow_entries`, if readable.
    pub rps_sock_flow_entries: Option<u64>,
    /// The pid of a running irqbalance, if any.
    pub irqbalance_pid: Option<u32>,
    /// Interfaces.
    pub nics: Vec<NicState>,
}

/// Asks a driver for channels and RSS (the ethtool ioctl on a live host; a stub in tests).
pub type ProbeFn<'a> = &'a dyn Fn(&str) -> (Probe<Channels>, Probe<Rss>);

/// A probe that queries nothing, with `reason`.
pub fn no_probe(reason: &str) -> (Probe<Channels>, Probe<Rss>) {
    (
        Probe::NotQueried(reason.to_string()),
        Probe::NotQueried(reason.to_string()),
    )
}

/// One line of `/proc/interrupts` for a numbered IRQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterruptLine {
    /// IRQ number.
    pub irq: u32,
    /// Total count over all CPUs.
    pub count: u64,
    /// The action name (last column).
    pub name: String,
}

/// Parses `/proc/interrupts`: numbered lines only, name = last column.
pub fn parse_interrupts(text: &str) -> Vec<InterruptLine> {
    let mut lines = text.lines().take(INTERRUPT_LINES_MAX);
    let cpus = lines.next().map_or(0, |h| h.split_whitespace().count());
    lines
        .filter_map(|line| {
            let mut tokens = line.split_whitespace();
            let irq = tokens.next()?.strip_suffix(':')?.parse::<u32>().ok()?;
            let rest: Vec<&str> = tokens.collect();
            let counts = rest.iter().take(cpus).map_while(|t| t.parse::<u64>().ok());
            let count = counts.fold(0u64, |a, c| a.saturating_add(c));
            let name = if rest.len() > cpus {
                rest.last().copied().unwrap_or("")
            } else {
                ""
            };
            Some(InterruptLine {
                irq,
                count,
                name: name.to_string(),
            })
        })
        .collect()
}

/// Classifies an IRQ action name: `eth1-TxRx-3` → combined 3, `virtio2-input.0` → RX 0,
/// `ens1f0-tx-2` → TX 2, `mlx5_comp5@pci:0000:3b:00.0` → combined 5, `virtio2-config` → other.
pub fn classify_irq_name(name: &str) -> IrqRole {
    let base = name.split('@').next().unwrap_or(name).to_ascii_lowercase();
    let digits = base.len() - base.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 || digits > 5 {
        return IrqRole::Other;
    }
    let (stem, index) = base.split_at(base.len() - digits);
    let Ok(q) = index.parse::<u32>() else {
        return IrqRole::Other;
    };
    if q > QUEUE_MAX {
        return IrqRole::Other;
    }
    let has = |w: &str| stem.contains(w);
    if has("txrx") || has("rxtx") || has("comp") || has("combined") || has("-ce-") || has("fp-") {
        IrqRole::Combined(q)
    } else if has("rx") || has("input") {
        IrqRole::Rx(q)
    } else if has("tx") || has("output") {
        IrqRole::Tx(q)
    } else {
        IrqRole::Other
    }
}

/// Resolves `rel` component by component, following relative symlinks (sysfs links are
/// relative and point into `sys/devices`); `None` for absolute links or too many hops.
fn canonical(fs: &dyn Fs, rel: &str) -> Option<String> {
    let mut todo: std::collections::VecDeque<String> = rel.split('/').map(String::from).collect();
    let mut done: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(part) = todo.pop_front() {
        match part.as_str() {
            "" | "." => continue,
            ".." => {
                done.pop()?;
                continue;
            }
            _ => done.push(part),
        }
        let Ok(target) = fs.read_link(&done.join("/")) else {
            continue;
        };
        hops += 1;
        if hops > LINK_DEPTH_MAX || target.starts_with('/') {
            return None;
        }
        done.pop();
        for p in target.split('/').rev() {
            todo.push_front(p.to_string());
        }
    }
    Some(done.join("/"))
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn parent(path: &str) -> Option<&str> {
    path.rsplit_once('/').map(|(p, _)| p)
}

fn read_cpus(fs: &dyn Fs, rel: &str) -> Option<CpuSet> {
    CpuSet::parse_mask(trimmed(&fs.read(rel).ok()?)).ok()
}

fn read_number(fs: &dyn Fs, rel: &str) -> Option<u64> {
    trimmed(&fs.read(rel).ok()?).trim().parse().ok()
}

/// The interfaces to look at: `wanted` (each must exist), or every interface with a device.
pub fn select_nics(fs: &dyn Fs, wanted: &[String]) -> Result<Vec<String>> {
    let all = fs.list("sys/class/net").map_err(|e| {
        TuneError::failed(format!(
            "cannot list {}/sys/class/net: {e}",
            fs.root().display()
        ))
    })?;
    if wanted.is_empty() {
        return Ok(all
            .into_iter()
            .filter(|n| fs.exists(&format!("sys/class/net/{n}/device")))
            .collect());
    }
    for w in wanted {
        check_ifname(w).map_err(TuneError::input)?;
        if !all.contains(w) {
            return Err(TuneError::input(format!(
                "unknown NIC {w:?} under {}; interfaces here: {}",
                fs.root().display(),
                all.join(", ")
            )));
        }
    }
    Ok(wanted.to_vec())
}

fn queue_indexes(fs: &dyn Fs, nic: &str, prefix: &str) -> Vec<u32> {
    let mut idx: Vec<u32> = fs
        .list(&format!("sys/class/net/{nic}/queues"))
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.strip_prefix(prefix)?.parse::<u32>().ok())
        .filter(|q| *q <= QUEUE_MAX)
        .collect();
    idx.sort_unstable();
    idx
}

fn read_rx(fs: &dyn Fs, nic: &str) -> Vec<RxQueue> {
    queue_indexes(fs, nic, "rx-")
        .into_iter()
        .map(|index| {
            let dir = format!("sys/class/net/{nic}/queues/rx-{index}");
            RxQueue {
                index,
                rps_cpus: read_cpus(fs, &format!("{dir}/rps_cpus")),
                rps_flow_cnt: read_number(fs, &format!("{dir}/rps_flow_cnt")),
            }
        })
        .collect()
}

fn read_tx(fs: &dyn Fs, nic: &str) -> Vec<TxQueue> {
    queue_indexes(fs, nic, "tx-")
        .into_iter()
        .map(|index| {
            let dir = format!("sys/class/net/{nic}/queues/tx-{index}");
            TxQueue {
                index,
                xps_cpus: read_cpus(fs, &format!("{dir}/xps_cpus")),
                xps_rxqs: read_cpus(fs, &format!("{dir}/xps_rxqs")),
            }
        })
        .collect()
}

/// The device directory and its parent (virtio devices keep `numa_node` and `msi_irqs` on
/// the PCI function above them).
fn device_dirs(fs: &dyn Fs, nic: &str) -> Vec<String> {
    let Some(dev) = canonical(fs, &format!("sys/class/net/{nic}/device")) else {
        return Vec::new();
    };
    if !fs.exists(&dev) {
        return Vec::new();
    }
    let mut dirs = vec![dev.clone()];
    if let Some(p) = parent(&dev).filter(|p| p.starts_with("sys/devices/")) {
        dirs.push(p.to_string());
    }
    dirs
}

fn first_readable<T>(dirs: &[String], f: impl Fn(&str) -> Option<T>) -> Option<T> {
    dirs.iter().find_map(|d| f(d))
}

fn nic_irq_numbers(fs: &dyn Fs, nic: &str, dirs: &[String], lines: &[InterruptLine]) -> Vec<u32> {
    let msi: Vec<u32> = first_readable(dirs, |d| fs.list(&format!("{d}/msi_irqs")).ok())
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    let dev_prefix = dirs.first().map(|d| format!("{}-", basename(d)));
    let mut irqs: Vec<u32> = lines
        .iter()
        .filter(|l| {
            msi.contains(&l.irq)
                || name_mentions(&l.name, nic)
                || dev_prefix.as_deref().is_some_and(|p| l.name.starts_with(p))
        })
        .map(|l| l.irq)
        .collect();
    irqs.sort_unstable();
    irqs.dedup();
    irqs
}

/// Whether an IRQ name carries the interface name as a `-`-separated token.
fn name_mentions(name: &str, nic: &str) -> bool {
    name == nic
        || name.split(['-', '@', ':']).any(|t| t == nic)
        || name.starts_with(&format!("{nic}-"))
}

fn read_irq(fs: &dyn Fs, line: &InterruptLine) -> IrqState {
    let dir = format!("proc/irq/{}", line.irq);
    IrqState {
        irq: line.irq,
        name: line.name.clone(),
        role: classify_irq_name(&line.name),
        smp_affinity: read_cpus(fs, &format!("{dir}/smp_affinity")),
        effective_affinity: read_cpus(fs, &format!("{dir}/effective_affinity")),
        affinity_hint: read_cpus(fs, &format!("{dir}/affinity_hint")),
        count: line.count,
    }
}

/// Reads one interface.
pub fn read_nic(fs: &dyn Fs, nic: &str, lines: &[InterruptLine], probe: ProbeFn) -> NicState {
    let dirs = device_dirs(fs, nic);
    let driver = first_readable(&dirs, |d| fs.read_link(&format!("{d}/driver")).ok())
        .map(|t| basename(&t).to_string());
    let numa_node = first_readable(&dirs, |d| {
        let text = fs.read(&format!("{d}/numa_node")).ok()?;
        Some(
            trimmed(&text)
                .trim()
                .parse::<i64>()
                .ok()
                .and_then(|n| u32::try_from(n).ok()),
        )
    })
    .flatten();
    let irqs = nic_irq_numbers(fs, nic, &dirs, lines)
        .into_iter()
        .filter_map(|irq| lines.iter().find(|l| l.irq == irq))
        .map(|l| read_irq(fs, l))
        .collect();
    let (channels, rss) = probe(nic);
    NicState {
        name: nic.to_string(),
        driver,
        numa_node,
        rx: read_rx(fs, nic),
        tx: read_tx(fs, nic),
        irqs,
        channels,
        rss,
    }
}

/// Whether irqbalance runs: scans `proc/PID/comm` under the root.
pub fn irqbalance_pid(fs: &dyn Fs) -> Option<u32> {
    fs.list("proc")
        .ok()?
        .iter()
        .take(DIR_LIMIT)
        .filter_map(|n| n.parse::<u32>().ok())
        .find(|pid| {
            fs.read(&format!("proc/{pid}/comm"))
                .is_ok_and(|c| trimmed(&c) == "irqbalance")
        })
}

/// Reads the host: topology (already read), NICs `wanted` (or all with a device), global knobs.
pub fn read_host(
    fs: &dyn Fs,
    topo: &Topology,
    wanted: &[String],
    probe: ProbeFn,
) -> Result<HostState> {
    let names = select_nics(fs, wanted)?;
    let lines = fs
        .read("proc/interrupts")
        .map(|t| parse_interrupts(&t))
        .unwrap_or_default();
    let nics = names
        .iter()
        .map(|n| read_nic(fs, n, &lines, probe))
        .collect();
    Ok(HostState {
        online: topo.online.clone(),
        isolated: topo.isolated.clone(),
        nohz_full: topo.nohz_full.clone(),
        packages: packages(topo),
        numa_nodes: topo.numa_nodes.clone(),
        smt_siblings: smt_groups(topo),
        rps_sock_flow_entries: read_number(fs, crate::knob::SOCK_FLOW_PATH),
        irqbalance_pid: irqbalance_pid(fs),
        nics,
    })
}

fn packages(topo: &Topology) -> Vec<(u32, CpuSet)> {
    topo.packages()
        .into_iter()
        .map(|p| {
            (
                p,
                topo.cpus
                    .iter()
                    .filter(|c| c.package == p)
                    .map(|c| c.cpu)
                    .collect(),
            )
        })
        .collect()
}

fn smt_groups(topo: &Topology) -> Vec<CpuSet> {
    let mut groups: Vec<CpuSet> = topo
        .cpus
        .iter()
        .filter(|c| c.siblings.len() > 1 && c.siblings.iter().next() == Some(c.cpu))
        .map(|c| c.siblings.clone())
        .collect();
    groups.dedup();
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    const VM_INTERRUPTS: &str = "           CPU0       CPU1       
 26:          0         13  IO-APIC   4-edge      ttyS0
 37:          0          0 PCI-MSIX-0000:00:03.0   0-edge      virtio2-config
 38:          0       1009 PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0
 39:        699          0 PCI-MSIX-0000:00:03.0   2-edge      virtio2-output.0
NMI:          0          0   Non-maskable interrupts
ERR:          0
";

    #[test]
    fn parses_proc_interrupts() {
        let lines = parse_interrupts(VM_INTERRUPTS);
        assert_eq!(lines.len(), 4);
        assert_eq!(
            lines[2],
            InterruptLine {
                irq: 38,
                count: 1009,
                name: "virtio2-input.0".into()
            }
        );
        assert_eq!(lines[0].name, "ttyS0");
        assert!(parse_interrupts("").is_empty());
        assert!(parse_interrupts("CPU0\n 5: 1 2 3 x\n garbage\n").len() == 1);
    }

    #[test]
    fn classifies_irq_names() {
        use IrqRole::*;
        let cases = [
            ("virtio2-input.0", Rx(0)),
            ("virtio2-output.0", Tx(0)),
            ("virtio2-config", Other),
            ("eth1-TxRx-5", Combined(5)),
            ("i40e-eth0-TxRx-12", Combined(12)),
            ("ens1f0-rx-2", Rx(2)),
            ("ens1f0-tx-3", Tx(3)),
            ("mlx5_comp7@pci:0000:3b:00.0", Combined(7)),
            ("mlx5_async0@pci:0000:3b:00.0", Other),
            ("ens1f0", Other),
            ("nvme0q1", Other),
        ];
        for (name, role) in cases {
            assert_eq!(classify_irq_name(name), role, "{name}");
        }
    }

    #[test]
    fn irq_names_mention_interfaces() {
        assert!(name_mentions("eth1-TxRx-0", "eth1"));
        assert!(name_mentions("i40e-eth1-TxRx-0", "eth1"));
        assert!(!name_mentions("eth10-TxRx-0", "eth1"));
        assert!(!name_mentions("virtio2-input.0", "eth0"));
    }
}
