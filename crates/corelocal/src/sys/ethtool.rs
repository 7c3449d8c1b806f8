//! Network-device ioctls: interface index by name (`SIOCGIFINDEX`, on `rustix`) and the
//! ethtool ioctl (`SIOCETHTOOL`, hand-written: `rustix` has no ethtool commands) for the driver
//! name, channel counts, the RSS hash key and the RSS indirection table (read and write), and
//! the GRO and TSO switches. `corelocal-tune`'s read-only probe uses the readers;
//! `corelocal-sweep` the switches.
//!
//! Commands (values from `linux/ethtool.h`): `ETHTOOL_GDRVINFO` 0x03, `ETHTOOL_STSO` 0x1f,
//! `ETHTOOL_GGRO` 0x2b / `ETHTOOL_SGRO` 0x2c, `ETHTOOL_GRXFHINDIR` 0x38 /
//! `ETHTOOL_SRXFHINDIR` 0x39 (table only), `ETHTOOL_GCHANNELS` 0x3c, `ETHTOOL_GRSSH` 0x46
//! (table and key). A driver without the operation answers `EOPNOTSUPP`.

use rustix::net::{AddressFamily, SocketFlags, SocketType};
use serde::Serialize;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GDRVINFO: u32 = 0x03;
const ETHTOOL_STSO: u32 = 0x1f;
const ETHTOOL_GGRO: u32 = 0x2b;
const ETHTOOL_SGRO: u32 = 0x2c;
const ETHTOOL_GRXFHINDIR: u32 = 0x38;
const ETHTOOL_SRXFHINDIR: u32 = 0x39;
const ETHTOOL_GCHANNELS: u32 = 0x3c;
const ETHTOOL_GRSSH: u32 = 0x46;
/// Largest indirection table accepted (drivers use 128 to 2048 entries).
pub const INDIR_MAX: u32 = 65_536;
/// Largest hash key accepted (Toeplitz keys are 40 or 52 bytes).
pub const KEY_MAX: u32 = 1024;
/// `struct ethtool_rxfh` up to `rss_config[]`, in u32 words.
const RXFH_HEADER_WORDS: usize = 6;
/// `struct ethtool_drvinfo` is 196 bytes; `driver[32]` follows `cmd`.
const DRVINFO_WORDS: usize = 49;

/// `struct ifreq` with the `ifr_data` member, padded to the kernel's 40 bytes.
#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

fn check_name(nic: &str) -> io::Result<()> {
    let bytes = nic.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {nic:?}"),
        ));
    }
    Ok(())
}

/// The interface index of `nic` in this network namespace (`SIOCGIFINDEX`, what
/// `if_nametoindex` does).
pub fn ifindex(nic: &str) -> io::Result<u32> {
    check_name(nic)?;
    Ok(rustix::net::netdevice::name_to_index(socket()?, nic)?)
}

