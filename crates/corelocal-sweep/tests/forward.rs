//! `sweep forward` end to end, in namespaces it creates: packets are really forwarded (the
//! sink counts what the router sent, no ICMP comes back), every layout is applied (read back
//! from the router's sysfs, and its effect seen: RPS IPIs on the other CPU, NAPI threads
//! busy) and reverted, a router without ip_forward forwards nothing and the run says so, the
//! firewall load really runs conntrack and its rules, and afterwards nothing is left: no
//! namespace, no NAPI thread, no nft table, the host's sysctls and interface knobs unchanged.
//! Needs root: skipped with a reason otherwise, except under `CI=true`, where it fails.

use clap::Parser;
use corelocal::cpu::{CpuSet, Topology};
use corelocal_sweep::forward::{self, layout::Layout, report::ForwardReport, testbed};

/// The tests below check that no `clfwd-*` namespace is left: they run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    cmd: forward::Command,
}

fn run(args: &[&str]) -> ForwardReport {
    let dir = corelocal::testing::ScratchDir::new("clfwd-test");
    let out = dir.join("r");
    let mut all = vec!["forward", "-o", out.to_str().unwrap()];
    all.extend_from_slice(args);
    let cli = Cli::parse_from(all);
    let topo = Topology::host().unwrap();
    forward::forward(&cli.cmd, &topo).unwrap()
}

/// `napi/fwPID*` threads of this process's testbeds still running.
fn our_napi_threads() -> Vec<String> {
    let tag = format!("napi/fw{}", std::process::id() % 10_000_000);
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| {
            c.strip_prefix(&tag)
                .is_some_and(|rest| rest.starts_with(|ch: char| ch.is_ascii_lowercase()))
        })
        .collect()
}

fn assert_all_removed(r: &ForwardReport) {
    assert!(
        corelocal_sweep::netns::ours_with(testbed::PREFIX).is_empty(),
        "namespaces left: {:?}",
        corelocal_sweep::netns::ours_with(testbed::PREFIX)
    );
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !our_napi_threads().is_empty() && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(our_napi_threads().is_empty(), "{:?}", our_napi_threads());
    assert!(
        r.host_checked > 50,
        "host settings compared: {}",
        r.host_checked
    );
    assert!(r.host_changed.is_empty(), "{:?}", r.host_changed);
}

fn value(line: &str) -> &str {
    line.rsplit(" = ").next().unwrap().trim()
}

