//! [`Server`]: binds the listener group, starts one pinned current-thread runtime per CPU,
//! stops without losing a queued connection.

use crate::balance::{self, BalanceSnapshot};
use crate::worker::{self, WorkerCtx, WorkerInfo, WorkerSetup, DRAIN_QUIESCE};
use corelocal::cpu::{current_affinity, CpuSet};
use corelocal::listen::{ActiveSteering, GroupConfig, ListenError, ListenerGroup, Mode, Steering};
use corelocal::runtime::{ShutdownReport, Snapshot, StatsReader, WorkerStats};
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::watch;

/// Why a server could not be built, started or stopped.
#[derive(Debug)]
pub enum Error {
    /// The configuration is unusable.
    Config(String),
    /// Binding the listener group failed.
    Listen(ListenError),
    /// A system call failed.
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: io::Error,
    },
    /// A worker failed to start, returned an error or panicked.
    Worker {
        /// The worker's index.
        worker: usize,
        /// What happened.
        source: io::Error,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(m) => write!(f, "corelocal-tokio: {m}"),
            Error::Listen(e) => write!(f, "corelocal-tokio: {e}"),
            Error::Io { context, source } => write!(f, "corelocal-tokio: {context}: {source}"),
            Error::Worker { worker, source } => {
                write!(f, "corelocal-tokio: worker {worker}: {source}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Config(_) => None,
            Error::Listen(e) => Some(e),
            Error::Io { source, .. } | Error::Worker { source, .. } => Some(source),
        }
    }
}

/// Limits of every worker (see the [`Builder`] methods that set them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) drain_timeout: Duration,
    pub(crate) conns_per_worker_max: usize,
    pub(crate) input_bytes_max: usize,
    pub(crate) idle_timeout: Duration,
    /// On stop, how long the accept phase keeps accepting before it may end at an empty
    /// queue (longer with `TCP_DEFER_ACCEPT`: see [`Builder::defer_accept`]).
    pub(crate) accept_quiesce: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            drain_timeout: Duration::from_secs(5),
            conns_per_worker_max: 100_000,
            input_bytes_max: 64 * 1024,
            idle_timeout: Duration::from_secs(60),
            accept_quiesce: DRAIN_QUIESCE,
        }
    }
}

/// The smallest input limit: hyper's HTTP/1 read buffer cannot be smaller.
pub const INPUT_LIMIT_MIN: usize = 8192;

/// Configures a [`Server`]: `Server::builder().cpus(…).mode(…).listen(addr)`.
#[derive(Debug, Clone)]
pub struct Builder {
    cpus: Option<CpuSet>,
    mode: Mode,
    steering: Option<Steering>,
    backlog: u32,
    defer_accept_s: Option<u32>,
    limits: Limits,
    balance: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            cpus: None,
            mode: Mode::Local,
            steering: None,
            backlog: 4096,
            defer_accept_s: None,
            limits: Limits::default(),
            balance: true,
        }
    }
}

impl Builder {
    /// One worker per CPU of `cpus` (default: every CPU this thread may run on).
    pub fn cpus(mut self, cpus: CpuSet) -> Builder {
        self.cpus = Some(cpus);
        self
    }

    /// How connections are spread over the workers (default [`Mode::Local`]: the CPU that
    /// processed the SYN picks its worker).
    pub fn mode(mut self, mode: Mode) -> Builder {
        self.mode = mode;
        self
    }

    /// Forces a steering method in `local` mode (default: the best available — eBPF with
    /// CAP_BPF, else `SO_INCOMING_CPU` on kernel ≥ 6.2, else classic BPF).
    pub fn steering(mut self, steering: Steering) -> Builder {
        self.steering = Some(steering);
        self
    }

    /// Total listen backlog per address, split evenly over the workers' listeners (default
    /// 4096).
    pub fn backlog(mut self, backlog: u32) -> Builder {
        self.backlog = backlog;
        self
    }

