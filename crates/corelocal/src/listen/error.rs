//! Why a group could not be bound or changed: [`ListenError`].

use super::{Mode, Steering};
use crate::bpf::BpfError;
use std::fmt;
use std::io;
use std::net::SocketAddr;

/// Why a group could not be bound or changed.
#[derive(Debug)]
pub enum ListenError {
    /// The configuration is unusable.
    Config(String),
    /// A socket call failed.
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: io::Error,
    },
    /// Loading or updating the eBPF program failed.
    Bpf(BpfError),
    /// Another socket listens on this address (see [`super::GroupConfig::join_existing`]).
    AddrInUse(SocketAddr),
    /// This process's configuration differs from the running server's whose sockets it
    /// would adopt (every difference: see [`super::handover::Layout::check_matches`]).
    Mismatch(LayoutMismatch),
    /// A socket received from the running server is not what its layout announces.
    BadSocket(BadSocket),
}

/// One way a configuration differs from a running server's (ours, theirs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// The listen addresses.
    Addrs(Vec<SocketAddr>, Vec<SocketAddr>),
    /// The workers' CPUs (`--cpus` × `--workers-per-cpu`).
    WorkerCpus(Vec<usize>, Vec<usize>),
    /// The mode.
    Mode(Mode, Mode),
    /// The steering method this process forces, and the one the running server uses.
    Steering(Steering, Steering),
}

/// Every difference between a configuration and a running server's (never empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutMismatch(pub Vec<Mismatch>);

/// What is wrong with the sockets received from a running server.
#[derive(Debug)]
pub enum BadSocket {
    /// Not as many as the layout announces.
    Count {
        /// Sockets received.
        received: usize,
        /// Sockets the layout announces.
        announced: usize,
    },
    /// Socket `index` for `addr` is not a listening TCP socket of its family, bound there, in a
    /// reuseport group where the mode needs one.
    Socket {
        /// Its index among the address's sockets.
        index: usize,
        /// The address the layout gives it.
        addr: SocketAddr,
        /// What is wrong.
        problem: SocketProblem,
    },
}

/// What is wrong with one received socket ([`BadSocket::Socket`]).
#[derive(Debug)]
pub enum SocketProblem {
    /// Asking the kernel about it failed (not a socket, not TCP, not listening).
    Query(io::Error),
    /// Another address family than the layout's.
    Family,
    /// Bound elsewhere.
    BoundTo(SocketAddr),
    /// Without `SO_REUSEPORT`, in a mode with a socket per worker.
    NotReuseport,
}

fn list<T: fmt::Display>(items: &[T]) -> String {
    let parts: Vec<String> = items.iter().map(|i| i.to_string()).collect();
    format!("[{}]", parts.join(","))
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let this = "this process";
        let running = "the running server";
        match self {
            Mismatch::Addrs(ours, theirs) => write!(
                f,
                "listen addresses: {this} {}, {running} {}",
                list(ours),
                list(theirs)
            ),
            Mismatch::WorkerCpus(ours, theirs) => write!(
                f,
                "worker CPUs (one per worker, in order): {this} {}, {running} {}",
                list(ours),
                list(theirs)
            ),
            Mismatch::Mode(ours, theirs) => write!(f, "mode: {this} {ours}, {running} {theirs}"),
            Mismatch::Steering(ours, theirs) => {
                write!(f, "steering: {this} {ours}, {running} {theirs}")
            }
        }
    }
}

impl fmt::Display for LayoutMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(Mismatch::to_string).collect();
        write!(
            f,
            "configuration differs from the running server's: {}",
            parts.join("; ")
        )
    }
}

impl fmt::Display for BadSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadSocket::Count {
                received,
                announced,
            } => write!(
                f,
                "received {received} sockets, the layout announces {announced}"
            ),
            BadSocket::Socket {
                index,
                addr,
                problem,
            } => write!(f, "socket {index} for {addr}: {problem}"),
        }
    }
}

impl fmt::Display for SocketProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SocketProblem::Query(e) => write!(f, "{e}"),
            SocketProblem::Family => f.write_str("address family differs from the layout's"),
            SocketProblem::BoundTo(bound) => {
                write!(f, "bound to {bound}, not where the layout says")
            }
            SocketProblem::NotReuseport => f.write_str("SO_REUSEPORT is not set"),
        }
    }
}

impl fmt::Display for ListenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenError::Config(m) => f.write_str(m),
            ListenError::Io { context, source } => write!(f, "{context}: {source}"),
            ListenError::Bpf(e) => write!(f, "eBPF steering: {e}"),
            ListenError::Mismatch(m) => write!(f, "{m}"),
            ListenError::BadSocket(b) => write!(f, "{b}"),
            ListenError::AddrInUse(addr) => write!(
                f,
                "{addr} is in use by another listening socket (`ss -ltnp 'sport = :{}'` shows \
                 whose); a running corelocal server is replaced by taking its sockets over \
                 (a binary upgrade), not by a second bind",
                addr.port()
            ),
        }
    }
}

impl std::error::Error for ListenError {}

impl From<BpfError> for ListenError {
    fn from(e: BpfError) -> Self {
        ListenError::Bpf(e)
    }
}

pub(super) fn io_context(context: impl Into<String>) -> impl FnOnce(io::Error) -> ListenError {
    let context = context.into();
    move |source| ListenError::Io { context, source }
}
