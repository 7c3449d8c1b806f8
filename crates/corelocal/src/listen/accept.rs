//! Taking one connection from a listener: [`accept`] and the [`Accepted`] connection.

use crate::sys::socket;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Accepts one pending connection from `listener` (non-blocking): the connection, the peer,
/// and the CPU that processed its last packet (`SO_INCOMING_CPU`, `None` if unknown).
pub fn accept(listener: RawFd) -> io::Result<Accepted> {
    let (fd, peer) = socket::accept(listener)?;
    let incoming_cpu = socket::incoming_cpu(fd.as_raw_fd())
        .ok()
        .and_then(|c| usize::try_from(c).ok());
    Ok(Accepted {
        fd,
        peer,
        incoming_cpu,
    })
}

/// A connection taken from a listener.
#[derive(Debug)]
pub struct Accepted {
    /// The connected socket (non-blocking).
    pub fd: OwnedFd,
    /// The client's address.
    pub peer: Option<SocketAddr>,
    /// `SO_INCOMING_CPU` of the connection.
    pub incoming_cpu: Option<usize>,
}
