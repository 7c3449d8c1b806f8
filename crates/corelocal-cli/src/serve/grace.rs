//! memcached's graceful stop for `serve kv`: SIGUSR1 and `shutdown graceful` stop the server
//! as our SIGTERM does (requests in progress finish), and mark the stop graceful, so that
//! with `--memory-file` the cache is saved once the workers have stopped (memcached `-e`
//! saves only then: a SIGTERM or SIGINT stops without saving, as memcached's does).

use corelocal::sys::signal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Set once a graceful stop was asked for.
static GRACEFUL: AtomicBool = AtomicBool::new(false);

/// How often the SIGUSR1 flag is looked at (the signal handler may only set a flag).
const SIGUSR1_POLL: Duration = Duration::from_millis(100);

/// Marks the stop graceful and asks for it: a SIGTERM to this process.
pub(super) fn stop_gracefully() {
    GRACEFUL.store(true, Ordering::SeqCst);
    if let Err(e) = signal::terminate(std::process::id() as i32) {
        corelocal::log_line!("corelocal serve kv: graceful stop: {e}");
    }
}

/// Whether the stop was graceful ([`stop_gracefully`]).
pub(super) fn graceful() -> bool {
    GRACEFUL.load(Ordering::SeqCst)
}

/// Makes SIGUSR1 a graceful stop (its default action would kill the process), watched by a
/// thread that sleeps between looks.
pub(super) fn on_sigusr1() -> Result<(), String> {
    signal::flag_on(&[libc::SIGUSR1]).map_err(|e| format!("handling SIGUSR1: {e}"))?;
    std::thread::Builder::new()
        .name("kv-sigusr1".into())
        .spawn(|| loop {
            std::thread::sleep(SIGUSR1_POLL);
            if signal::raised(&[libc::SIGUSR1]) {
                corelocal::log_line!("corelocal serve kv: SIGUSR1, stopping gracefully");
                stop_gracefully();
                return;
            }
        })
        .map(drop)
        .map_err(|e| format!("starting the SIGUSR1 thread: {e}"))
}
