//! [`Server`]: binds the listener group, starts one pinned worker per CPU, stops gracefully.

use super::backend::Backend;
use super::backend::Wake;
use super::balance::{BalanceError, BalanceShared};
use super::handler::Service;
use super::handoff::{Gate, MovedConn, Outbox, StateImport};
use super::netstat::NetSampler;
use super::stats::{Snapshot, WorkerStats};
use super::worker::{Worker, WorkerSetup};
use super::{Limits, LimitsError};
use crate::cpu::{pin_current_thread, CpuSet, UnavailableCpus};
use crate::listen::{ActiveSteering, GroupConfig, ListenError, ListenerGroup, Migration, Mode};
use crate::sys::epoll::{EpollBackend, PoolConfig};
use crate::sys::uring::{UringBackend, UringConfig};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

/// Which I/O backend the workers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// epoll (readiness, emulated completions).
    Epoll,
    /// io_uring (multishot accept into direct descriptors, provided buffers); fails if refused.
    Uring,
    /// io_uring when the kernel allows it, else epoll (the reason is logged).
    Auto,
}

impl FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "epoll" => Ok(BackendKind::Epoll),
            "auto" => Ok(BackendKind::Auto),
            "uring" => Ok(BackendKind::Uring),
            _ => Err(format!(
                "unknown backend {s:?} (expected epoll, uring or auto)"
            )),
        }
    }
}

/// `TCP_DEFER_ACCEPT` of [`ServerConfig::recommended`], seconds: a client that connects and
/// stays silent is accepted after about this long.
pub const DEFER_ACCEPT_S_RECOMMENDED: u32 = 1;

/// Everything a server needs besides its service.
///
/// [`ServerConfig::recommended`] gives the defaults of `corelocal serve`;
/// [`ServerConfig::new`] a plain start (no balancer, no `TCP_DEFER_ACCEPT`) to build on.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Addresses, mode and steering; `worker_cpus` gets filled from `cpus`.
    pub listen: GroupConfig,
    /// The backend.
    pub backend: BackendKind,
    /// Limits.
    pub limits: Limits,
    /// The Affinity-Accept balancer's parameters (`None`: off). `workers` and `flow_groups`
    /// are taken from the listener group.
    pub balance: Option<crate::balance::BalanceConfig>,
    /// Packet-level flow-group steering: attach XDP + CPUMAP to this interface (generic mode),
    /// groups spread over the workers' CPUs; the balancer then migrates groups there.
    pub xdp_iface: Option<String>,
    /// Start behind a gate: the workers accept nothing and take the connections a
    /// predecessor hands over ([`Server::take_conn`]) until [`Server::open_gate`] (a binary
    /// upgrade; the service's state is imported meanwhile, see [`Server::import_state`]).
    pub gated: bool,
}

impl ServerConfig {
    /// One worker per CPU of `cpus`, listening on `addrs` in `mode`, default limits, the
    /// backend picked at start ([`BackendKind::Auto`]); no balancer, no `TCP_DEFER_ACCEPT`
    /// (see [`ServerConfig::recommended`] for those).
    pub fn new(addrs: Vec<SocketAddr>, cpus: &CpuSet, mode: Mode) -> ServerConfig {
        ServerConfig {
            listen: GroupConfig::new(addrs, cpus.iter().collect(), mode),
            backend: BackendKind::Auto,
            limits: Limits::default(),
            balance: None,
            xdp_iface: None,
            gated: false,
        }
    }