/// The socket the device ioctls go through: any AF_INET datagram socket, unbound.
fn socket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Issues `SIOCETHTOOL` on `nic` with `buf` as the command buffer; `buf` starts with the
/// `u32` command and is large enough for what that command reads and writes.
fn ethtool(nic: &str, buf: &mut [u32]) -> io::Result<()> {
    check_name(nic)?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: buf.as_mut_ptr().cast(),
        _pad: [0; 16],
    };
    for (dst, src) in req.name.iter_mut().zip(nic.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    let sock = socket()?;
    // `req` is a NUL-terminated ifreq whose data points to `buf`, sized for the command
    // from the kernel's own reported lengths (checked against limits) and alive during the call.
    // SAFETY: the conditions above hold.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut req as *mut IfReq) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A `struct ethtool_value` command (`cmd`, `data`): the value the kernel answers.
fn value(nic: &str, cmd: u32, data: u32) -> io::Result<u32> {
    debug_assert!(matches!(cmd, ETHTOOL_STSO | ETHTOOL_GGRO | ETHTOOL_SGRO));
    let mut buf = [cmd, data];
    ethtool(nic, &mut buf)?;
    Ok(buf[1])
}

/// Whether GRO is on for `nic` (`ETHTOOL_GGRO`).
pub fn gro(nic: &str) -> io::Result<bool> {
    value(nic, ETHTOOL_GGRO, 0).map(|v| v != 0)
}

/// Turns GRO on or off for `nic` (`ETHTOOL_SGRO`; on a veth it also switches the receive side
/// to NAPI).
pub fn set_gro(nic: &str, on: bool) -> io::Result<()> {
    value(nic, ETHTOOL_SGRO, u32::from(on)).map(|_| ())
}

/// Turns every TSO feature of `nic` on or off (`ETHTOOL_STSO`).
pub fn set_tso(nic: &str, on: bool) -> io::Result<()> {
    value(nic, ETHTOOL_STSO, u32::from(on)).map(|_| ())
}

/// The driver's name (`ETHTOOL_GDRVINFO`), e.g. `virtio_net`, `veth`, `mlx5_core`.
pub fn driver(nic: &str) -> io::Result<String> {
    let mut buf = [0u32; DRVINFO_WORDS];
    buf[0] = ETHTOOL_GDRVINFO;
    ethtool(nic, &mut buf)?;
    let bytes: Vec<u8> = buf[1..9].iter().flat_map(|w| w.to_ne_bytes()).collect();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

/// Channel counts (`ETHTOOL_GCHANNELS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Channels {
    /// Maximum RX-only channels.
    pub max_rx: u32,
    /// Maximum TX-only channels.
    pub max_tx: u32,
    /// Maximum other channels.
    pub max_other: u32,
    /// Maximum combined channels.
    pub max_combined: u32,
    /// Current RX-only channels.
    pub rx: u32,
    /// Current TX-only channels.
    pub tx: u32,
    /// Current other channels.
    pub other: u32,
    /// Current combined channels.
    pub combined: u32,
}

/// The channel counts of `nic` (`ETHTOOL_GCHANNELS`).
pub fn channels(nic: &str) -> io::Result<Channels> {
    let mut buf = [0u32; 9];
    buf[0] = ETHTOOL_GCHANNELS;
    ethtool(nic, &mut buf)?;
    Ok(Channels {
        max_rx: buf[1],
        max_tx: buf[2],
        max_other: buf[3],
        max_combined: buf[4],
        rx: buf[5],
        tx: buf[6],
        other: buf[7],
        combined: buf[8],
    })
}

/// RX queues the RSS table may point at (`ETHTOOL_GCHANNELS`: rx + combined channels).
pub fn rx_queues(nic: &str) -> io::Result<u32> {
    let c = channels(nic)?;
    Ok(c.rx.saturating_add(c.combined))
}

fn too_big(size: u32) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("RSS indirection table of {size} entries exceeds the limit {INDIR_MAX}"),
    )
}

/// `ETHTOOL_GRSSH` with no room for the table and key: their sizes (entries, bytes).
fn rxfh_sizes(nic: &str) -> io::Result<(u32, u32)> {
    let mut head = [0u32; RXFH_HEADER_WORDS];
    head[0] = ETHTOOL_GRSSH;
    ethtool(nic, &mut head)?;
    Ok((head[2], head[3]))
}

/// The RSS configuration read by `ETHTOOL_GRSSH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rxfh {
    /// Indirection table: bucket → RX queue.
    pub indirection: Vec<u32>,
    /// Hash key bytes.
    pub key: Vec<u8>,
    /// Hash function bits (`ETH_RSS_HASH_*`).
    pub hfunc: u8,
}

/// The RSS indirection table, hash key and hash function (`ETHTOOL_GRSSH`). A driver that
/// reports neither a table nor a key (virtio_net without `VIRTIO_NET_F_RSS`) is reported as
/// `EOPNOTSUPP`.
pub fn rxfh(nic: &str) -> io::Result<Rxfh> {
    let (indir, key) = rxfh_sizes(nic)?;
    if indir == 0 && key == 0 {
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    if indir > INDIR_MAX {
        return Err(too_big(indir));
    }
    if key > KEY_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("RSS hash key of {key} bytes exceeds the limit {KEY_MAX}"),
        ));
    }
    let total = 4 * RXFH_HEADER_WORDS + 4 * indir as usize + key as usize;
    let mut buf = vec![0u32; total.div_ceil(4)];
    buf[0] = ETHTOOL_GRSSH;
    buf[2] = indir;
    buf[3] = key;
    ethtool(nic, &mut buf)?;
    let start = RXFH_HEADER_WORDS;
    Ok(Rxfh {
        indirection: buf[start..start + indir as usize].to_vec(),
        key: buf[start + indir as usize..]
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .take(key as usize)
            .collect(),
        hfunc: buf[4].to_ne_bytes()[0],
    })
}

