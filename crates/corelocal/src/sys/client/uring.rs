//! The io_uring client: connect → send → recv submitted as one linked chain per new
//! connection, closes and cancels submitted asynchronously, one `io_uring_enter` per loop
//! turn for everything (MegaPipe's batching, on today's kernels).
//!
//! With direct descriptors (`--engine auto`/`uring` when the kernel has IORING_OP_SOCKET,
//! BIND and socket uring_cmd, i.e. 6.11+) the whole connection lives in the ring: socket →
//! setsockopt → bind → connect → send → recv is one linked chain into a fixed-file slot, and
//! close is a ring op too: no fd table, no per-connection syscall (MegaPipe's lwsocket).
//!
//! Buffer lifetime (the parent module's doc says what the caller may touch when): requests
//! point into a slot's sending buffer (a send), the free tail of its receive buffer (a
//! receive), its source address (a bind), the destination address (a connect) and the statics
//! `ONE` / `LINGER0` (setsockopt). All of them are heap blocks owned by this struct or statics:
//!
//! - the sending buffer is written (the caller's staging buffer copied in, or the queued
//!   request swapped in) only by `open` on a free slot, by `send` when `SlotIo::sending` is
//!   false and by the completion of the send in flight; neither buffer is ever handed out;
//! - the receive buffer is a boxed slice never replaced; the caller reads `inbuf[..in_len]`
//!   and resets `in_len` only while `SlotIo::recv_armed` is false, and a receive is armed only
//!   into `inbuf[in_len..]`;
//! - a slot's source address is rewritten only by `open` on a free slot, and a slot is free
//!   again (`Released`) only once all its requests completed (`pending == 0`; the setup steps
//!   that post no completion run before the connect linked after them, which is counted);
//! - `Drop` cancels and reaps every request before freeing, and leaks the buffers and
//!   addresses when some request does not complete in time.

use super::{client_socket, sockaddr, ClientIo, ConnBuf, ErrOp, Event, SockOpts};
use io_uring::{opcode, squeue, types, IoUring};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};

const OP_CONNECT: u64 = 1;
const OP_SEND: u64 = 2;
const OP_RECV: u64 = 3;
/// socket / setsockopt / bind in a direct chain.
const OP_SOCKET: u64 = 4;
/// The shutdown that wakes a closing slot's requests (direct descriptors only).
const OP_SHUTDOWN: u64 = 5;

static ONE: i32 = 1;
static LINGER0: libc::linger = libc::linger {
    l_onoff: 1,
    l_linger: 0,
};
/// Operations nobody waits for (close, cancel).
const OP_UNTRACKED: u64 = 0xff;
/// Setup steps of a direct chain (socket, setsockopt, bind): linked, and silent on success
/// (one completion per connection less to post and reap for each).
const SETUP_LINK: squeue::Flags = squeue::Flags::IO_LINK.union(squeue::Flags::SKIP_SUCCESS);

#[derive(Debug, Clone, Copy, Default)]
struct SlotIo {
    fd: i32,
    pending: u32,
    closing: bool,
    failed: bool,
    recv_armed: bool,
    /// A send of the slot's sending buffer is in flight.
    sending: bool,
    /// A request waits in the queued buffer for the send in flight to complete.
    queued: bool,
    send_off: usize,
}

/// The io_uring client.
pub struct Uring {
    ring: IoUring,
    opts: SockOpts,
    dst: Box<libc::sockaddr_in>,
    bufs: Vec<ConnBuf>,
    io: Vec<SlotIo>,
    ready: Vec<Event>,
    inflight: usize,
    flags: &'static str,
    direct: bool,
    srcs: Box<[libc::sockaddr_in]>,
    /// Each slot's socket without direct descriptors (`SlotIo::fd` is its number), until the
    /// ring's close request takes it over (or `Drop` closes it).
    owned: Vec<Option<OwnedFd>>,
}

/// Runs `$body` with `$f` bound to the slot's descriptor: a fixed-file index in direct mode,
/// else the fd.
macro_rules! with_fd {
    ($self:ident, $slot:expr, |$f:ident| $body:expr) => {
        if $self.direct {
            let $f = types::Fixed($slot as u32);
            $body
        } else {
            let $f = types::Fd($self.io[$slot].fd);
            $body
        }
    };
}

