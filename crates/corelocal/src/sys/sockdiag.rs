//! Listening TCP sockets of the calling thread's network namespace via `NETLINK_SOCK_DIAG`
//! (inet_diag dump filtered to TCP_LISTEN). The kernel walks only the listening hash, where
//! `/proc/net/tcp` walks the whole established hash (on this machine kind 262,144 buckets,
//! ~18 ms per pass), so this is the cheap way to re-scan listeners often.

use rustix::net::{netlink, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, OwnedFd};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const TCP_LISTEN: u32 = 10;
/// `struct nlmsghdr`.
const NLMSG_HDR_BYTES: usize = 16;
/// `struct inet_diag_msg`.
const DIAG_MSG_BYTES: usize = 72;
/// Most listeners returned (per family).
pub const LISTENERS_MAX: usize = 65_536;

/// One listening socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiagListener {
    /// Socket inode.
    pub inode: u64,
    /// Local address.
    pub addr: SocketAddr,
    /// Socket cookie.
    pub cookie: u64,
    /// Connections waiting in its accept queue (`idiag_rqueue` = `sk_ack_backlog`).
    pub queue_len: u32,
    /// The queue's room (`idiag_wqueue` = `sk_max_ack_backlog`, the backlog given to listen).
    pub queue_cap: u32,
}

/// All listening TCP sockets (IPv4 and IPv6) of this network namespace.
pub fn tcp_listeners() -> io::Result<Vec<DiagListener>> {
    let mut out = Vec::new();
    DiagSocket::new()?.listeners(&mut out)?;
    Ok(out)
}

/// A sock_diag socket kept open for repeated dumps (a balancer reads every listener's queue
/// each millisecond), in the network namespace it was opened in.
#[derive(Debug)]
pub struct DiagSocket {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl DiagSocket {
    /// A socket in the calling thread's network namespace.
    pub fn new() -> io::Result<DiagSocket> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC,
            Some(netlink::SOCK_DIAG),
        )?;
        Ok(DiagSocket {
            fd,
            buf: vec![0u8; 64 * 1024],
        })
    }

    /// A socket in the network namespace of process `pid` (opened by a short-lived thread
    /// that enters it; needs CAP_SYS_ADMIN over that namespace). The socket answers for that
    /// namespace for as long as it lives.
    pub fn in_netns_of(pid: u32) -> io::Result<DiagSocket> {
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
        std::thread::scope(|s| {
            s.spawn(|| {
                rustix::thread::move_into_link_name_space(
                    ns.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )?;
                DiagSocket::new()
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("sock_diag namespace thread panicked")))
        })
    }

    /// Appends every listening TCP socket (IPv4 and IPv6), with its queue, to `out`.
    pub fn listeners(&mut self, out: &mut Vec<DiagListener>) -> io::Result<()> {
        for family in [libc::AF_INET, libc::AF_INET6] {
            dump(&self.fd, &mut self.buf, family as u8, out)?;
        }
        Ok(())
    }
}

fn dump(fd: &OwnedFd, buf: &mut [u8], family: u8, out: &mut Vec<DiagListener>) -> io::Result<()> {
    let mut req = [0u8; NLMSG_HDR_BYTES + 56];
    let len = req.len() as u32;
    req[0..4].copy_from_slice(&len.to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // struct inet_diag_req_v2: family, protocol, ext, pad, states, sockid (zero = any).
    req[16] = family;
    req[17] = libc::IPPROTO_TCP as u8;
    req[20..24].copy_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
    // Unconnected and unbound: a plain send goes to the kernel.
    rustix::net::send(fd, &req, SendFlags::empty())?;
    loop {
        let (n, _) = rustix::net::recv(fd, &mut buf[..], RecvFlags::empty())?;
        if n == 0 {
            return Ok(());
        }
        let mut at = 0;
        while at + NLMSG_HDR_BYTES <= n {
            let h = &buf[at..n];
            let len = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]) as usize;
            let kind = u16::from_ne_bytes([h[4], h[5]]);
            if len < NLMSG_HDR_BYTES || len > h.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "sock_diag: bad netlink message length",
                ));
            }
            match kind {
                NLMSG_DONE => return Ok(()),
                NLMSG_ERROR => {
                    let errno = i32::from_ne_bytes([h[16], h[17], h[18], h[19]]);
                    return Err(io::Error::from_raw_os_error(-errno));
                }
                SOCK_DIAG_BY_FAMILY
                    if len >= NLMSG_HDR_BYTES + DIAG_MSG_BYTES && out.len() < LISTENERS_MAX * 2 =>
                {
                    if let Some(l) = parse_diag_msg(&h[NLMSG_HDR_BYTES..len]) {
                        out.push(l);
                    }
                }
                _ => {}
            }
            at += (len + 3) & !3;
        }
    }
}

/// Parses a `struct inet_diag_msg`.
pub fn parse_diag_msg(m: &[u8]) -> Option<DiagListener> {
    if m.len() < DIAG_MSG_BYTES {
        return None;
    }
    let family = m[0] as i32;
    let port = u16::from_be_bytes([m[4], m[5]]);
    let mut src = [0u8; 16];
    src.copy_from_slice(&m[8..24]);
    let mut cookie = [0u8; 8];
    cookie.copy_from_slice(&m[44..52]);
    let word = |at: usize| u32::from_ne_bytes([m[at], m[at + 1], m[at + 2], m[at + 3]]);
    let inode = word(68) as u64;
    let addr = match family {
        libc::AF_INET => SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::new(src[0], src[1], src[2], src[3]),
            port,
        )),
        libc::AF_INET6 => SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(src), port, 0, 0)),
        _ => return None,
    };
    Some(DiagListener {
        inode,
        addr,
        cookie: u64::from_ne_bytes(cookie),
        queue_len: word(56),
        queue_cap: word(60),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::socket::{self, ListenOptions};
    use std::os::fd::AsRawFd;

    #[test]
    fn finds_our_listener_with_its_inode_and_cookie() {
        let l = socket::listen(
            "127.0.0.1:0".parse().unwrap(),
            ListenOptions {
                reuseport: true,
                incoming_cpu: None,
                backlog: 8,
                defer_accept_s: None,
            },
        )
        .unwrap();
        let addr = socket::local_addr(l.as_raw_fd()).unwrap();
        let inode = std::fs::read_link(format!("/proc/self/fd/{}", l.as_raw_fd()))
            .unwrap()
            .to_string_lossy()
            .trim_start_matches("socket:[")
            .trim_end_matches(']')
            .parse::<u64>()
            .unwrap();
        let all = tcp_listeners().unwrap();
        let me = all.iter().find(|d| d.inode == inode).expect("listed");
        assert_eq!(me.addr, addr);
        assert_eq!(
            me.cookie,
            crate::sys::pidfd::socket_cookie(l.as_raw_fd()).unwrap()
        );
        assert_eq!((me.queue_len, me.queue_cap), (0, 8));
        // Two connections wait unaccepted: the queue says so, from a kept socket.
        let _c1 = std::net::TcpStream::connect(addr).unwrap();
        let _c2 = std::net::TcpStream::connect(addr).unwrap();
        let mut diag = DiagSocket::in_netns_of(std::process::id()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let mut all = Vec::new();
            diag.listeners(&mut all).unwrap();
            let me = all.iter().find(|d| d.inode == inode).expect("listed");
            if me.queue_len == 2 || std::time::Instant::now() > deadline {
                assert_eq!(me.queue_len, 2);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
