//! Synthetic `/sys` + `/proc` trees for tests and demos (`corelocal tune fixture KIND DIR`).
//!
//! - [`Kind::Vm`]: this project's VM, copied from the real one: 2 CPUs, virtio_net `eth0` with
//!   one RX and one TX queue, IRQs 37 (config), 38 (`virtio2-input.0`), 39
//!   (`virtio2-output.0`); `numa_node` and `msi_irqs` on the PCI function above the virtio
//!   device; no readable `xps_cpus` (the kernel answers ENOENT on single-queue devices).
//! - [`Kind::TwoSocket`]: 8 CPUs, 2 sockets × 2 cores × 2 threads, `ens1f0` (ixgbe) on NUMA
//!   node 1 with 4 `TxRx` queue IRQs (51–54) and a link IRQ (50).
//! - [`Kind::Large`]: 96 CPUs, 2 sockets × 24 cores × 2 threads, `ens2f0np0` (mlx5_core) on
//!   node 1 with 16 `mlx5_compN` IRQs (101–116) and an async IRQ (100); masks are 96 bits wide.

use corelocal::cpu::topology::fixture::{write_host, HostShape};
use corelocal::cpu::CpuSet;
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::Path;

/// Which fixture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// This VM: 2 CPUs, virtio eth0 with 1 queue.
    Vm,
    /// 8 CPUs, 2 sockets with SMT, a 4-queue NIC on node 1.
    TwoSocket,
    /// 96 CPUs, a 16-queue NIC on node 1 (masks wider than 64 bits).
    Large,
}

/// A NIC to write.
struct NicSpec<'a> {
    name: &'a str,
    driver: &'a str,
    pci: &'a str,
    numa: i32,
    /// (irq, name) of every interrupt of the device.
    irqs: Vec<(u32, String)>,
    queues: u32,
}

fn put(path: &Path, text: &str) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::write(path, format!("{text}\n"))
}

fn link(path: &Path, target: &str) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    symlink(target, path)
}

/// `set` as the kernel prints a cpumask on a host with `ncpus` CPUs (`%*pb`, nr_cpu_ids bits).
pub fn kernel_mask(set: &CpuSet, ncpus: usize) -> String {
    let groups = ncpus.div_ceil(32).max(1);
    let top_bits = ncpus - 32 * (groups - 1);
    let template = format!(
        "{},{}",
        "0".repeat(top_bits.div_ceil(4)),
        "00000000,".repeat(groups - 1)
    );
    crate::knob::mask_like(set, template.trim_end_matches(','))
}

fn write_irq(root: &Path, irq: u32, name: &str, ncpus: usize, eff: usize) -> io::Result<()> {
    let dir = root.join(format!("proc/irq/{irq}"));
    let all = CpuSet::first_n(ncpus);
    put(&dir.join("smp_affinity"), &kernel_mask(&all, ncpus))?;
    put(&dir.join("smp_affinity_list"), &all.to_list())?;
    put(
        &dir.join("effective_affinity"),
        &kernel_mask(&CpuSet::single(eff), ncpus),
    )?;
    put(&dir.join("effective_affinity_list"), &eff.to_string())?;
    put(
        &dir.join("affinity_hint"),
        &kernel_mask(&CpuSet::new(), ncpus),
    )?;
    put(&dir.join("node"), "-1")?;
    fs::create_dir_all(dir.join(name))
}

fn write_interrupts(root: &Path, ncpus: usize, irqs: &[(u32, String)]) -> io::Result<()> {
    let mut text: String = (0..ncpus)
        .map(|c| format!("{:>11}", format!("CPU{c}")))
        .collect();
    text = format!("    {text}\n");
    for (irq, name) in irqs {
        let counts: String = (0..ncpus)
            .map(|c| format!("{:>11}", if c == 0 { 7 } else { 0 }))
            .collect();
        text.push_str(&format!(
            "{irq:>4}:{counts}  PCI-MSIX-0000:00:00.0   0-edge      {name}\n"
        ));
    }
    text.push_str(&format!(
        "NMI:{}   Non-maskable interrupts\n",
        "          0".repeat(ncpus)
    ));
    put(&root.join("proc/interrupts"), text.trim_end())
}

