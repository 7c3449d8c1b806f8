//! Sockets: listener creation with the reuseport options, BPF attach, accept-queue depth via
//! TCP_INFO, accept4, and the byte-moving calls the epoll backend uses. On `rustix` except the
//! options it does not cover (the reuseport BPF attach and detach, `TCP_DEFER_ACCEPT`, the
//! first bytes of `TCP_INFO`).

use super::cvt;
use crate::bpf::insn::CbpfInsn;
use rustix::net::{self, sockopt, AddressFamily, SendFlags, SocketFlags, SocketType};
use std::io;
use std::mem::size_of;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// The descriptor numbers the callers of `sys` pass, as the borrowed descriptors `rustix`
/// takes.
pub(crate) fn borrow<'a>(fd: RawFd) -> BorrowedFd<'a> {
    // Every function here is called with a descriptor its caller holds open for the duration
    // of the call (a listener of the group, a connection of the epoll backend, a socket
    // received over SCM_RIGHTS); the borrow does not outlive the call.
    // SAFETY: `fd` stays open while the borrow lives (above).
    unsafe { BorrowedFd::borrow_raw(fd) }
}

/// Shuts down the sending side of a connected socket (`shutdown(fd, SHUT_WR)`): the peer reads
/// the end of the stream after what was sent, and receiving goes on.
pub fn shutdown_write(fd: RawFd) -> io::Result<()> {
    Ok(net::shutdown(borrow(fd), net::Shutdown::Write)?)
}

/// Sets `O_NONBLOCK` on a descriptor (`FIONBIO`).
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    Ok(rustix::io::ioctl_fionbio(borrow(fd), true)?)
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
        SocketAddr::V4(_) => AddressFamily::INET,
        SocketAddr::V6(_) => AddressFamily::INET6,
    };
    let flags = SocketFlags::NONBLOCK | SocketFlags::CLOEXEC;
    let fd = net::socket_with(domain, SocketType::STREAM, flags, None)?;
    sockopt::set_socket_reuseaddr(&fd, true)?;
    if opts.reuseport {
        sockopt::set_socket_reuseport(&fd, true)?;
    }
    if addr.is_ipv6() {
        sockopt::set_ipv6_v6only(&fd, true)?;
    }
    if let Some(cpu) = opts.incoming_cpu {
        sockopt::set_socket_incoming_cpu(&fd, cpu as u32)?;
    }
    if let Some(secs) = opts.defer_accept_s {
        set_defer_accept(fd.as_raw_fd(), secs)?;
    }
    net::bind(&fd, &addr)?;
    net::listen(&fd, opts.backlog.clamp(1, i32::MAX as u32) as i32)?;
    Ok(fd)
}

