//! [`Server::run_until_signal`]: a server's whole life in one call, as `corelocal serve` runs
//! it — termination signals blocked before the workers start, a wait for SIGINT or SIGTERM, a
//! graceful stop, the report.

use super::handler::Service;
use super::server::{Server, ServerConfig, ShutdownReport};
use crate::sys::signal;
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// How often the namespace's listen-path counters are sampled while serving (the report
/// carries the last sample; see [`Server::sample_net`]).
const NET_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

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
        let stop = loop {
            if let Some(stop) = signal::wait_termination_from(NET_SAMPLE_INTERVAL) {
                break stop;
            }
            server.sample_net();
        };
        crate::log_line!(
            "corelocal {name}: signal {} from pid {}, stopping (requests in progress get up to {:?})",
            stop.signal,
            stop.sender,
            drain_timeout
        );
        server.stop();
        let (result, report) = server.join_report();
        result.map(|()| report)
    }
}
