//! [`Server`]: binds the listener group, starts one pinned worker per CPU, stops gracefully.

use super::backend::Wake;
use super::handler::Service;
use super::stats::{Snapshot, WorkerStats};
use super::worker::{Worker, WorkerSetup};
use super::Limits;
use crate::cpu::{pin_current_thread, CpuSet};
use crate::listen::{ActiveSteering, GroupConfig, ListenError, ListenerGroup, Mode};
use crate::sys::epoll::{EpollBackend, PoolConfig};
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
    /// io_uring when the kernel allows it, else epoll.
    Auto,
}

impl FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "epoll" => Ok(BackendKind::Epoll),
            "auto" => Ok(BackendKind::Auto),
            "uring" => Err("the io_uring backend is not built yet; use epoll or auto".into()),
            _ => Err(format!(
                "unknown backend {s:?} (expected epoll, uring or auto)"
            )),
        }
    }
}

/// Everything a server needs besides its service.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Addresses, mode and steering; `worker_cpus` gets filled from `cpus`.
    pub listen: GroupConfig,
    /// The backend.
    pub backend: BackendKind,
    /// Limits.
    pub limits: Limits,
}

impl ServerConfig {
    /// One worker per CPU of `cpus`, listening on `addrs` in `mode`, default limits.
    pub fn new(addrs: Vec<SocketAddr>, cpus: &CpuSet, mode: Mode) -> ServerConfig {
        ServerConfig {
            listen: GroupConfig::new(addrs, cpus.iter().collect(), mode),
            backend: BackendKind::Auto,
            limits: Limits::default(),
        }
    }
}

/// Why a server could not start.
#[derive(Debug)]
pub enum ServerError {
    /// Binding the listeners failed.
    Listen(ListenError),
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
            ServerError::Worker { worker, source } => write!(f, "worker {worker}: {source}"),
        }
    }
}

impl std::error::Error for ServerError {}

/// A running server.
pub struct Server {
    group: Arc<ListenerGroup>,
    stats: Vec<Arc<WorkerStats>>,
    stop: Arc<AtomicBool>,
    wakers: Vec<Arc<dyn Wake>>,
    threads: Vec<JoinHandle<io::Result<()>>>,
    backend: &'static str,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("addrs", &self.group.local_addrs())
            .field("workers", &self.stats.len())
            .finish()
    }
}

impl Server {
    /// Binds and starts the workers.
    pub fn start<S: Service>(config: ServerConfig, service: Arc<S>) -> Result<Server, ServerError> {
        config
            .limits
            .validate()
            .map_err(|m| ServerError::Listen(ListenError::Config(m)))?;
        let group =
            Arc::new(ListenerGroup::bind(config.listen.clone()).map_err(ServerError::Listen)?);
        let stop = Arc::new(AtomicBool::new(false));
        let workers = group.workers();
        let stats: Vec<Arc<WorkerStats>> = (0..workers).map(|_| Arc::default()).collect();
        let (ready_tx, ready_rx) = mpsc::channel();
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
                limits: config.limits,
            };
            let ready = ready_tx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("corelocal-w{index}"))
                .spawn(move || run_worker(setup, ready))
                .map_err(|source| ServerError::Worker {
                    worker: index,
                    source,
                })?;
            threads.push(thread);
        }
        drop(ready_tx);
        let mut wakers: Vec<Option<Arc<dyn Wake>>> = (0..workers).map(|_| None).collect();
        let mut failure = None;
        for _ in 0..workers {
            match ready_rx.recv() {
                Ok((index, Ok(waker))) => wakers[index] = Some(waker),
                Ok((index, Err(source))) => {
                    failure = Some(ServerError::Worker {
                        worker: index,
                        source,
                    })
                }
                Err(_) => break,
            }
        }
        let server = Server {
            group,
            stats,
            stop,
            wakers: wakers.into_iter().flatten().collect(),
            threads,
            backend: "epoll",
        };
        if let Some(e) = failure {
            server.stop();
            let _ = server.join();
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
        Snapshot::from_workers(
            self.stats
                .iter()
                .enumerate()
                .map(|(w, s)| s.snapshot(w, self.group.worker_cpu(w)))
                .collect(),
        )
    }

    /// Asks every worker to stop: accepting stops, requests in progress finish (bounded by the
    /// drain timeout), then the workers exit.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            w.wake();
        }
    }

    /// Waits for every worker to exit; the first worker error, if any.
    pub fn join(self) -> io::Result<()> {
        let mut result = Ok(());
        for t in self.threads {
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

type Ready = mpsc::Sender<(usize, io::Result<Arc<dyn Wake>>)>;

fn run_worker<S: Service>(setup: WorkerSetup<S>, ready: Ready) -> io::Result<()> {
    let index = setup.index;
    let started = pin_current_thread(&CpuSet::single(setup.cpu))
        .map_err(|e| io::Error::new(e.kind(), format!("pin to CPU {}: {e}", setup.cpu)))
        .and_then(|()| {
            EpollBackend::new(PoolConfig {
                bufs: setup.limits.recv_bufs,
                buf_bytes: setup.limits.recv_buf_bytes,
            })
        });
    match started {
        Ok(backend) => {
            use super::backend::Backend;
            let _ = ready.send((index, Ok(backend.waker())));
            drop(ready);
            Worker::new(setup, backend).run()
        }
        Err(e) => {
            let kind = e.kind();
            let _ = ready.send((index, Err(e)));
            Err(io::Error::new(kind, "worker failed to start"))
        }
    }
}
