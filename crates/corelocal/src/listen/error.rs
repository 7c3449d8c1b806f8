//! Why a group could not be bound or changed: [`ListenError`].

use crate::bpf::BpfError;
use std::fmt;
use std::io;

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
    AddrInUse(std::net::SocketAddr),
}

impl fmt::Display for ListenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenError::Config(m) => f.write_str(m),
            ListenError::Io { context, source } => write!(f, "{context}: {source}"),
            ListenError::Bpf(e) => write!(f, "eBPF steering: {e}"),
            ListenError::AddrInUse(addr) => write!(
                f,
                "{addr} is in use by another listening socket (`ss -ltnp 'sport = :{}'` shows \
                 whose); a running corelocal server is replaced with --takeover",
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
