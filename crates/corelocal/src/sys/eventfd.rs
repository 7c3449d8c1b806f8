//! The eventfd both backends are woken through: another thread writes it, the worker's epoll
//! set or io_uring read sees it readable and the wait returns.

use crate::backend::Wake;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Wakes a worker through a non-blocking eventfd.
#[derive(Debug)]
pub(crate) struct EventFdWaker {
    fd: OwnedFd,
}

impl EventFdWaker {
    /// A fresh non-blocking, close-on-exec eventfd at 0.
    pub(crate) fn new() -> io::Result<EventFdWaker> {
        // SAFETY: plain eventfd; the result is checked.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(efd) };
        Ok(EventFdWaker { fd })
    }

    /// The descriptor, for the epoll set or the io_uring read.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Wake for EventFdWaker {
    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd. A full counter (EAGAIN) means
        // a wake-up is already pending, which is all we need.
        let _ = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }
}
