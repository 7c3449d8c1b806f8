//! Placing receive processing: RPS on the receiving veth's RX queues (written from a thread
//! inside the receiver namespace, with its own sysfs mount, so the host's interfaces are out
//! of reach), or the RX IRQs' affinity of a real NIC (saved first and restored on drop).
//! Also reads namespace-local `/proc/net` counters. Files go through corelocal-tune's
//! [`Fs`], knob paths and mask formatting.

use crate::sys;
use corelocal::cpu::{CpuSet, Topology};
use corelocal_tune::apply::{restore, SnapshotEntry};
use corelocal_tune::fs::{trimmed, Fs, RootFs};
use corelocal_tune::knob::{mask_like, Knob};
use std::collections::BTreeMap;

/// The most RX queues written per interface.
const QUEUES_MAX: usize = 4096;

/// Runs `f` on a new thread that first joins network namespace `ns` and, when `sysfs`, mounts
/// its own sysfs (so `/sys/class/net` shows the namespace's devices).
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    sysfs: bool,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let ns = ns.to_string();
    std::thread::Builder::new()
        .name("sweep-netns".into())
        .spawn(move || {
            sys::enter_netns(&ns).map_err(|e| format!("entering netns {ns}: {e}"))?;
            if sysfs {
                sys::private_sysfs().map_err(|e| format!("mounting sysfs in {ns}: {e}"))?;
            }
            f()
        })
        .map_err(|e| format!("spawning a thread: {e}"))?
        .join()
        .map_err(|_| "a namespace thread panicked".to_string())?
}

/// Refuses to write unless the visible interfaces are exactly `lo` and `ifname` (proof that
/// this sysfs belongs to our private namespace).
fn check_private(fs: &RootFs, ifname: &str) -> Result<(), String> {
    let ifs = fs
        .list("sys/class/net")
        .map_err(|e| format!("listing /sys/class/net: {e}"))?;
    let ok = ifs.iter().all(|i| i == "lo" || i == ifname) && ifs.iter().any(|i| i == ifname);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "refusing to write: /sys/class/net shows {ifs:?}, not just lo and {ifname}"
        ))
    }
}

/// The RX queue indexes of `ifname`.
fn rx_queues(fs: &dyn Fs, ifname: &str) -> Result<Vec<u32>, String> {
    let names = fs
        .list(&format!("sys/class/net/{ifname}/queues"))
        .map_err(|e| format!("listing queues of {ifname}: {e}"))?;
    let mut q: Vec<u32> = names
        .iter()
        .filter_map(|n| n.strip_prefix("rx-")?.parse().ok())
        .take(QUEUES_MAX)
        .collect();
    q.sort_unstable();
    Ok(q)
}

/// Writes `cpus` to every RX queue's `rps_cpus` of `ifname` under `fs`, reads each back and
/// checks it; returns the values read back.
pub fn write_rps(fs: &dyn Fs, ifname: &str, cpus: &CpuSet) -> Result<Vec<String>, String> {
    let mut back = Vec::new();
    for queue in rx_queues(fs, ifname)? {
        let path = Knob::RpsCpus {
            nic: ifname.to_string(),
            queue,
        }
        .path();
        let now = fs.read(&path).map_err(|e| format!("{path}: {e}"))?;
        fs.write(&path, &format!("{}\n", mask_like(cpus, trimmed(&now))))
            .map_err(|e| format!("writing {path}: {e}"))?;
        let read = fs.read(&path).map_err(|e| format!("{path}: {e}"))?;
        let got = CpuSet::parse_mask(trimmed(&read)).map_err(|e| format!("{path}: {e}"))?;
        if &got != cpus {
            return Err(format!(
                "{path} reads {:?} after writing {}",
                read,
                cpus.to_list()
            ));
        }
        back.push(trimmed(&read).to_string());
    }
    Ok(back)
}

/// Sets RPS of `ifname` in namespace `ns` to `cpus` (from inside the namespace).
pub fn set_rps_in_netns(ns: &str, ifname: &str, cpus: &CpuSet) -> Result<Vec<String>, String> {
    let (ifname, cpus) = (ifname.to_string(), cpus.clone());
    in_netns(ns, true, move || {
        let fs = RootFs::new("/");
        check_private(&fs, &ifname)?;
        write_rps(&fs, &ifname, &cpus)
    })
}

/// `/proc/net/snmp` + `/proc/net/netstat` counters of namespace `ns`.
pub fn counters_in_netns(ns: &str) -> Result<BTreeMap<String, u64>, String> {
    in_netns(ns, false, || Ok(read_counters("/proc/thread-self/net")))
}

