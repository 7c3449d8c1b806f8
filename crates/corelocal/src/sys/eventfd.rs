//! The eventfd both backends are woken through: another thread writes it, the worker's epoll
//! set or io_uring read sees it readable and the wait returns.

use crate::backend::Wake;
use rustix::event::EventfdFlags;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// Wakes a worker through a non-blocking eventfd.
#[derive(Debug)]
pub(crate) struct EventFdWaker {
    fd: OwnedFd,
}

impl EventFdWaker {
    /// A fresh non-blocking, close-on-exec eventfd at 0.
    pub(crate) fn new() -> io::Result<EventFdWaker> {
        let fd = rustix::event::eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        Ok(EventFdWaker { fd })
    }

    /// The descriptor, for the epoll set or the io_uring read.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The descriptor, borrowed (to drain the counter).
    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Wake for EventFdWaker {
    fn wake(&self) {
        // A full counter (EAGAIN) means a wake-up is already pending, which is all we need.
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }
}
