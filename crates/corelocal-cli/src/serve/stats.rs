//! Stats while serving and at the stop: the wait for a signal or a handover (the library's
//! [`Server::wait_for_stop`], which also samples the listen-path counters) with per-worker
//! lines printed between (text or JSON, also to `--stats-file`), and the stop summary.

use super::common::CommonArgs;
use super::fail;
use corelocal::runtime::upgrade::UpgradeServer;
use corelocal::runtime::{Server, Snapshot, StopReason};
use corelocal::sys::signal;
use std::io::Write;
use std::ops::ControlFlow;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How often the main thread looks whether a successor took the sockets over.
const HANDOVER_POLL: Duration = Duration::from_millis(50);

/// Prints stats every `--stats-interval` (when not zero) while [`Server::wait_for_stop`] waits
/// for SIGINT/SIGTERM (returned) or a handover over the upgrade socket (`None`), looked at every
/// [`HANDOVER_POLL`]. A worker that ended on its own (a panic or an error in its loop) also
/// returns `None`, said on stderr: the server then stops and exits 1, for its supervisor to
/// start it again, rather than serve on with one CPU's connections queued where nothing
/// accepts them.
pub(super) fn wait_for_stop(
    common: &CommonArgs,
    server: &Server,
    upgrade: Option<&UpgradeServer>,
    mut stats_file: Option<&mut std::fs::File>,
) -> Option<signal::Termination> {
    let started = Instant::now();
    let mut last = server.stats();
    let tick = common.stats_interval;
    let mut next_tick = started + tick;
    let reason = server.wait_for_stop(HANDOVER_POLL, |server| {
        if upgrade.is_some_and(|u| u.handed_over()) {
            return ControlFlow::Break(());
        }
        if tick.is_zero() || Instant::now() < next_tick {
            return ControlFlow::Continue(());
        }
        next_tick = (next_tick + tick).max(Instant::now());
        server.sample_net();
        let now = server.stats();
        if let Some(f) = stats_file.as_mut() {
            let _ = writeln!(f, "{}", now.to_json());
        }
        print_stats(&now, &last, started.elapsed(), tick, common.json);
        last = now;
        ControlFlow::Continue(())
    });
    match reason {
        StopReason::Signal(stop) => Some(stop),
        StopReason::Asked => None,
        StopReason::WorkerEnded(worker) => {
            corelocal::log_line!(
                "corelocal serve: worker {worker} ended on its own (see above); stopping the \
                 server (exit status 1) so that its CPU's connections are not left unaccepted"
            );
            None
        }
    }
}

/// Waits for the workers and prints the stop summary.
pub(super) fn finish(
    name: &str,
    server: Server,
    stats_file: Option<&mut std::fs::File>,
) -> ExitCode {
    let (result, report) = server.join_report();
    if let Some(f) = stats_file {
        let _ = writeln!(f, "{}", report.stats.to_json());
    }
    if report.handed_over {
        corelocal::log_line!(
            "corelocal serve {name}: stopped | handed over | connections moved {} | accepted while draining {} | lost at close 0 (the successor holds the sockets and their queues){}",
            report.stats.total.moved,
            report.stats.total.drain_accepted,
            overload_summary(&report.stats),
        );
    } else {
        corelocal::log_line!(
            "corelocal serve {name}: stopped | connections moved {} | accepted while draining {} | new SYNs refused {} | migration {} | lost at close {}{}",
            report.stats.total.moved,
            report.stats.total.drain_accepted, report.refused_new_syns, report.migration, report.lost_at_close,
            overload_summary(&report.stats),
        );
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e.to_string()),
    }
}

/// The overload counters for the stop line: SYN cookies and listen drops of the namespace,
/// pauses at the connection limit and for output back-pressure.
fn overload_summary(s: &Snapshot) -> String {
    format!(
        " | syncookies sent {} recv {} | listen overflows {} drops {} | conn-limit pauses {} | backpressure pauses {}",
        s.net.syncookies_sent,
        s.net.syncookies_recv,
        s.net.listen_overflows,
        s.net.listen_drops,
        s.total.conn_limit_pauses,
        s.total.backpressure_pauses,
    )
}

pub(super) fn open_stats_file(common: &CommonArgs) -> Result<Option<std::fs::File>, String> {
    let Some(path) = &common.stats_file else {
        return Ok(None);
    };
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(Some)
        .map_err(|e| format!("--stats-file {}: cannot open it: {e}", path.display()))
}

fn print_stats(now: &Snapshot, last: &Snapshot, elapsed: Duration, tick: Duration, json: bool) {
    if json {
        println!("{}", now.to_json());
        return;
    }
    let secs = tick.as_secs_f64();
    let mut line = format!("t={:>5.1}s", elapsed.as_secs_f64());
    for (w, l) in now.workers.iter().zip(&last.workers) {
        let accepted = w.accepted - l.accepted;
        let local = w.accepted_local - l.accepted_local;
        let local_pct = if accepted == 0 {
            100.0
        } else {
            100.0 * local as f64 / accepted as f64
        };
        line += &format!(
            " | w{} cpu{} conn/s {:.0} local {:.1}% stolen {} q {}{} req/s {:.0} open {} err {}",
            w.worker,
            w.cpu,
            accepted as f64 / secs,
            local_pct,
            w.stolen - l.stolen,
            w.queue_len,
            if w.busy { " BUSY" } else { "" },
            (w.requests - l.requests) as f64 / secs,
            w.open,
            w.errors.total() - l.errors.total(),
        );
    }
    if !now.net.is_zero() {
        let (n, l) = (&now.net, &last.net);
        line += &format!(
            " | net syncookies +{} listen drops +{}",
            n.syncookies_sent - l.syncookies_sent.min(n.syncookies_sent),
            n.listen_drops - l.listen_drops.min(n.listen_drops),
        );
    }
    println!("{line}");
}
