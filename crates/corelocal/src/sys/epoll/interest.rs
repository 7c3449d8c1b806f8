//! Interest: `epoll_ctl`, and each connection's interest (receive, pending send) marked on
//! change and registered once per turn, just before `epoll_wait`.

use super::{EpollBackend, TOKEN_CONN};
use crate::backend::ConnId;
use crate::sys::socket::borrow;
use rustix::event::epoll::{self, EventData, EventFlags};
use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// An `epoll_ctl` operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ctl {
    /// `EPOLL_CTL_ADD`.
    Add,
    /// `EPOLL_CTL_MOD`.
    Modify,
    /// `EPOLL_CTL_DEL` (events and token unused).
    Delete,
}

impl EpollBackend {
    /// `epoll_ctl` on `fd`, a descriptor the backend holds open (the waker, a listener of the
    /// worker's group, a connection of the table), with the `EPOLL*` bits `events`.
    pub(super) fn ctl(&self, op: Ctl, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.ctl_calls.set(self.ctl_calls.get() + 1);
        let (data, flags) = (
            EventData::new_u64(token),
            EventFlags::from_bits_retain(events),
        );
        match op {
            Ctl::Add => epoll::add(&self.epfd, borrow(fd), data, flags)?,
            Ctl::Modify => epoll::modify(&self.epfd, borrow(fd), data, flags)?,
            Ctl::Delete => epoll::delete(&self.epfd, borrow(fd))?,
        }
        Ok(())
    }

    /// Marks the connection's interest for registration before the next `epoll_wait`.
    pub(super) fn update_interest(&mut self, conn: ConnId) -> io::Result<()> {
        if let Some(c) = self.conn_mut(conn) {
            if !c.dirty {
                c.dirty = true;
                self.interest_dirty.push(conn);
            }
        }
        Ok(())
    }

    /// Registers the interest of every connection marked since the last wait (still open).
    pub(super) fn flush_interest(&mut self) -> io::Result<()> {
        let mut dirty = std::mem::take(&mut self.interest_dirty);
        for conn in dirty.drain(..) {
            self.register_interest(conn)?;
        }
        self.interest_dirty = dirty; // keep the allocation
        Ok(())
    }

    /// Registers the interest the connection's state asks for, if it changed.
    fn register_interest(&mut self, conn: ConnId) -> io::Result<()> {
        let Some(c) = self.conns.get_mut(conn as usize).and_then(Option::as_mut) else {
            return Ok(());
        };
        if !c.dirty {
            return Ok(()); // Closed and its id reused since it was marked.
        }
        c.dirty = false;
        let mut want = 0u32;
        if c.recv_on {
            want |= (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
        }
        if c.pending.is_some() {
            want |= libc::EPOLLOUT as u32;
        }
        if c.registered && want == c.interest {
            return Ok(());
        }
        let op = if c.registered { Ctl::Modify } else { Ctl::Add };
        c.registered = true;
        c.interest = want;
        let fd = c.fd.as_raw_fd();
        self.ctl(op, fd, want, TOKEN_CONN | conn as u64)
    }
}
