//! Prometheus text (exposition format 0.0.4) with the metric names of corelocal's runtime
//! (`corelocal serve … --metrics`): per worker, labelled `worker` and `cpu`.
//!
//! The counters a tokio worker keeps: `corelocal_accepted_total`,
//! `corelocal_accepted_local_total` (the SYN was processed on the worker's CPU),
//! `corelocal_requests_total`, `corelocal_received_bytes_total`, `corelocal_sent_bytes_total`,
//! `corelocal_conn_limit_pauses_total`, `corelocal_drain_accepted_total`,
//! `corelocal_open_connections`, `corelocal_errors_total{kind}`; and the network namespace's
//! listen-path counters `corelocal_net_*_total`. With the balancer on
//! ([`Builder::balance`](crate::Builder::balance)) also the runtime's `corelocal_stolen_total`,
//! `corelocal_stolen_from_total{victim}`, `corelocal_busy`, `corelocal_busy_transitions_total`,
//! `corelocal_accept_queue_length` and `corelocal_accept_queue_capacity`, and this crate's
//! `corelocal_busy_entered_total{reason}` (queue, stalled, not_running) and
//! `corelocal_redirects_total` (times the worker's CPU had its SYNs sent to other workers).
//! The runtime's flow-group and I/O-loop metrics have no meaning here and are left out.

use crate::balance::BalanceSnapshot;
use corelocal::balance::BusyReason;
use corelocal::runtime::prometheus::Families;
use corelocal::runtime::{Snapshot, WorkerSnapshot};
use std::fmt::Write as _;

/// Formats `snap` in the Prometheus text format; `info` labels go on one `corelocal_info`
/// sample. The runtime's formatter, without the balancer and I/O-loop families.
pub fn prometheus(snap: &Snapshot, info: &[(&str, String)]) -> String {
    corelocal::runtime::prometheus::prometheus(snap, info, Families::AcceptOnly)
}

type Field = fn(&WorkerSnapshot) -> u64;

/// The runtime's balancer families that mean the same here: (name, type, help, value).
const BALANCED: &[(&str, &str, &str, Field)] = &[
    (
        "corelocal_stolen_total",
        "counter",
        "Accepted connections taken from another worker's listener.",
        |w| w.stolen,
    ),
    (
        "corelocal_busy_transitions_total",
        "counter",
        "Changes between busy and not busy.",
        |w| w.busy_transitions,
    ),
    (
        "corelocal_busy",
        "gauge",
        "1 when the balancer marked the worker busy at the last sample.",
        |w| u64::from(w.busy),
    ),
    (
        "corelocal_accept_queue_length",
        "gauge",
        "Accept-queue length at the last sample.",
        |w| w.queue_len,
    ),
    (
        "corelocal_accept_queue_capacity",
        "gauge",
        "Accept-queue cap at the last sample.",
        |w| w.queue_cap,
    ),
];