/// Whether a TCP socket could bind `addr` on its own, without `SO_REUSEPORT`: false when
/// another socket listens there (with `SO_REUSEPORT` a server would join that socket's group
/// and share its connections, if both belong to the same user). Sockets in TIME_WAIT do not
/// count (`SO_REUSEADDR`); port 0 is always free.
pub fn tcp_addr_free(addr: SocketAddr) -> io::Result<bool> {
    if addr.port() == 0 {
        return Ok(true);
    }
    let domain = match addr {
        SocketAddr::V4(_) => AddressFamily::INET,
        SocketAddr::V6(_) => AddressFamily::INET6,
    };
    let fd = net::socket_with(domain, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    sockopt::set_socket_reuseaddr(&fd, true)?;
    if addr.is_ipv6() {
        // As `listen` binds it.
        sockopt::set_ipv6_v6only(&fd, true)?;
    }
    match net::bind(&fd, &addr) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::ADDRINUSE) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// An address as a std one (IPv4 or IPv6 only).
fn ip_addr(addr: Option<net::SocketAddrAny>) -> io::Result<SocketAddr> {
    addr.and_then(|a| SocketAddr::try_from(a).ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an IP socket"))
}

/// The local address a socket is bound to.
pub fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    ip_addr(Some(net::getsockname(borrow(fd))?))
}

/// The address of a connected socket's peer.
pub fn peer_addr(fd: RawFd) -> io::Result<SocketAddr> {
    ip_addr(net::getpeername(borrow(fd))?)
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
    Ok(sockopt::socket_incoming_cpu(borrow(fd))? as i32)
}

/// Checks that `fd` is a listening TCP socket (`SO_TYPE`, `SO_PROTOCOL`, `SO_ACCEPTCONN`) and
/// returns its address family (`SO_DOMAIN`: `AF_INET` or `AF_INET6`) and whether it has
/// `SO_REUSEPORT` set. Used on descriptors received from another process.
pub fn tcp_listener_info(fd: RawFd) -> io::Result<(libc::c_int, bool)> {
    let fd = borrow(fd);
    let invalid = |what: &str| {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            what.to_string(),
        ))
    };
    let tcp = sockopt::socket_protocol(fd)? == Some(net::ipproto::TCP);
    if sockopt::socket_type(fd)? != SocketType::STREAM || !tcp {
        return invalid("not a TCP socket");
    }
    if !sockopt::socket_acceptconn(fd)? {
        return invalid("a TCP socket that is not listening");
    }
    let domain = match sockopt::socket_domain(fd)? {
        AddressFamily::INET => libc::AF_INET,
        AddressFamily::INET6 => libc::AF_INET6,
        _ => return invalid("not an IPv4 or IPv6 socket"),
    };
    Ok((domain, sockopt::socket_reuseport(fd)?))
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
    let flags = SocketFlags::NONBLOCK | SocketFlags::CLOEXEC;
    let (fd, peer) = net::acceptfrom_with(borrow(listener), flags)?;
    Ok((fd, peer.and_then(|a| SocketAddr::try_from(a).ok())))
}

/// `recv` into `buf`; 0 = the peer closed its side.
pub fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    Ok(net::recv(borrow(fd), buf, net::RecvFlags::empty())?.0)
}

/// `send` of `buf` without SIGPIPE.
pub fn send(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    send_flags(fd, buf, SendFlags::empty())
}

/// `send` with `MSG_MORE`: the data waits for more (here: the close's FIN, which then rides in
/// the same segment).
pub fn send_more(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    send_flags(fd, buf, SendFlags::MORE)
}

fn send_flags(fd: RawFd, buf: &[u8], flags: SendFlags) -> io::Result<usize> {
    Ok(net::send(borrow(fd), buf, SendFlags::NOSIGNAL | flags)?)
}

/// A `msghdr` with one iovec (the payload) and one control message, in one box so that the
/// pointers inside stay valid while it is handed to the kernel (`sendmsg`, or io_uring's
/// `SENDMSG` until its completion).
pub struct ControlSend {
    hdr: libc::msghdr,
    iov: libc::iovec,
    /// The cmsghdr and its data (u64s: the alignment `cmsghdr` needs).
    cmsg: [u64; 8],
    payload: Vec<u8>,
}

impl std::fmt::Debug for ControlSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlSend")
            .field("payload_len", &self.payload.len())
            .finish_non_exhaustive()
    }
}

// SAFETY: the raw pointers inside point into the box itself (its iovec, its control buffer,
// its payload's heap buffer); nothing else shares them.
unsafe impl Send for ControlSend {}

impl ControlSend {
    /// The message for `payload` with `control` (data of at most 32 bytes).
    pub fn new(control: &crate::backend::ControlMessage, payload: Vec<u8>) -> Box<ControlSend> {
        let (level, kind, data) = (control.level, control.kind, &control.data[..]);
        assert!(
            data.len() <= crate::backend::ControlMessage::DATA_BYTES_MAX,
            "control data too long"
        );
        // SAFETY: all-zero is a valid msghdr and iovec (null pointers, zero lengths).
        let mut msg = Box::new(unsafe {
            ControlSend {
                hdr: std::mem::zeroed(),
                iov: std::mem::zeroed(),
                cmsg: [0; 8],
                payload,
            }
        });
        let m = &mut *msg;
        m.iov.iov_base = m.payload.as_mut_ptr().cast();
        m.iov.iov_len = m.payload.len();
        m.hdr.msg_iov = &mut m.iov;
        m.hdr.msg_iovlen = 1;
        m.hdr.msg_control = m.cmsg.as_mut_ptr().cast();
        // The buffer (64 bytes) holds a cmsghdr (16) and 32 bytes of data.
        // SAFETY: CMSG_FIRSTHDR is then non-null and CMSG_DATA has room for `data`.
        unsafe {
            m.hdr.msg_controllen = libc::CMSG_SPACE(data.len() as u32) as usize;
            let c = libc::CMSG_FIRSTHDR(&m.hdr);
            (*c).cmsg_level = level;
            (*c).cmsg_type = kind;
            (*c).cmsg_len = libc::CMSG_LEN(data.len() as u32) as usize;
            std::ptr::copy_nonoverlapping(data.as_ptr(), libc::CMSG_DATA(c), data.len());
        }
        msg
    }