#[test]
fn every_layout_is_applied_forwards_and_is_reverted() {
    if !corelocal::testing::root_or_skip("every_layout_is_applied_forwards_and_is_reverted") {
        return;
    }
    let _serial = serial();
    let online = Topology::host().unwrap().online;
    if online.len() < 2 {
        eprintln!("skipping: needs 2 online CPUs");
        return;
    }
    let gen = online.iter().next().unwrap();
    let mut other = online.clone();
    other.remove(gen);
    let before = testbed::HostNet::read();
    let r = run(&[
        "--layouts",
        "all",
        "--rounds",
        "1",
        "--duration",
        "600ms",
        "--warmup",
        "200ms",
        "--rate",
        "40k",
    ]);
    assert_eq!(r.cells.len(), 6);
    for c in &r.cells {
        let l = c.layout.unwrap();
        assert!(c.errors.is_empty(), "{}: {:?}", c.name, c.errors);
        let s = &c.samples[0];
        assert!(s.revert_error.is_none(), "{}: {:?}", c.name, s.revert_error);
        // Really forwarded, and the sink got what the router sent, with no ICMP back. (No
        // rate is asserted, and NAPI layouts are judged over the cell's whole life: on a
        // shared 2-CPU machine a NAPI thread, unlike a softirq, can wait for a CPU.)
        let napi_layout = matches!(l, Layout::NapiOther | Layout::NapiSpread);
        assert!(
            napi_layout || c.forwarded_pps.unwrap() > 0.0,
            "{}: {:?}",
            c.name,
            c.forwarded_pps
        );
        assert!(s.router_sent > 0, "{}: {}", c.name, s.router_sent);
        assert_eq!(
            s.sink_received, s.router_sent,
            "{}: the sink counts what the router sent",
            c.name
        );
        assert_eq!(s.sink_icmp_out, 0, "{}", c.name);
        // Applied: read back from the router's sysfs.
        let rps: Vec<&String> = s
            .applied
            .iter()
            .filter(|a| a.contains("rps_cpus"))
            .collect();
        let xps: Vec<&String> = s
            .applied
            .iter()
            .filter(|a| a.contains("xps_cpus"))
            .collect();
        let napi: Vec<&String> = s.applied.iter().filter(|a| a.contains("napi/")).collect();
        let queues = r.config.queues;
        match l {
            Layout::Default => assert!(s.applied.is_empty(), "{:?}", s.applied),
            Layout::RpsOther | Layout::RpsSpread | Layout::Xps => {
                let want = if l == Layout::RpsOther {
                    other.to_list()
                } else {
                    online.to_list()
                };
                assert_eq!(rps.len(), queues, "{}: {:?}", c.name, s.applied);
                assert!(rps.iter().all(|a| value(a) == want), "{:?}", s.applied);
                assert_eq!(xps.len(), if l == Layout::Xps { queues } else { 0 });
            }
            Layout::NapiOther | Layout::NapiSpread => {
                assert!(
                    s.applied[0].contains("threaded = 1 (GRO on)"),
                    "{:?}",
                    s.applied
                );
                assert_eq!(napi.len(), queues, "{:?}", s.applied);
            }
        }
        // ... and seen at work.
        let w = &s.window;
        match l {
            Layout::RpsOther => {
                let ipis: f64 = w
                    .cpus
                    .iter()
                    .filter(|p| other.contains(p.cpu))
                    .map(|p| p.rps_ipis_per_s)
                    .sum();
                assert!(
                    ipis > 0.0,
                    "no RPS IPI reached the other CPUs: {:?}",
                    w.cpus
                );
            }
            Layout::NapiOther | Layout::NapiSpread => {
                let ran: u64 = s
                    .thread_ns
                    .iter()
                    .filter(|t| t.0.starts_with("napi/"))
                    .map(|t| t.1)
                    .sum();
                assert!(ran > 0, "NAPI threads never ran: {:?}", s.thread_ns);
                if l == Layout::NapiOther {
                    assert!(w
                        .threads
                        .iter()
                        .filter(|t| t.name.starts_with("napi/"))
                        .all(|t| CpuSet::parse_list(&t.cpus).unwrap() == other));
                }
            }
            _ => {}
        }
        // Reverted: read back as before (empty masks, threaded 0, no thread left).
        for line in &s.reverted {
            if line.contains("threaded") {
                assert!(
                    line.contains("threaded = 0 (GRO off), 0 napi thread(s)"),
                    "{line}"
                );
            } else {
                assert!(
                    CpuSet::parse_mask(value(line)).unwrap().is_empty(),
                    "{line}"
                );
            }
        }
        assert_eq!(
            s.reverted.len(),
            s.applied.len() - napi.len(),
            "{}: {:?}",
            c.name,
            s.reverted
        );
    }
    assert!(forward::complete(&r));
    assert_all_removed(&r);
    assert!(before.changed(&testbed::HostNet::read()).is_empty());
}

#[test]
fn a_router_without_ip_forward_forwards_nothing_and_says_so() {
    if !corelocal::testing::root_or_skip("a_router_without_ip_forward_forwards_nothing_and_says_so")
    {
        return;
    }
    let _serial = serial();
    let r = run(&[
        "--layouts",
        "default",
        "--rounds",
        "1",
        "--duration",
        "400ms",
        "--warmup",
        "200ms",
        "--rate",
        "20k",
        "--no-ip-forward",
    ]);
    let c = &r.cells[0];
    let s = &c.samples[0];
    assert_eq!(c.forwarded_pps, Some(0.0));
    assert_eq!(s.router_sent, 0);
    assert_eq!(s.sink_received, 0);
    assert!(s.window.offered_pps > 1000.0, "{:?}", s.window);
    assert!(
        s.window.drops.router_not_forwarded > 0,
        "{:?}",
        s.window.drops
    );
    assert!(!forward::complete(&r));
    assert!(
        r.notes.iter().any(|n| n.contains("NOTHING WAS FORWARDED")),
        "{:?}",
        r.notes
    );
    assert!(
        r.verdicts[0].contains("nothing was forwarded"),
        "{:?}",
        r.verdicts
    );
    assert_all_removed(&r);
}

