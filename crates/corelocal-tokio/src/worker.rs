//! One worker: a pinned thread, its current-thread runtime and `LocalSet`, its listeners, the
//! counted accept loop ([`WorkerCtx::accept`]) with the zero-loss stop, and [`Stream`].

use crate::balance::{self, Thief};
use crate::server::{Limits, Stats};
use corelocal::cpu::{pin_current_thread, CpuSet};
use corelocal::runtime::{ErrorKind, WorkerStats};
use corelocal::sys::socket;
use std::cell::Cell;
use std::fmt;
use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::mpsc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// How long accepting pauses after accept() fails (EMFILE and friends), as in the runtime.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// On stop, how long a worker keeps accepting before it may stop at an empty queue: time for
/// handshakes in progress when the SYNs started being refused to land in the queue.
pub(crate) const DRAIN_QUIESCE: Duration = Duration::from_millis(100);
/// While draining the accept queue, how often it is checked for emptiness.
const DRAIN_POLL: Duration = Duration::from_millis(5);

/// Who a worker is: handed to the per-worker service factories of [`crate::http`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    /// The worker's index (0-based, in the order of the CPU set).
    pub index: usize,
    /// The CPU the worker's thread is pinned to.
    pub cpu: usize,
    /// The server's bound addresses.
    pub local_addrs: Vec<SocketAddr>,
}

pub(crate) struct WorkerSetup {
    pub(crate) info: WorkerInfo,
    pub(crate) listeners: Vec<OwnedFd>,
    pub(crate) stats: Arc<WorkerStats>,
    pub(crate) all_stats: Stats,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) limits: Limits,
    /// The balancer (`None`: off, or nothing to balance).
    pub(crate) balance: Option<Arc<balance::Shared>>,
}

type Ready = mpsc::Sender<(usize, io::Result<()>)>;

/// The worker thread: pin, build the runtime, own the listeners, run `f`, wind down.
pub(crate) fn run<F, Fut>(setup: WorkerSetup, f: Arc<F>, ready: Ready) -> io::Result<()>
where
    F: Fn(WorkerCtx) -> Fut,
    Fut: Future<Output = io::Result<()>> + 'static,
{
    let index = setup.info.index;
    let ready = &ready;
    let fail = |e: io::Error, what: &str| {
        let e = io::Error::new(e.kind(), format!("{what}: {e}"));
        let _ = ready.send((index, Err(io::Error::new(e.kind(), e.to_string()))));
        Err(e)
    };
    // Counted alive from here; dropped (a return or a panic): the balancer sees it stopped.
    let _alive = setup.balance.clone().map(|b| Alive::new(b, index));
    if let Err(e) = pin_current_thread(&CpuSet::single(setup.info.cpu)) {
        return fail(e, &format!("pin to CPU {}", setup.info.cpu));
    }
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_io().enable_time();
    if let Some(b) = &setup.balance {
        // The liveness the monitor reads: parked = waiting for events; each park and unpark is
        // one turn of the loop, so a handler that blocks the thread freezes the count.
        let (p, u) = (b.clone(), b.clone());
        builder
            .on_thread_park(move || p.parked(index))
            .on_thread_unpark(move || u.unparked(index));
    }
    let rt = match builder.build() {
        Ok(rt) => rt,
        Err(e) => return fail(e, "building the current-thread runtime"),
    };
    let local = tokio::task::LocalSet::new();
    let result = local.block_on(&rt, async move {
        let mut listeners = Vec::with_capacity(setup.listeners.len());
        for fd in setup.listeners {
            // The duplicate owns its descriptor; the socket stays in the reuseport group.
            let std = std::net::TcpListener::from(fd);
            let l = std
                .set_nonblocking(true)
                .and_then(|()| TcpListener::from_std(std));
            match l {
                Ok(l) => listeners.push(l),
                Err(e) => return fail(e, "registering the listener with tokio"),
            }
        }
        let _ = ready.send((index, Ok(())));
        let ctx = WorkerCtx {
            inner: Rc::new(Inner {
                info: setup.info,
                listeners,
                track: Rc::new(Track {
                    open: Cell::new(0),
                    closed: Notify::new(),
                    stats: setup.stats,
                }),
                all_stats: setup.all_stats,
                stop: setup.stop,
                limits: setup.limits,
                drain: Cell::new(None),
                accept_done: Cell::new(false),
                next_listener: Cell::new(0),
                thief: setup.balance.map(|b| Thief::new(index, b)),
            }),
        };
        let served = f(ctx.clone()).await;
        ctx.wind_down().await;
        served
    });
    // Dropping the LocalSet and the runtime cancels what is left (past the drain deadline).
    drop(local);
    drop(rt);
    result
}

