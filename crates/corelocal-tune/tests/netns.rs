//! A real run: apply → verify → revert of rps_cpus / xps_cpus / rps_flow_cnt on a 4-queue
//! veth inside a private network namespace (never the host's interfaces).
//!
//! The parent test creates the namespace and the veth with `ip`, then re-runs this test binary
//! under `ip netns exec` (which also remounts /sys, so /sys/class/net shows the namespace's
//! devices) to run [`netns_child`]. The namespace is deleted on every exit path. Needs root:
//! skipped with a reason otherwise, except under `CI=true`, where it fails.

mod common;

use corelocal::cpu::Topology;
use corelocal_tune::apply::{self, ApplyOptions, OnError};
use corelocal_tune::fs::{Fs, RootFs};
use corelocal_tune::knob::Knob;
use corelocal_tune::plan::{self, PlanOptions, Profile};
use corelocal_tune::verify;
use std::collections::BTreeMap;
use std::process::Command;

const CHILD_ENV: &str = "CORELOCAL_TUNE_NETNS_CHILD";
const VETH: &str = "tunev0";

/// Skips with `reason`, or fails under CI=true where root tests must run.
fn skip_or_fail(reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true: this test must run, but {reason}");
    }
    eprintln!("skipping veth netns test: {reason}");
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Deletes the namespace (and with it the veth pair) when dropped, even on panic.
struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.0]);
    }
}

#[test]
fn veth_in_private_netns_round_trip() {
    if !corelocal::sys::process::is_root() {
        return skip_or_fail("it needs root (ip netns add, writes to the veth's sysfs)");
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return skip_or_fail("the ip command (iproute2) is missing");
    }
    let ns = Netns(format!("corelocal-tune-{}", std::process::id()));
    ip(&["netns", "add", &ns.0]).unwrap();
    ip(&[
        "-n",
        &ns.0,
        "link",
        "add",
        VETH,
        "numrxqueues",
        "4",
        "numtxqueues",
        "4",
        "type",
        "veth",
        "peer",
        "name",
        "tunev1",
        "numrxqueues",
        "4",
        "numtxqueues",
        "4",
    ])
    .unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.0])
        .arg(exe)
        .args(["--exact", "netns_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, VETH)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains("netns child: round trip ok"),
        "the child did not run:\n{text}"
    );
}

fn knob_files(fs: &RootFs, nic: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for q in fs.list(&format!("sys/class/net/{nic}/queues")).unwrap() {
        for file in ["rps_cpus", "rps_flow_cnt", "xps_cpus"] {
            let rel = format!("sys/class/net/{nic}/queues/{q}/{file}");
            if let Ok(text) = fs.read(&rel) {
                out.insert(rel, text);
            }
        }
    }
    out
}

/// Runs only under `ip netns exec` from the test above.
#[test]
fn netns_child() {
    let Ok(nic) = std::env::var(CHILD_ENV) else {
        return;
    };
    let fs = RootFs::new("/");
    // Refuse to touch anything unless this really is the private namespace.
    assert!(
        fs.exists(&format!("sys/class/net/{nic}")),
        "no {nic}: not in the test netns"
    );
    for host_if in fs.list("sys/class/net").unwrap() {
        assert!(
            ["lo", "tunev0", "tunev1"].contains(&host_if.as_str()),
            "host interface {host_if} visible: refusing"
        );
    }
    let topo = Topology::host().unwrap();
    let host = corelocal_tune::read_host(&fs, &topo, std::slice::from_ref(&nic)).unwrap();
    println!("{}", corelocal_tune::render::show(&host));
    assert_eq!((host.nics[0].rx.len(), host.nics[0].tx.len()), (4, 4));
    let opts = PlanOptions {
        profile: Profile::Rfs,
        housekeeping: 0,
        flow_entries: 32768,
    };
    let mut plan = plan::plan(&topo, &host, &opts).unwrap();
    // rps_sock_flow_entries is global, not per namespace: leave the host's alone.
    plan.settings.retain(|s| s.knob != Knob::SockFlowEntries);
    let prefix = format!("sys/class/net/{nic}/");
    assert!(plan
        .settings
        .iter()
        .all(|s| s.knob.path().starts_with(&prefix)));
    assert_eq!(
        plan.settings.len(),
        12,
        "4 × rps_cpus, xps_cpus, rps_flow_cnt"
    );
    println!("{}", corelocal_tune::render::plan(&plan));
    round_trip(&fs, &topo, &plan, &nic);
    println!("netns child: round trip ok");
}

fn round_trip(fs: &RootFs, topo: &Topology, plan: &plan::Plan, nic: &str) {
    let before = knob_files(fs, nic);
    let dir = common::TempDir::new("netns");
    let snap = dir.path("snap.json");
    let o = ApplyOptions {
        yes: true,
        force: false,
        on_error: OnError::Rollback,
    };
    let report = apply::apply(fs, &topo.online, plan, &o, &snap).unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let rows = verify::verify(fs, plan).unwrap();
    print!("{}", verify::render_table(&rows));
    assert!(rows.iter().all(|r| r.status == "ok"));
    let during = knob_files(fs, nic);
    assert_ne!(during, before);
    let flow = format!("sys/class/net/{nic}/queues/rx-0/rps_flow_cnt");
    assert_eq!(during[&flow], "8192\n", "32768 / 4 queues");
    let snapshot: apply::Snapshot = corelocal_tune::load_json(&snap, "snapshot").unwrap();
    let back = apply::revert(fs, &snapshot).unwrap();
    assert!(
        back.failures.is_empty() && back.mismatches.is_empty(),
        "{back:?}"
    );
    assert_eq!(
        knob_files(fs, nic),
        before,
        "every value restored byte for byte"
    );
}
