//! top's readers on /proc files captured on this VM (tests/fixtures/vm-0 and vm-1, one second
//! apart, inside a private netns with a loopback bulk transfer and a listener whose queue
//! overflowed), plus corelocal-tune's VM fixture for /sys, and the binary's non-interactive
//! modes.

use corelocal_top::sample::{Sample, Source, View};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dst).unwrap();
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// corelocal-tune's VM fixture (sys + proc/interrupts + proc/irq) with capture `n` on top.
fn root(n: usize, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("corelocal-top-{tag}-{n}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    corelocal_tune::fixture::write(&dir, corelocal_tune::fixture::Kind::Vm).unwrap();
    let captured = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/vm-{n}"));
    copy_dir(&captured, &dir);
    dir
}

fn view(tag: &str) -> View {
    let (r0, r1) = (root(0, tag), root(1, tag));
    let src = |r: &Path| Source {
        root: r.to_path_buf(),
        server_stats: None,
        netns: None,
    };
    let a = Sample::read(&src(&r0));
    let mut b = Sample::read(&src(&r1));
    b.at = a.at + Duration::from_secs(1);
    std::fs::remove_dir_all(r0).unwrap();
    std::fs::remove_dir_all(r1).unwrap();
    View::between(&a, &b)
}

#[test]
fn rates_from_captured_files() {
    let v = view("rates");
    assert_eq!(v.cpus.len(), 2);
    let c0 = &v.cpus[0];
    // cpu0: user +94, sys +9, nothing else: 103 ticks.
    assert!((c0.user - 9400.0 / 103.0).abs() < 1e-6, "{c0:?}");
    assert!((c0.sys - 900.0 / 103.0).abs() < 1e-6);
    assert_eq!(c0.idle, 0.0);
    let c1 = &v.cpus[1];
    // cpu1: user +46, sys +31, softirq +26.
    assert!((c1.softirq - 2600.0 / 103.0).abs() < 1e-6, "{c1:?}");
    assert_eq!(c1.softnet_pps, (0x38e3ac - 0x3838f0) as f64);
    assert_eq!(c0.softnet_pps, 5.0);
    let lo = v.interfaces.iter().find(|i| i.name == "lo").unwrap();
    assert_eq!(lo.rx_pps, (79010 - 35229) as f64);
    assert_eq!(lo.rx_bps, 8.0 * (3644288750u64 - 1642805678) as f64);
    assert_eq!(lo.tx_pps, lo.rx_pps);
    assert_eq!(v.drops.listen_overflows_ps, 5.0);
    assert_eq!((v.drops.listen_overflows, v.drops.listen_drops), (10, 10));
    assert_eq!(v.drops.softnet_dropped, 0x99);
    assert_eq!(v.drops.softnet_time_squeeze, 1);
    assert_eq!(v.loadavg.map(|l| l.len()), Some(3));
    assert!(v.workers.is_none());
}

#[test]
fn frame_fits_80_columns_and_shows_every_section() {
    let v = view("frame");
    let lines = corelocal_top::render::frame(&v, "corelocal top  test", true);
    for l in &lines {
        assert!(
            l.chars().count() <= 80,
            "{} columns: {l:?}",
            l.chars().count()
        );
    }
    let text = lines.join("\n");
    for want in [
        "CPU   user%",
        "IFACE",
        "lo ",
        "listen overflows 5/s (10 total)",
        "softnet drops 153 total",
        "q: quit",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
}

#[test]
fn steering_columns_come_from_sysfs() {
    let dir = root(0, "steer");
    // The VM fixture's eth0: one RX queue, IRQ 38 (input.0) effective on CPU 1.
    std::fs::write(
        dir.join("proc/net/dev"),
        "Inter-|\n face |\n  eth0: 100 10 0 0 0 0 0 0 200 20 0 0 0 0 0 0\n",
    )
    .unwrap();
    let s = Sample::read(&Source {
        root: dir.clone(),
        server_stats: None,
        netns: None,
    });
    let st = &s.steer["eth0"];
    assert_eq!(st.rx_queues, 1);
    assert_eq!(st.rps, "", "rps_cpus 0: RPS off");
    assert!(!st.irq_cpus.is_empty(), "{st:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn workers_with_and_without_balancer_fields() {
    let dir = root(0, "workers");
    let stats = dir.join("stats.jsonl");
    let line0 = r#"{"workers":[{"worker":0,"cpu":0,"accepted":100,"accepted_local":99,"stolen":1,"open":3},{"worker":1,"cpu":1,"accepted":50,"accepted_local":50,"stolen":0,"open":1,"queue_len":7,"queue_cap":128,"busy":true}],"total":{}}"#;
    std::fs::write(&stats, format!("garbage\n{line0}\n")).unwrap();
    let src = Source {
        root: dir.clone(),
        server_stats: Some(stats.clone()),
        netns: None,
    };
    let a = Sample::read(&src);
    let line1 = line0.replace("\"accepted\":100", "\"accepted\":300");
    std::fs::write(&stats, format!("{line0}\n{line1}\n")).unwrap();
    let mut b = Sample::read(&src);
    b.at = a.at + Duration::from_secs(2);
    let v = View::between(&a, &b);
    let w = v.workers.as_ref().unwrap();
    assert_eq!(w[0].accepted_ps, Some(100.0));
    assert_eq!(w[0].now.queue_len, None);
    assert_eq!((w[1].now.queue_len, w[1].now.busy), (Some(7), Some(true)));
    let text = corelocal_top::render::frame(&v, "t", false).join("\n");
    assert!(text.contains("7/128") && text.contains("yes"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("0 ") && l.contains(" - ")),
        "{text}"
    );
    std::fs::write(&stats, "not json\n").unwrap();
    let bad = View::between(&b, &Sample::read(&src));
    assert!(bad.server_error.unwrap().contains("not JSON"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn binary_json_once_and_bad_flags() {
    let bin = env!("CARGO_BIN_EXE_corelocal-top");
    let dir = root(1, "bin");
    let out = std::process::Command::new(bin)
        .args(["--json", "--once", "--interval", "0.2", "--root"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cpus"].as_array().unwrap().len(), 2);
    assert_eq!(v["drops"]["listen_overflows"], 10);
    let plain = std::process::Command::new(bin)
        .args(["--once", "--interval", "0.2", "--root"])
        .arg(&dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&plain.stdout);
    assert!(text.contains("IFACE") && !text.contains('\x1b'), "{text}");
    for bad in [
        &["--interval", "0"][..],
        &["--bogus"],
        &["--root", "/nonexistent"],
    ] {
        let out = std::process::Command::new(bin).args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// `--netns`: the interfaces of a namespace, read from a thread that joins it and leaves;
/// the namespace can be deleted right after. Needs root (skips otherwise, not under CI=true).
#[test]
fn netns_interfaces_are_read_from_inside_the_namespace() {
    if !corelocal::testing::root_or_skip("netns_interfaces_are_read_from_inside_the_namespace") {
        return;
    }
    let ns = format!("cltop-{}", std::process::id());
    corelocal::testing::sh(&format!(
        "ip netns add {ns} && ip -n {ns} link add tq0 numrxqueues 2 type veth peer name tq1 && \
         ip -n {ns} link set tq0 up && ip -n {ns} link set tq1 up"
    ));
    let src = Source {
        root: PathBuf::from("/"),
        server_stats: None,
        netns: Some("cltop-*".into()),
    };
    let s = Sample::read(&src);
    corelocal::testing::sh(&format!("ip netns del {ns}"));
    assert_eq!(s.netns, Some(Ok(ns.clone())));
    let names: Vec<&str> = s.ifs.iter().map(|i| i.name.as_str()).collect();
    assert!(
        names.contains(&"tq0") && names.contains(&"tq1"),
        "{names:?}"
    );
    assert_eq!(s.steer["tq0"].rx_queues, 2, "sysfs of the namespace");
    let gone = Sample::read(&Source {
        netns: Some(ns.clone()),
        ..src
    });
    assert!(gone.ifs.is_empty());
    assert!(matches!(gone.netns, Some(Err(_))));
}
