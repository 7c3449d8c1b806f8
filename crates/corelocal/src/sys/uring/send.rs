//! Sending: buffers and file regions (read in chunks with `IORING_OP_READ`, never on the
//! worker thread: io_uring has no sendfile, and a read that misses the page cache would stall
//! every connection of the worker), and the last output with its close linked behind it.

use super::state::{
    user_data, RecvState, SendState, KIND_CLOSE, KIND_DRAIN, KIND_FILE_READ, KIND_RECV, KIND_SEND,
};
use super::UringBackend;
use crate::backend::FileRegion;
use crate::backend::{Completion, ConnId, ConnKey};
use io_uring::{opcode, squeue, types};
use std::cell::UnsafeCell;
use std::io;
use std::os::fd::AsRawFd;

/// Bytes of a file region read per send on this backend (no sendfile here; see `SendFile`).
const FILE_CHUNK_BYTES: usize = 256 * 1024;

/// Bytes a last send's chain reads and discards before its close (see [`drain_entry`]).
const DRAIN_BYTES: usize = 64 * 1024;

/// Where the discarding receives point: never read or written by this process, and with
/// `MSG_TRUNC` never written by TCP either (it discards without copying); real memory of the
/// given length all the same, so that nothing depends on that.
struct DrainSink(UnsafeCell<[u8; DRAIN_BYTES]>);

// SAFETY: no Rust code reads or writes the sink; only the kernel may, and its bytes mean
// nothing (every worker's receives may discard into it at once).
unsafe impl Sync for DrainSink {}

static DRAIN_SINK: DrainSink = DrainSink(UnsafeCell::new([0; DRAIN_BYTES]));

/// The receive that goes just before a last send and its linked close: it reads and discards
/// what the peer sent since the worker last read (a request pipelined after `Connection:
/// close`, sent while the worker was busy or preempted). A close with input left unread makes
/// the kernel reset the connection and purge the answer that waits, corked by MSG_MORE, for
/// the close's FIN: the client would get nothing. Nonblocking (`MSG_DONTWAIT`: nothing there
/// fails it with EAGAIN at once, the usual case), silent on success, and not linked: the
/// kernel issues SQEs in order, so it has run before the send does, and it costs no hop
/// through task work (hard-linked between the send and the close it cost one: 1.03–1.05× per
/// one-shot HTTP connection). What arrives after it, or beyond `DRAIN_BYTES`, still draws the
/// reset: a window of the submit's own microseconds instead of the worker's whole turn.
fn drain_entry(conn: ConnId, key: ConnKey) -> squeue::Entry {
    opcode::Recv::new(
        types::Fixed(conn),
        DRAIN_SINK.0.get().cast::<u8>(),
        DRAIN_BYTES as u32,
    )
    .flags(libc::MSG_DONTWAIT | libc::MSG_TRUNC)
    .build()
    .flags(squeue::Flags::SKIP_SUCCESS)
    .user_data(user_data(KIND_DRAIN, key))
}

impl UringBackend {
    fn send_next(&mut self, conn: ConnId) {
        let key = self.slots.key(conn);
        let slot = &mut self.slots[conn];
        let Some(send) = slot.send.as_mut() else {
            return;
        };
        let remaining = &send.buf[send.sent..];
        let last = send.close_after && send.file.is_none();
        // The last output goes whole (MSG_WAITALL: a short send breaks the link) and waits for
        // the close (MSG_MORE), whose FIN then rides in the data's last segment — unless a
        // ULP is attached (kTLS would hold MSG_MORE's data as an open record); unread input
        // is discarded just before (`drain_entry`).
        let flags = if last {
            let cork = if slot.ulp { 0 } else { libc::MSG_MORE };
            libc::MSG_NOSIGNAL | libc::MSG_WAITALL | cork
        } else {
            libc::MSG_NOSIGNAL
        };
        let entry = opcode::Send::new(
            types::Fixed(conn),
            remaining.as_ptr(),
            remaining.len().min(u32::MAX as usize) as u32,
        )
        .flags(flags)
        .build()
        .user_data(user_data(KIND_SEND, key));
        if !last {
            self.sqe(entry);
            return;
        }
        let recv_in_flight = slot.recv.in_flight();
        slot.recv = RecvState::Off;
        slot.closing = true;
        slot.close_linked = true;
        if recv_in_flight {
            self.cancel(user_data(KIND_RECV, key));
        }
        let close = opcode::Close::new(types::Fixed(conn))
            .build()
            .user_data(user_data(KIND_CLOSE, key));
        self.sqe(drain_entry(conn, key));
        self.sqe_chain(&[entry, close]);
    }

