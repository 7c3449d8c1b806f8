//! The io_uring backend: connect → send → recv submitted as one linked chain per new
//! connection, closes and cancels submitted asynchronously, one `io_uring_enter` per loop
//! turn for everything (MegaPipe's batching, on today's kernels).
//!
//! Buffer lifetime: a slot's buffers (`ConnBuf`) and the destination address live in this
//! struct, which outlives every operation: a slot is reused only after all its operations
//! completed (`pending == 0`), and `Drop` cancels and reaps everything before freeing.

use super::{client_socket, close, shutdown, sockaddr};
use crate::engine::{Backend, ConnBuf, Event, SockOpts};
use crate::stats::ErrKind;
use io_uring::{opcode, squeue, types, IoUring};
use std::io;
use std::net::Ipv4Addr;

const OP_CONNECT: u64 = 1;
const OP_SEND: u64 = 2;
const OP_RECV: u64 = 3;
/// Operations nobody waits for (close, cancel).
const OP_UNTRACKED: u64 = 0xff;

#[derive(Debug, Clone, Copy, Default)]
struct SlotIo {
    fd: i32,
    pending: u32,
    closing: bool,
    failed: bool,
    recv_armed: bool,
    send_off: usize,
}

/// io_uring backend.
pub struct Uring {
    ring: IoUring,
    opts: SockOpts,
    dst: Box<libc::sockaddr_in>,
    bufs: Vec<ConnBuf>,
    io: Vec<SlotIo>,
    ready: Vec<Event>,
    inflight: usize,
    flags: &'static str,
}

fn ud(slot: usize, op: u64) -> u64 {
    ((slot as u64) << 8) | op
}

impl Uring {
    /// A ring sized for `slots` connections. Fails when io_uring is unavailable.
    pub fn new(slots: usize, recv_buf: usize, opts: SockOpts) -> io::Result<Self> {
        let entries = (slots * 4).next_power_of_two().clamp(64, 16384) as u32;
        let (ring, flags) = match IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_coop_taskrun()
            .setup_cqsize(entries * 2)
            .build(entries)
        {
            Ok(r) => (r, "single_issuer+defer_taskrun"),
            Err(_) => (
                IoUring::builder()
                    .setup_cqsize(entries * 2)
                    .build(entries)?,
                "plain",
            ),
        };
        let mut probe = io_uring::Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        for op in [
            opcode::Connect::CODE,
            opcode::Send::CODE,
            opcode::Recv::CODE,
            opcode::Close::CODE,
        ] {
            if !probe.is_supported(op) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "io_uring lacks connect/send/recv/close",
                ));
            }
        }
        Ok(Uring {
            ring,
            dst: Box::new(sockaddr(opts.target)),
            opts,
            bufs: (0..slots).map(|_| ConnBuf::new(recv_buf)).collect(),
            io: vec![
                SlotIo {
                    fd: -1,
                    ..Default::default()
                };
                slots
            ],
            ready: Vec::new(),
            inflight: 0,
            flags,
        })
    }

    /// Setup flags in use.
    pub fn flags(&self) -> &'static str {
        self.flags
    }

    /// Makes room for `n` entries so a link chain is never split across two submissions.
    fn reserve(&mut self, n: usize) {
        let (cap, len) = {
            let sq = self.ring.submission();
            (sq.capacity(), sq.len())
        };
        if cap - len < n {
            let _ = self.ring.submit();
        }
    }

    fn push(&mut self, e: squeue::Entry) {
        // SAFETY: every entry built in this module points only into `self.dst` or into
        // `self.bufs[slot]`, which are heap allocations owned by `self` that are neither freed
        // nor moved while `pending > 0` for that slot (see the module comment and `Drop`).
        while unsafe { self.ring.submission().push(&e) }.is_err() {
            let _ = self.ring.submit();
        }
    }

    fn send_entry(&mut self, slot: usize) -> squeue::Entry {
        let fd = self.io[slot].fd;
        let off = self.io[slot].send_off;
        let out = &self.bufs[slot].out;
        opcode::Send::new(types::Fd(fd), out[off..].as_ptr(), (out.len() - off) as u32)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(ud(slot, OP_SEND))
    }

    fn recv_entry(&mut self, slot: usize) -> squeue::Entry {
        let fd = self.io[slot].fd;
        let b = &mut self.bufs[slot];
        let free = &mut b.inbuf[b.in_len..];
        opcode::Recv::new(types::Fd(fd), free.as_mut_ptr(), free.len() as u32)
            .build()
            .user_data(ud(slot, OP_RECV))
    }

    fn release_if_idle(&mut self, slot: usize) {
        let s = self.io[slot];
        if s.closing && s.pending == 0 {
            let e = opcode::Close::new(types::Fd(s.fd))
                .build()
                .user_data(ud(slot, OP_UNTRACKED));
            self.push(e);
            self.io[slot] = SlotIo {
                fd: -1,
                ..Default::default()
            };
            self.ready.push(Event::Released(slot));
        }
    }

    fn complete(&mut self, user_data: u64, res: i32, out: &mut Vec<Event>) {
        let op = user_data & 0xff;
        if op == OP_UNTRACKED {
            return;
        }
        let slot = (user_data >> 8) as usize;
        self.inflight -= 1;
        let s = &mut self.io[slot];
        s.pending -= 1;
        if op == OP_RECV {
            s.recv_armed = false;
        }
        if s.closing {
            self.release_if_idle(slot);
            out.append(&mut self.ready);
            return;
        }
        if res == -libc::ECANCELED && s.failed {
            return;
        }
        if res < 0 {
            s.failed = true;
            let kind = match op {
                OP_CONNECT => ErrKind::Connect,
                OP_SEND => ErrKind::Send,
                _ => ErrKind::Recv,
            };
            out.push(Event::Error(slot, kind, -res));
            return;
        }
        match op {
            OP_CONNECT => out.push(Event::Connected(slot)),
            OP_SEND => {
                let n = res as usize;
                s.send_off += n;
                out.push(Event::Sent(slot, n));
                if s.send_off < self.bufs[slot].out.len() {
                    let e = self.send_entry(slot);
                    self.io[slot].pending += 1;
                    self.inflight += 1;
                    self.push(e);
                }
            }
            _ => {
                let n = res as usize;
                self.bufs[slot].in_len += n;
                out.push(Event::Recv(slot, n));
            }
        }
    }
}

