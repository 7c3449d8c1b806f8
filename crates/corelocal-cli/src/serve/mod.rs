//! `corelocal serve`: run a server on the per-core runtime.
//!
//! Layout: this file holds [`serve`], which starts a service and runs it until a signal or a
//! handover, and its error exits; `args` holds the subcommand and each app's arguments,
//! `common` the options every server shares; `apps` turns each app's arguments into its
//! service and serves it ([`run`]); `config` builds the runtime's [`ServerConfig`]; `stats`
//! prints stats while serving and the stop summary; `upgrade` handles `--takeover` and
//! `--upgrade-socket`; `daemon` handles `--daemon` and `pidfile` `--pid-file`.

mod apps;
mod args;
mod common;
mod config;
mod daemon;
mod grace;
mod pidfile;
mod stats;
mod upgrade;

pub use apps::run;
pub use args::Command;
pub use common::CommonArgs;

use config::server_config;
use corelocal::runtime::upgrade::{resume, Handover, MoveFailure, UpgradeServer};
use corelocal::runtime::{Server, ServerConfig, Service};
use corelocal::sys::signal;
use stats::{finish, open_stats_file, wait_for_stop};
use std::process::ExitCode;
use std::sync::Arc;
use upgrade::{bind_upgrade_early, start_server, start_upgrade_socket, take_over, OldServer};

/// Starts `service`, prints stats until SIGINT/SIGTERM (or until a successor took the
/// listening sockets over the upgrade socket), then stops gracefully.
pub fn serve<S: Service>(common: &CommonArgs, service: Arc<S>) -> ExitCode {
    serve_with(common, service, |_| {})
}

/// [`serve`], telling `listening` the bound addresses once the server started.
pub fn serve_with<S: Service>(
    common: &CommonArgs,
    service: Arc<S>,
    listening: impl FnOnce(&[std::net::SocketAddr]),
) -> ExitCode {
    let name = service.name();
    let config = match server_config(common) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    if let Err(e) = signal::block_termination_signals() {
        return fail(&format!("blocking signals: {e}"));
    }
    // Opened before the workers start: once they accept, descriptors may run out (EMFILE).
    let mut stats_file = match open_stats_file(common) {
        Ok(f) => f,
        Err(e) => return fail(&e),
    };
    let old_server = match OldServer::check(common) {
        Ok(old) => old,
        Err(e) => return fail(&e),
    };
    if let Err(e) = pidfile::prepare(common) {
        return fail(&e);
    }
    let early_upgrade = match bind_upgrade_early(common) {
        Ok(l) => l,
        Err(e) => return fail(&e),
    };
    let (server, successor) = match start_server(common, &config, service.clone()) {
        Ok(started) => started,
        Err(e) => return fail(&e),
    };
    // Before the "listening on" line: whoever waits for it may ask for the addresses at once.
    listening(&server.local_addrs());
    print_listening(name, &config, &server);
    let metrics = crate::metrics::start_for(common.metrics, &server, name, &config);
    // The pid file names this process before the old server hears from it (it exits only
    // after that, and leaves a file that no longer holds its id).
    let taken = metrics
        .and_then(|m| pidfile::commit().map(|()| m))
        .and_then(|m| {
            take_over(&server, successor, old_server, common.takeover_timeout).map(|()| m)
        });
    let mut metrics = match taken {
        Ok(m) => m,
        Err(e) => {
            pidfile::revert();
            return abandon(server, &e);
        }
    };
    daemon::ready();
    let (mut server, mut early_upgrade) = (server, early_upgrade);
    loop {
        let upgrade = start_upgrade_socket(common, &server, early_upgrade.take());
        let stop = wait_for_stop(common, &server, upgrade.as_ref(), stats_file.as_mut());
        let failure = match stop_or_move(name, common, &server, upgrade, stop) {
            Some(failure) => failure,
            None => return finish(name, server, stats_file.as_mut()),
        };
        corelocal::log_line!(
            "corelocal serve {name}: the successor failed while moving ({failure}); serving on"
        );
        drop(metrics.take());
        server = match resume(server, config.clone(), service.clone(), failure) {
            Ok((s, _old)) => s,
            Err(e) => return fail(&format!("serving on after the failed move: {e}")),
        };
        corelocal::log_line!(
            "corelocal serve {name}: serving again on the same sockets ({} connections taken back)",
            server.taken_conns()
        );
        pidfile::rewrite();
        metrics =
            crate::metrics::start_for(common.metrics, &server, name, &config).unwrap_or_else(|e| {
                corelocal::log_line!("corelocal serve {name}: {e}; serving without metrics");
                None
            });
    }
}

/// After the wait: a successor took the sockets over the upgrade socket, or a SIGTERM came
/// (from a `--takeover PID` successor, which takes the connections, or from anyone else:
/// stop), or SIGINT (stop). The workers are stopping on return; `Some` when a successor
/// failed while the connections moved (this process must serve on).
fn stop_or_move(
    name: &str,
    common: &CommonArgs,
    server: &Server,
    upgrade: Option<UpgradeServer>,
    stop: Option<signal::Termination>,
) -> Option<MoveFailure> {
    let handover = upgrade.map_or(Handover::Kept, UpgradeServer::shutdown);
    let moved = match (handover, stop) {
        (Handover::Failed(failure), _) => return Some(failure),
        (Handover::Moved(_), _) => {
            corelocal::log_line!(
                "corelocal serve {name}: listening sockets handed over, draining (up to {:?})",
                common.drain_timeout
            );
            return None;
        }
        (Handover::Kept, Some(stop)) => {
            corelocal::log_line!(
                "corelocal serve {name}: signal {} from pid {}, draining (up to {:?})",
                stop.signal,
                stop.sender,
                common.drain_timeout
            );
            (stop.signal == libc::SIGTERM)
                .then(|| upgrade::move_to_successor(server, stop.sender, common.takeover_timeout))
                .flatten()
        }
        (Handover::Kept, None) => None,
    };
    match moved {
        Some(Err(failure)) => Some(failure),
        Some(Ok(_)) => None,
        None => {
            server.stop();
            None
        }
    }
}

fn print_listening(name: &str, config: &ServerConfig, server: &Server) {
    let addrs: Vec<String> = server.local_addrs().iter().map(|a| a.to_string()).collect();
    corelocal::log_line!(
        "corelocal serve {name}: listening on {} | workers on CPUs {} | mode {} | steering {} | backend {} | balancer {}",
        addrs.join(", "),
        config.listen.worker_cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","),
        config.listen.mode,
        server.steering(),
        server.backend(),
        if config.balance.is_some() { "on" } else { "off" },
    );
}

/// Gives up after the server started ([`Server::abandon`]: after a socket takeover without
/// disturbing the sockets the old server still serves from).
fn abandon(server: Server, message: &str) -> ExitCode {
    server.abandon();
    fail(message)
}

fn fail(message: &str) -> ExitCode {
    corelocal::log_line!("corelocal serve: {message}");
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests;
