//! Every syscall and `unsafe` block of the load generator: sockets, epoll, io_uring, limits.

pub mod epoll;
pub mod uring;

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};

pub(crate) fn cvt_int(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// A `sockaddr_in` for `a`.
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

fn setsockopt_int(fd: i32, level: i32, name: i32, v: i32) -> Result<(), i32> {
    // SAFETY: `v` is a live i32 and its size is passed; fd validity is checked by the kernel.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as u32,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// Sets SO_LINGER {on, 0}: close() sends RST and leaves no TIME_WAIT.
pub fn set_linger0(fd: i32) -> Result<(), i32> {
    let lg = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `lg` is a live linger struct and its exact size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &lg as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as u32,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// Creates a TCP socket with the per-connection options, bound to `src` (port chosen at
/// connect time thanks to IP_BIND_ADDRESS_NO_PORT, so 28k ports per source address).
pub fn client_socket(
    nonblock: bool,
    src: Option<Ipv4Addr>,
    linger0: bool,
    nodelay: bool,
) -> Result<i32, i32> {
    let ty =
        libc::SOCK_STREAM | libc::SOCK_CLOEXEC | if nonblock { libc::SOCK_NONBLOCK } else { 0 };
    // SAFETY: plain syscall with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, ty, 0) };
    if fd < 0 {
        return Err(errno());
    }
    let setup = || -> Result<(), i32> {
        if nodelay {
            setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)?;
        }
        if linger0 {
            set_linger0(fd)?;
        }
        if let Some(ip) = src {
            setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_BIND_ADDRESS_NO_PORT, 1)?;
            let sa = sockaddr(SocketAddrV4::new(ip, 0));
            // SAFETY: `sa` is a live sockaddr_in and its exact size is passed.
            let r = unsafe {
                libc::bind(
                    fd,
                    &sa as *const libc::sockaddr_in as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_in>() as u32,
                )
            };
            if r < 0 {
                return Err(errno());
            }
        }
        Ok(())
    };
    match setup() {
        Ok(()) => Ok(fd),
        Err(e) => {
            close(fd);
            Err(e)
        }
    }
}

/// Starts a non-blocking connect; Ok(()) also when it is in progress.
pub fn connect(fd: i32, sa: &libc::sockaddr_in) -> Result<(), i32> {
    // SAFETY: `sa` points to a live sockaddr_in of the size passed.
    let r = unsafe {
        libc::connect(
            fd,
            sa as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        )
    };
    if r < 0 {
        let e = errno();
        if e != libc::EINPROGRESS {
            return Err(e);
        }
    }
    Ok(())
}

/// SO_ERROR of a socket (0: no error).
pub fn so_error(fd: i32) -> i32 {
    let mut e: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as u32;
    // SAFETY: `e` and `len` are live and describe a buffer of `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            &mut e as *mut i32 as *mut libc::c_void,
            &mut len,
        )
    };
    if r < 0 {
        errno()
    } else {
        e
    }
}

/// Reads into `buf`: Ok(n) (0 = EOF), Err(errno).
pub fn read(fd: i32, buf: &mut [u8]) -> Result<usize, i32> {
    // SAFETY: `buf` is a live, writable slice of the length passed.
    let r = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

/// Sends `buf` without SIGPIPE: Ok(n), Err(errno).
pub fn send(fd: i32, buf: &[u8]) -> Result<usize, i32> {
    // SAFETY: `buf` is a live slice of the length passed.
    let r = unsafe {
        libc::send(
            fd,
            buf.as_ptr() as *const libc::c_void,
            buf.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

/// Closes a descriptor.
pub fn close(fd: i32) {
    // SAFETY: closing a descriptor this crate owns; errors are irrelevant here.
    unsafe { libc::close(fd) };
}

/// shutdown(SHUT_RDWR): wakes whatever waits on the socket.
pub fn shutdown(fd: i32) {
    // SAFETY: plain syscall on a descriptor this crate owns.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

/// Raises RLIMIT_NOFILE's soft limit to the hard limit; returns the new soft limit.
pub fn raise_nofile() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a live rlimit struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return 1024;
    }
    rl.rlim_cur = rl.rlim_max;
    // SAFETY: `rl` is a live, initialised rlimit struct.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) };
    rl.rlim_cur
}

/// Clock ticks per second of /proc CPU times.
pub fn clk_tck() -> u64 {
    // SAFETY: sysconf has no memory arguments.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// Sends SIGTERM (or SIGKILL when `kill`) to a process this crate started.
pub fn signal(pid: u32, kill: bool) {
    let sig = if kill { libc::SIGKILL } else { libc::SIGTERM };
    // SAFETY: plain syscall; the pid is a child this crate spawned.
    unsafe { libc::kill(pid as i32, sig) };
}

/// CPU time the calling thread has used (ns): CLOCK_THREAD_CPUTIME_ID.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
