//! Serving a hyper or tower service (an axum `Router`) on every worker, HTTP/1.1.
//!
//! Each worker builds its own service with the factory (`Fn(&WorkerInfo) -> S`, called on the
//! worker's thread, so `S` need not be `Send`), accepts with [`WorkerCtx::accept`] and serves
//! each connection in a `spawn_local` task with hyper's HTTP/1 server (keep-alive and
//! pipelining). Requests are counted per worker; connection errors by kind (a request that
//! does not parse, a head over the input limit, a head not received within the idle timeout,
//! I/O).
//!
//! On stop, every connection gets hyper's graceful shutdown: an idle keep-alive connection
//! closes, a request in progress is answered with `Connection: close`. A connection whose first
//! request has not arrived yet gets 100 ms for it (hyper would close it at once), as does one
//! taken from the accept queue after the stop began, which is served without keep-alive; what
//! is left at the drain deadline is dropped.

use crate::server::{Error, Running, Server};
use crate::worker::{WorkerCtx, WorkerInfo, DRAIN_QUIESCE};
use corelocal::runtime::{ErrorKind, ShutdownReport};
use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::cell::Cell;
use std::error::Error as StdError;
use std::io;
use std::rc::Rc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;

type BoxError = Box<dyn StdError + Send + Sync>;

/// Whether a connection's first request arrived (hyper closes a connection that saw no bytes
/// yet at once on graceful shutdown, so the stop waits for it a little).
#[derive(Default)]
struct FirstRequest {
    seen: Cell<bool>,
    notify: Notify,
}

/// A hyper service counted per request.
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    ctx: WorkerCtx,
    first: Rc<FirstRequest>,
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Counted<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>>,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        self.ctx.record_requests(1);
        if !self.first.seen.replace(true) {
            self.first.notify.notify_one();
        }
        self.inner.call(req)
    }
}

/// Serves one accepted connection with `service` until it closes; on stop, gracefully (see
/// the module docs). Counts requests and errors on `ctx`'s worker.
///
/// `stream` is the accepted [`Stream`](crate::Stream) or anything wrapping it — a TLS stream from
/// tokio-rustls, for example (the `https` example): the connection stays counted open for as
/// long as the wrapper holds the `Stream`.
pub async fn serve_connection<I, S, B>(ctx: WorkerCtx, stream: I, service: S)
where
    I: AsyncRead + AsyncWrite + Unpin + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Error: Into<BoxError>,
    B: Body + 'static,
    B::Error: Into<BoxError>,
{
    let limits = ctx.limits();
    // Taken from the queue after the stop began: one request, answered with `close`.
    let drained = ctx.is_stopping();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .keep_alive(!drained)
        .header_read_timeout(limits.idle_timeout)
        .max_header_size(limits.input_bytes_max)
        .max_buf_size(limits.input_bytes_max);
    let first = Rc::new(FirstRequest::default());
    let counted = Counted {
        inner: service,
        ctx: ctx.clone(),
        first: first.clone(),
    };
    let conn = builder.serve_connection(TokioIo::new(stream), counted);
    tokio::pin!(conn);
    let result = async {
        if !drained {
            tokio::select! {
                r = conn.as_mut() => return r,
                _ = ctx.stopping() => {}
            }
        }
        // Stopping. A connection whose first request is still on its way gets the quiesce
        // time for it to land; one that stays silent is closed, as the runtime does.
        if !first.seen.get() {
            tokio::select! {
                r = conn.as_mut() => return r,
                _ = first.notify.notified() => {}
                _ = tokio::time::sleep(DRAIN_QUIESCE) => {}
            }
        }
        // Idle keep-alive: closes now; a request in progress: answered with `close`.
        conn.as_mut().graceful_shutdown();
        conn.await
    }
    .await;
    if let Err(e) = result {
        ctx.record_error(error_kind(&e));
    }
}

/// The counter an HTTP/1 connection error goes to.
fn error_kind(e: &hyper::Error) -> ErrorKind {
    if e.is_parse_too_large() {
        ErrorKind::TooLarge
    } else if e.is_parse() || e.is_parse_status() {
        ErrorKind::BadRequest
    } else if e.is_timeout() {
        ErrorKind::IdleTimeout
    } else {
        ErrorKind::Io
    }
}

/// A worker's whole life with a hyper service: accept, serve each connection in a
/// `spawn_local` task, end when the stop drained the queue.
pub async fn serve_worker<S, B>(ctx: WorkerCtx, service: S) -> io::Result<()>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Clone + 'static,
    S::Error: Into<BoxError>,
    B: Body + 'static,
    B::Error: Into<BoxError>,
{
    while let Some((stream, _peer)) = ctx.accept().await {
        tokio::task::spawn_local(serve_connection(ctx.clone(), stream, service.clone()));
    }
    Ok(())
}

impl Server {
    /// Starts serving a hyper service on every worker (`make` builds each worker's, on its
    /// thread); returns at once. See [`Server::start`].
    pub fn start_hyper<F, S, B>(self, make: F) -> Result<Running, Error>
    where
        F: Fn(&WorkerInfo) -> S + Send + Sync + 'static,
        S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Clone + 'static,
        S::Error: Into<BoxError>,
        B: Body + 'static,
        B::Error: Into<BoxError>,
    {
        self.start(move |ctx| {
            let service = make(ctx.info());
            serve_worker(ctx, service)
        })
    }

    /// Serves a hyper service on every worker until SIGINT/SIGTERM, then stops without losing
    /// a queued connection. See [`Server::serve`].
    pub fn serve_hyper<F, S, B>(self, make: F) -> Result<ShutdownReport, Error>
    where
        F: Fn(&WorkerInfo) -> S + Send + Sync + 'static,
        S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Clone + 'static,
        S::Error: Into<BoxError>,
        B: Body + 'static,
        B::Error: Into<BoxError>,
    {
        self.serve(move |ctx| {
            let service = make(ctx.info());
            serve_worker(ctx, service)
        })
    }

    /// Starts serving a tower service — an axum `Router` — on every worker; returns at once.
    pub fn start_tower<F, S, B>(self, make: F) -> Result<Running, Error>
    where
        F: Fn(&WorkerInfo) -> S + Send + Sync + 'static,
        S: tower_service::Service<Request<Incoming>, Response = Response<B>> + Clone + 'static,
        S::Error: Into<BoxError>,
        B: Body + 'static,
        B::Error: Into<BoxError>,
    {
        self.start_hyper(move |info| TowerToHyperService::new(make(info)))
    }

    /// Serves a tower service — an axum `Router` — on every worker until SIGINT/SIGTERM, then
    /// stops without losing a queued connection:
    /// `server.serve_tower(move |_| router.clone())`.
    pub fn serve_tower<F, S, B>(self, make: F) -> Result<ShutdownReport, Error>
    where
        F: Fn(&WorkerInfo) -> S + Send + Sync + 'static,
        S: tower_service::Service<Request<Incoming>, Response = Response<B>> + Clone + 'static,
        S::Error: Into<BoxError>,
        B: Body + 'static,
        B::Error: Into<BoxError>,
    {
        self.serve_hyper(move |info| TowerToHyperService::new(make(info)))
    }
}
