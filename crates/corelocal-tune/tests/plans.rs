//! Reading fixture hosts and planning on them, checked against hand-worked layouts.

mod common;

use common::{expect, values, Fixture};
use corelocal_tune::fixture::Kind;
use corelocal_tune::plan::{self, PlanOptions, Profile};
use corelocal_tune::state::{IrqRole, Probe};

#[test]
fn reads_the_vm_like_the_real_one() {
    let f = Fixture::new(Kind::Vm);
    let host = f.host(&[]);
    assert_eq!(host.online.to_list(), "0-1");
    assert!(host.smt_siblings.is_empty());
    assert_eq!(host.rps_sock_flow_entries, Some(0));
    assert_eq!(host.irqbalance_pid, None);
    // Only interfaces with a device by default: eth0, not lo.
    assert_eq!(host.nics.len(), 1);
    let eth0 = &host.nics[0];
    assert_eq!(eth0.name, "eth0");
    assert_eq!(eth0.driver.as_deref(), Some("virtio_net"));
    assert_eq!(eth0.numa_node, None, "numa_node -1 on the PCI function");
    assert_eq!((eth0.rx.len(), eth0.tx.len()), (1, 1));
    assert_eq!(
        eth0.tx[0].xps_cpus, None,
        "no readable xps_cpus on a 1-queue virtio NIC"
    );
    assert_eq!(
        eth0.rx[0].rps_cpus.as_ref().map(|s| s.to_list()),
        Some(String::new())
    );
    let irqs: Vec<(u32, IrqRole, String, String)> = eth0
        .irqs
        .iter()
        .map(|i| {
            let eff = i.effective_affinity.as_ref().unwrap().to_list();
            (
                i.irq,
                i.role,
                i.smp_affinity.as_ref().unwrap().to_list(),
                eff,
            )
        })
        .collect();
    assert_eq!(
        irqs,
        vec![
            (37, IrqRole::Other, "0-1".into(), "0".into()),
            (38, IrqRole::Rx(0), "0-1".into(), "1".into()),
            (39, IrqRole::Tx(0), "0-1".into(), "0".into()),
        ]
    );
    assert!(matches!(eth0.rss, Probe::NotQueried(_)));
    let lo = f.host(&["lo"]);
    assert_eq!(lo.nics[0].driver, None);
    assert!(lo.nics[0].irqs.is_empty());
}

#[test]
fn show_json_has_every_field() {
    let f = Fixture::new(Kind::TwoSocket);
    let v = serde_json::to_value(f.host(&[])).unwrap();
    let nic = &v["nics"][0];
    assert_eq!(nic["name"], "ens1f0");
    assert_eq!(nic["numa_node"], 1);
    assert_eq!(nic["irqs"][1]["role"]["kind"], "combined");
    assert_eq!(nic["irqs"][1]["smp_affinity"], "0-7");
    assert_eq!(nic["tx"][3]["xps_cpus"], "");
    assert_eq!(nic["rx"][0]["rps_flow_cnt"], 0);
    assert_eq!(nic["rss"]["status"], "not_queried");
    assert_eq!(v["smt_siblings"][0], "0,4");
    assert_eq!(v["numa_nodes"][1][1], "2-3,6-7");
}

#[test]
fn unknown_nic_is_a_clear_error() {
    let f = Fixture::new(Kind::Vm);
    let nics = vec!["eth9".to_string()];
    let err = corelocal_tune::state::read_host(&f.fs(), &f.topo(), &nics, &|_| {
        corelocal_tune::state::no_probe("x")
    })
    .unwrap_err();
    assert_eq!(err.exit_code(), std::process::ExitCode::from(2));
    assert!(err.to_string().contains("unknown NIC \"eth9\""), "{err}");
    assert!(err.to_string().contains("eth0, lo"), "{err}");
}