    /// What `corelocal serve` runs with unless told otherwise: one worker per CPU of `cpus` in
    /// [`Mode::Local`] (each connection is accepted on the CPU that processed its SYN, with the
    /// best steering the process may use), the Affinity-Accept balancer on with its paper
    /// parameters when there are two or more workers (a stopped or starved worker's queued
    /// connections are taken by the others), `TCP_DEFER_ACCEPT` of
    /// [`DEFER_ACCEPT_S_RECOMMENDED`] switched by each worker with its load (while it batches
    /// a connection is accepted with its first request bytes; an idle worker accepts at once,
    /// see [`crate::runtime::defer`]: right for protocols where the client speaks first; set
    /// `config.listen.defer_accept_s = None` for one where the server greets first), the
    /// io_uring backend when the kernel allows it (else epoll, [`BackendKind::Auto`]), a
    /// backlog of 4,096 per address and the default [`Limits`].
    ///
    /// ```
    /// use corelocal::cpu::current_affinity;
    /// use corelocal::runtime::ServerConfig;
    ///
    /// let cpus = current_affinity().unwrap();
    /// let config = ServerConfig::recommended(vec!["127.0.0.1:7007".parse().unwrap()], &cpus);
    /// assert_eq!(config.balance.is_some(), cpus.len() > 1);
    /// assert_eq!(config.listen.defer_accept_s, Some(1));
    /// assert!(config.listen.defer_accept_adaptive);
    /// ```
    pub fn recommended(addrs: Vec<SocketAddr>, cpus: &CpuSet) -> ServerConfig {
        let mut config = ServerConfig::new(addrs, cpus, Mode::Local);
        config.listen.defer_accept_s = Some(DEFER_ACCEPT_S_RECOMMENDED);
        config.listen.defer_accept_adaptive = true;
        let workers = config.listen.worker_cpus.len();
        // One worker has nobody to balance with: pacing its accepts would only cost.
        if workers > 1 {
            let mut balance = crate::balance::BalanceConfig::new(workers);
            balance.flow_groups = config.listen.flow_groups;
            config.balance = Some(balance);
        }
        config
    }

    /// Runs `n` workers on each CPU (each with its own listener and ring), e.g. to hold more
    /// connections than one io_uring file table allows. Worker order: CPU by CPU.
    pub fn workers_per_cpu(mut self, n: usize) -> ServerConfig {
        assert!(n >= 1, "at least one worker per CPU");
        let cpus = std::mem::take(&mut self.listen.worker_cpus);
        self.listen.worker_cpus = cpus
            .into_iter()
            .flat_map(|c| std::iter::repeat_n(c, n))
            .collect();
        self
    }
}

/// Why a server could not start.
#[derive(Debug)]
pub enum ServerError {
    /// Binding the listeners failed.
    Listen(ListenError),
    /// A [`Limits`] value cannot work.
    Limits(LimitsError),
    /// Some worker CPUs are not online or outside the process's affinity mask (checked
    /// before any worker starts).
    Cpus(UnavailableCpus),
    /// XDP steering could not be attached.
    Xdp(crate::steer::XdpError),
    /// The balancer cannot run over these listeners.
    Balance(BalanceError),
    /// A worker could not start (pinning, backend creation).
    Worker {
        /// The worker.
        worker: usize,
        /// The error.
        source: io::Error,
    },
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerError::Listen(e) => write!(f, "{e}"),
            ServerError::Limits(e) => write!(f, "{e}"),
            ServerError::Cpus(e) => write!(f, "cannot pin the workers: {e}"),
            ServerError::Xdp(e) => write!(f, "XDP steering: {e}"),
            ServerError::Balance(e) => write!(f, "{e}"),
            ServerError::Worker { worker, source } => write!(f, "worker {worker}: {source}"),
        }
    }
}

impl std::error::Error for ServerError {}

type Importer = Box<dyn Fn() -> Option<Box<dyn StateImport>> + Send + Sync>;

