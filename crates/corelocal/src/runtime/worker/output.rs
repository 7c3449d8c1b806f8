//! Output: sending the handler's output one chunk at a time (the last one may carry the
//! close), send completions, and the spare send buffers kept for reuse.

use super::{Closing, Worker};
use crate::runtime::backend::{Backend, ConnId, Op};
use crate::runtime::handler::{Chunk, Service};
use crate::runtime::stats::ErrorKind;
use std::time::Instant;

/// Spare send buffers kept for reuse.
const SPARE_BUFS_MAX: usize = 64;
/// Largest send buffer kept for reuse: spares hold at most 64 × 64 KiB = 4 MiB per worker;
/// larger buffers (bulk responses, slow readers' queues) go back to the allocator.
const SPARE_BUF_BYTES_MAX: usize = 64 << 10;

impl<S: Service, B: Backend> Worker<S, B> {
    pub(super) fn on_sent(&mut self, id: ConnId, result: std::io::Result<u64>, now: Instant) {
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        conn.sending = false;
        conn.in_flight = 0;
        match result {
            Ok(n) => {
                self.setup.stats.bytes_out(n);
                conn.last_active = now;
            }
            Err(_) => {
                self.setup.stats.error(ErrorKind::Io);
                self.force_close(id);
                return;
            }
        }
        let half = self.setup.limits.output_bytes_max as u64 / 2;
        if conn.notify_again && conn.pending() <= half {
            // The handler has more to say than the output had room for.
            conn.notify_again = false;
            self.notify_conn(self.conns.key(id), now);
        }
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        if conn.recv_paused && conn.pending() <= half {
            self.resume_reading(id, now);
            return;
        }
        self.flush(id);
        self.try_detach(id);
    }

    /// Starts the next send if none is in flight; closes when output is done and asked to.
    pub(super) fn flush(&mut self, id: ConnId) {
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        if conn.sending || !matches!(conn.closing, Closing::Open | Closing::Flushing(_)) {
            return;
        }
        let spare = self.spare_bufs.pop().unwrap_or_default();
        match conn.output.take_front(spare) {
            Some(Chunk::Bytes(buf)) => {
                conn.sending = true;
                conn.in_flight = buf.len() as u64;
                // The last output of a closing connection whose input is finished: the backend
                // closes after it (one turn and, on loopback, one packet fewer than send, then
                // close). Else the close waits for the send and lingers (`finish_close`).
                let close_after = matches!(conn.closing, Closing::Flushing(_))
                    && conn.output.is_empty()
                    && conn.closes_with_answer(&self.setup.limits);
                if close_after {
                    conn.closing = Closing::LastSend;
                }
                self.backend.push(Op::Send {
                    conn: id,
                    buf,
                    close_after,
                });
            }
            Some(Chunk::File(region)) => {
                conn.sending = true;
                conn.in_flight = region.len;
                self.backend.push(Op::SendFile { conn: id, region });
            }
            None => {
                if matches!(conn.closing, Closing::Flushing(_)) {
                    self.finish_close(id);
                }
            }
        }
    }

    pub(super) fn recycle(&mut self, mut buf: Vec<u8>) {
        if self.spare_bufs.len() < SPARE_BUFS_MAX && buf.capacity() <= SPARE_BUF_BYTES_MAX {
            buf.clear();
            self.spare_bufs.push(buf);
        }
    }
}