impl Backend for Uring {
    fn buf(&mut self, slot: usize) -> &mut ConnBuf {
        &mut self.bufs[slot]
    }

    fn open(&mut self, slot: usize, src: Option<Ipv4Addr>) -> Result<(), i32> {
        let fd = client_socket(false, src, self.opts.linger0, self.opts.nodelay)?;
        self.io[slot] = SlotIo {
            fd,
            pending: 3,
            recv_armed: true,
            ..Default::default()
        };
        self.inflight += 3;
        let connect = opcode::Connect::new(
            types::Fd(fd),
            &*self.dst as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        )
        .build()
        .flags(squeue::Flags::IO_LINK)
        .user_data(ud(slot, OP_CONNECT));
        let send = self.send_entry(slot).flags(squeue::Flags::IO_LINK);
        let recv = self.recv_entry(slot);
        self.reserve(3);
        self.push(connect);
        self.push(send);
        self.push(recv);
        Ok(())
    }

    fn send(&mut self, slot: usize) {
        self.io[slot].send_off = 0;
        let arm = !self.io[slot].recv_armed;
        let mut send = self.send_entry(slot);
        self.io[slot].pending += 1;
        self.inflight += 1;
        if arm {
            send = send.flags(squeue::Flags::IO_LINK);
            let recv = self.recv_entry(slot);
            self.io[slot].pending += 1;
            self.io[slot].recv_armed = true;
            self.inflight += 1;
            self.reserve(2);
            self.push(send);
            self.push(recv);
        } else {
            self.push(send);
        }
    }

    fn recv(&mut self, slot: usize) {
        if self.io[slot].recv_armed || self.io[slot].fd < 0 {
            return;
        }
        let e = self.recv_entry(slot);
        self.io[slot].recv_armed = true;
        self.io[slot].pending += 1;
        self.inflight += 1;
        self.push(e);
    }

    fn close(&mut self, slot: usize) {
        let s = self.io[slot];
        if s.fd < 0 {
            self.ready.push(Event::Released(slot));
            return;
        }
        self.io[slot].closing = true;
        if s.pending > 0 {
            // Wake what waits on the socket (recv returns 0, send fails), then cancel anything
            // still queued (a connect in progress).
            shutdown(s.fd);
            let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(s.fd)).all())
                .build()
                .user_data(ud(slot, OP_UNTRACKED));
            self.push(cancel);
        } else {
            self.release_if_idle(slot);
        }
    }

    fn wait(&mut self, timeout_ns: u64, out: &mut Vec<Event>) -> io::Result<()> {
        out.append(&mut self.ready);
        let want = if out.is_empty() { 1 } else { 0 };
        let ts = types::Timespec::new()
            .sec(timeout_ns / 1_000_000_000)
            .nsec((timeout_ns % 1_000_000_000) as u32);
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(want, &args) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                ) => {}
            Err(e) => return Err(e),
        }
        loop {
            let batch: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            if batch.is_empty() {
                break;
            }
            for (u, r) in batch {
                self.complete(u, r, out);
            }
        }
        out.append(&mut self.ready);
        Ok(())
    }

    fn name(&self) -> &'static str {
        "io_uring"
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        // Wake and cancel every operation, then reap until none is in flight (bounded).
        for slot in 0..self.io.len() {
            if self.io[slot].fd >= 0 && self.io[slot].pending > 0 {
                self.close(slot);
            }
        }
        let mut sink = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while self.inflight > 0 && std::time::Instant::now() < deadline {
            if self.wait(100_000_000, &mut sink).is_err() {
                break;
            }
            sink.clear();
        }
        let _ = self.ring.submit();
        for s in &self.io {
            if s.fd >= 0 {
                close(s.fd);
            }
        }
        if self.inflight > 0 {
            // Operations still hold pointers into our buffers: leak them rather than free.
            std::mem::forget(std::mem::take(&mut self.bufs));
        }
    }
}