    pub(super) fn start_send(
        &mut self,
        conn: ConnId,
        buf: Vec<u8>,
        file: Option<(FileRegion, u64)>,
        close_after: bool,
    ) {
        let slot = &mut self.slots[conn];
        assert!(slot.send.is_none(), "one send at a time per connection");
        slot.send = Some(SendState {
            buf,
            sent: 0,
            file,
            close_after,
            reading: false,
            control: None,
        });
        self.continue_send(conn);
    }

    /// Bytes with a control message: one `SENDMSG`, all of it or an error.
    pub(super) fn start_control_send(
        &mut self,
        conn: ConnId,
        msg: Box<crate::sys::socket::ControlSend>,
    ) {
        let key = self.slots.key(conn);
        let slot = &mut self.slots[conn];
        assert!(slot.send.is_none(), "one send at a time per connection");
        // The message (its msghdr, iovec, control buffer, payload) stays in the slot, or in
        // the graveyard if the connection closes first, until the completion.
        let entry = opcode::SendMsg::new(types::Fixed(conn), msg.hdr())
            .flags(libc::MSG_NOSIGNAL as u32)
            .build()
            .user_data(user_data(KIND_SEND, key));
        slot.send = Some(SendState {
            buf: Vec::new(),
            sent: 0,
            file: None,
            close_after: false,
            reading: false,
            control: Some(msg),
        });
        self.sqe(entry);
    }

    /// Sends what is left; refills from the file region when the buffer is done.
    fn continue_send(&mut self, conn: ConnId) {
        let key = self.slots.key(conn);
        let slot = &mut self.slots[conn];
        let Some(send) = slot.send.as_mut() else {
            return;
        };
        if send.sent < send.buf.len() {
            self.send_next(conn);
            return;
        }
        let Some((region, _)) = send.file.as_mut().filter(|(r, _)| r.len > 0) else {
            let done = slot.send.take().expect("send in flight");
            self.ready.push_back(match done.file {
                Some((_, total)) => Completion::SentFile {
                    conn,
                    result: Ok(total),
                },
                None => Completion::Sent {
                    conn,
                    result: Ok(done.sent),
                    buf: done.buf,
                },
            });
            return;
        };
        // The next chunk: read by the kernel (page cache, or io-wq on a miss), then sent.
        let chunk = region.len.min(FILE_CHUNK_BYTES as u64) as usize;
        send.buf.resize(chunk, 0);
        send.reading = true;
        let entry = opcode::Read::new(
            types::Fd(region.file.as_raw_fd()),
            send.buf.as_mut_ptr(),
            chunk as u32,
        )
        .offset(region.offset)
        .build()
        .user_data(user_data(KIND_FILE_READ, key));
        self.sqe(entry);
    }

    /// A chunk of a file region was read (or not): send it, or end the send with the error.
    pub(super) fn on_file_read(&mut self, conn: ConnId, res: i32) {
        let slot = &mut self.slots[conn];
        let Some(send) = slot.send.as_mut() else {
            return;
        };
        send.reading = false;
        let Some((region, _)) = send.file.as_mut() else {
            return;
        };
        if res > 0 {
            let n = res as usize;
            send.buf.truncate(n);
            send.sent = 0;
            region.offset += n as u64;
            region.len -= n as u64;
            self.send_next(conn);
            return;
        }
        let error = if res == 0 {
            io::Error::new(io::ErrorKind::UnexpectedEof, "file shorter than the region")
        } else {
            io::Error::from_raw_os_error(-res)
        };
        slot.send = None;
        self.ready.push_back(Completion::SentFile {
            conn,
            result: Err(error),
        });
    }

    pub(super) fn on_send(&mut self, conn: ConnId, res: i32) {
        let slot = &mut self.slots[conn];
        let Some(send) = slot.send.as_mut() else {
            return;
        };
        if send.control.is_some() {
            return self.on_control_sent(conn, res);
        }
        if res < 0 {
            let send = slot.send.take().expect("send in flight");
            let error = io::Error::from_raw_os_error(-res);
            self.ready.push_back(match send.file {
                Some(_) => Completion::SentFile {
                    conn,
                    result: Err(error),
                },
                None => Completion::Sent {
                    conn,
                    buf: send.buf,
                    result: Err(error),
                },
            });
            return;
        }
        send.sent += res as usize;
        self.continue_send(conn);
    }

    /// A message with a control message went (all of it), or not.
    fn on_control_sent(&mut self, conn: ConnId, res: i32) {
        let send = self.slots[conn].send.take().expect("send in flight");
        let msg = send.control.expect("a control send");
        let result = match res {
            n if n < 0 => Err(io::Error::from_raw_os_error(-n)),
            n if (n as usize) < msg.len() => Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "a message with a control message went out in part",
            )),
            n => Ok(n as usize),
        };
        self.ready.push_back(Completion::Sent {
            conn,
            buf: msg.into_payload(),
            result,
        });
    }
}
