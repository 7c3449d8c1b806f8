//! Accepting: a listener's registration while it accepts with budget left, a batch of
//! accepts per readiness event (both as the accept policy, `ListenerAccept`, decides), and one accept (also a steal from another worker's listener).

use super::interest::Ctl;
use super::{would_block, ConnIo, EpollBackend, TOKEN_LISTENER};
use crate::backend::{Completion, ConnId, Origin};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Connections accepted per listener readiness event before going back to the loop.
const ACCEPT_BATCH_MAX: usize = 64;

impl EpollBackend {
    /// Registers the listener in epoll while active with budget left, removes it otherwise.
    pub(super) fn sync_listener(&mut self, listener: u32) -> io::Result<()> {
        let Some(Some(l)) = self.listeners.get(listener as usize).copied() else {
            return Ok(());
        };
        let want = l.policy.wants_readiness();
        if want != l.registered {
            let (op, events) = if want {
                (Ctl::Add, l.events)
            } else {
                (Ctl::Delete, 0)
            };
            self.ctl(op, l.fd, events, TOKEN_LISTENER | listener as u64)?;
            if let Some(Some(state)) = self.listeners.get_mut(listener as usize) {
                state.registered = want;
            }
        }
        Ok(())
    }

    pub(super) fn accept_batch(&mut self, listener: u32) -> io::Result<()> {
        let Some(Some(l)) = self.listeners.get(listener as usize).copied() else {
            return Ok(());
        };
        let Some(limit) = l.policy.batch(ACCEPT_BATCH_MAX) else {
            return Ok(());
        };
        let mut accepted = 0;
        let mut failure = None;
        while accepted < limit {
            match self.accept_one(l.fd, Origin::Local(listener)) {
                Ok(()) => accepted += 1,
                Err(e) if would_block(&e) => break,
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }
        if let Some(error) = failure {
            self.ready
                .push_back(Completion::AcceptFailed { listener, error });
        }
        if let Some(Some(state)) = self.listeners.get_mut(listener as usize) {
            state.policy.took(accepted as u32);
        }
        self.sync_listener(listener)
    }

    /// A new connection's state, in the slot of its descriptor number; nothing is armed.
    pub(super) fn insert_conn(&mut self, fd: OwnedFd) -> ConnId {
        let conn = fd.as_raw_fd() as ConnId;
        let slot = conn as usize;
        if self.conns.len() <= slot {
            self.conns.resize_with(slot + 1, || None);
        }
        self.conns[slot] = Some(ConnIo {
            fd,
            recv_on: false,
            recv_held: false,
            registered: false,
            interest: 0,
            dirty: false,
            pending: None,
            close_after: false,
            ulp: false,
        });
        conn
    }

    pub(super) fn accept_one(&mut self, fd: RawFd, origin: Origin) -> io::Result<()> {
        let a = crate::sys::socket::accept_conn(fd)?;
        let conn = self.insert_conn(a.fd);
        self.ready.push_back(Completion::Accepted {
            origin,
            conn,
            peer: a.peer,
            incoming_cpu: a.incoming_cpu,
        });
        Ok(())
    }
}
