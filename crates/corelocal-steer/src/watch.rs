//! `steer watch`: keep the CPU → listener mapping right while the server changes.

use crate::apply::{self, Method, SteerError};
use crate::plan;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// A full discovery runs at least this often, even when no process changed (catches new
/// listeners opened by a running process, and workers that stopped or started polling one).
pub const FULL_SCAN_EVERY: Duration = Duration::from_secs(2);
/// After the processes changed, every tick runs a full discovery for this long.
pub const SETTLE: Duration = Duration::from_secs(1);

/// Wall-clock time of day (UTC) with milliseconds, for log lines.
pub fn clock() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let ms = secs % 1000;
    let s = secs / 1000;
    format!(
        "{:02}:{:02}:{:02}.{ms:03}",
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60
    )
}

/// Attaches, then re-scans every `interval` and re-syncs each group whose CPU → listener map
/// changed (reload, worker respawn, affinity change, new listeners), until `stop()` says so or
/// the server exits. Each tick lists `/proc` and reads the server's own processes' start times
/// and thread affinities ([`crate::discover::fingerprint`]); a full discovery (bounded, see
/// [`crate::discover`]) runs only when that changed, or every [`FULL_SCAN_EVERY`]. Maps are
/// written only when something changed, and every change is one log line.
pub fn watch(
    pid: u32,
    filters: &[String],
    method: Method,
    interval: Duration,
    stop: &dyn Fn() -> bool,
    log: &mut dyn FnMut(String),
) -> Result<(), SteerError> {
    // Per group: the CPU → cookie map last installed, or the refusal last logged.
    let mut applied: BTreeMap<SocketAddr, BTreeMap<usize, Vec<u64>>> = BTreeMap::new();
    let mut refused: BTreeMap<SocketAddr, String> = BTreeMap::new();
    let mut first = true;
    let mut cache = crate::discover::ParentCache::default();
    let mut last_print = None;
    let mut last_full = Instant::now();
    let mut settle_until = Instant::now();
    loop {
        if stop() {
            log("watch: stopping, leaving the steering in place".into());
            return Ok(());
        }
        if !std::path::Path::new(&format!("/proc/{}", pid)).exists() {
            log(format!("watch: pid {} exited; stopping", pid));
            return Ok(());
        }
        // Cheap check first: nothing about the processes changed and the last full scan is
        // recent → nothing to do this tick.
        let print = crate::discover::fingerprint(pid, &mut cache).ok();
        let changed = print != last_print;
        if changed {
            // New workers take a moment to open their epoll and register their listener:
            // keep scanning fully while they settle.
            settle_until = Instant::now() + SETTLE;
        }
        if !first
            && !changed
            && last_full.elapsed() < FULL_SCAN_EVERY
            && Instant::now() >= settle_until
        {
            std::thread::sleep(interval);
            continue;
        }
        last_print = print;
        last_full = Instant::now();
        let (plan, dups) = match apply::discover_cached(pid, filters, &mut cache) {
            Ok(x) => x,
            Err(e) if first => return Err(e),
            Err(e) => {
                log(format!("watch: scan failed ({e}); retrying"));
                std::thread::sleep(interval);
                continue;
            }
        };
        if first && plan.groups.is_empty() {
            return Err(SteerError(format!(
                "pid {}: no listening TCP socket (matching --listen) in its process tree",
                pid
            )));
        }
        for g in &plan.groups {
            if let Some(r) = &g.refusal {
                if first {
                    return Err(SteerError(format!(
                        "refused, nothing changed:\n  {}: {r}",
                        g.addr
                    )));
                }
                // While new workers settle (forked, not yet pinned or polling) a refusal is
                // expected and passes: say so only if it outlasts the settle period.
                if refused.get(&g.addr) != Some(r) && Instant::now() >= settle_until {
                    log(format!(
                        "{}: cannot steer now, leaving it as is: {r}",
                        g.addr
                    ));
                    refused.insert(g.addr, r.clone());
                }
                continue;
            }
            refused.remove(&g.addr);
            let want = apply::wanted_map(g);
            if applied.get(&g.addr) == Some(&want) {
                continue;
            }
            let one = plan::Plan {
                pid: plan.pid,
                groups: vec![g.clone()],
                held_progs: plan.held_progs.clone(),
            };
            match apply::attach(&one, &dups, method, false, log) {
                Ok(done) => {
                    let how = match done[0].prog_id {
                        Some(id) if done[0].updated => format!("program {id} updated"),
                        Some(id) => format!("program {id} attached"),
                        None => "SO_INCOMING_CPU set".to_string(),
                    };
                    let why = if applied.contains_key(&g.addr) {
                        "workers or listeners changed"
                    } else {
                        "steering"
                    };
                    log(format!(
                        "{}: {why}: {} ({how}, {} writes)",
                        g.addr,
                        crate::describe_map(g),
                        done[0].writes
                    ));
                    for n in &g.notes {
                        log(format!("{}: note: {n}", g.addr));
                    }
                    applied.insert(g.addr, want);
                }
                Err(e) if first => return Err(e),
                Err(e) => log(format!("{}: re-sync failed: {e}", g.addr)),
            }
        }
        drop(dups);
        first = false;
        std::thread::sleep(interval);
    }
}
