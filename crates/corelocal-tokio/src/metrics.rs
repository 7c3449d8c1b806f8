//! Prometheus text (exposition format 0.0.4) with the metric names of corelocal's runtime
//! (`corelocal serve … --metrics`): per worker, labelled `worker` and `cpu`.
//!
//! The counters a tokio worker keeps: `corelocal_accepted_total`,
//! `corelocal_accepted_local_total` (the SYN was processed on the worker's CPU),
//! `corelocal_requests_total`, `corelocal_received_bytes_total`, `corelocal_sent_bytes_total`,
//! `corelocal_conn_limit_pauses_total`, `corelocal_drain_accepted_total`,
//! `corelocal_open_connections`, `corelocal_errors_total{kind}`; and the network namespace's
//! listen-path counters `corelocal_net_*_total`. The runtime's balancer and batching metrics
//! (stolen, queue samples, busy) have no meaning here and are left out.

use corelocal::runtime::prometheus::Families;
use corelocal::runtime::Snapshot;

/// Formats `snap` in the Prometheus text format; `info` labels go on one `corelocal_info`
/// sample. The runtime's formatter, without the balancer and I/O-loop families.
pub fn prometheus(snap: &Snapshot, info: &[(&str, String)]) -> String {
    corelocal::runtime::prometheus::prometheus(snap, info, Families::AcceptOnly)
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
}
