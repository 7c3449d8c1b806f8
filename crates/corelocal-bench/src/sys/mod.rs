//! Every syscall and `unsafe` block of the load generator: sockets, epoll, io_uring, limits.
//! The calls go through `rustix` (and the `io-uring` crate for the ring); what neither covers
//! (`IP_BIND_ADDRESS_NO_PORT`) is `corelocal::sys`'s. The one `unsafe` block is the io_uring
//! backend's push of submission entries, which point into buffers the backend owns.

pub mod epoll;
pub mod uring;

use rustix::io::Errno;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, OwnedFd};

/// The errno of a failed call.
fn errno(e: Errno) -> i32 {
    e.raw_os_error()
}

/// A `sockaddr_in` for `a` (what the io_uring backend's connect and bind requests point at).
pub fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Sets SO_LINGER {on, 0}: close() sends RST and leaves no TIME_WAIT.
pub fn set_linger0(fd: impl AsFd) -> Result<(), i32> {
    rustix::net::sockopt::set_socket_linger(fd, Some(std::time::Duration::ZERO)).map_err(errno)
}

/// Creates a TCP socket with the per-connection options, bound to `src` (port chosen at
/// connect time thanks to IP_BIND_ADDRESS_NO_PORT, so 28k ports per source address).
pub fn client_socket(
    nonblock: bool,
    src: Option<Ipv4Addr>,
    linger0: bool,
    nodelay: bool,
) -> Result<OwnedFd, i32> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let flags = SocketFlags::CLOEXEC
        | if nonblock {
            SocketFlags::NONBLOCK
        } else {
            SocketFlags::empty()
        };
    let fd = rustix::net::socket_with(AddressFamily::INET, SocketType::STREAM, flags, None)
        .map_err(errno)?;
    // On an error the descriptor is closed when `fd` drops.
    if nodelay {
        rustix::net::sockopt::set_tcp_nodelay(&fd, true).map_err(errno)?;
    }
    if linger0 {
        set_linger0(&fd)?;
    }
    if let Some(ip) = src {
        corelocal::sys::socket::set_bind_address_no_port(&fd)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        rustix::net::bind(&fd, &SocketAddrV4::new(ip, 0)).map_err(errno)?;
    }
    Ok(fd)
}

/// Starts a non-blocking connect; Ok(()) also when it is in progress.
pub fn connect(fd: impl AsFd, sa: &SocketAddrV4) -> Result<(), i32> {
    match rustix::net::connect(fd, sa) {
        Ok(()) | Err(Errno::INPROGRESS) => Ok(()),
        Err(e) => Err(errno(e)),
    }
}

/// SO_ERROR of a socket (0: no error).
pub fn so_error(fd: impl AsFd) -> i32 {
    match rustix::net::sockopt::socket_error(fd) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) | Err(e) => errno(e),
    }
}

/// Reads into `buf`: Ok(n) (0 = EOF), Err(errno).
pub fn read(fd: impl AsFd, buf: &mut [u8]) -> Result<usize, i32> {
    rustix::io::read(fd, buf).map_err(errno)
}

/// Sends `buf` without SIGPIPE: Ok(n), Err(errno).
pub fn send(fd: impl AsFd, buf: &[u8]) -> Result<usize, i32> {
    rustix::net::send(fd, buf, rustix::net::SendFlags::NOSIGNAL).map_err(errno)
}

/// Raises RLIMIT_NOFILE's soft limit to the hard limit; returns the new soft limit.
pub fn raise_nofile() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut rl = getrlimit(Resource::Nofile);
    rl.current = rl.maximum;
    let _ = setrlimit(Resource::Nofile, rl);
    // None is RLIM_INFINITY.
    rl.current.unwrap_or(libc::RLIM_INFINITY)
}

/// Clock ticks per second of /proc CPU times.
pub fn clk_tck() -> u64 {
    match rustix::param::clock_ticks_per_second() {
        0 => 100,
        t => t,
    }
}

/// Sends SIGTERM (or SIGKILL when `kill`) to a process this crate started.
pub fn signal(pid: u32, kill: bool) {
    use rustix::process::{kill_process, Pid, Signal};
    let sig = if kill { Signal::KILL } else { Signal::TERM };
    if let Some(pid) = Pid::from_raw(pid as i32) {
        let _ = kill_process(pid, sig);
    }
}

/// CPU time the calling thread has used (ns): CLOCK_THREAD_CPUTIME_ID.
pub fn thread_cpu_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