/// A running server: one pinned worker per CPU, each with its listener, backend and
/// connections.
///
/// [`Server::start`] binds, starts the workers and returns; the caller stops it
/// ([`Server::stop`], then [`Server::join_report`]). [`Server::run_until_signal`] does the
/// whole life in one call, until SIGINT or SIGTERM.
///
/// ```no_run
/// use corelocal::cpu::current_affinity;
/// use corelocal::runtime::{ConnInfo, Handler, Output, Server, ServerConfig, Service, Step};
/// use std::io::{Read, Write};
/// use std::net::TcpStream;
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
/// let addrs = vec!["127.0.0.1:0".parse().unwrap()]; // any free port
/// let config = ServerConfig::recommended(addrs, &current_affinity().unwrap());
/// let server = Server::start(config, Arc::new(Echo)).unwrap();
/// let mut client = TcpStream::connect(server.local_addrs()[0]).unwrap();
/// client.write_all(b"hi").unwrap();
/// let mut answer = [0u8; 2];
/// client.read_exact(&mut answer).unwrap();
/// assert_eq!(&answer, b"hi");
/// println!("{} connections", server.stats().total.accepted);
/// server.stop(); // graceful: queued connections are served, then the workers exit
/// let (result, report) = server.join_report();
/// result.unwrap();
/// assert_eq!(report.lost_at_close, 0);
/// ```
pub struct Server {
    outbox: Arc<Outbox>,
    gate: Option<Arc<Gate>>,
    import: Importer,
    /// Round-robin among the workers of one CPU for connections taken over.
    take_next: std::sync::atomic::AtomicUsize,
    group: Arc<ListenerGroup>,
    stats: Vec<Arc<WorkerStats>>,
    stop: Arc<AtomicBool>,
    wakers: Vec<Arc<dyn Wake>>,
    threads: Vec<JoinHandle<io::Result<()>>>,
    backend: &'static str,
    /// Detaches on drop, after the workers are gone.
    _xdp: Option<Arc<crate::steer::XdpSteering>>,
    refusing: AtomicBool,
    /// The listeners were handed to a successor ([`ReleaseHandle::release`]).
    released: Arc<AtomicBool>,
    net: Arc<NetSampler>,
}

/// How a graceful stop went (see [`Server::join_report`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShutdownReport {
    /// Every worker's final counters (`drain_accepted`: taken from the queues after the stop).
    pub stats: Snapshot,
    /// Whether new SYNs were refused during the stop (eBPF steering) — else they kept queuing.
    pub refused_new_syns: bool,
    /// How a closing listener's queue survives.
    pub migration: Migration,
    /// Connections still queued when the last listeners closed: these were reset. Always 0
    /// after a handover: the successor holds the same sockets, queues included.
    pub lost_at_close: u64,
    /// The listening sockets were handed to a successor process ([`ReleaseHandle::release`]).
    pub handed_over: bool,
}

/// Reads every worker's counters of a [`Server`]; see [`Server::stats_reader`].
#[derive(Clone)]
pub struct StatsReader {
    group: Arc<ListenerGroup>,
    stats: Vec<Arc<WorkerStats>>,
    net: Arc<NetSampler>,
}

impl fmt::Debug for StatsReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatsReader")
            .field("workers", &self.stats.len())
            .finish()
    }
}

impl StatsReader {
    /// Every worker's counters now, with the listen-path counters of the last
    /// [`sample_net`](StatsReader::sample_net).
    pub fn snapshot(&self) -> Snapshot {
        let mut snap = Snapshot::from_workers(
            self.stats
                .iter()
                .enumerate()
                .map(|(w, s)| s.snapshot(w, self.group.worker_cpu(w)))
                .collect(),
        );
        snap.net = self.net.latest();
        snap
    }

    /// Samples the namespace's listen-path counters (one read of `/proc/net/netstat`): call it
    /// at the stats interval, never per connection.
    pub fn sample_net(&self) {
        self.net.sample();
    }

    /// Fresh counters for every worker of `group`, for runtimes other than corelocal's own
    /// (e.g. `corelocal-tokio`) that count the same way and report the same snapshot.
    pub fn for_group(group: Arc<ListenerGroup>) -> StatsReader {
        let workers = group.workers();
        StatsReader {
            stats: (0..workers)
                .map(|_| Arc::new(WorkerStats::new(workers)))
                .collect(),
            group,
            net: Arc::new(NetSampler::new()),
        }
    }

    /// Worker `index`'s counters, for the thread that updates them.
    pub fn worker(&self, index: usize) -> Arc<WorkerStats> {
        Arc::clone(&self.stats[index])
    }
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("addrs", &self.group.local_addrs())
            .field("workers", &self.stats.len())
            .finish()
    }
}