    /// `TCP_DEFER_ACCEPT` on the listeners (default off; 0 turns it off): a connection is
    /// accepted once its first bytes arrived, so the accept and the first read happen in one
    /// wake-up (what `corelocal serve --defer-accept 1` does): 0.91–0.94× server CPU per
    /// one-shot request for the axum example (results/tokio/tokio-defer-accept-crr.md). A connection that stays silent is accepted after about
    /// `secs` (the kernel's next SYN-ACK retransmission). On stop it is turned off and the
    /// accept phase waits `secs` + 0.5 s (within half the drain timeout), so a client that
    /// connected before the stop and speaks during it is still answered.
    pub fn defer_accept(mut self, secs: u32) -> Builder {
        self.defer_accept_s = (secs > 0).then_some(secs);
        self
    }

    /// On stop, how long connections in progress get to finish (default 5 s); the accept
    /// queues are drained for at most half of it.
    pub fn drain_timeout(mut self, timeout: Duration) -> Builder {
        self.limits.drain_timeout = timeout;
        self
    }

    /// Open connections per worker (default 100,000): a worker at the limit stops accepting
    /// and further connections wait, handshake done, in the kernel's accept queue.
    pub fn conns_per_worker(mut self, max: usize) -> Builder {
        self.limits.conns_per_worker_max = max;
        self
    }

    /// The [`http`](crate::http) helpers: largest request head buffered per connection
    /// (default 64 KiB, at least [`INPUT_LIMIT_MIN`]).
    pub fn input_limit(mut self, bytes: usize) -> Builder {
        self.limits.input_bytes_max = bytes;
        self
    }

    /// The [`http`](crate::http) helpers: how long a connection may take to send a request
    /// head, including the wait between keep-alive requests (default 60 s).
    pub fn idle_timeout(mut self, timeout: Duration) -> Builder {
        self.limits.idle_timeout = timeout;
        self
    }

    /// The balancer for workers that stop serving (default on): a worker whose runtime is
    /// neither waiting for events nor turning its loop for 5 ms (a handler that blocks its
    /// thread: `std::thread::sleep`, a blocking read, a lock; a starved or dead thread), or
    /// whose queue holds connections it does not accept, is busy. While it is, the other
    /// workers accept from its listener (stealing, 5:1 with their own), and with eBPF
    /// steering its CPU's new SYNs go to the closest non-busy workers; they come back as soon
    /// as it drains. A monitor thread per server watches every worker each 4 ms (8 ms while
    /// everything is idle, 1 ms while a worker is busy and another can help, and when a stall
    /// window ends). `false`: no monitor, no stealing: a blocked worker's connections wait
    /// for it. Counters: [`Stats::balance`], `stolen` in the [`Snapshot`].
    pub fn balance(mut self, on: bool) -> Builder {
        self.balance = on;
        self
    }

    /// Binds every worker's listener on `addr` (port 0: one ephemeral port for all).
    pub fn listen(self, addr: impl ToSocketAddrs) -> Result<Server, Error> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|source| Error::Io {
                context: "resolving the listen address".into(),
                source,
            })?
            .collect();
        let first = addrs
            .first()
            .copied()
            .ok_or_else(|| Error::Config("the listen address resolves to nothing".into()))?;
        self.listen_on(vec![first])
    }

    /// Binds every worker's listeners on each of `addrs` (e.g. IPv4 and IPv6).
    pub fn listen_on(self, addrs: Vec<SocketAddr>) -> Result<Server, Error> {
        let cpus = match self.cpus {
            Some(c) => c,
            None => current_affinity().map_err(|source| Error::Io {
                context: "sched_getaffinity".into(),
                source,
            })?,
        };
        if cpus.is_empty() {
            return Err(Error::Config("no workers (empty CPU set)".into()));
        }
        if self.limits.drain_timeout.is_zero() || self.limits.idle_timeout.is_zero() {
            return Err(Error::Config(
                "drain and idle timeouts must be positive".into(),
            ));
        }
        if self.limits.conns_per_worker_max == 0 {
            return Err(Error::Config(
                "connections per worker must be positive".into(),
            ));
        }
        if self.limits.input_bytes_max < INPUT_LIMIT_MIN {
            return Err(Error::Config(format!(
                "input limit must be at least {INPUT_LIMIT_MIN} bytes"
            )));
        }
        let mut config = GroupConfig::new(addrs, cpus.iter().collect(), self.mode);
        config.steering = self.steering;
        config.backlog_total = self.backlog;
        config.defer_accept_s = self.defer_accept_s;
        let group = Arc::new(ListenerGroup::bind(config).map_err(Error::Listen)?);
        let mut limits = self.limits;
        limits.accept_quiesce = group.stop_quiesce().unwrap_or(DRAIN_QUIESCE);
        let balance = match self.balance {
            true => balance::Shared::for_group(&group).map_err(|source| Error::Io {
                context: "duplicating the listeners for stealing".into(),
                source,
            })?,
            false => None,
        };
        let stats = Stats {
            reader: StatsReader::for_group(group.clone()),
            group: group.clone(),
            balance: balance.clone(),
        };
        Ok(Server {
            group,
            limits,
            stats,
            balance,
        })
    }
}

