//! Reaching into another process: `pidfd_open(2)`, `pidfd_getfd(2)` (a duplicate of one of its
//! descriptors), `sched_getaffinity(2)` of another task, and the socket options `corelocal
//! steer` reads or sets on such a duplicate (`SO_COOKIE`, `SO_INCOMING_CPU`).
//!
//! A duplicate refers to the same open socket as the original: an option set through it
//! changes the other process's socket, and a reuseport program attached through it applies to
//! the whole group. Holding a duplicate of a listening socket keeps it listening after the
//! owner closed it, so callers drop duplicates as soon as they are done.

use super::socket::borrow;
use crate::cpu::CpuSet;
use rustix::net::sockopt;
use rustix::process::{Pid, PidfdFlags, PidfdGetfdFlags, Signal};
use std::io;
use std::os::fd::{OwnedFd, RawFd};

/// A pidfd for `pid` (`pidfd_open(pid, 0)`): a stable handle that cannot be confused with a
/// later process reusing the number.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    Ok(rustix::process::pidfd_open(pid, PidfdFlags::empty())?)
}

/// A duplicate of descriptor `target_fd` of the process behind `pidfd`
/// (`pidfd_getfd(2)`, Linux ≥ 5.6). Needs ptrace access to that process
/// (`PTRACE_MODE_ATTACH_REALCREDS`: same user and Yama permitting, or CAP_SYS_PTRACE).
/// The duplicate is close-on-exec.
pub fn pidfd_getfd(pidfd: &OwnedFd, target_fd: RawFd) -> io::Result<OwnedFd> {
    Ok(rustix::process::pidfd_getfd(
        pidfd,
        target_fd,
        PidfdGetfdFlags::empty(),
    )?)
}

/// Sends signal `sig` to the process behind `pidfd` (`pidfd_send_signal(2)`, Linux ≥ 5.1):
/// unlike `kill(2)` it can never reach a later process that reused the number.
pub fn pidfd_send_signal(pidfd: &OwnedFd, sig: libc::c_int) -> io::Result<()> {
    let sig =
        Signal::from_named_raw(sig).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    Ok(rustix::process::pidfd_send_signal(pidfd, sig)?)
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
    let pid = i32::try_from(tid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    let mask = rustix::thread::sched_getaffinity(Some(pid))?;
    Ok((0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&cpu| mask.is_set(cpu))
        .collect())
}

/// The socket's cookie (`SO_COOKIE`), stable for the socket's life and the same through any
/// duplicate.
pub fn socket_cookie(fd: RawFd) -> io::Result<u64> {
    Ok(sockopt::socket_cookie(borrow(fd))?)
}

/// Sets `SO_INCOMING_CPU` on a socket (`-1` clears it). On a listener in a reuseport group
/// (Linux ≥ 6.2) SYNs processed on `cpu` prefer this listener.
pub fn set_incoming_cpu(fd: RawFd, cpu: i32) -> io::Result<()> {
    Ok(sockopt::set_socket_incoming_cpu(borrow(fd), cpu as u32)?)
}

/// Whether `fd` is a TCP socket that is not listening (a connection, or one being made).
pub fn is_tcp_connection(fd: RawFd) -> bool {
    let fd = borrow(fd);
    sockopt::socket_protocol(fd).ok() == Some(Some(rustix::net::ipproto::TCP))
        && sockopt::socket_acceptconn(fd).ok() == Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::socket::{self, ListenOptions};
    use std::os::fd::AsRawFd;

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