/// Lets another thread hand a running [`Server`]'s listening sockets to a successor process
/// and then stop the server without disturbing them (see [`Server::release_handle`]).
#[derive(Clone)]
pub struct ReleaseHandle {
    outbox: Arc<Outbox>,
    group: Arc<ListenerGroup>,
    stop: Arc<AtomicBool>,
    released: Arc<AtomicBool>,
    wakers: Vec<Arc<dyn Wake>>,
}

impl fmt::Debug for ReleaseHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseHandle")
            .field("addrs", &self.group.local_addrs())
            .finish()
    }
}

impl ReleaseHandle {
    /// The server's listener group (what gets handed over).
    pub fn listeners(&self) -> &ListenerGroup {
        &self.group
    }

    /// The successor serves from the same sockets now: every worker stops accepting at once,
    /// serves what it accepted (bounded by the drain timeout) and exits. Unlike
    /// [`Server::stop`], nothing touches the sockets — no refusing of new SYNs, no waiting for
    /// empty queues (the successor drains them), no shutdown: closing this process's
    /// descriptors at exit leaves the sockets open in the successor.
    pub fn release(&self) {
        self.released.store(true, Ordering::Release);
        self.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            w.wake();
        }
    }

    /// Like [`ReleaseHandle::release`], and the workers move their open connections to the
    /// [`Outbox`] between requests instead of closing them (the successor takes them).
    pub fn release_moving(&self) {
        self.outbox.enable();
        self.release();
    }

    /// Where the workers put the connections they move ([`ReleaseHandle::release_moving`]).
    pub fn outbox(&self) -> &Arc<Outbox> {
        &self.outbox
    }

    /// Whether [`ReleaseHandle::release`] was called.
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }
}

impl Server {
    /// Binds and starts the workers.
    pub fn start<S: Service>(config: ServerConfig, service: Arc<S>) -> Result<Server, ServerError> {
        config.limits.validate().map_err(ServerError::Limits)?;
        let group = ListenerGroup::bind(config.listen.clone()).map_err(ServerError::Listen)?;
        Self::start_with_listeners(config, service, group)
    }

    /// Starts the workers on an already built listener group — e.g. one adopted from a running
    /// server ([`ListenerGroup::adopt`]); `config.listen` is not used (the group has its own).
    pub fn start_with_listeners<S: Service>(
        config: ServerConfig,
        service: Arc<S>,
        group: ListenerGroup,
    ) -> Result<Server, ServerError> {
        Self::start_on_group(config, service, Arc::new(group))
    }

