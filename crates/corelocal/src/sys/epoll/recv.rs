//! Receiving: one read into a pool buffer per readiness event, reported as data, EOF or an
//! error.

use super::{would_block, EpollBackend};
use crate::backend::{Completion, ConnId};
use crate::sys::socket;
use std::io;
use std::os::fd::AsRawFd;

impl EpollBackend {
    pub(super) fn read_once(&mut self, conn: ConnId) -> io::Result<()> {
        let Some(c) = self.conns.get(conn as usize).and_then(Option::as_ref) else {
            return Ok(());
        };
        if !c.recv_on {
            return Ok(());
        }
        let fd = c.fd.as_raw_fd();
        let Some(buf) = self.pool_free.pop() else {
            return Ok(()); // Pool empty: level-triggered epoll reports the socket again.
        };
        let start = buf as usize * self.buf_bytes;
        let result = socket::recv(fd, &mut self.pool[start..start + self.buf_bytes]);
        let stop = match result {
            Ok(0) => {
                self.pool_free.push(buf);
                self.ready.push_back(Completion::Eof { conn });
                true
            }
            Ok(len) => {
                self.ready.push_back(Completion::Recv { conn, buf, len });
                false
            }
            Err(e) if would_block(&e) => {
                self.pool_free.push(buf);
                false
            }
            Err(error) => {
                self.pool_free.push(buf);
                self.ready.push_back(Completion::RecvFailed { conn, error });
                true
            }
        };
        if stop {
            if let Some(c) = self.conn_mut(conn) {
                c.recv_on = false;
            }
            self.update_interest(conn)?;
        }
        Ok(())
    }
}