fn write_queues(dir: &Path, spec: &NicSpec, ncpus: usize, xps: bool) -> io::Result<()> {
    let zero = kernel_mask(&CpuSet::new(), ncpus);
    for q in 0..spec.queues {
        put(&dir.join(format!("queues/rx-{q}/rps_cpus")), &zero)?;
        put(&dir.join(format!("queues/rx-{q}/rps_flow_cnt")), "0")?;
        if xps {
            put(&dir.join(format!("queues/tx-{q}/xps_cpus")), &zero)?;
        }
        let rxqs = kernel_mask(&CpuSet::new(), spec.queues as usize);
        put(&dir.join(format!("queues/tx-{q}/xps_rxqs")), &rxqs)?;
    }
    Ok(())
}

/// A PCI NIC: `sys/devices/PCI/net/NAME`, `sys/class/net/NAME` → it, `device` → the PCI dir.
fn write_pci_nic(root: &Path, spec: &NicSpec, ncpus: usize) -> io::Result<()> {
    let pci = root.join(format!("sys/devices/{}", spec.pci));
    put(&pci.join("numa_node"), &spec.numa.to_string())?;
    link(
        &pci.join("driver"),
        &format!("../../../bus/pci/drivers/{}", spec.driver),
    )?;
    for (irq, _) in &spec.irqs {
        put(&pci.join(format!("msi_irqs/{irq}")), "msix")?;
    }
    let dev = pci.join(format!("net/{}", spec.name));
    link(&dev.join("device"), &format!("../../../{}", pci_leaf(spec)))?;
    write_queues(&dev, spec, ncpus, spec.queues > 1)?;
    let target = format!("../../devices/{}/net/{}", spec.pci, spec.name);
    link(&root.join(format!("sys/class/net/{}", spec.name)), &target)
}

fn pci_leaf<'a>(spec: &NicSpec<'a>) -> &'a str {
    spec.pci.rsplit('/').next().unwrap_or(spec.pci)
}

fn write_irqs(root: &Path, spec: &NicSpec, ncpus: usize) -> io::Result<()> {
    for (i, (irq, name)) in spec.irqs.iter().enumerate() {
        write_irq(root, *irq, name, ncpus, i % ncpus)?;
    }
    write_interrupts(root, ncpus, &spec.irqs)
}

fn write_common(root: &Path, ncpus: usize) -> io::Result<()> {
    put(&root.join("proc/sys/net/core/rps_sock_flow_entries"), "0")?;
    put(
        &root.join("proc/irq/default_smp_affinity"),
        &kernel_mask(&CpuSet::first_n(ncpus), ncpus),
    )?;
    let lo = root.join("sys/devices/virtual/net/lo");
    put(
        &lo.join("queues/rx-0/rps_cpus"),
        &kernel_mask(&CpuSet::new(), ncpus),
    )?;
    put(&lo.join("queues/rx-0/rps_flow_cnt"), "0")?;
    put(&lo.join("queues/tx-0/xps_rxqs"), "0")?;
    link(
        &root.join("sys/class/net/lo"),
        "../../devices/virtual/net/lo",
    )
}