/// A worker thread alive for the balancer while this lives.
struct Alive {
    shared: Arc<balance::Shared>,
    worker: usize,
}

impl Alive {
    fn new(shared: Arc<balance::Shared>, worker: usize) -> Alive {
        shared.started();
        Alive { shared, worker }
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.shared.exited(self.worker);
    }
}

/// The phases of a stop, fixed when it begins.
#[derive(Debug, Clone, Copy)]
struct Drain {
    /// Before this, keep accepting even at an empty queue.
    quiet_at: Instant,
    /// Stop accepting at this time even if the queue never empties.
    until: Instant,
    /// Connections still open at this time are dropped.
    deadline: Instant,
}

/// Open connections of one worker.
struct Track {
    open: Cell<usize>,
    closed: Notify,
    stats: Arc<WorkerStats>,
}

struct Inner {
    info: WorkerInfo,
    listeners: Vec<TcpListener>,
    track: Rc<Track>,
    all_stats: Stats,
    stop: watch::Receiver<bool>,
    limits: Limits,
    drain: Cell<Option<Drain>>,
    accept_done: Cell<bool>,
    next_listener: Cell<usize>,
    /// Stealing from busy workers (`None`: balance off).
    thief: Option<Thief>,
}

/// What the closure given to [`Server::serve`](crate::Server::serve) /
/// [`Server::start`](crate::Server::start) gets, once per worker, on the worker's thread: its
/// listener(s), CPU and index, counted accepts with the zero-loss stop, and the stop signal.
/// Cheap to clone; `!Send` (it belongs to its worker's thread).
#[derive(Clone)]
pub struct WorkerCtx {
    inner: Rc<Inner>,
}

impl fmt::Debug for WorkerCtx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerCtx")
            .field("index", &self.inner.info.index)
            .field("cpu", &self.inner.info.cpu)
            .finish()
    }
}

impl WorkerCtx {
    /// The worker's index.
    pub fn index(&self) -> usize {
        self.inner.info.index
    }

    /// The CPU this worker's thread is pinned to.
    pub fn cpu(&self) -> usize {
        self.inner.info.cpu
    }

    /// Index, CPU and addresses.
    pub fn info(&self) -> &WorkerInfo {
        &self.inner.info
    }

    /// The worker's listener of the first address, a `tokio::net::TcpListener` (a duplicate
    /// descriptor of the listener group's socket). Accepting from it directly bypasses the
    /// counters and the drain of [`WorkerCtx::accept`]; count such connections with
    /// [`WorkerCtx::track`].
    pub fn listener(&self) -> &TcpListener {
        &self.inner.listeners[0]
    }

    /// The worker's listeners, one per address.
    pub fn listeners(&self) -> &[TcpListener] {
        &self.inner.listeners
    }

    /// Every worker's counters.
    pub fn stats(&self) -> &Stats {
        &self.inner.all_stats
    }

    pub(crate) fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// Whether the server is stopping.
    pub fn is_stopping(&self) -> bool {
        *self.inner.stop.borrow()
    }