/// `snmp` + `netstat` counters under a `net` directory (missing files give nothing).
pub fn read_counters(net_dir: &str) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for f in ["snmp", "netstat"] {
        let path = std::path::Path::new(net_dir).join(f);
        if let Ok(text) = corelocal::procfs::read_text(&path) {
            m.extend(corelocal::procfs::parse_counters(&text));
        }
    }
    m
}

/// A real NIC's RX IRQs, moved cell by cell; the original `smp_affinity` contents are
/// restored byte for byte on drop.
#[derive(Debug)]
pub struct IrqPlacer {
    fs: RootFs,
    irqs: Vec<u32>,
    saved: Vec<SnapshotEntry>,
}

impl IrqPlacer {
    /// Finds `iface`'s RX IRQs under `root` and saves their affinity. Refuses while irqbalance
    /// runs (it would undo the placement) unless `force`.
    pub fn new(root: &std::path::Path, iface: &str, force: bool) -> Result<IrqPlacer, String> {
        let fs = RootFs::new(root);
        let topo = Topology::read(root).map_err(|e| format!("topology: {e}"))?;
        let host = corelocal_tune::read_host(&fs, &topo, &[iface.to_string()])
            .map_err(|e| e.to_string())?;
        if let (Some(pid), false) = (host.irqbalance_pid, force) {
            return Err(format!(
                "irqbalance runs (pid {pid}) and would undo the IRQ placement; stop it or pass --force"
            ));
        }
        let irqs = crate::placement::rx_irqs(&host.nics[0]);
        if irqs.is_empty() {
            return Err(format!("no RX interrupts found for {iface}"));
        }
        let mut saved = Vec::new();
        for irq in &irqs {
            let path = Knob::IrqAffinity { irq: *irq }.path();
            let content = fs.read(&path).map_err(|e| format!("{path}: {e}"))?;
            saved.push(SnapshotEntry { path, content });
        }
        Ok(IrqPlacer { fs, irqs, saved })
    }

    /// The IRQs moved.
    pub fn irqs(&self) -> &[u32] {
        &self.irqs
    }

    /// Points every RX IRQ at `cpu`; checks the value reads back.
    pub fn place(&self, cpu: usize) -> Result<(), String> {
        let want = CpuSet::single(cpu);
        for e in &self.saved {
            let text = format!("{}\n", mask_like(&want, trimmed(&e.content)));
            self.fs
                .write(&e.path, &text)
                .map_err(|err| format!("writing {}: {err}", e.path))?;
            let back = self.fs.read(&e.path).map_err(|err| err.to_string())?;
            if CpuSet::parse_mask(trimmed(&back)).ok().as_ref() != Some(&want) {
                return Err(format!("{} reads {back:?} after writing CPU {cpu}", e.path));
            }
        }
        Ok(())
    }
}

impl Drop for IrqPlacer {
    fn drop(&mut self) {
        for f in restore(&self.fs, &self.saved) {
            eprintln!(
                "corelocal sweep: warning: restoring IRQ affinity: {}",
                f.message
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(kind: corelocal_tune::fixture::Kind, name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("corelocal-sweep-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        corelocal_tune::fixture::write(&dir, kind).unwrap();
        dir
    }

    #[test]
    fn rps_on_every_rx_queue_of_a_fixture() {
        let dir = fixture(corelocal_tune::fixture::Kind::TwoSocket, "rps");
        let fs = RootFs::new(&dir);
        let back = write_rps(&fs, "ens1f0", &CpuSet::single(5)).unwrap();
        assert_eq!(back, vec!["20"; 4], "8-CPU host: 2 hex digits");
        check_private(&fs, "ens1f0").unwrap();
        assert!(
            check_private(&fs, "eth9").is_err(),
            "ens1f0 visible: not ours"
        );
        assert!(write_rps(&fs, "nope", &CpuSet::single(1)).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn irq_placer_moves_rx_irqs_and_restores_bytes() {
        let dir = fixture(corelocal_tune::fixture::Kind::TwoSocket, "irq");
        let fs = RootFs::new(&dir);
        let before: Vec<String> = (50..=54)
            .map(|i| fs.read(&format!("proc/irq/{i}/smp_affinity")).unwrap())
            .collect();
        {
            let p = IrqPlacer::new(&dir, "ens1f0", false).unwrap();
            assert_eq!(p.irqs(), &[51, 52, 53, 54]);
            p.place(6).unwrap();
            assert_eq!(fs.read("proc/irq/52/smp_affinity").unwrap(), "40\n");
            assert_eq!(fs.read("proc/irq/50/smp_affinity").unwrap(), before[0]);
        }
        let after: Vec<String> = (50..=54)
            .map(|i| fs.read(&format!("proc/irq/{i}/smp_affinity")).unwrap())
            .collect();
        assert_eq!(after, before);
        assert!(IrqPlacer::new(&dir, "nope0", false).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