/// This VM's eth0, laid out like the real `/sys` (virtio device under its PCI function).
fn write_vm_nic(root: &Path) -> io::Result<()> {
    let pci = root.join("sys/devices/pci0000:00/0000:00:03.0");
    put(&pci.join("numa_node"), "-1")?;
    link(&pci.join("driver"), "../../../bus/pci/drivers/virtio-pci")?;
    for irq in [37, 38, 39] {
        put(&pci.join(format!("msi_irqs/{irq}")), "msix")?;
    }
    let virtio = pci.join("virtio2");
    link(
        &virtio.join("driver"),
        "../../../../bus/virtio/drivers/virtio_net",
    )?;
    let dev = virtio.join("net/eth0");
    link(&dev.join("device"), "../../../virtio2")?;
    put(&dev.join("queues/rx-0/rps_cpus"), "0")?;
    put(&dev.join("queues/rx-0/rps_flow_cnt"), "0")?;
    put(&dev.join("queues/tx-0/xps_rxqs"), "0")?;
    link(
        &root.join("sys/class/net/eth0"),
        "../../devices/pci0000:00/0000:00:03.0/virtio2/net/eth0",
    )
}

fn write_vm(root: &Path) -> io::Result<()> {
    write_host(
        root,
        HostShape {
            packages: 1,
            cores_per_package: 2,
            threads_per_core: 1,
        },
    )?;
    write_common(root, 2)?;
    write_vm_nic(root)?;
    let irqs: Vec<(u32, String)> = [
        (37, "virtio2-config"),
        (38, "virtio2-input.0"),
        (39, "virtio2-output.0"),
    ]
    .iter()
    .map(|(i, n)| (*i, n.to_string()))
    .collect();
    // As read on the VM: smp_affinity 3, effective 0 / 1 / 0, hint 0 / 3 / 3.
    for (irq, name) in &irqs {
        write_irq(root, *irq, name, 2, usize::from(*irq == 38))?;
    }
    put(&root.join("proc/irq/38/affinity_hint"), "3")?;
    put(&root.join("proc/irq/39/affinity_hint"), "3")?;
    write_interrupts(root, 2, &irqs)
}

fn nic_spec(kind: Kind) -> NicSpec<'static> {
    match kind {
        Kind::TwoSocket => NicSpec {
            name: "ens1f0",
            driver: "ixgbe",
            pci: "pci0000:80/0000:81:00.0",
            numa: 1,
            irqs: std::iter::once((50, "ens1f0".to_string()))
                .chain((0..4).map(|q| (51 + q, format!("ens1f0-TxRx-{q}"))))
                .collect(),
            queues: 4,
        },
        _ => NicSpec {
            name: "ens2f0np0",
            driver: "mlx5_core",
            pci: "pci0000:3a/0000:3b:00.0",
            numa: 1,
            irqs: std::iter::once((100, "mlx5_async0@pci:0000:3b:00.0".to_string()))
                .chain((0..16).map(|q| (101 + q, format!("mlx5_comp{q}@pci:0000:3b:00.0"))))
                .collect(),
            queues: 16,
        },
    }
}

/// Writes fixture `kind` under `root` (which should be empty or absent).
pub fn write(root: &Path, kind: Kind) -> io::Result<()> {
    if kind == Kind::Vm {
        return write_vm(root);
    }
    let shape = match kind {
        Kind::TwoSocket => HostShape {
            packages: 2,
            cores_per_package: 2,
            threads_per_core: 2,
        },
        _ => HostShape {
            packages: 2,
            cores_per_package: 24,
            threads_per_core: 2,
        },
    };
    let ncpus = shape.cpus();
    write_host(root, shape)?;
    write_common(root, ncpus)?;
    let spec = nic_spec(kind);
    write_pci_nic(root, &spec, ncpus)?;
    write_irqs(root, &spec, ncpus)
}

/// Marks a fake process `pid` named `comm` (for the irqbalance check).
pub fn add_process(root: &Path, pid: u32, comm: &str) -> io::Result<()> {
    put(&root.join(format!("proc/{pid}/comm")), comm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_mask_widths() {
        assert_eq!(kernel_mask(&CpuSet::single(1), 2), "2");
        assert_eq!(kernel_mask(&CpuSet::first_n(8), 8), "ff");
        assert_eq!(
            kernel_mask(&CpuSet::new(), 96),
            "00000000,00000000,00000000"
        );
        assert_eq!(kernel_mask(&CpuSet::single(35), 36), "8,00000000");
    }
}
