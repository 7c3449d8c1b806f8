//! Sending: a send (bytes or a file region) is attempted at once and continued on EPOLLOUT
//! until done or failed; a last send closes the connection after it.

use super::{would_block, EpollBackend};
use crate::backend::FileRegion;
use crate::backend::{Completion, ConnId};
use crate::sys::socket;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// Bytes moved per sendfile call.
const SENDFILE_CHUNK_BYTES: usize = 1 << 20;

/// A send in progress (the socket buffer filled before all of it went out).
#[derive(Debug)]
pub(super) enum PendingSend {
    Bytes {
        buf: Vec<u8>,
        sent: usize,
    },
    File {
        region: FileRegion,
        sent: u64,
    },
    /// Bytes with a control message: all of them in one `sendmsg`.
    Control {
        msg: Box<socket::ControlSend>,
        sent: bool,
    },
}

impl EpollBackend {
    pub(super) fn start_send(&mut self, conn: ConnId, send: PendingSend) -> io::Result<()> {
        let Some(c) = self.conn_mut(conn) else {
            return Ok(());
        };
        assert!(c.pending.is_none(), "one send at a time per connection");
        c.pending = Some(send);
        self.continue_send(conn)
    }

    /// Pushes a pending send as far as the socket takes it; completes it when done or failed.
    pub(super) fn continue_send(&mut self, conn: ConnId) -> io::Result<()> {
        let Some(c) = self.conn_mut(conn) else {
            return Ok(());
        };
        let fd = c.fd.as_raw_fd();
        let close_after = c.close_after;
        // With a ULP (kTLS) attached, MSG_MORE would leave the last record open.
        let cork = close_after && !c.ulp;
        let Some(mut pending) = c.pending.take() else {
            return Ok(());
        };
        let outcome = drive_send(fd, &mut pending, cork);
        match outcome {
            Err(e) if would_block(&e) => {
                c.pending = Some(pending);
            }
            result => self.ready.push_back(match pending {
                PendingSend::Bytes { buf, .. } => Completion::Sent {
                    conn,
                    buf,
                    result: result.map(|n| n as usize),
                },
                PendingSend::File { .. } => Completion::SentFile { conn, result },
                PendingSend::Control { msg, .. } => Completion::Sent {
                    conn,
                    buf: msg.into_payload(),
                    result: result.map(|n| n as usize),
                },
            }),
        }
        let done = self.conn_mut(conn).is_some_and(|c| c.pending.is_none());
        if close_after && done {
            // The FIN rides on the data (sent with MSG_MORE) and goes before the close: input
            // that arrived since the worker last read (a request pipelined after `Connection:
            // close`) makes the close reset the connection, which would purge the corked
            // answer; after the shutdown the reset comes behind the answer and its FIN. A
            // failure here (the peer already reset) changes nothing: the close follows anyway.
            if let Some(slot) = self.conns.get_mut(conn as usize) {
                if let Some(c) = slot.take() {
                    let _ = socket::shutdown_write(c.fd.as_raw_fd());
                }
            }
            self.ready.push_back(Completion::Closed { conn });
            return Ok(());
        }
        self.update_interest(conn)
    }
}

fn drive_send(fd: RawFd, pending: &mut PendingSend, last: bool) -> io::Result<u64> {
    loop {
        match pending {
            PendingSend::Bytes { buf, sent } => {
                if *sent == buf.len() {
                    return Ok(*sent as u64);
                }
                *sent += if last {
                    socket::send_more(fd, &buf[*sent..])?
                } else {
                    socket::send(fd, &buf[*sent..])?
                };
            }
            PendingSend::Control { msg, sent } => {
                if *sent {
                    return Ok(msg.len() as u64);
                }
                if msg.send(fd)? < msg.len() {
                    // A control message's bytes go whole (one TLS record) or not at all.
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "a message with a control message went out in part",
                    ));
                }
                *sent = true;
            }
            PendingSend::File { region, sent } => {
                if *sent == region.len {
                    return Ok(*sent);
                }
                let chunk = (region.len - *sent).min(SENDFILE_CHUNK_BYTES as u64) as usize;
                let n =
                    socket::sendfile(fd, region.file.as_raw_fd(), region.offset + *sent, chunk)?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "file shorter than the region to send",
                    ));
                }
                *sent += n as u64;
            }
        }
    }
}
