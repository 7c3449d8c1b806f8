//! Reaching into another process: `pidfd_open(2)`, `pidfd_getfd(2)` (a duplicate of one of its
//! descriptors), `sched_getaffinity(2)` of another task, and the socket options `corelocal
//! steer` reads or sets on such a duplicate (`SO_COOKIE`, `SO_INCOMING_CPU`).
//!
//! A duplicate refers to the same open socket as the original: an option set through it
//! changes the other process's socket, and a reuseport program attached through it applies to
//! the whole group. Holding a duplicate of a listening socket keeps it listening after the
//! owner closed it, so callers drop duplicates as soon as they are done.

use super::cvt;
use crate::cpu::CpuSet;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `SO_COOKIE`: the socket's 64-bit cookie (what a REUSEPORT_SOCKARRAY lookup returns).
pub const SO_COOKIE: libc::c_int = 57;
/// `SO_INCOMING_CPU`.
const SO_INCOMING_CPU: libc::c_int = 49;
/// Largest CPU id `sched_getaffinity` reports here.
const AFFINITY_CPUS_MAX: usize = 8192;

/// A pidfd for `pid` (`pidfd_open(pid, 0)`): a stable handle that cannot be confused with a
/// later process reusing the number.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments; the result is checked before use.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0 as libc::c_uint) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this new descriptor, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}

/// A duplicate of descriptor `target_fd` of the process behind `pidfd`
/// (`pidfd_getfd(2)`, Linux ≥ 5.6). Needs ptrace access to that process
/// (`PTRACE_MODE_ATTACH_REALCREDS`: same user and Yama permitting, or CAP_SYS_PTRACE).
/// The duplicate is close-on-exec.
pub fn pidfd_getfd(pidfd: &OwnedFd, target_fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments; the result is checked before use.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_getfd,
            pidfd.as_raw_fd(),
            target_fd,
            0 as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this new descriptor, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}

/// Sends signal `sig` to the process behind `pidfd` (`pidfd_send_signal(2)`, Linux ≥ 5.1):
/// unlike `kill(2)` it can never reach a later process that reused the number.
pub fn pidfd_send_signal(pidfd: &OwnedFd, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscall with integer arguments (no siginfo: a null pointer, flags 0).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0 as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the process behind `pidfd` has exited (its pidfd polls readable then).
pub fn has_exited(pidfd: &OwnedFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        pidfd,
        rustix::event::PollFlags::IN,
    )];
    rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default()))
        .is_ok_and(|ready| ready > 0)
}

/// The CPUs task `tid` (a process or thread id) may run on.
pub fn affinity_of(tid: u32) -> io::Result<CpuSet> {
    const WORDS: usize = AFFINITY_CPUS_MAX / 64;
    let mut mask = [0u64; WORDS];
    // SAFETY: `mask` is writable for the size passed; the kernel writes at most that many bytes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_getaffinity,
            tid as libc::pid_t,
            size_of::<[u64; WORDS]>(),
            mask.as_mut_ptr(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut set = CpuSet::new();
    for (w, word) in mask.iter().enumerate() {
        for bit in 0..64 {
            if word & (1 << bit) != 0 {
                set.insert(w * 64 + bit);
            }
        }
    }
    Ok(set)
}

/// The socket's cookie (`SO_COOKIE`), stable for the socket's life and the same through any
/// duplicate.
pub fn socket_cookie(fd: RawFd) -> io::Result<u64> {
    let mut value: u64 = 0;
    let mut len = size_of::<u64>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live and `len` holds value's size.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_COOKIE,
            &mut value as *mut u64 as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok(value)
}

/// Sets `SO_INCOMING_CPU` on a socket (`-1` clears it). On a listener in a reuseport group
/// (Linux ≥ 6.2) SYNs processed on `cpu` prefer this listener.
pub fn set_incoming_cpu(fd: RawFd, cpu: i32) -> io::Result<()> {
    let value: libc::c_int = cpu;
    // SAFETY: `value` points to a live c_int and its exact size is passed.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_INCOMING_CPU,
            &value as *const libc::c_int as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

fn getsockopt_int(fd: RawFd, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live and `len` holds value's size.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            &mut value as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok(value)
}

/// Whether `fd` is a TCP socket that is not listening (a connection, or one being made).
pub fn is_tcp_connection(fd: RawFd) -> bool {
    getsockopt_int(fd, libc::SO_PROTOCOL).ok() == Some(libc::IPPROTO_TCP)
        && getsockopt_int(fd, libc::SO_ACCEPTCONN).ok() == Some(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::socket::{self, ListenOptions};

    #[test]
    fn a_duplicate_of_our_own_listener_is_the_same_socket() {
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
        let pidfd = pidfd_open(std::process::id()).unwrap();
        let dup = pidfd_getfd(&pidfd, l.as_raw_fd()).unwrap();
        assert_ne!(dup.as_raw_fd(), l.as_raw_fd());
        assert_eq!(
            socket_cookie(dup.as_raw_fd()).unwrap(),
            socket_cookie(l.as_raw_fd()).unwrap()
        );
        set_incoming_cpu(dup.as_raw_fd(), 0).unwrap();
        assert_eq!(socket::incoming_cpu(l.as_raw_fd()).unwrap(), 0);
        set_incoming_cpu(dup.as_raw_fd(), -1).unwrap();
        assert_eq!(socket::incoming_cpu(l.as_raw_fd()).unwrap(), -1);
        let me = affinity_of(std::process::id()).unwrap();
        assert!(!me.is_empty());
        assert!(!is_tcp_connection(l.as_raw_fd()), "a listener");
        let c = std::net::TcpStream::connect(socket::local_addr(l.as_raw_fd()).unwrap()).unwrap();
        assert!(is_tcp_connection(c.as_raw_fd()));
    }
}