    /// Resolves when the server starts stopping (at once if it has).
    pub fn stopping(&self) -> impl Future<Output = ()> + 'static {
        let mut stop = self.inner.stop.clone();
        async move {
            // An error means the server is gone: stopping too.
            let _ = stop.wait_for(|s| *s).await;
        }
    }

    /// Counts `n` completed requests on this worker (the [`crate::http`] helpers do).
    pub fn record_requests(&self, n: u64) {
        self.inner.track.stats.requests(n);
    }

    /// Counts an error on this worker (the [`crate::http`] helpers do).
    pub fn record_error(&self, kind: ErrorKind) {
        self.inner.track.stats.error(kind);
    }

    /// The next connection from this worker's listeners, counted (accepted; local when the
    /// socket's `SO_INCOMING_CPU` is this worker's CPU; open until the [`Stream`] drops).
    /// Accept errors are counted and retried after a pause. At the connection limit it waits
    /// for a connection to close (the rest wait in the kernel's queue).
    ///
    /// Once the server stops it keeps accepting until the queues stay empty (new SYNs are
    /// refused meanwhile with eBPF steering), then returns `None` for good: end the accept
    /// loop there and let the connections finish.
    pub async fn accept(&self) -> Option<(Stream, SocketAddr)> {
        let inner = &*self.inner;
        loop {
            if inner.accept_done.get() {
                return None;
            }
            if inner.track.open.get() >= inner.limits.conns_per_worker_max {
                inner.track.stats.conn_limit();
                let closed = inner.track.closed.notified();
                match inner.drain.get() {
                    None => tokio::select! {
                        _ = closed => {}
                        _ = self.stopping() => self.begin_drain(),
                    },
                    Some(d) => {
                        if self.drain_done(d) {
                            continue;
                        }
                        tokio::select! {
                            _ = closed => {}
                            _ = tokio::time::sleep(DRAIN_POLL) => {}
                        }
                    }
                }
                continue;
            }
            if let Some(c) = self.steal_turn().await {
                return Some(c);
            }
            match inner.drain.get() {
                None => {
                    tokio::select! {
                        biased;
                        _ = self.stopping() => self.begin_drain(),
                        r = self.accept_any() => {
                            if let Some(c) = self.on_accept(r, None).await {
                                return Some(c);
                            }
                        }
                        _ = self.steal_wake() => {}
                    }
                }
                Some(d) => {
                    if self.drain_done(d) {
                        continue;
                    }
                    tokio::select! {
                        r = self.accept_any() => {
                            if let Some(c) = self.on_accept(r, None).await {
                                return Some(c);
                            }
                        }
                        _ = tokio::time::sleep(DRAIN_POLL) => {}
                        _ = self.steal_wake() => {}
                    }
                }
            }
        }
    }

    /// Counts a connection accepted some other way (e.g. from [`WorkerCtx::listener`]) like
    /// [`WorkerCtx::accept`] does and wraps it.
    pub fn track(&self, stream: TcpStream) -> Stream {
        self.track_from(stream, None)
    }

    /// Counts a connection from this worker's queue (`victim` `None`) or stolen from
    /// `victim`'s, and wraps it.
    fn track_from(&self, stream: TcpStream, victim: Option<usize>) -> Stream {
        let incoming_cpu = socket::incoming_cpu(stream.as_raw_fd())
            .ok()
            .and_then(|c| usize::try_from(c).ok());
        let local = incoming_cpu == Some(self.inner.info.cpu);
        let track = &self.inner.track;
        track.stats.accepted(local, victim.is_some());
        match (victim, &self.inner.thief) {
            (Some(v), _) => track.stats.stole_from(v),
            (None, Some(t)) => t.record_local(),
            (None, None) => {}
        }
        track.open.set(track.open.get() + 1);
        Stream {
            io: stream,
            track: track.clone(),
            incoming_cpu,
        }
    }

    /// Whether the accept phase of the stop is over (and marks it so).
    fn drain_done(&self, d: Drain) -> bool {
        let now = Instant::now();
        if now >= d.until || (now >= d.quiet_at && self.queues_empty()) {
            self.inner.accept_done.set(true);
            return true;
        }
        false
    }

    fn begin_drain(&self) {
        if self.inner.drain.get().is_some() {
            return;
        }
        let now = Instant::now();
        let timeout = self.inner.limits.drain_timeout;
        self.inner.drain.set(Some(Drain {
            quiet_at: now + self.inner.limits.accept_quiesce.min(timeout / 2),
            until: now + timeout / 2,
            deadline: now + timeout,
        }));
    }

    fn queues_empty(&self) -> bool {
        self.inner
            .listeners
            .iter()
            .all(|l| socket::listen_queue(l.as_raw_fd()).map_or(true, |q| q.len == 0))
    }

    fn accept_any(&self) -> impl Future<Output = io::Result<(TcpStream, SocketAddr)>> + '_ {
        poll_fn(move |cx| self.poll_accept_any(cx))
    }

    /// A connection from this worker's queues if one is there now (never waits).
    fn accept_ready(
        &self,
    ) -> impl Future<Output = Option<io::Result<(TcpStream, SocketAddr)>>> + '_ {
        poll_fn(move |cx| match self.poll_accept_any(cx) {
            Poll::Ready(r) => Poll::Ready(Some(r)),
            Poll::Pending => Poll::Ready(None),
        })
    }

    fn poll_accept_any(&self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
        let inner = &*self.inner;
        let n = inner.listeners.len();
        let start = inner.next_listener.get();
        for i in 0..n {
            let k = (start + i) % n;
            if let Poll::Ready(r) = inner.listeners[k].poll_accept(cx) {
                inner.next_listener.set((k + 1) % n);
                return Poll::Ready(r);
            }
        }
        Poll::Pending
    }

    /// Resolves when the balancer asks this worker to steal (never with balance off).
    async fn steal_wake(&self) {
        match &self.inner.thief {
            Some(t) => t.woken().await,
            None => std::future::pending().await,
        }
    }

    /// While another worker is busy and this one is not: one connection from a busy worker's
    /// queue, or from this worker's own when the 5:1 share says so (Affinity-Accept §3.3.1).
    /// `None`: nothing to steal now, or take the own queue's next connection.
    async fn steal_turn(&self) -> Option<(Stream, SocketAddr)> {
        let thief = self.inner.thief.as_ref()?;
        if !thief.should_steal() {
            return None;
        }
        if let Some(v) = thief.steal_due() {
            if let r @ Some(_) = thief.steal_from(v, true).transpose() {
                return self.on_accept_stolen(r?).await;
            }
        }
        if let Some(r) = self.accept_ready().await {
            return self.on_accept(r, None).await;
        }
        match thief.steal_any() {
            Ok(None) => None,
            r => self.on_accept_stolen(r.transpose()?).await,
        }
    }

    async fn on_accept_stolen(
        &self,
        r: io::Result<balance::Stolen>,
    ) -> Option<(Stream, SocketAddr)> {
        // A steal is a plain accept(2), outside tokio's accounting: spend the task's budget as
        // tokio's own accept does, so a long queue is taken over several turns of the loop and
        // the connections already taken get served in between.
        tokio::task::coop::consume_budget().await;
        let r = r.and_then(|s| {
            s.stream.set_nonblocking(true)?;
            Ok((TcpStream::from_std(s.stream)?, s.peer, s.victim))
        });
        match r {
            Ok((stream, peer, victim)) => self.on_accept(Ok((stream, peer)), Some(victim)).await,
            Err(e) => self.on_accept(Err(e), None).await,
        }
    }

    async fn on_accept(
        &self,
        r: io::Result<(TcpStream, SocketAddr)>,
        victim: Option<usize>,
    ) -> Option<(Stream, SocketAddr)> {
        match r {
            Ok((stream, peer)) => {
                let s = self.track_from(stream, victim);
                if self.inner.drain.get().is_some() {
                    self.inner.track.stats.drain_accepted();
                }
                Some((s, peer))
            }
            // The peer gave up before we accepted: nothing to count.
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => None,
            Err(_) => {
                self.inner.track.stats.error(ErrorKind::Accept);
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                None
            }
        }
    }

    /// After the worker's future ended: wait for its connections to close — until the drain
    /// deadline once the server stops.
    async fn wind_down(&self) {
        let track = &self.inner.track;
        loop {
            if track.open.get() == 0 {
                return;
            }
            let closed = track.closed.notified();
            match self.inner.drain.get() {
                None => tokio::select! {
                    _ = closed => {}
                    _ = self.stopping() => self.begin_drain(),
                },
                Some(d) => tokio::select! {
                    _ = closed => {}
                    _ = tokio::time::sleep_until(d.deadline) => return,
                },
            }
        }
    }
}

