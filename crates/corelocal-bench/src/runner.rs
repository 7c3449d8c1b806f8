//! Runs a workload: pinned client threads, the measurement window, snapshots of the server's
//! CPU and counters at the window's edges, the rate search, and the outputs.

use crate::engine::{ClientIo, Engine, OpenLoop, Plan, SockOpts, Unit};
use crate::options::{ArrivalKind, Dur, EngineKind, ProgressKind};
use crate::report::{self, Report};
pub use crate::runspec::{RunSpec, ScriptKind, Snapshots, ThreadResult};
use corelocal::cpu::CpuSet;
use corelocal::sys::client::{epoll::Epoll, uring::Uring};
use std::io::IsTerminal;
use std::net::{SocketAddrV4, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Per-run overrides (rate search probes).
#[derive(Debug, Clone, Copy, Default)]
pub struct Overrides {
    /// Open-loop rate.
    pub rate: Option<f64>,
    /// Run length.
    pub duration: Option<Dur>,
    /// Warm-up.
    pub warmup: Option<Dur>,
    /// No server snapshots, no progress.
    pub quiet: bool,
}

fn split(total: u64, parts: usize, i: usize) -> u64 {
    total / parts as u64 + u64::from((i as u64) < total % parts as u64)
}

fn run_thread(spec: &RunSpec, plan: Plan, cpu: usize) -> Result<ThreadResult, String> {
    if let Err(e) = corelocal::cpu::pin_current_thread(&CpuSet::single(cpu)) {
        return Err(format!("cannot pin a client thread to CPU {cpu}: {e}"));
    }
    let opts = SockOpts {
        target: spec.target,
        src: spec.src.clone().into(),
        linger0: spec.linger0,
        // One write per connection (crr) gains nothing from TCP_NODELAY: skip the syscall.
        nodelay: !spec.common.no_nodelay && spec.workload != "crr",
    };
    let slots = plan.slots;
    let recv = spec.common.recv_buf;
    fn go<B: ClientIo>(
        b: B,
        plan: Plan,
        cpu: usize,
        note: Option<String>,
    ) -> Result<ThreadResult, String> {
        let slots = plan.slots;
        let mut e = Engine::new(b, plan);
        e.run()
            .map_err(|err| format!("client engine on CPU {cpu}: {err}"))?;
        let engine = e.backend_name();
        Ok(ThreadResult {
            cpu,
            engine,
            conns: slots,
            stats: std::mem::take(&mut e.stats),
            note,
        })
    }
    match spec.common.engine {
        EngineKind::Epoll => go(
            Epoll::new(slots, recv, opts).map_err(|e| format!("epoll: {e}"))?,
            plan,
            cpu,
            None,
        ),
        EngineKind::Uring | EngineKind::UringFd => go(
            Uring::new(slots, recv, opts, spec.common.engine == EngineKind::Uring)
                .map_err(|e| format!("io_uring unavailable: {e}"))?,
            plan,
            cpu,
            None,
        ),
        EngineKind::Auto => match Uring::new(slots, recv, opts.clone(), true) {
            Ok(u) => go(u, plan, cpu, None),
            Err(e) => {
                let note = format!("io_uring unavailable ({e}); fell back to epoll");
                go(
                    Epoll::new(slots, recv, opts).map_err(|e| format!("epoll: {e}"))?,
                    plan,
                    cpu,
                    Some(note),
                )
            }
        },
    }
}

/// Checks that the target accepts connections (a clear error instead of a storm of them).
pub fn probe_target(target: SocketAddrV4) -> Result<(), String> {
    match TcpStream::connect_timeout(&target.into(), Duration::from_secs(2)) {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "--target: cannot connect to {target}: {e}; is the server running and listening there?"
        )),
    }
}