/// Every worker's counters; cheap to clone and to send to another thread (e.g. a metrics
/// route). Counted the way corelocal's runtime counts: a connection is local when the accepted
/// socket's `SO_INCOMING_CPU` (the CPU that processed its SYN) is the worker's CPU.
#[derive(Clone)]
pub struct Stats {
    reader: StatsReader,
    group: Arc<ListenerGroup>,
    balance: Option<Arc<balance::Shared>>,
}

impl fmt::Debug for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stats")
            .field("workers", &self.group.workers())
            .finish()
    }
}

impl Stats {
    /// Every worker's counters now (corelocal's [`Snapshot`]: `accepted`, `accepted_local`,
    /// `open`, `requests`, `bytes_in`/`bytes_out`, `drain_accepted`, `errors`, …), with the
    /// namespace's listen-path counters of the last [`Stats::sample_net`].
    pub fn snapshot(&self) -> Snapshot {
        self.reader.snapshot()
    }

    /// Samples the namespace's listen-path counters (one read of `/proc/net/netstat`): at a
    /// stats interval or per metrics request, never per connection.
    pub fn sample_net(&self) {
        self.reader.sample_net();
    }

    /// The balancer's counters ([`Builder::balance`]): busy transitions by reason and
    /// redirect episodes per worker.
    pub fn balance(&self) -> BalanceSnapshot {
        BalanceSnapshot::of(self.balance.as_deref(), |w| self.group.worker_cpu(w))
    }

    /// [`Stats::sample_net`], then the counters in the Prometheus text format with
    /// corelocal's metric names (see [`crate::metrics`]), the balancer's with them.
    pub fn prometheus(&self) -> String {
        self.sample_net();
        crate::metrics::prometheus_balanced(&self.snapshot(), &self.balance(), &self.info())
    }

    /// The labels of the `corelocal_info` sample.
    pub fn info(&self) -> Vec<(&'static str, String)> {
        vec![
            ("app", "tokio".to_string()),
            ("backend", "tokio".to_string()),
            ("mode", self.group.mode().to_string()),
            ("steering", self.group.steering().to_string()),
        ]
    }

    pub(crate) fn worker(&self, index: usize) -> Arc<WorkerStats> {
        self.reader.worker(index)
    }
}

/// A bound server: every worker's listener exists (connections already queue in them);
/// [`Server::serve`] or [`Server::start`] runs the workers.
pub struct Server {
    group: Arc<ListenerGroup>,
    limits: Limits,
    stats: Stats,
    balance: Option<Arc<balance::Shared>>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("addrs", &self.group.local_addrs())
            .field("workers", &self.group.workers())
            .field("steering", &self.group.steering())
            .finish()
    }
}

