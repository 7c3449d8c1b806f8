//! The per-core runtime (MegaPipe §3.2–3.4): one worker thread per CPU, pinned, owning its
//! listener, backend, connections and buffers; nothing connection-related is shared.
//!
//! - [`handler`]: the sans-IO application API ([`Service`], [`Handler`], [`Output`]).
//! - [`handoff`]: what moves to a successor process besides the listeners (connections, the
//!   service's state).
//! - [`balance`]: the Affinity-Accept balancer in the worker loop (sample, watch, wake, steal,
//!   migrate).
//! - [`backend`]: the submit / reap / wait interface every backend implements (a leaf module of
//!   the crate, re-exported here: `sys` implements it without importing the runtime).
//! - [`worker`]: the loop that drives a handler over a backend.
//! - [`server`]: binding, starting, stats, graceful stop; [`Server::run_until_signal`] runs
//!   a server until SIGINT or SIGTERM; [`Server::wait_for_stop`] is its wait, for callers
//!   with checks of their own between.
//! - [`stats`]: per-worker counters on their own cache lines.
//! - [`upgrade`]: binary upgrades: the upgrade socket that hands the listening sockets to a
//!   successor process, and the move of connections and state that follows both forms.
//! - [`prometheus`]: the counters in Prometheus text (the metric names every front end uses).
//! - [`netstat`]: the namespace's listen-path counters (SYN cookies, queue overflows).

mod accept;
pub use crate::backend;
pub mod balance;
pub mod defer;
pub mod handler;
pub mod handoff;
pub mod log;
pub mod netstat;
pub mod notify;
pub mod prometheus;
pub mod server;
pub mod stats;
mod until_signal;
pub mod upgrade;
pub mod worker;

pub use backend::{Backend, Completion, Op};
pub use handler::{
    Chunk, CloseReason, ConnInfo, ControlMessage, FileRegion, Handler, Next, Notifier, Output,
    OutputFront, Service, SocketOption, Step,
};
pub use netstat::{NetCounters, NetSampler};
pub use server::{
    BackendKind, ReleaseHandle, Server, ServerConfig, ServerError, ShutdownReport, StatsReader,
    DEFER_ACCEPT_S_RECOMMENDED,
};
pub use stats::{Batching, ErrorKind, Snapshot, WorkerSnapshot, WorkerStats};
pub use until_signal::{StopReason, Termination};
// Binary upgrades (the upgrade socket, moving connections) are `upgrade::…`: not re-exported
// here, so that the serving API above reads first.

use std::time::Duration;

/// A limit on everything a connection or worker can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Unconsumed input per connection; reaching it without progress closes as too large.
    pub input_bytes_max: usize,
    /// Pending output per connection above which reading pauses (resumes at half).
    pub output_bytes_max: usize,
    /// Open connections per worker; accepting pauses at the limit.
    pub conns_per_worker_max: usize,
    /// With the balancer on: connections a worker may take from its own queue per loop turn
    /// (its allowance is topped up to this once per turn); the rest stay in the kernel's
    /// accept queue, visible to busy detection and stealable. Paces accepting by how fast the
    /// worker turns its loop, never by what its connections do (see the worker's accept path).
    pub accept_batch_max: usize,
    /// A connection with no traffic for this long is closed.
    pub idle_timeout: Duration,
    /// On stop, requests in progress get this long to finish.
    pub drain_timeout: Duration,
    /// On stop, how long a worker keeps accepting before it may stop at an empty queue: time
    /// for handshakes done before the stop to land there (100 ms; the server raises it to
    /// cover `TCP_DEFER_ACCEPT`'s period, see `ListenerGroup::stop_quiesce`). At most half
    /// the drain timeout is used.
    pub accept_quiesce: Duration,
    /// Receive buffers per worker.
    pub recv_bufs: u32,
    /// Bytes per receive buffer.
    pub recv_buf_bytes: usize,
    /// Lingering close (nginx's `lingering_time`): the longest a closing connection whose
    /// peer may still be sending is read and discarded after its last answer. Zero turns
    /// lingering off: such a close then happens with the last answer (and the kernel resets
    /// the connection if input is left unread).
    pub linger_time: Duration,
    /// Lingering close (nginx's `lingering_timeout`): a lingering connection closes when the
    /// peer stays silent this long.
    pub linger_timeout: Duration,
    /// Lingering close: at most this many bytes are read and discarded before the close.
    pub linger_bytes_max: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            input_bytes_max: 64 * 1024,
            output_bytes_max: 1 << 20,
            conns_per_worker_max: 100_000,
            accept_batch_max: 16,
            idle_timeout: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(5),
            accept_quiesce: Duration::from_millis(100),
            recv_bufs: 256,
            recv_buf_bytes: 16 * 1024,
            linger_time: Duration::from_secs(30),
            linger_timeout: Duration::from_secs(5),
            linger_bytes_max: 16 << 20,
        }
    }
}

/// A [`Limits`] value that cannot work: which field, and what it must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitsError {
    /// The field of [`Limits`], e.g. `idle_timeout`.
    pub field: &'static str,
    /// What it must be, e.g. `must be positive`.
    pub reason: &'static str,
}

impl std::fmt::Display for LimitsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid limit Limits::{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for LimitsError {}

impl Limits {
    /// Checks the limits make sense: every size, count and the idle timeout is positive.
    pub fn validate(&self) -> Result<(), LimitsError> {
        let zero = [
            ("input_bytes_max", self.input_bytes_max == 0),
            ("output_bytes_max", self.output_bytes_max == 0),
            ("conns_per_worker_max", self.conns_per_worker_max == 0),
            ("accept_batch_max", self.accept_batch_max == 0),
            ("recv_bufs", self.recv_bufs == 0),
            ("recv_buf_bytes", self.recv_buf_bytes == 0),
            ("idle_timeout", self.idle_timeout.is_zero()),
            ("linger_timeout", self.linger_timeout.is_zero()),
        ];
        match zero.into_iter().find(|(_, is_zero)| *is_zero) {
            Some((field, _)) => Err(LimitsError {
                field,
                reason: "is 0, must be positive",
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod limits_tests {
    use super::*;

    #[test]
    fn a_zero_limit_is_named_by_its_field() {
        assert_eq!(Limits::default().validate(), Ok(()));
        let idle = Limits {
            idle_timeout: Duration::ZERO,
            ..Limits::default()
        };
        let e = idle.validate().unwrap_err();
        assert_eq!(e.field, "idle_timeout");
        assert_eq!(
            e.to_string(),
            "invalid limit Limits::idle_timeout: is 0, must be positive"
        );
        let batch = Limits {
            accept_batch_max: 0,
            ..Limits::default()
        };
        assert_eq!(batch.validate().unwrap_err().field, "accept_batch_max");
    }
}
