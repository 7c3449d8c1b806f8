//! A real 2×2 sweep between two private network namespaces: every cell completes, the
//! receive processing really ran on the flow CPU, and all network state is restored (no
//! `clsweep-*` namespace left, the host's `rps_cpus` unchanged). Needs root: skipped with a
//! reason otherwise, except under `CI=true`, where it fails.

use clap::Parser;
use corelocal::cpu::Topology;
use std::collections::BTreeMap;

/// The tests below check that no `clsweep-*` namespace is left: they run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    cmd: corelocal_sweep::Command,
}

/// Every `rps_cpus` of the host's interfaces, as read now.
fn host_rps() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(ifs) = std::fs::read_dir("/sys/class/net") else {
        return out;
    };
    for i in ifs.flatten() {
        let q = i.path().join("queues");
        for e in std::fs::read_dir(&q).into_iter().flatten().flatten() {
            let p = e.path().join("rps_cpus");
            if let Ok(t) = std::fs::read_to_string(&p) {
                out.insert(p.display().to_string(), t);
            }
        }
    }
    out
}

fn ip_netns_list() -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn real_2x2_sweep_in_namespaces_restores_everything() {
    if !corelocal::testing::root_or_skip("real_2x2_sweep_in_namespaces_restores_everything") {
        return;
    }
    let _serial = serial();
    let topo = Topology::host().unwrap();
    let cpus: Vec<usize> = topo.online.iter().take(2).collect();
    if cpus.len() < 2 {
        eprintln!("skipping: needs 2 online CPUs");
        return;
    }
    let dir = std::env::temp_dir().join(format!("corelocal-sweep-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let list = format!("{},{}", cpus[0], cpus[1]);
    let out = dir.join("m");
    let cli = Cli::parse_from([
        "sweep",
        "--cpus",
        &list,
        "--duration",
        "800ms",
        "--warmup",
        "300ms",
        "--port",
        "5391",
        "-o",
        out.to_str().unwrap(),
    ]);
    let rps_before = host_rps();
    let report = corelocal_sweep::sweep(&cli.cmd, &topo).unwrap();
    assert_eq!(report.cells.len(), 4);
    for c in &report.cells {
        assert!(
            c.errors.is_empty(),
            "cell {}/{}: {:?}",
            c.flow_cpu,
            c.app_cpu,
            c.errors
        );
        let g = c.gbps.unwrap();
        assert!(
            g > 0.05,
            "cell {}/{} moved only {g} Gbit/s",
            c.flow_cpu,
            c.app_cpu
        );
        let s = &c.samples[0];
        let flow = s.cpus.iter().find(|p| p.cpu == c.flow_cpu).unwrap();
        // Protocol processing happened on the flow CPU: its NET_RX softirq processed packets.
        assert!(
            flow.softnet_pps > 100.0,
            "flow CPU {} idle in softnet: {s:?}",
            c.flow_cpu
        );
        assert!(s.receiver_busy_pct > 1.0, "{s:?}");
        assert!(s.counters.contains_key("s:Tcp:RetransSegs"));
    }
    assert!(report.recommendation.relation.is_some());
    assert!(!report.recommendation.text.is_empty());
    // All network state restored.
    let left = ip_netns_list();
    assert!(!left.contains("clsweep-"), "namespaces left: {left}");
    assert!(corelocal_sweep::netns::ours().is_empty());
    assert_eq!(host_rps(), rps_before, "host rps_cpus changed");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_flags_are_input_errors_and_touch_nothing() {
    let topo = Topology::host().unwrap();
    let cli = Cli::parse_from(["sweep", "--cpus", "0-999"]);
    assert!(matches!(
        corelocal_sweep::sweep(&cli.cmd, &topo),
        Err(corelocal_sweep::SweepError::Input(_))
    ));
    assert!(Cli::try_parse_from(["sweep", "--flows", "0"]).is_err());
    assert!(Cli::try_parse_from(["sweep", "--duration", "forever"]).is_err());
    let cli = Cli::parse_from(["sweep", "--sender-cpu", "9999"]);
    assert!(matches!(
        corelocal_sweep::sweep(&cli.cmd, &topo),
        Err(corelocal_sweep::SweepError::Input(_))
    ));
}

#[test]
fn namespaces_are_deleted_when_a_cell_panics() {
    if !corelocal::testing::root_or_skip("namespaces_are_deleted_when_a_cell_panics") {
        return;
    }
    let _serial = serial();
    let names = std::panic::catch_unwind(|| {
        let pair = corelocal_sweep::netns::VethPair::create(2).unwrap();
        let names = (
            pair.sender.name().to_string(),
            pair.receiver.name().to_string(),
        );
        assert!(ip_netns_list().contains(&names.1));
        std::panic::panic_any(names);
    })
    .unwrap_err();
    let (s, r) = names.downcast_ref::<(String, String)>().unwrap();
    let left = ip_netns_list();
    assert!(
        !left.contains(s.as_str()) && !left.contains(r.as_str()),
        "{left}"
    );
}

#[test]
fn several_flows_over_a_multi_queue_veth() {
    if !corelocal::testing::root_or_skip("several_flows_over_a_multi_queue_veth") {
        return;
    }
    let _serial = serial();
    let topo = Topology::host().unwrap();
    let cpu = topo.online.iter().next().unwrap().to_string();
    let dir = std::env::temp_dir().join(format!("corelocal-sweep-flows-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("m");
    let cli = Cli::parse_from([
        "sweep",
        "--cpus",
        &cpu,
        "--flows",
        "3",
        "--duration",
        "500ms",
        "--warmup",
        "200ms",
        "--port",
        "5491",
        "-o",
        out.to_str().unwrap(),
    ]);
    let report = corelocal_sweep::sweep(&cli.cmd, &topo).unwrap();
    let c = &report.cells[0];
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert!(c.gbps.unwrap() > 0.05);
    assert_eq!(report.config.flows, 3);
    assert!(corelocal_sweep::netns::ours().is_empty());
    std::fs::remove_dir_all(dir).unwrap();
}
