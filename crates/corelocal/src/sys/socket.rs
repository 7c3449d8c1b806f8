//! Sockets: listener creation with the reuseport options, BPF attach, accept-queue depth via
//! TCP_INFO, accept4, and the byte-moving calls the epoll backend uses.

use super::{cvt, cvt_size};
use crate::bpf::insn::CbpfInsn;
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Shuts down the sending side of a connected socket (`shutdown(fd, SHUT_WR)`): the peer reads
/// the end of the stream after what was sent, and receiving goes on.
pub fn shutdown_write(fd: RawFd) -> io::Result<()> {
    // SAFETY: shutdown(2) on a descriptor; no memory is involved.
    cvt(unsafe { libc::shutdown(fd, libc::SHUT_WR) }).map(|_| ())
}

/// Sets `O_NONBLOCK` on a descriptor.
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl(2) flag calls on an open descriptor; no memory is involved.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) }).map(|_| ())
}

/// `SO_INCOMING_CPU`.
pub const SO_INCOMING_CPU: libc::c_int = 49;
/// `SO_ATTACH_REUSEPORT_CBPF`.
pub const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;
/// `SO_ATTACH_REUSEPORT_EBPF`.
pub const SO_ATTACH_REUSEPORT_EBPF: libc::c_int = 52;
/// `SO_DETACH_REUSEPORT_BPF`.
pub const SO_DETACH_REUSEPORT_BPF: libc::c_int = 68;
/// `TCP_LISTEN` in `tcpi_state`.
const TCP_STATE_LISTEN: u8 = 10;

fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` points to a live T and its exact size is passed.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            value as *const T as *const libc::c_void,
            size_of::<T>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

fn getsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live and `len` holds value's size.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            &mut value as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok(value)
}

/// Options of one listening socket.
#[derive(Debug, Clone, Copy)]
pub struct ListenOptions {
    /// Join a SO_REUSEPORT group.
    pub reuseport: bool,
    /// `SO_INCOMING_CPU` to set before `listen()`.
    pub incoming_cpu: Option<usize>,
    /// The `listen()` backlog.
    pub backlog: u32,
    /// `TCP_DEFER_ACCEPT` in seconds: a connection is queued for accept only once its first
    /// data arrives (or, silent, after about this long).
    pub defer_accept_s: Option<u32>,
}

/// Creates a non-blocking TCP listener bound to `addr`.
pub fn listen(addr: SocketAddr, opts: ListenOptions) -> io::Result<OwnedFd> {
    let domain = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain socket(2) call; the result is checked before use.
    let raw = cvt(unsafe {
        libc::socket(
            domain,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: `raw` is a new descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let one: libc::c_int = 1;
    setsockopt(raw, libc::SOL_SOCKET, libc::SO_REUSEADDR, &one)?;
    if opts.reuseport {
        setsockopt(raw, libc::SOL_SOCKET, libc::SO_REUSEPORT, &one)?;
    }
    if addr.is_ipv6() {
        setsockopt(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, &one)?;
    }
    if let Some(cpu) = opts.incoming_cpu {
        let cpu = cpu as libc::c_int;
        setsockopt(raw, libc::SOL_SOCKET, SO_INCOMING_CPU, &cpu)?;
    }
    if let Some(secs) = opts.defer_accept_s {
        set_defer_accept(raw, secs)?;
    }
    let (storage, len) = sockaddr_from(addr);
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes for this address family.
    cvt(unsafe { libc::bind(raw, &storage as *const _ as *const libc::sockaddr, len) })?;
    let backlog = opts.backlog.clamp(1, i32::MAX as u32) as libc::c_int;
    // SAFETY: plain listen(2) on our socket.
    cvt(unsafe { libc::listen(raw, backlog) })?;
    Ok(fd)
}

/// The local address a socket is bound to.
pub fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: storage is large enough for any address and `len` says so.
    cvt(unsafe { libc::getsockname(fd, storage.as_mut_ptr() as *mut libc::sockaddr, &mut len) })?;
    // SAFETY: zero-initialised, then filled by the kernel.
    sockaddr_to(unsafe { &storage.assume_init() })
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an IP socket"))
}

/// The address of a connected socket's peer.
pub fn peer_addr(fd: RawFd) -> io::Result<SocketAddr> {
    let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: storage is large enough for any address and `len` says so.
    cvt(unsafe { libc::getpeername(fd, storage.as_mut_ptr() as *mut libc::sockaddr, &mut len) })?;
    // SAFETY: zero-initialised, then filled by the kernel.
    sockaddr_to(unsafe { &storage.assume_init() })
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an IP socket"))
}

/// Attaches a classic BPF reuseport program to the group `fd` belongs to.
pub fn attach_reuseport_cbpf(fd: RawFd, prog: &[CbpfInsn]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as libc::c_ushort,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    setsockopt(fd, libc::SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &fprog)
}

/// Attaches an eBPF reuseport program (by descriptor) to the group `fd` belongs to.
pub fn attach_reuseport_ebpf(fd: RawFd, prog_fd: RawFd) -> io::Result<()> {
    setsockopt(fd, libc::SOL_SOCKET, SO_ATTACH_REUSEPORT_EBPF, &prog_fd)
}

/// Detaches the group's reuseport program.
pub fn detach_reuseport_bpf(fd: RawFd) -> io::Result<()> {
    let zero: libc::c_int = 0;
    setsockopt(fd, libc::SOL_SOCKET, SO_DETACH_REUSEPORT_BPF, &zero)
}

/// Sets `TCP_DEFER_ACCEPT` on a listener (0: off). Turning it off does not queue the
/// connections it holds at once: each is queued with its first data, or when its SYN-ACK is
/// sent again and acknowledged.
pub fn set_defer_accept(fd: RawFd, secs: u32) -> io::Result<()> {
    let secs = secs.min(i32::MAX as u32) as libc::c_int;
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT, &secs)
}

/// `SO_INCOMING_CPU` of a socket: the CPU that processed its last received packet (-1 if none).
pub fn incoming_cpu(fd: RawFd) -> io::Result<i32> {
    getsockopt_int(fd, libc::SOL_SOCKET, SO_INCOMING_CPU)
}

/// Checks that `fd` is a listening TCP socket (`SO_TYPE`, `SO_PROTOCOL`, `SO_ACCEPTCONN`) and
/// returns its address family (`SO_DOMAIN`: `AF_INET` or `AF_INET6`) and whether it has
/// `SO_REUSEPORT` set. Used on descriptors received from another process.
pub fn tcp_listener_info(fd: RawFd) -> io::Result<(libc::c_int, bool)> {
    let get = |name| getsockopt_int(fd, libc::SOL_SOCKET, name);
    let invalid = |what: &str| {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            what.to_string(),
        ))
    };
    if get(libc::SO_TYPE)? != libc::SOCK_STREAM || get(libc::SO_PROTOCOL)? != libc::IPPROTO_TCP {
        return invalid("not a TCP socket");
    }
    if get(libc::SO_ACCEPTCONN)? != 1 {
        return invalid("a TCP socket that is not listening");
    }
    let domain = get(libc::SO_DOMAIN)?;
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return invalid("not an IPv4 or IPv6 socket");
    }
    Ok((domain, get(libc::SO_REUSEPORT)? != 0))
}

/// Accept-queue depth of a listener from TCP_INFO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueDepth {
    /// Children ready for accept() (`tcpi_unacked`).
    pub len: u32,
    /// The backlog cap (`tcpi_sacked`); the queue holds cap + 1.
    pub cap: u32,
}

/// Reads a listener's accept-queue depth (`tcpi_unacked` / `tcpi_sacked`).
pub fn listen_queue(fd: RawFd) -> io::Result<QueueDepth> {
    // Only the first 32 bytes of struct tcp_info are needed: state @0, unacked @24, sacked @28.
    let mut info = [0u8; 32];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes; the kernel truncates to that length.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    })?;
    if len < 32 || info[0] != TCP_STATE_LISTEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a listening TCP socket",
        ));
    }
    let word = |at: usize| u32::from_ne_bytes([info[at], info[at + 1], info[at + 2], info[at + 3]]);
    Ok(QueueDepth {
        len: word(24),
        cap: word(28),
    })
}

/// Accepts one connection (non-blocking, close-on-exec), with the peer address.
pub fn accept(listener: RawFd) -> io::Result<(OwnedFd, Option<SocketAddr>)> {
    let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: storage is large enough for any address and `len` says so.
    let raw = cvt(unsafe {
        libc::accept4(
            listener,
            storage.as_mut_ptr() as *mut libc::sockaddr,
            &mut len,
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    })?;
    // SAFETY: a new descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: zero-initialised, then filled by the kernel.
    Ok((fd, sockaddr_to(unsafe { &storage.assume_init() })))
}

/// `recv` into `buf`; 0 = the peer closed its side.
pub fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable for its length.
    cvt_size(unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) })
}

/// `send` of `buf` without SIGPIPE.
pub fn send(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    send_flags(fd, buf, 0)
}

/// `send` with `MSG_MORE`: the data waits for more (here: the close's FIN, which then rides in
/// the same segment).
pub fn send_more(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    send_flags(fd, buf, libc::MSG_MORE)
}

fn send_flags(fd: RawFd, buf: &[u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: `buf` is readable for its length.
    cvt_size(unsafe {
        libc::send(
            fd,
            buf.as_ptr() as *const libc::c_void,
            buf.len(),
            libc::MSG_NOSIGNAL | flags,
        )
    })
}

/// `sendfile` of up to `len` bytes of `file` from `offset`.
pub fn sendfile(fd: RawFd, file: RawFd, offset: u64, len: usize) -> io::Result<usize> {
    let mut off = offset as libc::off_t;
    // SAFETY: both descriptors are open; `off` is a live offset variable.
    cvt_size(unsafe { libc::sendfile(fd, file, &mut off, len) })
}

/// Sets `SO_LINGER {on, 0}` so that close sends RST (tests use it to count resets).
pub fn set_linger_zero(fd: RawFd) -> io::Result<()> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, &linger)
}

/// Sets `TCP_NODELAY`.
pub fn set_nodelay(fd: &impl AsRawFd) -> io::Result<()> {
    let one: libc::c_int = 1;
    setsockopt(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_NODELAY, &one)
}

fn sockaddr_from(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in, sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in6, sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

fn sockaddr_to(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(storage as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(storage as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// The running kernel's (major, minor) version from `uname`.
pub fn kernel_version() -> Option<(u32, u32)> {
    // SAFETY: utsname is plain old data; uname fills it.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uts` is a live, writable utsname.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return None;
    }
    let release: String = uts
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect();
    parse_kernel_version(&release)
}

/// Parses "6.18.44-foo" into (6, 18).
pub fn parse_kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Accepts one pending connection from `listener` (non-blocking): the connection, the peer,
/// and the CPU that processed its last packet (`SO_INCOMING_CPU`, `None` if unknown).
pub fn accept_conn(listener: RawFd) -> io::Result<Accepted> {
    let (fd, peer) = accept(listener)?;
    let incoming_cpu = incoming_cpu(fd.as_raw_fd())
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
