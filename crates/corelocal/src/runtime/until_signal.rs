//! [`Server::run_until_signal`]: a server's whole life in one call — termination signals
//! blocked before the workers start, a wait for SIGINT or SIGTERM, a graceful stop, the report
//! — and [`Server::wait_for_stop`], the wait itself, which `corelocal serve` uses with its own
//! checks between (stats lines, a successor taking the sockets over).

use super::handler::Service;
use super::server::{Server, ServerConfig, ShutdownReport};
use crate::sys::signal;
pub use crate::sys::signal::Termination;
use std::io;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the namespace's listen-path counters are sampled while serving (the report
/// carries the last sample; see [`Server::sample_net`]).
const NET_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// The longest [`Server::wait_for_stop`] sleeps between two looks at its workers: a worker
/// that ended on its own is seen within this, whatever `poll` the caller asked for.
const WORKER_LOOK_INTERVAL_MAX: Duration = Duration::from_secs(1);

/// Why [`Server::wait_for_stop`] returned. The server is still running in every case: the
/// caller stops it ([`Server::stop`]) or, after [`StopReason::Asked`], does what it asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// SIGINT or SIGTERM arrived (blocked beforehand with
    /// [`signal::block_termination_signals`], as [`Server::run_until_signal`] does).
    Signal(Termination),
    /// This worker's thread ended on its own (its loop failed or it panicked): the connections
    /// the kernel steers to its CPU would wait unanswered, so stop the server rather than serve
    /// on ([`Server::exited_worker`]).
    WorkerEnded(usize),
    /// The caller's `tick` returned [`ControlFlow::Break`].
    Asked,
}

impl Server {
    /// Starts `service` on `config`, calls `started` with the running server (to print its
    /// addresses, keep a [`Server::stats_reader`]), serves until SIGINT or SIGTERM, then stops
    /// gracefully ([`Server::stop`]: queued connections are served, requests in progress get
    /// up to the drain timeout) and returns how the stop went.
    ///
    /// SIGINT and SIGTERM are blocked in the calling thread before the workers start (they
    /// inherit the mask) and taken with `sigtimedwait`: no handler runs, none is lost. Call it
    /// from the main thread before starting threads of your own, or block the two signals in
    /// those threads too ([`signal::block_termination_signals`]): a thread that does not
    /// block them may take one, and its default action ends the process at once. They stay
    /// blocked in the calling thread on return.
    ///
    /// Errors: the start failed (the error's inner error is the [`ServerError`]:
    /// `e.get_ref().and_then(|e| e.downcast_ref::<ServerError>())`), the signals could not be
    /// blocked, or a worker failed (its error; the report is lost then).
    ///
    /// [`ServerError`]: super::ServerError
    ///
    /// ```no_run
    /// use corelocal::cpu::current_affinity;
    /// use corelocal::runtime::{ConnInfo, Handler, Output, Server, ServerConfig, Service, Step};
    /// use std::sync::Arc;
    /// use std::time::Instant;
    ///
    /// struct Echo;
    /// struct EchoConn;
    /// impl Service for Echo {
    ///     type Conn = EchoConn;
    ///     fn name(&self) -> &'static str {
    ///         "echo"
    ///     }
    ///     fn connect(&self, _info: &ConnInfo) -> EchoConn {
    ///         EchoConn
    ///     }
    /// }
    /// impl Handler for EchoConn {
    ///     fn on_input(&mut self, input: &[u8], out: &mut Output, _now: Instant) -> Step {
    ///         out.write(input);
    ///         Step::read(input.len(), 1)
    ///     }
    /// }
    ///
    /// fn main() -> std::io::Result<()> {
    ///     let config = ServerConfig::recommended(
    ///         vec!["127.0.0.1:7007".parse().unwrap()],
    ///         &current_affinity()?,
    ///     );
    ///     let report = Server::run_until_signal(config, Arc::new(Echo), |server| {
    ///         println!("echo: listening on {:?}", server.local_addrs());
    ///     })?;
    ///     println!("stopped: {} requests", report.stats.total.requests);
    ///     Ok(())
    /// }
    /// ```
    ///
    /// A worker that ends on its own (a panic in a handler, an error in its loop) stops the
    /// server too — the other workers drain — and returns that worker's error.
    pub fn run_until_signal<S: Service>(
        config: ServerConfig,
        service: Arc<S>,
        started: impl FnOnce(&Server),
    ) -> io::Result<ShutdownReport> {
        let name = service.name();
        signal::block_termination_signals()?;
        let drain_timeout = config.limits.drain_timeout;
        let server = Server::start(config, service).map_err(io::Error::other)?;
        started(&server);
        let reason = server.wait_for_stop(NET_SAMPLE_INTERVAL, |_| ControlFlow::Continue(()));
        match reason {
            StopReason::Signal(stop) => crate::log_line!(
                "corelocal {name}: signal {} from pid {}, stopping (requests in progress get up to {:?})",
                stop.signal,
                stop.sender,
                drain_timeout
            ),
            StopReason::WorkerEnded(worker) => crate::log_line!(
                "corelocal {name}: worker {worker} ended on its own, stopping the server"
            ),
            StopReason::Asked => unreachable!("the tick above never breaks"),
        }
        server.stop();
        let (result, report) = server.join_report();
        match (result, reason) {
            (Ok(()), StopReason::WorkerEnded(worker)) => Err(io::Error::other(format!(
                "worker {worker} ended on its own"
            ))),
            (result, _) => result.map(|()| report),
        }
    }

    /// Waits until SIGINT or SIGTERM arrives, a worker ends on its own, or `tick` breaks,
    /// and says which; the server keeps running. `tick` is called about every `poll` (for
    /// stats lines, or a condition of the caller's: `corelocal serve` looks there whether a
    /// successor took the sockets over); the namespace's listen-path counters are sampled every
    /// second ([`Server::sample_net`]). The two signals must be blocked in every thread
    /// beforehand ([`signal::block_termination_signals`] before [`Server::start`]), or the
    /// first one ends the process before this sees it.
    pub fn wait_for_stop(
        &self,
        poll: Duration,
        mut tick: impl FnMut(&Server) -> ControlFlow<()>,
    ) -> StopReason {
        let poll = poll.min(WORKER_LOOK_INTERVAL_MAX);
        let mut next_sample = Instant::now() + NET_SAMPLE_INTERVAL;
        loop {
            if let Some(stop) = signal::wait_termination_from(poll) {
                return StopReason::Signal(stop);
            }
            if let Some(worker) = self.exited_worker() {
                return StopReason::WorkerEnded(worker);
            }
            if Instant::now() >= next_sample {
                next_sample = Instant::now() + NET_SAMPLE_INTERVAL;
                self.sample_net();
            }
            if tick(self).is_break() {
                return StopReason::Asked;
            }
        }
    }
}
