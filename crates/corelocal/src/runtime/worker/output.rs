//! Output: sending the handler's output one chunk at a time (the last one may carry the
//! close), send completions, and the spare byte buffers kept for reuse ([`SpareBufs`]).

use super::{Closing, Worker};
use crate::runtime::backend::{Backend, ConnId, Op};
use crate::runtime::handler::{Chunk, Service};
use crate::runtime::stats::ErrorKind;
use std::time::Instant;

/// Spare byte buffers kept for reuse.
const SPARE_BUFS_MAX: usize = 64;
/// Largest buffer kept for reuse: spares hold at most 64 × 64 KiB = 4 MiB per worker;
/// larger buffers (bulk responses, slow readers' queues) go back to the allocator.
const SPARE_BUF_BYTES_MAX: usize = 64 << 10;

/// A worker's byte buffers kept for reuse: send buffers after their send, and a closed
/// connection's input and output buffers, which the next connection's first receive takes.
/// A one-request connection then costs no allocation for its bytes (two `malloc`/`free`
/// pairs and two buffer growths otherwise, ~600 instructions of ~5,400 per kv get).
/// Bounded in count and in each buffer's size.
#[derive(Debug, Default)]
pub(super) struct SpareBufs {
    bufs: Vec<Vec<u8>>,
}

impl SpareBufs {
    /// An empty buffer, with the capacity of one used before when there is one.
    #[inline]
    pub(super) fn take(&mut self) -> Vec<u8> {
        self.bufs.pop().unwrap_or_default()
    }

    /// Keeps `buf` for reuse (emptied), unless the pool is full, it is too large, or it never
    /// held anything.
    #[inline]
    pub(super) fn give(&mut self, mut buf: Vec<u8>) {
        let capacity = buf.capacity();
        if capacity != 0 && capacity <= SPARE_BUF_BYTES_MAX && self.bufs.len() < SPARE_BUFS_MAX {
            buf.clear();
            self.bufs.push(buf);
        }
    }
}

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
        if conn.output.take_recv_stop() {
            self.start_recv_stop(id);
            return self.flush(id);
        }
        if conn.sending || !matches!(conn.closing, Closing::Open | Closing::Flushing(_)) {
            return;
        }
        // A spare only when there is something to send: `take_front` drops it otherwise.
        let spare = if conn.output.is_empty() {
            Vec::new()
        } else {
            self.spare.take()
        };
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
            Some(mark) => self.send_mark(id, mark),
            None => {
                if matches!(conn.closing, Closing::Flushing(_)) {
                    self.finish_close(id);
                }
            }
        }
    }
}

impl<S: Service, B: Backend> Worker<S, B> {
    /// Socket options or a control message in the output (rare: kTLS, once or twice per
    /// connection): they go like a send, the next output waits for them.
    #[cold]
    #[inline(never)]
    fn send_mark(&mut self, id: ConnId, mark: Chunk) {
        let Some(conn) = self.conns.occupant_mut(id) else {
            return;
        };
        conn.sending = true;
        match mark {
            Chunk::Control(control, payload) => {
                conn.in_flight = payload.len() as u64;
                self.backend.push(Op::SendControl {
                    conn: id,
                    control,
                    payload,
                });
            }
            Chunk::Options(options) => {
                conn.in_flight = 0;
                self.backend.push(Op::SetOptions { conn: id, options });
            }
            Chunk::Bytes(_) | Chunk::File(_) => unreachable!("sent by `flush`"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers come back empty, with their capacity; the pool keeps neither unallocated
    /// buffers, nor ones past the size bound, nor more than its count bound.
    #[test]
    fn spare_buffers_are_emptied_and_bounded() {
        let mut spare = SpareBufs::default();
        spare.give(b"secret of the last connection".to_vec());
        let reused = spare.take();
        assert!(reused.is_empty() && reused.capacity() >= 29);
        assert_eq!(spare.take().capacity(), 0, "the pool is empty again");
        spare.give(Vec::new());
        spare.give(Vec::with_capacity(SPARE_BUF_BYTES_MAX + 1));
        assert_eq!(spare.take().capacity(), 0, "neither was kept");
        for _ in 0..SPARE_BUFS_MAX + 5 {
            spare.give(Vec::with_capacity(16));
        }
        let kept = std::iter::from_fn(|| Some(spare.take()))
            .take_while(|b| b.capacity() != 0)
            .count();
        assert_eq!(kept, SPARE_BUFS_MAX);
    }
}