    /// The `msghdr` to hand to the kernel.
    pub fn hdr(&self) -> *const libc::msghdr {
        &self.hdr
    }

    /// The payload (given back once sent).
    pub fn into_payload(self) -> Vec<u8> {
        self.payload
    }

    /// The payload's length.
    pub fn len(&self) -> usize {
        self.payload.len()
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.payload.is_empty()
    }

    /// `sendmsg` of the whole message, nonblocking, without SIGPIPE.
    pub fn send(&self, fd: RawFd) -> io::Result<usize> {
        // SAFETY: `hdr` points into this live box (see `new`).
        let n = unsafe { libc::sendmsg(fd, &self.hdr, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        cvt(n as libc::c_int).map(|_| n as usize)
    }
}

/// `sendfile` of up to `len` bytes of `file` from `offset`.
pub fn sendfile(fd: RawFd, file: RawFd, offset: u64, len: usize) -> io::Result<usize> {
    let mut off = offset;
    Ok(rustix::fs::sendfile(
        borrow(fd),
        borrow(file),
        Some(&mut off),
        len,
    )?)
}

/// Sets `SO_LINGER {on, 0}` so that close sends RST (tests use it to count resets).
pub fn set_linger_zero(fd: RawFd) -> io::Result<()> {
    Ok(sockopt::set_socket_linger(
        borrow(fd),
        Some(std::time::Duration::ZERO),
    )?)
}

/// Sets `TCP_NODELAY`.
pub fn set_nodelay(fd: &impl AsFd) -> io::Result<()> {
    Ok(sockopt::set_tcp_nodelay(fd, true)?)
}

/// Sets `IP_BIND_ADDRESS_NO_PORT` (`rustix` has no setter): a later `bind` to port 0 leaves
/// the port to `connect`, so a client gets the ephemeral ports per destination, not per
/// source address.
pub fn set_bind_address_no_port(fd: &impl AsFd) -> io::Result<()> {
    let one: libc::c_int = 1;
    setsockopt(
        fd.as_fd().as_raw_fd(),
        libc::IPPROTO_IP,
        libc::IP_BIND_ADDRESS_NO_PORT,
        &one,
    )
}

/// A blocking TCP connection from `src` to `dst`, its port chosen at connect time
/// (`IP_BIND_ADDRESS_NO_PORT`, where the kernel has it: else the bind picks one).
pub fn connect_from(src: Ipv4Addr, dst: SocketAddrV4) -> io::Result<TcpStream> {
    let fd = net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    let _ = set_bind_address_no_port(&fd);
    net::bind(&fd, &SocketAddrV4::new(src, 0))?;
    net::connect(&fd, &dst)?;
    Ok(TcpStream::from(fd))
}

/// The running kernel's (major, minor) version from `uname`.
pub fn kernel_version() -> Option<(u32, u32)> {
    parse_kernel_version(&rustix::system::uname().release().to_string_lossy())
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

/// `setsockopt` with a value given as bytes (a socket option the runtime sets for a handler:
/// [`crate::backend::SocketOption`]).
pub fn set_option_bytes(fd: RawFd, level: i32, name: i32, value: &[u8]) -> io::Result<()> {
    // SAFETY: `value` is a live slice and its exact length is passed.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            value.as_ptr().cast::<libc::c_void>(),
            value.len() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// Attaches the upper-layer protocol `name` (`tls` for kTLS) to connected socket `fd`. The
/// kernel loads its module on demand; `ENOENT` says it has none by that name.
pub fn set_tcp_ulp(fd: RawFd, name: &[u8; 3]) -> io::Result<()> {
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_ULP, name)
}