#[test]
fn vm_plans() {
    let f = Fixture::new(Kind::Vm);
    fn irq(cpu: &str) -> Vec<(&'static str, &str)> {
        vec![
            ("proc/irq/38/smp_affinity", cpu),
            ("proc/irq/39/smp_affinity", cpu),
        ]
    }
    let spread = f.plan(Profile::Spread, 0);
    assert_eq!(values(&spread), expect(&irq("0")));
    assert!(
        spread
            .notes
            .iter()
            .any(|n| n.contains("consider --profile rps")),
        "{:?}",
        spread.notes
    );
    assert!(spread.notes.iter().any(|n| n.contains("XPS not planned")));
    // Seed 002: keep a core for userland.
    let hk = f.plan(Profile::Spread, 1);
    assert_eq!(values(&hk), expect(&irq("1")));
    assert_eq!(hk.housekeeping_cpus.to_list(), "0");
    // One queue, two cores: RPS to the interrupting CPU's node.
    let mut want = irq("0");
    want.push(("sys/class/net/eth0/queues/rx-0/rps_cpus", "0-1"));
    assert_eq!(values(&f.plan(Profile::Rps, 0)), expect(&want));
    want.push(("sys/class/net/eth0/queues/rx-0/rps_flow_cnt", "32768"));
    want.push(("proc/sys/net/core/rps_sock_flow_entries", "32768"));
    assert_eq!(values(&f.plan(Profile::Rfs, 0)), expect(&want));
    let bulk = f.plan(Profile::Bulk, 0);
    let mut want = irq("0");
    want.push(("sys/class/net/eth0/queues/rx-0/rps_cpus", "(none)"));
    assert_eq!(values(&bulk), expect(&want));
    assert_eq!(bulk.app_cpus.unwrap().to_list(), "1");
}

const TXQ: &str = "sys/class/net/ens1f0/queues";

#[test]
fn two_socket_spread_puts_one_queue_per_physical_core_nic_node_first() {
    // CPUs 0-3 are the first threads (0,1 on socket 0; 2,3 on socket 1), 4-7 their SMT
    // siblings; the NIC is on node 1, so cores 2, 3 come first, then 0, 1.
    let f = Fixture::new(Kind::TwoSocket);
    let p = f.plan(Profile::Spread, 0);
    assert_eq!(p.network_cores, vec![2, 3, 0, 1]);
    let want = [
        ("proc/irq/51/smp_affinity", "2"),
        ("proc/irq/52/smp_affinity", "3"),
        ("proc/irq/53/smp_affinity", "0"),
        ("proc/irq/54/smp_affinity", "1"),
        // Every CPU on its own core's queue; SMT siblings follow their core.
        (&format!("{TXQ}/tx-0/xps_cpus"), "2,6"),
        (&format!("{TXQ}/tx-1/xps_cpus"), "3,7"),
        (&format!("{TXQ}/tx-2/xps_cpus"), "0,4"),
        (&format!("{TXQ}/tx-3/xps_cpus"), "1,5"),
    ];
    assert_eq!(values(&p), expect(&want));
    assert!(p.notes.is_empty(), "{:?}", p.notes);
}

#[test]
fn two_socket_housekeeping_frees_core_zero() {
    // Core 0 (CPUs 0 and 4) is kept for userland: 4 queues on 3 cores [2, 3, 1], queue 3
    // wraps to core 2. CPUs 0, 4 (no queue) use queue 2, whose core 1 shares their LLC;
    // tx-3 gets no CPU by the partition and falls back to its own IRQ CPU 2.
    let f = Fixture::new(Kind::TwoSocket);
    let p = f.plan(Profile::Spread, 1);
    assert_eq!(p.housekeeping_cpus.to_list(), "0,4");
    let want = [
        ("proc/irq/51/smp_affinity", "2"),
        ("proc/irq/52/smp_affinity", "3"),
        ("proc/irq/53/smp_affinity", "1"),
        ("proc/irq/54/smp_affinity", "2"),
        (&format!("{TXQ}/tx-0/xps_cpus"), "2,6"),
        (&format!("{TXQ}/tx-1/xps_cpus"), "3,7"),
        (&format!("{TXQ}/tx-2/xps_cpus"), "0-1,4-5"),
        (&format!("{TXQ}/tx-3/xps_cpus"), "2"),
    ];
    assert_eq!(values(&p), expect(&want));
    assert!(p.notes.iter().any(|n| n.contains("queues share cores")));
}