/// An accepted connection: a `tokio::net::TcpStream` that counts its bytes and, when dropped,
/// its close. Implements tokio's `AsyncRead` and `AsyncWrite` (wrap it in
/// `hyper_util::rt::TokioIo` for hyper). `!Send`: it stays on its worker's thread.
pub struct Stream {
    io: TcpStream,
    track: Rc<Track>,
    incoming_cpu: Option<usize>,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("io", &self.io)
            .field("incoming_cpu", &self.incoming_cpu)
            .finish()
    }
}

impl Stream {
    /// The CPU that processed the connection's packets when it was accepted
    /// (`SO_INCOMING_CPU`; `None` if unknown).
    pub fn incoming_cpu(&self) -> Option<usize> {
        self.incoming_cpu
    }

    /// The socket.
    pub fn get_ref(&self) -> &TcpStream {
        &self.io
    }

    /// The socket, mutably.
    pub fn get_mut(&mut self) -> &mut TcpStream {
        &mut self.io
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let t = &self.track;
        t.open.set(t.open.get().saturating_sub(1));
        t.stats.closed();
        t.closed.notify_waiters();
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            this.track.stats.bytes_in(n as u64);
        }
        r
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            this.track.stats.bytes_out(n as u64);
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            this.track.stats.bytes_out(n as u64);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