/// The unspecified address, port 0.
fn sockaddr_any() -> libc::sockaddr_in {
    sockaddr(std::net::SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))
}

fn ud(slot: usize, op: u64) -> u64 {
    ((slot as u64) << 8) | op
}

impl Uring {
    /// A ring sized for `slots` connections, with direct descriptors when `direct` and the
    /// kernel supports them. Fails when io_uring is unavailable.
    pub fn new(slots: usize, recv_buf: usize, opts: SockOpts, direct: bool) -> io::Result<Self> {
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
        let mut u = Uring {
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
            direct: false,
            srcs: vec![sockaddr_any(); slots].into_boxed_slice(),
            owned: (0..slots).map(|_| None).collect(),
        };
        if direct {
            u.direct = u.try_direct(&probe, slots);
        }
        Ok(u)
    }

    /// Whether connections use direct descriptors.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Registers a sparse file table and checks, with one trial chain, that socket, socket
    /// uring_cmd (setsockopt) and close work on direct descriptors here.
    fn try_direct(&mut self, probe: &io_uring::Probe, slots: usize) -> bool {
        for op in [
            opcode::Socket::CODE,
            opcode::Bind::CODE,
            opcode::SetSockOpt::CODE,
        ] {
            if !probe.is_supported(op) {
                return false;
            }
        }
        if self
            .ring
            .submitter()
            .register_files_sparse(slots as u32)
            .is_err()
        {
            return false;
        }
        let Ok(dest) = types::DestinationSlot::try_from_slot_target(0) else {
            return false;
        };
        let trial = [
            opcode::Socket::new(libc::AF_INET, libc::SOCK_STREAM, 0)
                .file_index(Some(dest))
                .build()
                .flags(squeue::Flags::IO_LINK)
                .user_data(1),
            opcode::SetSockOpt::new(
                types::Fixed(0),
                libc::IPPROTO_IP as u32,
                libc::IP_BIND_ADDRESS_NO_PORT as u32,
                &ONE as *const i32 as *const libc::c_void,
                4,
            )
            .build()
            .flags(squeue::Flags::IO_LINK)
            .user_data(2),
            opcode::Close::new(types::Fixed(0)).build().user_data(3),
        ];
        // The entries point only at the static `ONE`; the queue is empty, with room for them.
        for e in trial {
            self.push(e);
        }
        if self.ring.submit_and_wait(3).is_err() {
            return false;
        }
        let results: Vec<i32> = self.ring.completion().map(|c| c.result()).collect();
        results.len() == 3 && results.iter().all(|&r| r >= 0)
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
        // Entries point only into `self.dst`, `self.srcs[slot]`, the slot's sending buffer or
        // the free tail of its receive buffer (heap blocks owned by `self`, neither freed,
        // moved nor handed to safe code while the slot has requests pending: module doc) or
        // at the statics `ONE` / `LINGER0`.
        // SAFETY: every buffer an entry points at outlives its request (above).
        while unsafe { self.ring.submission().push(&e) }.is_err() {
            let _ = self.ring.submit();
        }
    }

    fn send_entry(&mut self, slot: usize) -> squeue::Entry {
        let off = self.io[slot].send_off;
        let out = &self.bufs[slot].sending;
        let (ptr, len) = (out[off..].as_ptr(), (out.len() - off) as u32);
        with_fd!(self, slot, |f| opcode::Send::new(f, ptr, len)
            .flags(libc::MSG_NOSIGNAL)
            .build())
        .user_data(ud(slot, OP_SEND))
    }

    fn recv_entry(&mut self, slot: usize) -> squeue::Entry {
        let b = &mut self.bufs[slot];
        let free = &mut b.inbuf[b.in_len..];
        let (ptr, len) = (free.as_mut_ptr(), free.len() as u32);
        with_fd!(self, slot, |f| opcode::Recv::new(f, ptr, len).build())
            .user_data(ud(slot, OP_RECV))
    }

    fn sockopt(
        &self,
        slot: usize,
        level: i32,
        name: i32,
        val: *const libc::c_void,
        len: u32,
    ) -> squeue::Entry {
        opcode::SetSockOpt::new(
            types::Fixed(slot as u32),
            level as u32,
            name as u32,
            val,
            len,
        )
        .build()
        .flags(SETUP_LINK)
        .user_data(ud(slot, OP_SOCKET))
    }