    /// Starts the workers on a listener group another server of this process used before
    /// (see `upgrade::resume`: a successor failed, this process serves on).
    pub(crate) fn start_on_group<S: Service>(
        config: ServerConfig,
        service: Arc<S>,
        group: Arc<ListenerGroup>,
    ) -> Result<Server, ServerError> {
        config.limits.validate().map_err(ServerError::Limits)?;
        let cpus: CpuSet = (0..group.workers()).map(|w| group.worker_cpu(w)).collect();
        if let Some(unavailable) = crate::cpu::unavailable(&cpus) {
            return Err(ServerError::Cpus(unavailable));
        }
        let xdp = match &config.xdp_iface {
            Some(iface) => Some(Arc::new(attach_xdp(iface, &group)?)),
            None => None,
        };
        let workers = group.workers();
        let stats: Vec<Arc<WorkerStats>> = (0..workers)
            .map(|_| Arc::new(WorkerStats::new(workers)))
            .collect();
        let balance = match &config.balance {
            Some(cfg) => Some(Arc::new(
                BalanceShared::new(cfg.clone(), group.clone(), xdp.clone(), stats.clone())
                    .map_err(ServerError::Balance)?,
            )),
            None => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let released = Arc::new(AtomicBool::new(false));
        let net = Arc::new(NetSampler::new());
        let (ready_tx, ready_rx) = mpsc::channel();
        let mut limits = config.limits;
        if let Some(quiesce) = group.stop_quiesce() {
            limits.accept_quiesce = limits.accept_quiesce.max(quiesce);
        }
        let exporter = service.clone();
        // The successor (this service again) keeps its gate closed while it imports state.
        let keeps_sent = service.clone().import_state().is_some();
        let outbox = Arc::new(Outbox::new(
            workers,
            Box::new(move || exporter.clone().export_state()),
            keeps_sent,
        ));
        let gate = config.gated.then(|| Arc::new(Gate::new(workers)));
        // Each worker switches deferring on its own listeners; shared ones (`stock`) stay put.
        let defer_switch_s = config
            .listen
            .defer_accept_s
            .filter(|_| config.listen.defer_accept_adaptive && group.mode() != Mode::Stock);
        let mut threads = Vec::with_capacity(workers);
        for (index, worker_stats) in stats.iter().enumerate() {
            let setup = WorkerSetup {
                index,
                cpu: group.worker_cpu(index),
                listeners: group.listeners(index),
                shared_listeners: group.mode() == Mode::Stock,
                service: service.clone(),
                stats: worker_stats.clone(),
                stop: stop.clone(),
                released: released.clone(),
                limits,
                balance: balance.clone(),
                outbox: Some(outbox.clone()),
                gate: gate.clone(),
                defer_switch_s,
            };
            let ready = ready_tx.clone();
            let kind = config.backend;
            let thread = std::thread::Builder::new()
                .name(format!("corelocal-w{index}"))
                .spawn(move || run_worker(setup, kind, ready))
                .map_err(|source| ServerError::Worker {
                    worker: index,
                    source,
                })?;
            threads.push(thread);
        }
        drop(ready_tx);
        let mut wakers: Vec<Option<Arc<dyn Wake>>> = (0..workers).map(|_| None).collect();
        let mut failure = None;
        let mut backend = "none";
        for _ in 0..workers {
            match ready_rx.recv() {
                Ok((index, Ok((name, waker)))) => {
                    wakers[index] = Some(waker);
                    backend = name;
                }
                Ok((index, Err(source))) => {
                    failure = Some(ServerError::Worker {
                        worker: index,
                        source,
                    })
                }
                Err(_) => break,
            }
        }
        let wakers: Vec<Arc<dyn Wake>> = wakers.into_iter().flatten().collect();
        if let Some(b) = &balance {
            let _ = b.wakers.set(wakers.clone());
        }
        let importer = service.clone();
        let server = Server {
            outbox,
            gate,
            import: Box::new(move || importer.clone().import_state()),
            take_next: std::sync::atomic::AtomicUsize::new(0),
            group,
            stats,
            stop,
            wakers,
            threads,
            backend,
            _xdp: xdp,
            refusing: AtomicBool::new(false),
            released,
            net,
        };
        if let Some(e) = failure {
            server.abandon();
            return Err(e);
        }
        Ok(server)
    }

    /// The bound addresses.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.group.local_addrs()
    }

    /// The steering in force.
    pub fn steering(&self) -> ActiveSteering {
        self.group.steering()
    }

    /// The backend in use.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// The listener group (queue depths, flow-group overrides).
    pub fn listeners(&self) -> &Arc<ListenerGroup> {
        &self.group
    }

    /// Every worker's counters.
    pub fn stats(&self) -> Snapshot {
        self.stats_reader().snapshot()
    }

    /// A cheap, shareable handle that takes the same snapshots as [`Server::stats`] from
    /// another thread (e.g. a metrics endpoint) without borrowing the server.
    pub fn stats_reader(&self) -> StatsReader {
        StatsReader {
            group: Arc::clone(&self.group),
            stats: self.stats.clone(),
            net: Arc::clone(&self.net),
        }
    }

    /// A handle to hand the listening sockets to a successor from another thread, then stop
    /// without disturbing them ([`ReleaseHandle::release`]).
    pub fn release_handle(&self) -> ReleaseHandle {
        ReleaseHandle {
            outbox: Arc::clone(&self.outbox),
            group: Arc::clone(&self.group),
            stop: Arc::clone(&self.stop),
            released: Arc::clone(&self.released),
            wakers: self.wakers.clone(),
        }
    }

