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

use corelocal::runtime::{NetCounters, Snapshot, WorkerSnapshot};
use std::fmt::Write as _;

type Field = fn(&WorkerSnapshot) -> u64;

/// Per-worker metrics: (name, type, help, value).
const PER_WORKER: &[(&str, &str, &str, Field)] = &[
    (
        "corelocal_accepted_total",
        "counter",
        "Connections accepted by the worker.",
        |w| w.accepted,
    ),
    (
        "corelocal_accepted_local_total",
        "counter",
        "Accepted connections whose SYN was processed on the worker's CPU.",
        |w| w.accepted_local,
    ),
    (
        "corelocal_requests_total",
        "counter",
        "Requests completed.",
        |w| w.requests,
    ),
    (
        "corelocal_received_bytes_total",
        "counter",
        "Bytes received.",
        |w| w.bytes_in,
    ),
    (
        "corelocal_sent_bytes_total",
        "counter",
        "Bytes sent.",
        |w| w.bytes_out,
    ),
    (
        "corelocal_conn_limit_pauses_total",
        "counter",
        "Times accepting paused at the per-worker connection limit.",
        |w| w.conn_limit_pauses,
    ),
    (
        "corelocal_drain_accepted_total",
        "counter",
        "Connections taken from the accept queue after a graceful stop began.",
        |w| w.drain_accepted,
    ),
    (
        "corelocal_open_connections",
        "gauge",
        "Connections open now.",
        |w| w.open,
    ),
];

type NetField = fn(&NetCounters) -> u64;

/// The namespace's listen-path counters: (name, help, value).
const NET: &[(&str, &str, NetField)] = &[
    (
        "corelocal_net_listen_overflows_total",
        "Completed handshakes dropped on a full accept queue (TcpExt ListenOverflows) in the server's network namespace since it started.",
        |n| n.listen_overflows,
    ),
    (
        "corelocal_net_listen_drops_total",
        "SYNs and handshakes dropped at listeners (TcpExt ListenDrops) since the server started.",
        |n| n.listen_drops,
    ),
    (
        "corelocal_net_syncookies_sent_total",
        "SYN-ACKs answered with a SYN cookie (TcpExt SyncookiesSent) since the server started.",
        |n| n.syncookies_sent,
    ),
    (
        "corelocal_net_syncookies_recv_total",
        "Handshakes completed by a valid SYN cookie (TcpExt SyncookiesRecv) since the server started.",
        |n| n.syncookies_recv,
    ),
    (
        "corelocal_net_syncookies_failed_total",
        "ACKs with an invalid SYN cookie (TcpExt SyncookiesFailed) since the server started.",
        |n| n.syncookies_failed,
    ),
    (
        "corelocal_net_reqq_full_drop_total",
        "SYNs dropped on a full SYN queue without cookies (TcpExt TCPReqQFullDrop) since the server started.",
        |n| n.req_q_full_drop,
    ),
    (
        "corelocal_net_reqq_full_do_cookies_total",
        "SYNs answered with a cookie because a SYN queue was full (TcpExt TCPReqQFullDoCookies) since the server started.",
        |n| n.req_q_full_do_cookies,
    ),
];

/// Error kinds: (label, value).
const ERROR_KINDS: &[(&str, Field)] = &[
    ("bad_request", |w| w.errors.bad_request),
    ("too_large", |w| w.errors.too_large),
    ("idle_timeout", |w| w.errors.idle_timeout),
    ("io", |w| w.errors.io),
    ("accept", |w| w.errors.accept),
];

/// Escapes a Prometheus label value (backslash, double quote, newline).
fn escape(value: &str) -> String {
    let mut s = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// Formats `snap` in the Prometheus text format; `info` labels go on one `corelocal_info`
/// sample.
pub fn prometheus(snap: &Snapshot, info: &[(&str, String)]) -> String {
    let mut s = String::with_capacity(256 + snap.workers.len() * 1024);
    s.push_str("# HELP corelocal_info The server: application, backend, mode, steering.\n");
    s.push_str("# TYPE corelocal_info gauge\ncorelocal_info{");
    for (i, (k, v)) in info.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(s, "{sep}{k}=\"{}\"", escape(v));
    }
    s.push_str("} 1\n");
    s.push_str("# HELP corelocal_workers Worker threads.\n# TYPE corelocal_workers gauge\n");
    let _ = writeln!(s, "corelocal_workers {}", snap.workers.len());
    for (name, kind, help, field) in PER_WORKER {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for w in &snap.workers {
            let _ = writeln!(
                s,
                "{name}{{worker=\"{}\",cpu=\"{}\"}} {}",
                w.worker,
                w.cpu,
                field(w)
            );
        }
    }
    for (name, help, field) in NET {
        let _ = writeln!(
            s,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
            field(&snap.net)
        );
    }
    let name = "corelocal_errors_total";
    let _ = writeln!(
        s,
        "# HELP {name} Errors by kind (bad_request, too_large, idle_timeout, io, accept).\n# TYPE {name} counter"
    );
    for w in &snap.workers {
        for (kind, field) in ERROR_KINDS {
            let _ = writeln!(
                s,
                "{name}{{worker=\"{}\",cpu=\"{}\",kind=\"{kind}\"}} {}",
                w.worker,
                w.cpu,
                field(w)
            );
        }
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
}