impl Server {
    /// A [`Builder`] with defaults: every allowed CPU, `local` mode, best steering.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The bound addresses (ports resolved).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.group.local_addrs()
    }

    /// The steering in force (`local` mode: which method).
    pub fn steering(&self) -> ActiveSteering {
        self.group.steering()
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.group.mode()
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.group.workers()
    }

    /// The CPU of each worker.
    pub fn worker_cpus(&self) -> Vec<usize> {
        (0..self.workers())
            .map(|w| self.group.worker_cpu(w))
            .collect()
    }

    /// The counters (take it before starting to hand it to a metrics route).
    pub fn stats(&self) -> Stats {
        self.stats.clone()
    }

    /// Runs `f` once per worker, on the worker's pinned thread inside its current-thread
    /// runtime and `LocalSet` (so `tokio::task::spawn_local` works), then returns at once.
    /// Each worker owns a duplicate of its listeners (same sockets: the steering still picks
    /// them). After `f`'s future ends, the worker waits for the connections it accepted to
    /// close (bounded by the drain timeout once stopping), then its runtime shuts down.
    ///
    /// `f`'s future should end only when [`WorkerCtx::accept`] returns `None` (the stop
    /// drained the queue): a worker that ends early leaves its listener in the group, and the
    /// connections steered to it wait there until the server stops (its error is reported by
    /// [`Running::join`]).
    pub fn start<F, Fut>(self, f: F) -> Result<Running, Error>
    where
        F: Fn(WorkerCtx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<()>> + 'static,
    {
        let f = Arc::new(f);
        let (stop_tx, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            group: self.group.clone(),
            stop_tx,
            stopping: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
        });
        let (ready_tx, ready_rx) = mpsc::channel();
        let mut threads = Vec::with_capacity(self.group.workers());
        let mut failure = None;
        for index in 0..self.group.workers() {
            let listeners = match self.group.try_clone_listeners(index) {
                Ok(l) => l,
                Err(source) => {
                    failure = Some(Error::Io {
                        context: format!("duplicating worker {index}'s listeners"),
                        source,
                    });
                    break;
                }
            };
            let setup = WorkerSetup {
                info: WorkerInfo {
                    index,
                    cpu: self.group.worker_cpu(index),
                    local_addrs: self.group.local_addrs(),
                },
                listeners,
                stats: self.stats.worker(index),
                all_stats: self.stats.clone(),
                stop: stop_rx.clone(),
                limits: self.limits,
                balance: self.balance.clone(),
            };
            let f = f.clone();
            let ready = ready_tx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("corelocal-tokio-w{index}"))
                .spawn(move || worker::run(setup, f, ready));
            match spawned {
                Ok(t) => threads.push(t),
                Err(source) => {
                    failure = Some(Error::Worker {
                        worker: index,
                        source,
                    });
                    break;
                }
            }
        }
        drop(ready_tx);
        for _ in 0..threads.len() {
            match ready_rx.recv() {
                Ok((_, Ok(()))) => {}
                Ok((worker, Err(source))) => {
                    failure.get_or_insert(Error::Worker { worker, source });
                }
                Err(_) => break,
            }
        }
        let mut running = Running {
            shared,
            threads,
            stats: self.stats,
            monitor: None,
        };
        if failure.is_none() {
            if let Some(b) = self.balance {
                match balance::spawn_monitor(b, self.group.clone(), &running.stats) {
                    Ok(m) => running.monitor = Some(m),
                    Err(source) => {
                        failure = Some(Error::Io {
                            context: "starting the balancer's monitor thread".into(),
                            source,
                        })
                    }
                }
            }
        }
        if let Some(e) = failure {
            running.stop();
            let _ = running.join();
            return Err(e);
        }
        Ok(running)
    }

    /// [`Server::start`], then waits for SIGINT or SIGTERM (or a [`StopHandle::stop`]),
    /// stops without losing a queued connection and waits for the workers: the whole life of
    /// a service in one call. The signal handlers (tokio's) are installed before the workers
    /// start and stay installed for the life of the process.
    pub fn serve<F, Fut>(self, f: F) -> Result<ShutdownReport, Error>
    where
        F: Fn(WorkerCtx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<()>> + 'static,
    {
        let signals = Signals::register()?;
        let running = self.start(f)?;
        signals.wait(&running);
        running.stop();
        running.join()
    }
}

/// What the workers and every handle share.
struct Shared {
    group: Arc<ListenerGroup>,
    stop_tx: watch::Sender<bool>,
    stopping: AtomicBool,
    refusing: AtomicBool,
}

