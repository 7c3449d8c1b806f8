//! Raw TCP SYNs from spoofed IPv4 sources (root, inside a private network namespace): a SYN
//! flood whose SYN-ACKs go nowhere, for the overload tests.
//!
//! Packets are built here (IPv4 header + TCP header with an MSS option, TCP checksum over the
//! pseudo-header) and sent on an `AF_INET, SOCK_RAW, IPPROTO_RAW` socket (header included;
//! the kernel fills the IP checksum). IPPROTO_RAW sockets only send, so the flooder does not
//! also receive a copy of every TCP packet of the namespace.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// IPv4 header (20) + TCP header with one MSS option (24).
pub const SYN_LEN: usize = 44;

/// The Internet checksum (RFC 1071) of `data`, continuing from the partial sum `sum`.
pub fn checksum(data: &[u8], mut sum: u32) -> u16 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    if let [last] = chunks.remainder() {
        sum += (*last as u32) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The partial sum of the TCP pseudo-header (addresses, protocol 6, segment length).
fn pseudo_sum(src: Ipv4Addr, dst: Ipv4Addr, tcp_len: usize) -> u32 {
    let words = [src.octets(), dst.octets()];
    let mut sum = 6 + tcp_len as u32;
    for o in words {
        sum += u16::from_be_bytes([o[0], o[1]]) as u32 + u16::from_be_bytes([o[2], o[3]]) as u32;
    }
    sum
}

/// One SYN from `src` to `dst` with sequence number `seq`.
pub fn syn_packet(src: SocketAddrV4, dst: SocketAddrV4, seq: u32) -> [u8; SYN_LEN] {
    let mut p = [0u8; SYN_LEN];
    p[0] = 0x45; // version 4, 5 words
    p[2..4].copy_from_slice(&(SYN_LEN as u16).to_be_bytes());
    p[6] = 0x40; // don't fragment
    p[8] = 64; // TTL
    p[9] = 6; // TCP
    p[12..16].copy_from_slice(&src.ip().octets());
    p[16..20].copy_from_slice(&dst.ip().octets());
    let t = &mut p[20..];
    t[0..2].copy_from_slice(&src.port().to_be_bytes());
    t[2..4].copy_from_slice(&dst.port().to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[12] = 6 << 4; // data offset: 6 words
    t[13] = 0x02; // SYN
    t[14..16].copy_from_slice(&64240u16.to_be_bytes()); // window
    t[20..24].copy_from_slice(&[2, 4, 0x05, 0xb4]); // MSS 1460
    let sum = checksum(t, pseudo_sum(*src.ip(), *dst.ip(), t.len()));
    t[16..18].copy_from_slice(&sum.to_be_bytes());
    p
}

/// Sends SYNs to one listener from random sources in `10.99.0.0/16` (ports, sequence numbers
/// random too); `sent` counts those the kernel took.
pub struct SynFlood {
    fd: OwnedFd,
    dst: SocketAddrV4,
    rng: u64,
    /// SYNs handed to the kernel.
    pub sent: u64,
}

impl SynFlood {
    /// A raw socket (needs CAP_NET_RAW) aimed at `dst`.
    pub fn new(dst: SocketAddrV4) -> io::Result<SynFlood> {
        // SAFETY: plain socket(2); the result is checked before use.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(SynFlood {
            fd,
            dst,
            rng: 0x9e37_79b9_7f4a_7c15,
            sent: 0,
        })
    }

    fn next(&mut self) -> u64 {
        // xorshift64*: enough to spread sources, ports and sequence numbers.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Sends `n` SYNs, each from a fresh random `10.99.x.y:port`.
    pub fn send(&mut self, n: usize) -> io::Result<()> {
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(self.dst.ip().octets()),
            },
            sin_zero: [0; 8],
        };
        for _ in 0..n {
            let r = self.next();
            let src_ip = Ipv4Addr::new(10, 99, (r >> 8) as u8, (r as u8).max(1));
            let src = SocketAddrV4::new(src_ip, 1024 + (r >> 16) as u16 % 60000);
            let packet = syn_packet(src, self.dst, (r >> 32) as u32);
            // SAFETY: `packet` and `addr` are live for the call and their lengths are passed.
            let rc = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    packet.as_ptr().cast(),
                    packet.len(),
                    0,
                    (&addr as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENOBUFS) {
                    continue; // a full queue drops this one, as a network would
                }
                return Err(e);
            }
            self.sent += 1;
        }
        Ok(())
    }
}
