//! `--iface` mode without a real NIC: corelocal-tune's VM fixture stands in for /proc/irq
//! (eth0's RX IRQ 38), the data comes over loopback from the `--send-to` role. Every cell
//! moves the fixture's IRQ and the original bytes are back afterwards. Runs unprivileged.

use clap::Parser;
use corelocal::cpu::Topology;
use std::time::Duration;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    cmd: corelocal_sweep::Command,
}

#[test]
fn nic_irq_mode_on_a_fixture_restores_affinity() {
    let dir = std::env::temp_dir().join(format!("corelocal-sweep-iface-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    corelocal_tune::fixture::write(&dir, corelocal_tune::fixture::Kind::Vm).unwrap();
    let irq = dir.join("proc/irq/38/smp_affinity");
    let before = std::fs::read_to_string(&irq).unwrap();
    let host = Topology::host().unwrap();
    if host.online.len() < 2 {
        eprintln!("skipping: needs 2 online CPUs to pin to the fixture's CPUs 0-1");
        return;
    }
    let port = 5000 + (std::process::id() % 20000) as u16;
    let listen = format!("127.0.0.1:{port}");
    let out = dir.join("m");
    let cli = Cli::parse_from([
        "sweep",
        "--iface",
        "eth0",
        "--root",
        dir.to_str().unwrap(),
        "--listen",
        &listen,
        "--cpus",
        "0-1",
        "--duration",
        "300ms",
        "--warmup",
        "100ms",
        "-o",
        out.to_str().unwrap(),
    ]);
    let sender = Cli::parse_from(["sweep", "--send-to", &listen, "--for", "20s"]);
    let topo = Topology::read(&dir).unwrap();
    let send_cfg = corelocal_sweep::cell::CellConfig {
        duration_ms: 300,
        warmup_ms: 100,
        flows: 1,
        write_size: 1 << 16,
        read_size: 1 << 16,
        sender_cpu: None,
        port,
    };
    let dst = sender.cmd.send_to.unwrap();
    // The remote role, bounded: it outlives the 4 cells (~0.5 s each) and then stops.
    let t = std::thread::spawn(move || {
        corelocal_sweep::cell::send_forever(dst, &send_cfg, Duration::from_secs(6))
    });
    let report = corelocal_sweep::sweep(&cli.cmd, &topo);
    t.join().unwrap().unwrap();
    let report = report.unwrap();
    assert_eq!(report.mode, "nic-irq");
    for c in &report.cells {
        assert!(c.errors.is_empty(), "{:?}", c.errors);
        assert!(c.gbps.unwrap() > 0.0);
    }
    assert_eq!(
        std::fs::read_to_string(&irq).unwrap(),
        before,
        "IRQ affinity restored byte for byte"
    );
    std::fs::remove_dir_all(dir).unwrap();
}