/// [`prometheus`], plus the balancer's families when it runs (see the module docs).
pub fn prometheus_balanced(
    snap: &Snapshot,
    balance: &BalanceSnapshot,
    info: &[(&str, String)],
) -> String {
    let mut s = prometheus(snap, info);
    if !balance.enabled {
        return s;
    }
    let label = |w: &WorkerSnapshot| format!("worker=\"{}\",cpu=\"{}\"", w.worker, w.cpu);
    for (name, kind, help, field) in BALANCED {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for w in &snap.workers {
            let _ = writeln!(s, "{name}{{{}}} {}", label(w), field(w));
        }
    }
    let name = "corelocal_stolen_from_total";
    let _ = writeln!(
        s,
        "# HELP {name} Connections the worker stole, by victim worker.\n# TYPE {name} counter"
    );
    for w in &snap.workers {
        for (victim, n) in w.stolen_from.iter().enumerate() {
            let _ = writeln!(s, "{name}{{{},victim=\"{victim}\"}} {n}", label(w));
        }
    }
    let name = "corelocal_busy_entered_total";
    let _ = writeln!(
        s,
        "# HELP {name} Times the worker became busy (or changed reason while busy), by reason.\n# TYPE {name} counter"
    );
    for w in &balance.workers {
        for r in BusyReason::ALL {
            let _ = writeln!(
                s,
                "{name}{{worker=\"{}\",cpu=\"{}\",reason=\"{}\"}} {}",
                w.worker,
                w.cpu,
                r.as_str(),
                w.busy[r.index()]
            );
        }
    }
    let name = "corelocal_redirects_total";
    let _ = writeln!(
        s,
        "# HELP {name} Times the worker's CPU had its new connections sent to other workers while it was busy.\n# TYPE {name} counter"
    );
    for w in &balance.workers {
        let _ = writeln!(
            s,
            "{name}{{worker=\"{}\",cpu=\"{}\"}} {}",
            w.worker, w.cpu, w.redirects
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use corelocal::runtime::WorkerStats;

    #[test]
    fn names_and_labels_match_the_runtime() {
        let a = WorkerStats::new(2);
        a.accepted(true, false);
        a.accepted(false, false);
        a.requests(5);
        let b = WorkerStats::new(2);
        b.accepted(true, false);
        let snap = Snapshot::from_workers(vec![a.snapshot(0, 3), b.snapshot(1, 7)]);
        let text = prometheus(&snap, &[("mode", "local".into()), ("x", "a\"b".into())]);
        assert!(text.contains("corelocal_info{mode=\"local\",x=\"a\\\"b\"} 1\n"));
        assert!(text.contains("corelocal_workers 2\n"));
        assert!(text.contains("corelocal_accepted_total{worker=\"0\",cpu=\"3\"} 2\n"));
        assert!(text.contains("corelocal_accepted_local_total{worker=\"0\",cpu=\"3\"} 1\n"));
        assert!(text.contains("corelocal_accepted_local_total{worker=\"1\",cpu=\"7\"} 1\n"));
        assert!(text.contains("corelocal_requests_total{worker=\"0\",cpu=\"3\"} 5\n"));
        assert!(text.contains("corelocal_open_connections{worker=\"0\",cpu=\"3\"} 2\n"));
        assert!(text.contains("corelocal_errors_total{worker=\"1\",cpu=\"7\",kind=\"io\"} 0\n"));
        assert!(text.contains("# TYPE corelocal_net_listen_overflows_total counter\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, value) = line.rsplit_once(' ').expect("sample has a value");
            value.parse::<u64>().expect("numeric value");
        }
    }

    #[test]
    fn balancer_families_only_when_it_runs() {
        let a = WorkerStats::new(2);
        a.accepted(false, true);
        a.stole_from(1);
        a.queue(3, 128, false);
        let b = WorkerStats::new(2);
        b.queue(7, 128, true);
        b.busy_transition();
        let snap = Snapshot::from_workers(vec![a.snapshot(0, 0), b.snapshot(1, 1)]);
        let off = prometheus_balanced(&snap, &BalanceSnapshot::default(), &[]);
        assert_eq!(off, prometheus(&snap, &[]));
        assert!(!off.contains("corelocal_stolen_total"));
        let mut on = BalanceSnapshot {
            enabled: true,
            redirect: true,
            workers: vec![Default::default(), Default::default()],
        };
        on.workers[1].worker = 1;
        on.workers[1].cpu = 1;
        on.workers[1].busy[BusyReason::NotRunning.index()] = 2;
        on.workers[1].redirects = 1;
        let text = prometheus_balanced(&snap, &on, &[]);
        assert!(text.contains("corelocal_stolen_total{worker=\"0\",cpu=\"0\"} 1\n"));
        assert!(
            text.contains("corelocal_stolen_from_total{worker=\"0\",cpu=\"0\",victim=\"1\"} 1\n")
        );
        assert!(text.contains("corelocal_busy{worker=\"1\",cpu=\"1\"} 1\n"));
        assert!(text.contains("corelocal_busy_transitions_total{worker=\"1\",cpu=\"1\"} 1\n"));
        assert!(text.contains("corelocal_accept_queue_length{worker=\"1\",cpu=\"1\"} 7\n"));
        assert!(text.contains(
            "corelocal_busy_entered_total{worker=\"1\",cpu=\"1\",reason=\"not_running\"} 2\n"
        ));
        assert!(text
            .contains("corelocal_busy_entered_total{worker=\"0\",cpu=\"0\",reason=\"queue\"} 0\n"));
        assert!(text.contains("corelocal_redirects_total{worker=\"1\",cpu=\"1\"} 1\n"));
        // One HELP and TYPE per family.
        assert_eq!(text.matches("# TYPE corelocal_stolen_total ").count(), 1);
    }
}
