//! `watch --metrics ADDR`: a Prometheus text endpoint. `GET /metrics` reads the steering
//! program's per-CPU counters at scrape time (by the program ids `watch` keeps in its
//! [`WatchState`]) and adds what `watch` did (attaches, re-syncs, target changes, failures).
//! One connection at a time, bounded request, 2 s timeouts.

use crate::discover;
use crate::watch::WatchState;
use corelocal::balance::BusyReason;
use corelocal::bpf::cpu_pick::{CpuPick, PickCounts};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Largest request read.
const REQUEST_MAX: usize = 8192;
/// Read and write timeout per scrape.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders the exposition text: `state`, plus each eBPF group's per-CPU counters
/// (`counts[group]`, read by the caller).
pub fn render(state: &WatchState, counts: &[(String, Vec<PickCounts>)]) -> String {
    let mut o = String::new();
    let family = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    family(
        &mut o,
        "corelocal_steer_syns_total",
        "counter",
        "SYNs seen by the steering program since it was attached, by group, CPU and outcome \
         (steered: to the worker pinned to that CPU; redirected: to another CPU's worker while \
         that CPU's were busy; no_worker, listener_gone: the kernel's hash).",
    );
    for (group, per_cpu) in counts {
        for (cpu, c) in per_cpu.iter().enumerate() {
            if *c == PickCounts::default() {
                continue;
            }
            for (outcome, v) in [
                ("steered", c.steered),
                ("redirected", c.redirected),
                ("no_worker", c.no_worker),
                ("listener_gone", c.listener_gone),
            ] {
                let _ = writeln!(
                    o,
                    "corelocal_steer_syns_total{{group=\"{}\",cpu=\"{cpu}\",outcome=\"{outcome}\"}} {v}",
                    label(group)
                );
            }
        }
    }
    family(
        &mut o,
        "corelocal_steer_steered_ratio",
        "gauge",
        "Share of the SYNs since attach that were steered (accepted on their CPU's worker).",
    );
    for (group, per_cpu) in counts {
        let steered: u64 = per_cpu.iter().map(|c| c.steered).sum();
        let total: u64 = steered
            + per_cpu
                .iter()
                .map(|c| c.fallback() + c.redirected)
                .sum::<u64>();
        if total > 0 {
            let _ = writeln!(
                o,
                "corelocal_steer_steered_ratio{{group=\"{}\"}} {}",
                label(group),
                steered as f64 / total as f64
            );
        }
    }
    family(
        &mut o,
        "corelocal_steer_group_info",
        "gauge",
        "One per group watched: how it is steered (ebpf, incoming-cpu, refused, foreign, failed).",
    );
    for (g, gs) in &state.groups {
        let _ = writeln!(
            o,
            "corelocal_steer_group_info{{group=\"{}\",method=\"{}\",prog_id=\"{}\"}} 1",
            label(g),
            label(&gs.method),
            gs.prog_id.map_or(String::new(), |i| i.to_string())
        );
    }
    family(
        &mut o,
        "corelocal_steer_listeners",
        "gauge",
        "Listeners in the group.",
    );
    for (g, gs) in &state.groups {
        let _ = writeln!(
            o,
            "corelocal_steer_listeners{{group=\"{}\"}} {}",
            label(g),
            gs.listeners
        );
    }
    family(
        &mut o,
        "corelocal_steer_cpus_mapped",
        "gauge",
        "CPUs with a worker pinned there (their SYNs are steered).",
    );
    for (g, gs) in &state.groups {
        let _ = writeln!(
            o,
            "corelocal_steer_cpus_mapped{{group=\"{}\"}} {}",
            label(g),
            gs.cpus_mapped
        );
    }
    render_balance(&mut o, state);
    family(
        &mut o,
        "corelocal_steer_server_pid",
        "gauge",
        "The server master followed now (0: none running).",
    );
    let _ = writeln!(o, "corelocal_steer_server_pid {}", state.pid.unwrap_or(0));
    for (name, help, v) in [
        (
            "corelocal_steer_attaches_total",
            "Fresh attachments (a new program, or SO_INCOMING_CPU set on new listeners).",
            state.attaches,
        ),
        (
            "corelocal_steer_resyncs_total",
            "Re-syncs of an attached group after the server changed (reload, respawn, taskset).",
            state.resyncs,
        ),
        (
            "corelocal_steer_target_changes_total",
            "Times the followed server process changed (binary upgrade, restart).",
            state.target_changes,
        ),
        (
            "corelocal_steer_failures_total",
            "Refusals and failures after start (each distinct one counted once).",
            state.failures,
        ),
    ] {
        family(&mut o, name, "counter", help);
        let _ = writeln!(o, "{name} {v}");
    }
    o
}