fn host_nft_tables() -> String {
    let out = std::process::Command::new("nft")
        .args(["list", "tables"])
        .output()
        .expect("nft");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_firewall_load_runs_conntrack_and_its_rules_and_leaves_nothing() {
    if !corelocal::testing::root_or_skip(
        "the_firewall_load_runs_conntrack_and_its_rules_and_leaves_nothing",
    ) {
        return;
    }
    if !testbed::nft_available() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "nft is missing: CI must install nftables (apt-get install nftables)"
        );
        eprintln!("skipping: nft is not installed (apt-get install nftables)");
        return;
    }
    let _serial = serial();
    let tables = host_nft_tables();
    let r = run(&[
        "--layouts",
        "default",
        "--firewall",
        "0,50",
        "--rounds",
        "1",
        "--duration",
        "400ms",
        "--warmup",
        "200ms",
        "--rate",
        "20k",
    ]);
    assert_eq!(r.cells.len(), 2);
    let plain = &r.cells[0].samples[0];
    let fw = &r.cells[1].samples[0];
    assert_eq!(r.cells[1].firewall_rules, 50);
    assert_eq!(plain.firewall_accepted, None);
    assert_eq!(
        plain.window.conntrack_entries, 0,
        "no conntrack without firewall"
    );
    assert!(
        fw.window.conntrack_entries >= 100,
        "one entry per flow (256): {:?}",
        fw.window
    );
    let accepted = fw.firewall_accepted.expect("the nft counter");
    assert!(
        accepted >= fw.router_sent && fw.router_sent > 1000,
        "every forwarded packet passed the 50 rules: accepted {accepted}, sent {}",
        fw.router_sent
    );
    assert!(forward::complete(&r));
    assert_all_removed(&r);
    assert_eq!(host_nft_tables(), tables, "host nft tables changed");
}

#[test]
fn stale_namespaces_of_dead_runs_are_removed() {
    if !corelocal::testing::root_or_skip("stale_namespaces_of_dead_runs_are_removed") {
        return;
    }
    let _serial = serial();
    // A pid that cannot exist (above pid_max's ceiling of 2^22).
    let name = format!("{}4999999-0-g", testbed::PREFIX);
    corelocal_sweep::netns::ip(&["netns", "add", &name]).unwrap();
    let removed = corelocal_sweep::netns::remove_stale_with(testbed::PREFIX);
    assert!(removed.contains(&name), "{removed:?}");
    assert!(!corelocal_sweep::netns::ours_with(testbed::PREFIX).contains(&name));
}

#[test]
fn real_interfaces_are_only_measured() {
    if !corelocal::testing::root_or_skip("real_interfaces_are_only_measured") {
        return;
    }
    let _serial = serial();
    let before = testbed::HostNet::read();
    let r = run(&[
        "--real-ifaces",
        "lo,lo",
        "--duration",
        "300ms",
        "--rounds",
        "2",
    ]);
    assert_eq!(r.config.mode, "observe");
    assert_eq!(r.cells.len(), 1);
    assert_eq!(r.cells[0].name, "as-is");
    assert_eq!(r.cells[0].samples.len(), 2);
    assert!(r.cells[0].samples.iter().all(|s| s.applied.is_empty()));
    assert!(corelocal_sweep::netns::ours_with(testbed::PREFIX).is_empty());
    assert!(r.host_changed.is_empty());
    assert!(before.changed(&testbed::HostNet::read()).is_empty());
    let topo = Topology::host().unwrap();
    let cli = Cli::parse_from(["forward", "--real-ifaces", "nosuch0,lo"]);
    assert!(matches!(
        forward::forward(&cli.cmd, &topo),
        Err(corelocal_sweep::SweepError::Input(_))
    ));
}

#[test]
fn bad_flags_are_input_errors_and_touch_nothing() {
    let topo = Topology::host().unwrap();
    for args in [
        vec!["forward", "--layouts", "irq-magic"],
        vec!["forward", "--firewall", "x"],
        vec!["forward", "--gen-cpu", "4096"],
        vec!["forward", "--real-ifaces", "eth0"],
    ] {
        let cli = Cli::parse_from(&args);
        match forward::forward(&cli.cmd, &topo) {
            Err(corelocal_sweep::SweepError::Input(m)) => assert!(!m.is_empty()),
            other => panic!("{args:?}: {other:?}"),
        }
    }
    assert!(Cli::try_parse_from(["forward", "--frame", "20"]).is_err());
    assert!(Cli::try_parse_from(["forward", "--rate", "fast"]).is_err());
}
