//! The ethtool ioctl (`SIOCETHTOOL`): channel counts and the RSS indirection table and key.
//! Every `unsafe` block of the crate is here.
//!
//! Commands used (values from `linux/ethtool.h`): `ETHTOOL_GCHANNELS` 0x3c,
//! `ETHTOOL_GRSSH` 0x46 (table and key), `ETHTOOL_GRXFHINDIR` 0x38 (table only, older
//! drivers). Each is read-only. A driver without the operation answers `EOPNOTSUPP`, reported
//! as [`Probe::Unsupported`].

use crate::state::{Channels, Probe, Rss};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GCHANNELS: u32 = 0x3c;
const ETHTOOL_GRSSH: u32 = 0x46;
const ETHTOOL_GRXFHINDIR: u32 = 0x38;
/// Largest indirection table accepted (drivers use 128 to 2048 entries).
const INDIR_MAX: u32 = 65_536;
/// Largest hash key accepted (Toeplitz keys are 40 or 52 bytes).
const KEY_MAX: u32 = 1024;
/// `struct ethtool_rxfh` up to `rss_config[]`.
const RXFH_HEADER: usize = 24;

/// `struct ifreq` with the `ifr_data` member, padded to the kernel's 40 bytes.
#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes no pointers; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Issues `SIOCETHTOOL` on `nic` with `buf` as the command buffer; `buf` starts with the
/// `u32` command and is large enough for what that command reads and writes.
fn ethtool(nic: &str, buf: &mut [u32]) -> io::Result<()> {
    let bytes = nic.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "bad interface name",
        ));
    }
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: buf.as_mut_ptr().cast(),
        _pad: [0; 16],
    };
    for (dst, src) in req.name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let sock = socket()?;
    // SAFETY: `req` is a valid, NUL-terminated ifreq whose data pointer refers to `buf`, which
    // outlives the call and is sized for the command (callers size it from the kernel's own
    // reported lengths, checked against limits). The kernel reads/writes only within it.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut req as *mut IfReq) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn unsupported<T>(e: io::Error) -> Probe<T> {
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            Probe::Unsupported("the driver has no such operation or an empty table".into())
        }
        Some(libc::ENODEV) => Probe::Unsupported("no such device in this network namespace".into()),
        Some(libc::EPERM) => Probe::NotQueried("permission denied".into()),
        _ => Probe::Unsupported(e.to_string()),
    }
}

/// `ETHTOOL_GCHANNELS`.
pub fn channels(nic: &str) -> Probe<Channels> {
    let mut buf = [0u32; 9];
    buf[0] = ETHTOOL_GCHANNELS;
    match ethtool(nic, &mut buf) {
        Ok(()) => Probe::Ok(Channels {
            max_rx: buf[1],
            max_tx: buf[2],
            max_other: buf[3],
            max_combined: buf[4],
            rx: buf[5],
            tx: buf[6],
            other: buf[7],
            combined: buf[8],
        }),
        Err(e) => unsupported(e),
    }
}

/// The RSS table and key: `ETHTOOL_GRSSH`, falling back to `ETHTOOL_GRXFHINDIR`.
pub fn rss(nic: &str) -> Probe<Rss> {
    match rss_grssh(nic) {
        Ok(r) => Probe::Ok(r),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => match rss_indir(nic) {
            Ok(r) => Probe::Ok(r),
            Err(e) => unsupported(e),
        },
        Err(e) => unsupported(e),
    }
}

fn too_big() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "RSS table or key larger than the tuner's limit",
    )
}

fn rss_grssh(nic: &str) -> io::Result<Rss> {
    let mut head = [0u32; RXFH_HEADER / 4];
    head[0] = ETHTOOL_GRSSH;
    ethtool(nic, &mut head)?;
    let (indir, key) = (head[2], head[3]);
    if indir == 0 && key == 0 {
        // virtio_net without VIRTIO_NET_F_RSS answers with empty sizes.
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    if indir > INDIR_MAX || key > KEY_MAX {
        return Err(too_big());
    }
    let total = RXFH_HEADER + 4 * indir as usize + key as usize;
    let mut buf = vec![0u32; total.div_ceil(4)];
    buf[0] = ETHTOOL_GRSSH;
    buf[2] = indir;
    buf[3] = key;
    ethtool(nic, &mut buf)?;
    let hfunc = buf[4].to_ne_bytes()[0];
    let start = RXFH_HEADER / 4;
    let indirection = buf[start..start + indir as usize].to_vec();
    let key_bytes: Vec<u8> = buf[start + indir as usize..]
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .take(key as usize)
        .collect();
    Ok(Rss {
        indirection,
        key: key_bytes.iter().map(|b| format!("{b:02x}")).collect(),
        hfunc: Some(hfunc),
    })
}

fn rss_indir(nic: &str) -> io::Result<Rss> {
    let mut head = [ETHTOOL_GRXFHINDIR, 0];
    ethtool(nic, &mut head)?;
    let size = head[1];
    if size > INDIR_MAX {
        return Err(too_big());
    }
    let mut buf = vec![0u32; 2 + size as usize];
    buf[0] = ETHTOOL_GRXFHINDIR;
    buf[1] = size;
    ethtool(nic, &mut buf)?;
    Ok(Rss {
        indirection: buf[2..].to_vec(),
        key: String::new(),
        hfunc: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifreq_matches_the_kernel_size() {
        assert!(std::mem::size_of::<IfReq>() >= 40);
    }

    #[test]
    fn unknown_interface_is_reported_not_fatal() {
        assert!(matches!(
            channels("nosuchif0"),
            Probe::Unsupported(_) | Probe::NotQueried(_)
        ));
        assert!(matches!(
            rss("nosuchif0"),
            Probe::Unsupported(_) | Probe::NotQueried(_)
        ));
        assert!(matches!(channels(""), Probe::Unsupported(_)));
    }
}