/// Runs once and builds the report.
pub fn run_once(spec: &RunSpec, ov: Overrides) -> Result<Report, String> {
    corelocal::sys::process::raise_nofile();
    let c = &spec.common;
    let cpus: Vec<usize> = c.cpus.iter().collect();
    let nthreads = cpus.len();
    let warmup = ov.warmup.or(c.warmup).unwrap_or(if c.requests.is_some() {
        Dur(0)
    } else {
        Dur(1_000_000_000)
    });
    let requests_mode = c.requests.is_some() && ov.duration.is_none();
    let duration = ov.duration.or(c.duration).unwrap_or(if requests_mode {
        Dur(300_000_000_000)
    } else {
        Dur(10_000_000_000)
    });
    let rate = ov.rate.or(c.rate);
    let origin = Instant::now();
    let warmup_end_ns = warmup.ns();
    let end_ns = warmup.ns() + duration.ns();
    let stop = Arc::new(AtomicBool::new(false));
    let counters: Vec<Arc<AtomicU64>> =
        (0..nthreads).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);

    let mut handles = Vec::new();
    for (t, &cpu) in cpus.iter().enumerate() {
        let plan = Plan {
            slots: split(spec.conns as u64, nthreads, t).max(1) as usize,
            unit: spec.unit,
            quota: if requests_mode {
                c.requests.map(|n| split(n, nthreads, t))
            } else {
                None
            },
            open_loop: rate.map(|r| OpenLoop {
                rate: r / nthreads as f64,
                exponential: c.arrivals == ArrivalKind::Exp,
            }),
            origin,
            warmup_end_ns,
            end_ns,
            timeout_ns: c.timeout.ns().max(1_000_000),
            seed: c.seed.wrapping_mul(1_000_003).wrapping_add(t as u64),
            script: spec.script(),
            src: spec.src.clone().into(),
            src_on_demand: spec.common.src == crate::options::SrcSpec::Auto,
            src_offset: t * spec.src.len().max(1) / nthreads,
            progress: counters[t].clone(),
            stop: stop.clone(),
        };
        let s = spec.clone();
        let h = std::thread::Builder::new()
            .name(format!("bench-cpu{cpu}"))
            .spawn(move || run_thread(&s, plan, cpu))
            .map_err(|e| format!("spawn: {e}"))?;
        handles.push(h);
    }

    let show = !ov.quiet
        && match c.progress {
            ProgressKind::Always => true,
            ProgressKind::Never => false,
            ProgressKind::Auto => std::io::stderr().is_terminal(),
        };
    let mut snap0 = None;
    let mut snap1 = None;
    let mut t_window_start = None;
    let mut t_window_end = None;
    let now_ns = || origin.elapsed().as_nanos() as u64;
    let total_done =
        |cs: &[Arc<AtomicU64>]| cs.iter().map(|x| x.load(Ordering::Relaxed)).sum::<u64>();
    let mut last_draw = 0u64;
    let mut last_units = 0u64;
    loop {
        let now = now_ns();
        let all_done = handles.iter().all(|h| h.is_finished());
        if snap0.is_none() && (now >= warmup_end_ns || all_done) {
            snap0 = Some(Snapshots::take(c, ov.quiet));
            t_window_start = Some(now);
        }
        if snap1.is_none() && ((!requests_mode && now >= end_ns) || all_done) {
            snap1 = Some(Snapshots::take(c, ov.quiet));
            t_window_end = Some(now);
        }
        if show && now >= last_draw + 200_000_000 {
            let units = total_done(&counters);
            let dt = (now - last_draw) as f64 / 1e9;
            let rate_now = if last_draw > 0 {
                (units - last_units) as f64 / dt
            } else {
                0.0
            };
            last_draw = now;
            last_units = units;
            report::draw_progress(
                now,
                warmup_end_ns,
                end_ns,
                units,
                c.requests.filter(|_| requests_mode),
                rate_now,
            );
        }
        if all_done {
            break;
        }
        std::thread::sleep(Duration::from_millis(if show { 50 } else { 10 }));
    }
    if show {
        report::clear_progress();
    }
    let mut results = Vec::new();
    for h in handles {
        results.push(
            h.join()
                .map_err(|_| "a client thread panicked".to_string())??,
        );
    }
    let ws = t_window_start.unwrap_or(warmup_end_ns);
    let we = t_window_end.unwrap_or_else(now_ns);
    let window_s = if requests_mode {
        (we.saturating_sub(ws)) as f64 / 1e9
    } else {
        duration.secs()
    };
    Ok(report::build(report::Inputs {
        spec,
        results,
        window_s: window_s.max(1e-9),
        warmup_s: warmup.secs(),
        rate,
        snap0: snap0.unwrap_or_default(),
        snap1: snap1.unwrap_or_default(),
        started_unix,
    }))
}

/// Runs the rate search probes; returns the search state.
pub fn rate_search(spec: &RunSpec) -> Result<crate::ratesearch::RateSearch, String> {
    let c = &spec.common;
    let mut s = crate::ratesearch::RateSearch::new(
        c.search_start,
        c.search_probes,
        c.search_p99.map(|d| d.ns() as f64 / 1000.0),
    );
    while let Some(r) = s.next_rate() {
        let ov = Overrides {
            rate: Some(r),
            duration: Some(c.search_duration),
            warmup: Some(Dur(500_000_000)),
            quiet: true,
        };
        let rep = run_once(spec, ov)?;
        let achieved = rep.throughput.units_per_s;
        let err_rate = rep.errors.rate;
        let p99 = rep.latency.corrected().map(|l| l.p99_us);
        let p = s.record(r, achieved, err_rate, p99);
        eprintln!(
            "rate search: offered {:.0}/s achieved {:.0}/s errors {:.2}% p99 {} -> {}",
            p.offered,
            p.achieved,
            p.error_rate * 100.0,
            p99.map_or("-".to_string(), |v| format!("{v:.0}us")),
            if p.ok { "ok" } else { "saturated" }
        );
        // Let TIME_WAIT and queues settle a little between probes.
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(s)
}

/// The whole command: probe, optional rate search, run, write outputs, exit code.
pub fn main(mut spec: RunSpec) -> Result<ExitCode, String> {
    probe_target(spec.target)?;
    let mut search = None;
    if spec.common.rate_search {
        let s = rate_search(&spec)?;
        let r = s
            .result()
            .ok_or("rate search found no rate the server sustains")?;
        eprintln!("rate search: saturating rate ≈ {r:.0}/s; running at it");
        spec.common.rate = Some(r);
        if spec.common.conns.is_none() && spec.unit == Unit::Session {
            // Open loop: room for a backlog of connections.
            spec.conns = 1000;
        }
        search = Some(s);
    }
    let mut rep = run_once(&spec, Overrides::default())?;
    rep.rate_search = search;
    let md = report::markdown(&rep);
    print!("{md}");
    report::write_outputs(&rep, &md, &spec.common)?;
    if rep.throughput.units == 0 {
        eprintln!("corelocal bench: no unit of work completed");
        return Ok(ExitCode::from(1));
    }
    if rep.errors.rate > spec.common.max_error_rate {
        eprintln!(
            "corelocal bench: error rate {:.2}% exceeds --max-error-rate {:.2}%",
            rep.errors.rate * 100.0,
            spec.common.max_error_rate * 100.0
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn split_is_exact() {
        for (n, p) in [(10u64, 3usize), (1, 2), (0, 4), (1001, 7)] {
            assert_eq!((0..p).map(|i| split(n, p, i)).sum::<u64>(), n);
        }
    }
}
