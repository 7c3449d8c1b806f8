//! A real SIGINT in the middle of `sweep forward` (its own test binary: the stop flag is
//! process-wide): the run stops within seconds and removes everything — namespaces, links,
//! NAPI threads, nft tables — and the host's settings are unchanged. Needs root: skipped
//! with a reason otherwise, except under `CI=true`, where it fails.

use clap::Parser;
use corelocal::cpu::Topology;
use corelocal_sweep::forward::{self, testbed};
use std::time::{Duration, Instant};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    cmd: forward::Command,
}

#[test]
fn sigint_mid_run_removes_the_testbed() {
    if !corelocal::testing::root_or_skip("sigint_mid_run_removes_the_testbed") {
        return;
    }
    let firewall = if testbed::nft_available() { "20" } else { "0" };
    let dir = corelocal::testing::ScratchDir::new("clfwd-int");
    let out = dir.join("r");
    let cli = Cli::parse_from([
        "forward",
        "--layouts",
        "napi-other,rps-other",
        "--firewall",
        firewall,
        "--rounds",
        "3",
        "--duration",
        "20s",
        "--warmup",
        "200ms",
        "--rate",
        "20k",
        "-o",
        out.to_str().unwrap(),
    ]);
    corelocal_sweep::sys::install_stop_handler().unwrap();
    let before = testbed::HostNet::read();
    let run = std::thread::spawn(move || {
        let topo = Topology::host().unwrap();
        forward::forward(&cli.cmd, &topo)
    });
    // Wait until the first testbed exists and its layout is in place, then interrupt.
    let end = Instant::now() + Duration::from_secs(20);
    while corelocal_sweep::netns::ours_with(testbed::PREFIX).len() < 3 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        corelocal_sweep::netns::ours_with(testbed::PREFIX).len(),
        3,
        "the testbed never came up"
    );
    std::thread::sleep(Duration::from_millis(800));
    let status = std::process::Command::new("kill")
        .args(["-INT", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let stopped = Instant::now();
    let report = run.join().unwrap().unwrap();
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "took {:?} to stop",
        stopped.elapsed()
    );
    assert!(corelocal_sweep::sys::stop_requested());
    let left = corelocal_sweep::netns::ours_with(testbed::PREFIX);
    assert!(left.is_empty(), "namespaces left: {left:?}");
    let tag = format!("napi/fw{}", std::process::id() % 10_000_000);
    let end = Instant::now() + Duration::from_secs(5);
    let threads = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
            .filter(|c| c.starts_with(&tag))
            .count()
    };
    while threads() > 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(threads(), 0, "NAPI threads left");
    assert!(report.host_changed.is_empty(), "{:?}", report.host_changed);
    assert!(before.changed(&testbed::HostNet::read()).is_empty());
    // The interrupted cell is reported as stopped, nothing after it ran.
    let errors: Vec<&String> = report.cells.iter().flat_map(|c| &c.errors).collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("stopped"), "{errors:?}");
    assert!(!forward::complete(&report));
}