/// The balancer's families: busy workers, per reason; redirected CPUs.
fn render_balance(o: &mut String, state: &WatchState) {
    let family = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    family(
        o,
        "corelocal_steer_worker_busy",
        "gauge",
        "1 while the balancer holds the worker busy, by reason (queue: above the high \
         watermark; stalled: queue not drained; not_running: stopped, starved or blocked).",
    );
    for (g, gb) in &state.balance {
        for m in &gb.members {
            for reason in BusyReason::ALL {
                let r = reason.as_str();
                let _ = writeln!(
                    o,
                    "corelocal_steer_worker_busy{{group=\"{}\",cpu=\"{}\",pid=\"{}\",reason=\"{r}\"}} {}",
                    label(g),
                    m.cpu,
                    m.tid,
                    u8::from(m.busy == Some(r))
                );
            }
        }
    }
    family(
        o,
        "corelocal_steer_worker_busy_total",
        "counter",
        "Times the worker became busy, by reason.",
    );
    for (g, gb) in &state.balance {
        for m in &gb.members {
            for (r, v) in &m.busy_total {
                let _ = writeln!(
                    o,
                    "corelocal_steer_worker_busy_total{{group=\"{}\",cpu=\"{}\",pid=\"{}\",reason=\"{r}\"}} {v}",
                    label(g),
                    m.cpu,
                    m.tid
                );
            }
        }
    }
    family(
        o,
        "corelocal_steer_cpu_redirected",
        "gauge",
        "1 while the CPU's SYNs go to other CPUs' workers (its own are busy).",
    );
    for (g, gb) in &state.balance {
        for cpu in gb.redirected.keys() {
            let _ = writeln!(
                o,
                "corelocal_steer_cpu_redirected{{group=\"{}\",cpu=\"{cpu}\"}} 1",
                label(g)
            );
        }
    }
    family(
        o,
        "corelocal_steer_redirects_total",
        "counter",
        "Times a CPU's SYNs were sent to other CPUs' workers.",
    );
    for (g, gb) in &state.balance {
        let _ = writeln!(
            o,
            "corelocal_steer_redirects_total{{group=\"{}\"}} {}",
            label(g),
            gb.redirects_total
        );
    }
}

/// Reads the counters of every eBPF group in `state` (programs that went away are skipped).
pub fn read_counts(state: &WatchState) -> Vec<(String, Vec<PickCounts>)> {
    let cpus = discover::possible_cpus();
    state
        .groups
        .iter()
        .filter_map(|(g, gs)| {
            let pick = CpuPick::open(gs.prog_id?).ok()?;
            Some((g.clone(), pick.counts(cpus).ok()?))
        })
        .collect()
}

fn answer(mut conn: TcpStream, state: &Mutex<WatchState>) -> std::io::Result<()> {
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < REQUEST_MAX {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&req);
    let path = line.split_whitespace().nth(1).unwrap_or("");
    let (status, body, kind) = if path == "/metrics" || path == "/" {
        let snapshot = state.lock().expect("watch state").clone();
        let counts = read_counts(&snapshot);
        (
            "200 OK",
            render(&snapshot, &counts),
            "text/plain; version=0.0.4",
        )
    } else {
        ("404 Not Found", "not found\n".to_string(), "text/plain")
    };
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Binds `addr` and serves scrapes on a thread; returns the bound address.
pub fn serve(addr: &str, state: Arc<Mutex<WatchState>>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    std::thread::Builder::new()
        .name("steer-metrics".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                let _ = answer(conn, &state);
            }
        })?;
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::GroupState;

    #[test]
    fn exposition() {
        let mut st = WatchState {
            pid: Some(42),
            attaches: 1,
            resyncs: 2,
            ..Default::default()
        };
        st.groups.insert(
            "127.0.0.1:80".into(),
            GroupState {
                method: "ebpf".into(),
                prog_id: Some(7),
                listeners: 2,
                cpus_mapped: 2,
            },
        );
        st.balance.insert(
            "127.0.0.1:80".into(),
            crate::balance::GroupState {
                members: vec![crate::balance::MemberState {
                    cpu: 1,
                    pid: 43,
                    tid: 43,
                    busy: Some("not_running"),
                    busy_total: [("not_running", 3)].into_iter().collect(),
                    queue_len: 2,
                }],
                redirected: [(1, vec![0])].into_iter().collect(),
                redirects_total: 3,
            },
        );
        let counts = vec![(
            "127.0.0.1:80".to_string(),
            vec![
                PickCounts {
                    steered: 30,
                    ..Default::default()
                },
                PickCounts::default(),
                PickCounts {
                    steered: 9,
                    redirected: 2,
                    no_worker: 1,
                    listener_gone: 0,
                },
            ],
        )];
        let text = render(&st, &counts);
        assert!(text.contains(
            "corelocal_steer_syns_total{group=\"127.0.0.1:80\",cpu=\"0\",outcome=\"steered\"} 30"
        ));
        assert!(text.contains(
            "corelocal_steer_syns_total{group=\"127.0.0.1:80\",cpu=\"2\",outcome=\"no_worker\"} 1"
        ));
        assert!(
            !text.contains("syns_total{group=\"127.0.0.1:80\",cpu=\"1\""),
            "idle CPUs are left out"
        );
        assert!(text.contains(
            "corelocal_steer_syns_total{group=\"127.0.0.1:80\",cpu=\"2\",outcome=\"redirected\"} 2"
        ));
        assert!(text
            .contains("corelocal_steer_steered_ratio{group=\"127.0.0.1:80\"} 0.9285714285714286"));
        assert!(text.contains(
            "corelocal_steer_worker_busy{group=\"127.0.0.1:80\",cpu=\"1\",pid=\"43\",reason=\"not_running\"} 1"
        ));
        assert!(text.contains("corelocal_steer_cpu_redirected{group=\"127.0.0.1:80\",cpu=\"1\"} 1"));
        assert!(text.contains(
            "corelocal_steer_worker_busy_total{group=\"127.0.0.1:80\",cpu=\"1\",pid=\"43\",reason=\"not_running\"} 3"
        ));
        assert!(text.contains(
            "corelocal_steer_group_info{group=\"127.0.0.1:80\",method=\"ebpf\",prog_id=\"7\"} 1"
        ));
        assert!(text.contains("corelocal_steer_server_pid 42"));
        assert!(text.contains("corelocal_steer_resyncs_total 2"));
        // Every sample line belongs to a declared family.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let name = l.split(['{', ' ']).next().unwrap();
            assert!(text.contains(&format!("# TYPE {name} ")), "{l}");
        }
    }
}