    /// A started-behind-the-gate server ([`ServerConfig::gated`]) takes over a connection its
    /// predecessor moved: the worker on the CPU that processed its last packet
    /// (`SO_INCOMING_CPU`) gets it, else one on the CPU that served it before, else any.
    /// Waits while many are pending registration (descriptors are bounded).
    pub fn take_conn(&self, conn: MovedConn, wait: std::time::Duration) {
        let gate = self
            .gate
            .as_ref()
            .expect("take_conn on a server without a gate");
        let incoming = crate::sys::socket::incoming_cpu(std::os::fd::AsRawFd::as_raw_fd(&conn.fd))
            .ok()
            .and_then(|c| usize::try_from(c).ok());
        let on_cpu = |cpu: usize| -> Vec<usize> {
            (0..self.group.workers())
                .filter(|&w| self.group.worker_cpu(w) == cpu)
                .collect()
        };
        let mut candidates = incoming.map(on_cpu).unwrap_or_default();
        if candidates.is_empty() {
            candidates = on_cpu(conn.cpu as usize);
        }
        if candidates.is_empty() {
            candidates = (0..self.group.workers()).collect();
        }
        let turn = self.take_next.fetch_add(1, Ordering::Relaxed);
        let worker = candidates[turn % candidates.len()];
        gate.deliver(worker, conn, wait);
        if let Some(w) = self.wakers.get(worker) {
            w.wake(); // A worker serving already takes it at its next turn.
        }
    }

    /// The move from the predecessor is over (or gave up): nothing more comes through
    /// [`Server::take_conn`], and the gate opens if it was still closed.
    pub fn finish_taking(&self) {
        if let Some(g) = &self.gate {
            g.finish();
            g.open();
        }
    }

    /// Connections taken over so far ([`Server::take_conn`]).
    pub fn taken_conns(&self) -> u64 {
        self.gate.as_ref().map_or(0, |g| g.delivered_total())
    }

    /// Where the predecessor's service state goes (call before [`Server::open_gate`]).
    pub fn import_state(&self) -> Option<Box<dyn StateImport>> {
        (self.import)()
    }

    /// The workers serve: the connections taken over first, then whatever they accept.
    /// Nothing happens on a server started without a gate.
    pub fn open_gate(&self) {
        if let Some(g) = &self.gate {
            g.open();
        }
    }

    /// Samples the namespace's listen-path counters (see [`StatsReader::sample_net`]).
    pub fn sample_net(&self) {
        self.net.sample();
    }

    /// A worker whose thread ended while the server was neither stopping nor handed over (its
    /// loop failed or panicked): its listener is no longer accepted from, so the connections
    /// steered to its CPU would wait unanswered. The caller stops the server (see the CLI).
    pub fn exited_worker(&self) -> Option<usize> {
        if self.stop.load(Ordering::Acquire) || self.released.load(Ordering::Acquire) {
            return None;
        }
        self.threads.iter().position(JoinHandle::is_finished)
    }