    /// The whole connection setup as one linked chain into fixed-file slot `slot`.
    fn open_direct(&mut self, slot: usize, src: Option<Ipv4Addr>) -> Result<(), i32> {
        let dest =
            types::DestinationSlot::try_from_slot_target(slot as u32).map_err(|_| libc::EMFILE)?;
        let mut chain = Vec::with_capacity(8);
        chain.push(
            opcode::Socket::new(libc::AF_INET, libc::SOCK_STREAM, 0)
                .file_index(Some(dest))
                .build()
                .flags(SETUP_LINK)
                .user_data(ud(slot, OP_SOCKET)),
        );
        let one = &ONE as *const i32 as *const libc::c_void;
        if self.opts.nodelay {
            chain.push(self.sockopt(slot, libc::IPPROTO_TCP, libc::TCP_NODELAY, one, 4));
        }
        if self.opts.linger0 {
            let lg = &LINGER0 as *const libc::linger as *const libc::c_void;
            let len = std::mem::size_of::<libc::linger>() as u32;
            chain.push(self.sockopt(slot, libc::SOL_SOCKET, libc::SO_LINGER, lg, len));
        }
        if let Some(ip) = src {
            chain.push(self.sockopt(
                slot,
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                one,
                4,
            ));
            self.srcs[slot] = sockaddr(std::net::SocketAddrV4::new(ip, 0));
            let sa = &self.srcs[slot] as *const libc::sockaddr_in as *const libc::sockaddr;
            chain.push(
                opcode::Bind::new(
                    types::Fixed(slot as u32),
                    sa,
                    std::mem::size_of::<libc::sockaddr_in>() as u32,
                )
                .build()
                .flags(SETUP_LINK)
                .user_data(ud(slot, OP_SOCKET)),
            );
        }
        chain.push(
            opcode::Connect::new(
                types::Fixed(slot as u32),
                &*self.dst as *const libc::sockaddr_in as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            )
            .build()
            .flags(squeue::Flags::IO_LINK)
            .user_data(ud(slot, OP_CONNECT)),
        );
        self.io[slot] = SlotIo {
            fd: slot as i32,
            pending: 0,
            recv_armed: true,
            sending: true,
            ..Default::default()
        };
        self.bufs[slot].stage();
        chain.push(self.send_entry(slot).flags(squeue::Flags::IO_LINK));
        chain.push(self.recv_entry(slot));
        // socket / setsockopt / bind post a completion only when they fail.
        let posting = chain
            .iter()
            .filter(|e| e.get_user_data() & 0xff != OP_SOCKET)
            .count();
        self.io[slot].pending = posting as u32;
        self.inflight += posting;
        self.reserve(chain.len());
        for e in chain {
            self.push(e);
        }
        Ok(())
    }

