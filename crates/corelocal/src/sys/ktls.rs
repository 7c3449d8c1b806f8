//! Whether the kernel offers kTLS: the `tls` upper-layer protocol that takes TLS record
//! encryption (TLS_TX) and decryption (TLS_RX) into the kernel after a user-space handshake.
//!
//! Detection only: the TLS servers encrypt records in user space on every kernel today, and
//! report this at start so an operator knows which path a kTLS-capable build would take.

use std::io;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;

/// What the kernel offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsUlp {
    /// `tls` is listed in `net.ipv4.tcp_available_ulp` (its module is loaded).
    Loaded,
    /// Not listed, but attaching it to a loopback connection worked (loaded on demand).
    OnDemand,
    /// The kernel has no `tls` ULP (`ENOENT`), or the probe failed: why.
    Absent(String),
}

impl std::fmt::Display for TlsUlp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsUlp::Loaded => write!(f, "kernel tls ULP available (loaded)"),
            TlsUlp::OnDemand => write!(f, "kernel tls ULP available (loaded on demand)"),
            TlsUlp::Absent(why) => write!(f, "no kernel tls ULP ({why})"),
        }
    }
}

/// Checks `net.ipv4.tcp_available_ulp`, then, if `tls` is not there, tries to attach it to a
/// throwaway loopback connection (the kernel only attaches a ULP to a connected socket).
pub fn tls_ulp() -> TlsUlp {
    let listed = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
        .is_ok_and(|s| s.split_whitespace().any(|u| u == "tls"));
    if listed {
        return TlsUlp::Loaded;
    }
    match probe() {
        Ok(()) => TlsUlp::OnDemand,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            TlsUlp::Absent("the kernel has no `tls` module".into())
        }
        Err(e) => TlsUlp::Absent(format!("probe failed: {e}")),
    }
}

fn probe() -> io::Result<()> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let client = TcpStream::connect(listener.local_addr()?)?;
    let (_server, _) = listener.accept()?;
    super::socket::set_tcp_ulp(client.as_raw_fd(), b"tls")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_answers_on_any_kernel() {
        // Which answer depends on the kernel; that it answers without failing does not.
        let found = tls_ulp();
        assert!(!found.to_string().is_empty(), "{found:?}");
    }
}