    /// Asks every worker to stop without losing a queued connection: new SYNs are refused
    /// (eBPF steering; or a successor's listeners in the same group take them), each worker
    /// accepts until its queues are empty, requests in progress finish (bounded by the drain
    /// timeout), then the workers exit.
    pub fn stop(&self) {
        if self.released.load(Ordering::Acquire) {
            return; // Handed over: the workers are stopping already, the sockets are shared.
        }
        match self.group.begin_stop() {
            Ok(refusing) => self.refusing.store(refusing, Ordering::Relaxed),
            Err(e) => crate::log_line!("corelocal: refusing new SYNs on stop failed: {e}"),
        }
        self.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            w.wake();
        }
    }

    /// Like [`Server::stop`], and the workers move their open connections to the outbox
    /// between requests instead of closing them, for a successor that takes them
    /// ([`super::upgrade::send_moving`]; `--takeover PID`).
    pub fn stop_moving(&self) {
        self.outbox.enable();
        self.stop();
    }

    /// Where the workers put the connections they move ([`Server::stop_moving`]).
    pub fn outbox(&self) -> &Arc<Outbox> {
        &self.outbox
    }

    /// Gives up right after starting: a group adopted from a running server is released
    /// (its sockets are still shared with that server, which takes its steering back and
    /// serves on: refusing SYNs or draining here would disturb it); a group of its own stops
    /// as usual. Waits for the workers.
    pub fn abandon(self) {
        if self.group.is_adopted() {
            self.release_handle().release();
        } else {
            self.stop();
        }
        let _ = self.join();
    }

    /// Waits for every worker to exit; the first worker error, if any.
    pub fn join(self) -> io::Result<()> {
        self.join_report().0
    }

    /// Waits for every worker to exit, then reports how the stop went (counted before the
    /// listeners close: what is still queued then is lost).
    pub fn join_report(self) -> (io::Result<()>, ShutdownReport) {
        let reader = self.stats_reader();
        let result = Self::join_threads(self.threads);
        let handed_over = self.released.load(Ordering::Acquire);
        reader.sample_net();
        let report = ShutdownReport {
            stats: reader.snapshot(),
            refused_new_syns: self.refusing.load(Ordering::Relaxed),
            migration: self.group.migration(),
            // After a handover the queues are the successor's: nothing closes with them.
            lost_at_close: if handed_over {
                0
            } else {
                self.group.queued_total()
            },
            handed_over,
        };
        (result, report)
    }

    fn join_threads(threads: Vec<JoinHandle<io::Result<()>>>) -> io::Result<()> {
        let mut result = Ok(());
        for t in threads {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("worker panicked")));
            if result.is_ok() {
                result = r;
            }
        }
        result
    }
}

/// XDP + CPUMAP over the workers' CPUs for the group's ports; flow groups as the listener
/// group's (so the balancer's moves map one to one).
fn attach_xdp(
    iface: &str,
    group: &ListenerGroup,
) -> Result<crate::steer::XdpSteering, ServerError> {
    let cpus: CpuSet = (0..group.workers()).map(|w| group.worker_cpu(w)).collect();
    let ports: Vec<u16> = group.local_addrs().iter().map(|a| a.port()).collect();
    let config = crate::steer::XdpConfig::new(iface, &cpus, group.flow_groups(), &ports);
    crate::steer::XdpSteering::attach(&config).map_err(ServerError::Xdp)
}

/// Tells the outbox a worker exited, whichever way it exits (an error, a panic).
struct ExitNotice(Arc<Outbox>);

impl Drop for ExitNotice {
    fn drop(&mut self) {
        self.0.worker_exited();
    }
}