impl Shared {
    fn stop(&self) {
        if self.stopping.swap(true, Ordering::AcqRel) {
            return;
        }
        // Refuse new SYNs first (eBPF steering), then let the workers drain their queues.
        match self.group.begin_stop() {
            Ok(refusing) => self.refusing.store(refusing, Ordering::Relaxed),
            Err(e) => eprintln!("corelocal-tokio: refusing new SYNs on stop failed: {e}"),
        }
        self.stop_tx.send_replace(true);
    }
}

/// Asks a [`Running`] server to stop, from any thread.
#[derive(Clone)]
pub struct StopHandle {
    shared: Arc<Shared>,
}

impl fmt::Debug for StopHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopHandle").finish_non_exhaustive()
    }
}

impl StopHandle {
    /// See [`Running::stop`].
    pub fn stop(&self) {
        self.shared.stop();
    }
}

/// A started server ([`Server::start`]).
pub struct Running {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<io::Result<()>>>,
    stats: Stats,
    /// The balancer's monitor; it ends after the workers.
    monitor: Option<JoinHandle<()>>,
}

impl fmt::Debug for Running {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running")
            .field("addrs", &self.shared.group.local_addrs())
            .field("workers", &self.threads.len())
            .finish()
    }
}

impl Running {
    /// The bound addresses.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.shared.group.local_addrs()
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.stats.clone()
    }

    /// A handle that stops the server from another thread.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            shared: self.shared.clone(),
        }
    }

    /// Starts the zero-loss stop: new SYNs are refused (eBPF steering; without it they keep
    /// queuing until the listeners close), every worker accepts until its queues stay empty
    /// (at most half the drain timeout), [`WorkerCtx::accept`] then returns `None`,
    /// connections in progress finish (the [`http`](crate::http) helpers answer the request
    /// in progress with `Connection: close`; bounded by the drain timeout) and the runtimes
    /// shut down. Returns at once; [`Running::join`] waits.
    pub fn stop(&self) {
        self.shared.stop();
    }

    /// Waits for SIGINT or SIGTERM (or a [`StopHandle::stop`]). Register early: a signal
    /// that arrives before this call registers its handler kills the process.
    pub fn wait_for_signal(&self) -> Result<(), Error> {
        Signals::register()?.wait(self);
        Ok(())
    }

    /// Waits for every worker to exit, then reports how the stop went: the final counters
    /// (`drain_accepted`: taken from the queues after the stop began), whether new SYNs were
    /// refused, and the connections still queued when the last listeners close (lost).
    pub fn join(self) -> Result<ShutdownReport, Error> {
        let mut failure = None;
        for (worker, t) in self.threads.into_iter().enumerate() {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("worker panicked")));
            if let Err(source) = r {
                failure.get_or_insert(Error::Worker { worker, source });
            }
        }
        if let Some(m) = self.monitor {
            // It sees the workers gone within one sampling period.
            let _ = m.join();
        }
        self.stats.sample_net();
        let report = ShutdownReport {
            stats: self.stats.snapshot(),
            refused_new_syns: self.shared.refusing.load(Ordering::Relaxed),
            migration: self.shared.group.migration(),
            lost_at_close: self.shared.group.queued_total(),
            handed_over: false,
        };
        match failure {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }
}

/// SIGINT and SIGTERM handlers on a small runtime of the calling thread.
struct Signals {
    rt: tokio::runtime::Runtime,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn register() -> Result<Signals, Error> {
        use tokio::signal::unix::{signal, SignalKind};
        let io = |context: &str| {
            let context = context.to_string();
            move |source| Error::Io { context, source }
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .map_err(io("building the signal runtime"))?;
        let (term, int) = rt
            .block_on(async {
                Ok::<_, io::Error>((
                    signal(SignalKind::terminate())?,
                    signal(SignalKind::interrupt())?,
                ))
            })
            .map_err(io("registering SIGTERM/SIGINT"))?;
        Ok(Signals { rt, term, int })
    }

    fn wait(mut self, running: &Running) {
        let mut stop = running.shared.stop_tx.subscribe();
        self.rt.block_on(async {
            tokio::select! {
                _ = self.term.recv() => {}
                _ = self.int.recv() => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        });
    }
}
