//! Whether the kernel offers kTLS: the `tls` upper-layer protocol that takes TLS record
//! encryption (TLS_TX) and decryption (TLS_RX) into the kernel after a user-space handshake.
//!
//! Detection: [`tls_ulp`] says whether the ULP is there; [`tx_accepts`] whether the kernel takes
//! a given TLS_TX setting (a cipher its build may lack), each tried on a throwaway loopback
//! connection. The TLS service asks both at start and hands TLS 1.3 records to the kernel
//! (TX) for the ciphers it takes; the options themselves are set by the runtime
//! (`Output::push_socket_options`).

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

/// `SOL_TLS`: the level of kTLS's socket options.
pub const SOL_TLS: i32 = 282;
/// `TLS_TX`: hands the sending direction's records to the kernel (a `tls12_crypto_info_*`).
pub const TLS_TX: i32 = 1;
/// `TLS_RX`: hands the receiving direction's records to the kernel (the same struct); the
/// socket's next unread byte must start a record.
pub const TLS_RX: i32 = 2;

/// Whether the kernel takes `crypto_info` (a `struct tls12_crypto_info_*`, e.g. all-zero keys
/// for a cipher) as TLS_TX: attaches the `tls` ULP to a throwaway loopback connection and sets
/// it there. The error says why not (ENOENT: no `tls` ULP; EINVAL or ENOPROTOOPT: a cipher
/// or version this kernel's TLS lacks).
pub fn tx_accepts(crypto_info: &[u8]) -> io::Result<()> {
    accepts(TLS_TX, crypto_info)
}

/// As [`tx_accepts`], for TLS_RX.
pub fn rx_accepts(crypto_info: &[u8]) -> io::Result<()> {
    accepts(TLS_RX, crypto_info)
}

fn accepts(direction: i32, crypto_info: &[u8]) -> io::Result<()> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let client = TcpStream::connect(listener.local_addr()?)?;
    let (_server, _) = listener.accept()?;
    super::socket::set_tcp_ulp(client.as_raw_fd(), b"tls")?;
    super::socket::set_option_bytes(client.as_raw_fd(), SOL_TLS, direction, crypto_info)
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

    #[test]
    fn a_setting_no_kernel_takes_is_refused() {
        // Version 0 and cipher 0: refused by a kernel with kTLS (EINVAL), or ENOENT without.
        let err = tx_accepts(&[0; 40]).unwrap_err();
        assert!(err.raw_os_error().is_some(), "{err}");
    }
}