type Ready = mpsc::Sender<(usize, io::Result<(&'static str, Arc<dyn Wake>)>)>;

/// Receive-buffer count as the io_uring buffer ring wants it: a power of two ≤ 32768.
fn ring_bufs(bufs: u32) -> u16 {
    bufs.clamp(1, 32768).next_power_of_two().min(32768) as u16
}

/// Direct-descriptor slots kept free above a worker's connection limit (a quarter of the
/// table at most): the worker accepts exactly up to its limit, so these only absorb a race
/// (a multishot accept's last pass); a full table would drop the connection it accepted.
const RING_FILES_HEADROOM: u32 = 64;

/// The direct-descriptor table is limited per ring by RLIMIT_NOFILE (checked at registration).
fn ring_files(limits: &Limits) -> u32 {
    let nofile = crate::sys::process::nofile_limit().map_or(1024, |(soft, _)| soft);
    (limits.conns_per_worker_max as u64 + RING_FILES_HEADROOM as u64)
        .min(nofile)
        .clamp(1, u32::MAX as u64) as u32
}

/// The connection limit a ring of `files` slots can hold with its headroom.
fn ring_conns_max(files: u32, limit: usize) -> usize {
    let headroom = RING_FILES_HEADROOM.min(files / 4);
    limit.min((files - headroom).max(1) as usize)
}

fn run_worker<S: Service>(
    mut setup: WorkerSetup<S>,
    kind: BackendKind,
    ready: Ready,
) -> io::Result<()> {
    let index = setup.index;
    if let Err(e) = pin_current_thread(&CpuSet::single(setup.cpu)) {
        let why = crate::cpu::unavailable(&CpuSet::single(setup.cpu))
            .map_or_else(|| e.to_string(), |u| format!("{e}: {u}"));
        let error = io::Error::new(e.kind(), format!("pin to CPU {}: {why}", setup.cpu));
        let _ = ready.send((index, Err(error)));
        return Err(io::Error::new(e.kind(), "worker failed to start"));
    }
    // On the worker's own thread, pinned: per-worker state is made (and first touched) here.
    setup.service = Arc::clone(&setup.service).for_worker(index);
    let limits = setup.limits;
    let epoll = || {
        EpollBackend::new(PoolConfig {
            bufs: limits.recv_bufs,
            buf_bytes: limits.recv_buf_bytes,
        })
    };
    let uring_config = UringConfig {
        sq_entries: 2048,
        files: ring_files(&setup.limits),
        bufs: ring_bufs(setup.limits.recv_bufs),
        buf_bytes: setup.limits.recv_buf_bytes,
    };
    match kind {
        BackendKind::Epoll => launch(setup, epoll(), ready),
        BackendKind::Uring | BackendKind::Auto => match UringBackend::new(uring_config) {
            Ok(backend) => {
                setup.limits.conns_per_worker_max =
                    ring_conns_max(uring_config.files, setup.limits.conns_per_worker_max);
                launch(setup, Ok(backend), ready)
            }
            Err(e) if kind == BackendKind::Auto => {
                if index == 0 {
                    crate::log_line!("corelocal: io_uring refused ({e}); using epoll");
                }
                launch(setup, epoll(), ready)
            }
            Err(e) => {
                let error = io::Error::new(e.kind(), format!("io_uring: {e}"));
                launch::<S, EpollBackend>(setup, Err(error), ready)
            }
        },
    }
}

fn launch<S: Service, B: Backend>(
    setup: WorkerSetup<S>,
    backend: io::Result<B>,
    ready: Ready,
) -> io::Result<()> {
    match backend {
        Ok(backend) => {
            let (index, name, waker) = (setup.index, backend.name(), backend.waker());
            let _exit = setup.outbox.clone().map(ExitNotice);
            // Built before the server reports started: its listeners are as it starts them.
            let worker = Worker::new(setup, backend);
            let _ = ready.send((index, Ok((name, waker))));
            drop(ready);
            worker.run()
        }
        Err(e) => {
            if let Some(outbox) = &setup.outbox {
                outbox.worker_exited();
            }
            let kind = e.kind();
            let _ = ready.send((setup.index, Err(e)));
            Err(io::Error::new(kind, "worker failed to start"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_tables_keep_headroom_above_the_connection_limit() {
        let limits = Limits {
            conns_per_worker_max: 25,
            ..Limits::default()
        };
        assert!(ring_files(&limits) >= 25 + RING_FILES_HEADROOM.min(89 / 4));
        assert_eq!(ring_conns_max(89, 25), 25);
        assert_eq!(ring_conns_max(20_000, 100_000), 19_936);
        assert_eq!(ring_conns_max(64, 100_000), 48, "RLIMIT_NOFILE 64");
        assert_eq!(ring_conns_max(1, 5), 1);
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;
    use crate::balance::ConfigError;

    /// The balancer's errors are its own (not a listen error), with the words users saw.
    #[test]
    fn a_balancer_error_reads_as_before() {
        let xdp = ServerError::Balance(BalanceError::XdpNeedsOneWorkerPerCpu);
        assert_eq!(
            xdp.to_string(),
            "XDP steering needs one worker per CPU, in CPU order"
        );
        let config = ServerError::Balance(BalanceError::Config(ConfigError("workers".into())));
        assert_eq!(config.to_string(), "invalid balancer config: workers");
    }
}