#[test]
fn two_socket_rps_rfs_and_bulk() {
    let f = Fixture::new(Kind::TwoSocket);
    let rfs = values(&f.plan(Profile::Rfs, 0));
    let rps_part: Vec<_> = rfs[8..12].to_vec();
    assert_eq!(
        rps_part,
        expect(&[
            (&format!("{TXQ}/rx-0/rps_cpus"), "2-3"),
            (&format!("{TXQ}/rx-1/rps_cpus"), "2-3"),
            (&format!("{TXQ}/rx-2/rps_cpus"), "0-1"),
            (&format!("{TXQ}/rx-3/rps_cpus"), "0-1"),
        ])
    );
    // 32768 entries / 4 queues.
    assert!(rfs[12..16]
        .iter()
        .all(|(p, v)| p.ends_with("rps_flow_cnt") && v == "8192"));
    assert_eq!(
        rfs[16],
        (
            "proc/sys/net/core/rps_sock_flow_entries".into(),
            "32768".into()
        )
    );
    // Seed 003: all queue IRQs on core 2 (NIC node), the application on core 3, same socket.
    let bulk = f.plan(Profile::Bulk, 0);
    assert_eq!(bulk.app_cpus.as_ref().unwrap().to_list(), "3");
    let v = values(&bulk);
    assert!(v[..4].iter().all(|(_, cpu)| cpu == "2"), "{v:?}");
    assert!(v[4..]
        .iter()
        .all(|(p, cpu)| p.ends_with("rps_cpus") && cpu == "(none)"));
}

#[test]
fn large_host_spread_and_rfs() {
    // 96 CPUs: 0-23 / 24-47 first threads of sockets 0 / 1, 48-95 their siblings; the NIC is
    // on node 1, so its 16 queues go to cores 24..39.
    let f = Fixture::new(Kind::Large);
    let p = f.plan(Profile::Spread, 0);
    let v = values(&p);
    for (q, pair) in v[..16].iter().enumerate() {
        let want = (
            format!("proc/irq/{}/smp_affinity", 101 + q),
            (24 + q).to_string(),
        );
        assert_eq!(*pair, want);
    }
    let q = "sys/class/net/ens2f0np0/queues";
    // tx-0: its core (24, 72), one leftover node-1 CPU by LLC round-robin (40), and node-0
    // CPUs by global round-robin (0, 16, 56).
    assert_eq!(
        v[16],
        (format!("{q}/tx-0/xps_cpus"), "0,16,24,40,56,72".into())
    );
    assert_eq!(
        v[31],
        (format!("{q}/tx-15/xps_cpus"), "15,39,55,71,87,95".into())
    );
    let rfs = values(&f.plan(Profile::Rfs, 0));
    assert_eq!(rfs[32], (format!("{q}/rx-0/rps_cpus"), "24-47".into()));
    assert!(
        rfs[48..64].iter().all(|(_, n)| n == "2048"),
        "scaling.rst: 32768 / 16"
    );
}

#[test]
fn planning_rejects_impossible_options() {
    let f = Fixture::new(Kind::Vm);
    let host = f.host(&[]);
    let opts = |profile, housekeeping, flow_entries| PlanOptions {
        profile,
        housekeeping,
        flow_entries,
    };
    let err = plan::plan(&f.topo(), &host, &opts(Profile::Spread, 2, 32768)).unwrap_err();
    assert!(
        err.to_string().contains("--housekeeping 2 leaves no core"),
        "{err}"
    );
    let err = plan::plan(&f.topo(), &host, &opts(Profile::Rfs, 0, 1000)).unwrap_err();
    assert!(err.to_string().contains("power of two"), "{err}");
}

#[test]
fn plans_survive_a_json_round_trip() {
    let f = Fixture::new(Kind::Large);
    let p = f.plan(Profile::Rfs, 2);
    let text = serde_json::to_string_pretty(&p).unwrap();
    assert!(text.contains(r#""path": "proc/irq/101/smp_affinity""#));
    let back: plan::Plan = serde_json::from_str(&text).unwrap();
    assert_eq!(back, p);
}
