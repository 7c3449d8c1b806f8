//! The runtime's counters in the Prometheus text exposition format (version 0.0.4): one
//! sample per worker and counter, labelled `worker` and `cpu`, plus the network namespace's
//! listen-path counters. Pure formatting of a [`Snapshot`]; the CLI's `--metrics` endpoint and
//! `corelocal-tokio` serve it, so both use the same metric names.

use super::{NetCounters, Snapshot, WorkerSnapshot};
use std::fmt::Write as _;

/// Which metric families to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Families {
    /// Everything corelocal's runtime counts (`corelocal serve`).
    Runtime,
    /// Without the families only the runtime's balancer and I/O loop keep (stealing, flow-group
    /// migration, accept-queue samples, busy state, output back-pressure): for runtimes that
    /// count accepts, requests and errors only (`corelocal-tokio`).
    AcceptOnly,
}

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

type Field = fn(&WorkerSnapshot) -> u64;

/// Per-worker metrics: (name, type, help, value, kept by the runtime only).
const PER_WORKER: &[(&str, &str, &str, Field, bool)] = &[
    (
        "corelocal_accepted_total",
        "counter",
        "Connections accepted by the worker.",
        |w| w.accepted,
        false,
    ),
    (
        "corelocal_accepted_local_total",
        "counter",
        "Accepted connections whose SYN was processed on the worker's CPU.",
        |w| w.accepted_local,
        false,
    ),
    (
        "corelocal_stolen_total",
        "counter",
        "Accepted connections taken from another worker's listener.",
        |w| w.stolen,
        true,
    ),
    (
        "corelocal_requests_total",
        "counter",
        "Requests completed.",
        |w| w.requests,
        false,
    ),
    (
        "corelocal_received_bytes_total",
        "counter",
        "Bytes received.",
        |w| w.bytes_in,
        false,
    ),
    (
        "corelocal_sent_bytes_total",
        "counter",
        "Bytes sent.",
        |w| w.bytes_out,
        false,
    ),
    (
        "corelocal_migrated_flow_groups_total",
        "counter",
        "Flow groups migrated to the worker by the balancer.",
        |w| w.migrated_in,
        true,
    ),
    (
        "corelocal_migrated_out_flow_groups_total",
        "counter",
        "Flow groups migrated away from the worker.",
        |w| w.migrated_out,
        true,
    ),
    (
        "corelocal_busy_transitions_total",
        "counter",
        "Changes between busy and not busy.",
        |w| w.busy_transitions,
        true,
    ),
    (
        "corelocal_accept_queue_samples_total",
        "counter",
        "Accept-queue samples taken by the balancer.",
        |w| w.queue_samples,
        true,
    ),
    (
        "corelocal_accept_queue_length_sum",
        "counter",
        "Sum of the sampled accept-queue lengths (mean = sum / samples).",
        |w| w.queue_len_sum,
        true,
    ),
    (
        "corelocal_conn_limit_pauses_total",
        "counter",
        "Times accepting paused at the per-worker connection limit.",
        |w| w.conn_limit_pauses,
        false,
    ),
    (
        "corelocal_drain_accepted_total",
        "counter",
        "Connections taken from the accept queue after a graceful stop began.",
        |w| w.drain_accepted,
        false,
    ),
    (
        "corelocal_backpressure_pauses_total",
        "counter",
        "Times reading paused on a connection whose pending output hit the output limit.",
        |w| w.backpressure_pauses,
        true,
    ),
    (
        "corelocal_open_connections",
        "gauge",
        "Connections open now.",
        |w| w.open,
        false,
    ),
    (
        "corelocal_accept_queue_length",
        "gauge",
        "Accept-queue length at the last sample (0 when the balancer is off).",
        |w| w.queue_len,
        true,
    ),
    (
        "corelocal_accept_queue_capacity",
        "gauge",
        "Accept-queue cap at the last sample.",
        |w| w.queue_cap,
        true,
    ),
    (
        "corelocal_busy",
        "gauge",
        "1 when the balancer marked the worker busy at the last sample.",
        |w| u64::from(w.busy),
        true,
    ),
];

type NetField = fn(&NetCounters) -> u64;

/// The namespace's listen-path counters: (name, help, value); one sample each, no labels.
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

/// Formats `snap` in the Prometheus text format. `info` labels (e.g. app, backend, mode) go on
/// one `corelocal_info` sample.
pub fn prometheus(snap: &Snapshot, info: &[(&str, String)], families: Families) -> String {
    let all = families == Families::Runtime;
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
    for (name, kind, help, field, _) in PER_WORKER.iter().filter(|m| all || !m.4) {
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
    let name = "corelocal_stolen_from_total";
    if all {
        let _ = writeln!(
            s,
            "# HELP {name} Connections the worker stole, by victim worker.\n# TYPE {name} counter"
        );
    }
    for w in snap.workers.iter().filter(|_| all) {
        for (victim, n) in w.stolen_from.iter().enumerate() {
            let _ = writeln!(
                s,
                "{name}{{worker=\"{}\",cpu=\"{}\",victim=\"{victim}\"}} {n}",
                w.worker, w.cpu
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
    use crate::runtime::WorkerStats;

    #[test]
    fn accept_only_leaves_out_the_runtime_families() {
        let w = WorkerStats::new(2);
        w.accepted(true, true);
        w.stole_from(1);
        let snap = Snapshot::from_workers(vec![w.snapshot(0, 0)]);
        let all = prometheus(&snap, &[], Families::Runtime);
        let accept = prometheus(&snap, &[], Families::AcceptOnly);
        for name in [
            "corelocal_stolen_total",
            "corelocal_stolen_from_total",
            "corelocal_busy",
        ] {
            assert!(all.contains(&format!("# TYPE {name} ")), "{name} in {all}");
            assert!(!accept.contains(&format!("{name}{{")), "{name} in {accept}");
        }
        for text in [&all, &accept] {
            assert!(text.contains("corelocal_accepted_local_total{worker=\"0\",cpu=\"0\"} 1\n"));
            assert!(text.contains("corelocal_drain_accepted_total{worker=\"0\",cpu=\"0\"} 0\n"));
        }
    }
}