    fn release_if_idle(&mut self, slot: usize) {
        let s = self.io[slot];
        if s.closing && s.pending == 0 {
            let e = with_fd!(self, slot, |f| opcode::Close::new(f).build())
                .flags(squeue::Flags::SKIP_SUCCESS)
                .user_data(ud(slot, OP_UNTRACKED));
            self.push(e);
            // The close request owns the socket now.
            if let Some(fd) = self.owned[slot].take() {
                let _ = fd.into_raw_fd();
            }
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
        if op != OP_SOCKET {
            // Setup steps complete silently (SKIP_SUCCESS): their completion is a failure,
            // and the rest of the chain still posts (cancelled), so it is not counted.
            self.inflight -= 1;
            self.io[slot].pending -= 1;
        }
        let s = &mut self.io[slot];
        if op == OP_RECV {
            s.recv_armed = false;
        }
        if op == OP_SEND {
            s.sending = false;
        }
        if s.closing {
            self.release_if_idle(slot);
            out.append(&mut self.ready);
            return;
        }
        if res == -libc::ECANCELED && s.failed {
            s.queued = false;
            return;
        }
        if res < 0 {
            s.failed = true;
            s.queued = false;
            let kind = match op {
                OP_SOCKET => ErrOp::Socket,
                OP_CONNECT => ErrOp::Connect,
                OP_SEND => ErrOp::Send,
                _ => ErrOp::Recv,
            };
            out.push(Event::Error(slot, kind, -res));
            return;
        }
        match op {
            OP_SOCKET => {}
            OP_CONNECT => out.push(Event::Connected(slot)),
            OP_SEND => {
                let n = res as usize;
                s.send_off += n;
                out.push(Event::Sent(slot, n));
                if s.send_off < self.bufs[slot].sending.len() {
                    let e = self.send_entry(slot);
                    self.io[slot].pending += 1;
                    self.io[slot].sending = true;
                    self.inflight += 1;
                    self.push(e);
                } else if s.queued {
                    // The request `send` queued behind this one.
                    s.queued = false;
                    s.send_off = 0;
                    self.bufs[slot].dequeue();
                    let e = self.send_entry(slot);
                    self.io[slot].pending += 1;
                    self.io[slot].sending = true;
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

impl ClientIo for Uring {
    #[inline]
    fn out(&mut self, slot: usize) -> &mut Vec<u8> {
        &mut self.bufs[slot].out
    }

    #[inline]
    fn received(&self, slot: usize) -> &[u8] {
        assert!(!self.io[slot].recv_armed, "slot {slot}: a receive is armed");
        let b = &self.bufs[slot];
        &b.inbuf[..b.in_len]
    }

    #[inline]
    fn consume(&mut self, slot: usize) {
        assert!(!self.io[slot].recv_armed, "slot {slot}: a receive is armed");
        self.bufs[slot].in_len = 0;
    }

    fn open(&mut self, slot: usize, src: Option<Ipv4Addr>) -> Result<(), i32> {
        if self.io[slot].fd >= 0 || self.io[slot].pending > 0 {
            return Err(libc::EBUSY);
        }
        if self.direct {
            return self.open_direct(slot, src);
        }
        let sock = client_socket(false, src, self.opts.linger0, self.opts.nodelay)?;
        let fd = sock.as_raw_fd();
        self.owned[slot] = Some(sock);
        self.io[slot] = SlotIo {
            fd,
            pending: 3,
            recv_armed: true,
            sending: true,
            ..Default::default()
        };
        self.bufs[slot].stage();
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
        if self.io[slot].fd < 0 {
            // A free slot: what a send on no socket answers.
            self.ready
                .push(Event::Error(slot, ErrOp::Send, libc::EBADF));
            return;
        }
        if self.io[slot].sending {
            // The previous send's completion is not reaped yet (its bytes may be out, the
            // response in): the sending buffer is the kernel's until then.
            self.bufs[slot].queue();
            self.io[slot].queued = true;
            self.recv(slot);
            return;
        }
        self.bufs[slot].stage();
        self.io[slot].sending = true;
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
            if self.direct {
                // Tracked like any request: the kernel runs a shutdown from its io-wq threads
                // and looks the direct descriptor up only then, so the slot (and its number)
                // must not be closed and reused before it completed, or it would shut down
                // the slot's next connection.
                let sh = opcode::Shutdown::new(types::Fixed(slot as u32), libc::SHUT_RDWR)
                    .build()
                    .user_data(ud(slot, OP_SHUTDOWN));
                self.io[slot].pending += 1;
                self.inflight += 1;
                self.push(sh);
            } else if let Some(fd) = &self.owned[slot] {
                let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Both);
            }
            let cancel = with_fd!(self, slot, |f| opcode::AsyncCancel2::new(
                types::CancelBuilder::fd(f).all()
            )
            .build())
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
        if self.direct {
            "io_uring+direct"
        } else {
            "io_uring"
        }
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
        // Closes the sockets no close request took over.
        self.owned.clear();
        if self.inflight > 0 {
            // Operations still hold pointers into our buffers and addresses: leak them rather
            // than free.
            std::mem::forget(std::mem::take(&mut self.bufs));
            std::mem::forget(std::mem::replace(&mut self.dst, Box::new(sockaddr_any())));
            std::mem::forget(std::mem::take(&mut self.srcs));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{SocketAddrV4, TcpListener};

    /// Events for a few loop turns of `ms` milliseconds each.
    fn turns(u: &mut Uring, n: usize, ms: u64) -> Vec<Event> {
        let mut all = Vec::new();
        for _ in 0..n {
            let mut out = Vec::new();
            u.wait(ms * 1_000_000, &mut out).unwrap();
            all.extend(out);
        }
        all
    }

    /// Opens slot 0 to the listener; returns the server's side of the connection.
    /// A two-slot client of `listener`, with direct descriptors when `direct` (and the kernel
    /// has them).
    pub(super) fn client(listener: &TcpListener, direct: bool) -> Uring {
        let std::net::SocketAddr::V4(target) = listener.local_addr().unwrap() else {
            unreachable!("bound to IPv4");
        };
        let opts = SockOpts {
            target: SocketAddrV4::new(*target.ip(), target.port()),
            src: Vec::new().into(),
            linger0: false,
            nodelay: true,
        };
        Uring::new(2, 4096, opts, direct).unwrap()
    }

    fn connect(u: &mut Uring, listener: &TcpListener) -> std::net::TcpStream {
        *u.out(0) = b"ping".to_vec();
        u.open(0, None).unwrap();
        let events = turns(u, 5, 10); // submits the connect
        let (server, _) = listener.accept().unwrap();
        assert!(events.contains(&Event::Connected(0)), "{events:?}");
        server
    }

    /// A slot closed with its receive in flight is woken by a shutdown, which the kernel runs
    /// from io-wq and which finds the direct descriptor by its index only then. Held back
    /// there, it must not reach the slot's next connection: the slot is released only once the
    /// shutdown ran (else the next connection reads an EOF its server never sent).
    #[test]
    fn a_late_shutdown_never_reaches_the_slots_next_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut u = client(&listener, true);
        if !u.is_direct() {
            eprintln!("skipping: this kernel has no direct-descriptor sockets");
            return;
        }
        let _first = connect(&mut u, &listener);
        let (hold, entries) =
            crate::testing::IoWqHold::new(&u.ring.submitter(), ud(0, OP_UNTRACKED)).unwrap();
        for e in entries {
            u.push(e);
        }
        turns(&mut u, 1, 10);
        u.close(0); // its receive is armed: woken by the shutdown (held in io-wq)
        let released_early = turns(&mut u, 5, 10).contains(&Event::Released(0));
        let mut _next = None;
        if released_early {
            _next = Some(connect(&mut u, &listener));
        }
        hold.release();
        let mut events = turns(&mut u, 10, 10);
        if !released_early {
            assert!(events.contains(&Event::Released(0)), "{events:?}");
            _next = Some(connect(&mut u, &listener));
        }
        events.extend(turns(&mut u, 10, 20));
        assert!(
            !events.contains(&Event::Recv(0, 0)),
            "the slot's next connection read an EOF nobody sent: {events:?}"
        );
    }
}

#[cfg(test)]
mod buffer_tests {
    use super::tests::client;
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    /// A `send` while the slot's previous send is still in flight (here: the opening one, not
    /// even submitted) queues the request: both go out once, in order, and the caller's
    /// staging buffer is never the one the kernel reads.
    #[test]
    fn a_send_behind_one_in_flight_is_queued_not_overwritten() {
        for direct in [false, true] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut u = client(&listener, direct);
            *u.out(0) = b"first;".to_vec();
            u.open(0, None).unwrap();
            *u.out(0) = b"second;".to_vec();
            u.send(0);
            // The staging buffer is the caller's again at once.
            u.out(0).clear();
            u.out(0).extend_from_slice(b"garbage");
            assert_eq!(u.open(0, None), Err(libc::EBUSY));
            let mut events = Vec::new();
            for _ in 0..10 {
                // A fresh vector each turn, as the engine's: `wait` only polls when given events.
                let mut turn = Vec::new();
                u.wait(10_000_000, &mut turn).unwrap();
                events.extend(turn);
            }
            let (mut server, _) = listener.accept().unwrap();
            server
                .set_read_timeout(Some(std::time::Duration::from_millis(200)))
                .unwrap();
            let mut got = Vec::new();
            let mut b = [0u8; 64];
            while let Ok(n) = server.read(&mut b) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&b[..n]);
            }
            assert_eq!(
                got, b"first;second;",
                "direct: {direct}, events: {events:?}"
            );
            let sent: usize = events
                .iter()
                .map(|e| if let Event::Sent(0, n) = e { *n } else { 0 })
                .sum();
            assert_eq!(sent, 13, "{events:?}");
        }
    }

    /// The received bytes are not readable while a receive is armed into the buffer.
    #[test]
    #[should_panic(expected = "a receive is armed")]
    fn received_bytes_are_refused_while_a_receive_is_armed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut u = client(&listener, false);
        *u.out(0) = b"ping".to_vec();
        u.open(0, None).unwrap();
        let _ = u.received(0);
    }
}