/// The size of the RSS indirection table (`ETHTOOL_GRXFHINDIR` with no room for entries),
/// checked against [`INDIR_MAX`].
fn indir_size(nic: &str) -> io::Result<u32> {
    let mut size_query = [ETHTOOL_GRXFHINDIR, 0];
    ethtool(nic, &mut size_query)?;
    let size = size_query[1];
    if size > INDIR_MAX {
        return Err(too_big(size));
    }
    Ok(size)
}

/// The `size` entries of the RSS indirection table (`ETHTOOL_GRXFHINDIR`).
fn indir_entries(nic: &str, size: u32) -> io::Result<Vec<u32>> {
    let mut buf = vec![0u32; 2 + size as usize];
    buf[0] = ETHTOOL_GRXFHINDIR;
    buf[1] = size;
    ethtool(nic, &mut buf)?;
    Ok(buf.split_off(2))
}

/// The RSS indirection table by `ETHTOOL_GRXFHINDIR` alone (older drivers); may be empty.
pub fn rxfh_indir(nic: &str) -> io::Result<Vec<u32>> {
    let size = indir_size(nic)?;
    indir_entries(nic, size)
}

/// The RSS indirection table (bucket → RX queue): the size from `ETHTOOL_GRSSH`, the entries
/// from `ETHTOOL_GRXFHINDIR`. An empty table (virtio_net without `VIRTIO_NET_F_RSS`) is
/// reported as `EOPNOTSUPP`.
pub fn rss_table(nic: &str) -> io::Result<Vec<u32>> {
    if let Ok((0, _)) = rxfh_sizes(nic) {
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    let size = indir_size(nic)?;
    if size == 0 {
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    indir_entries(nic, size)
}

/// The `ETHTOOL_SRXFHINDIR` command buffer (`struct ethtool_rxfh_indir`) for `table`.
pub fn srxfhindir_buffer(table: &[u32]) -> Vec<u32> {
    let mut buf = Vec::with_capacity(2 + table.len());
    buf.push(ETHTOOL_SRXFHINDIR);
    buf.push(table.len() as u32);
    buf.extend_from_slice(table);
    buf
}

/// Writes the whole RSS indirection table (`ETHTOOL_SRXFHINDIR`; needs CAP_NET_ADMIN). The
/// size must equal the device's; the kernel checks every entry against its RX ring count.
pub fn set_rss_table(nic: &str, table: &[u32]) -> io::Result<()> {
    if table.is_empty() || table.len() > INDIR_MAX as usize {
        return Err(too_big(table.len() as u32));
    }
    ethtool(nic, &mut srxfhindir_buffer(table))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifreq_matches_the_kernel_size() {
        assert!(std::mem::size_of::<IfReq>() >= 40);
    }

    #[test]
    fn srxfhindir_buffer_is_cmd_size_entries() {
        assert_eq!(srxfhindir_buffer(&[0, 1, 1, 0]), vec![0x39, 4, 0, 1, 1, 0]);
    }

    #[test]
    fn bad_names_and_missing_interfaces_are_errors() {
        assert!(ifindex("").is_err());
        assert!(ifindex("a/very/long/interface/name").is_err());
        assert!(ifindex("nosuchif0").is_err());
        assert!(rss_table("nosuchif0").is_err());
        assert!(channels("nosuchif0").is_err());
        assert!(rxfh("nosuchif0").is_err());
        assert!(rxfh_indir("nosuchif0").is_err());
        assert!(channels("").is_err());
        assert!(gro("nosuchif0").is_err());
        assert!(set_tso("", false).is_err());
        assert!(ifindex("lo").unwrap() >= 1);
        assert!(gro("lo").is_ok());
    }
}
