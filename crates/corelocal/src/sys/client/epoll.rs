//! The epoll client: non-blocking sockets, level-triggered readiness (the fallback and the
//! baseline; it does what crr_client does). Its I/O are synchronous calls on buffers borrowed
//! for the call, so no buffer is in the kernel's hands between calls.

use super::{
    client_socket, connect, read, send, so_error, ClientIo, ConnBuf, ErrOp, Event, SockOpts,
};
use rustix::event::epoll::{self, EventData, EventFlags};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::OwnedFd;

#[derive(Debug, Default)]
struct SlotIo {
    /// The connection's socket (None: the slot is free); closed when dropped.
    fd: Option<OwnedFd>,
    interest: EventFlags,
    connecting: bool,
    send_off: usize,
    sending: bool,
}

/// The epoll client.
pub struct Epoll {
    // Sockets close before the epoll instance (field order), as they always did.
    io: Vec<SlotIo>,
    ep: OwnedFd,
    opts: SockOpts,
    dst: SocketAddrV4,
    bufs: Vec<ConnBuf>,
    ready: Vec<Event>,
    evs: Vec<epoll::Event>,
}

/// Events returned by one epoll_wait at most.
const EVENTS_MAX: usize = 512;

impl Epoll {
    /// A backend with `slots` connection slots and `recv_buf` bytes of receive buffer each.
    pub fn new(slots: usize, recv_buf: usize, opts: SockOpts) -> io::Result<Self> {
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        Ok(Epoll {
            ep,
            dst: opts.target,
            opts,
            bufs: (0..slots).map(|_| ConnBuf::new(recv_buf)).collect(),
            io: (0..slots).map(|_| SlotIo::default()).collect(),
            ready: Vec::new(),
            evs: Vec::with_capacity(EVENTS_MAX),
        })
    }

    fn set_interest(&mut self, slot: usize, events: EventFlags) -> Result<(), i32> {
        let s = &self.io[slot];
        if s.interest != events {
            // A free slot has no descriptor: what epoll_ctl on -1 answered.
            let fd = s.fd.as_ref().ok_or(libc::EBADF)?;
            epoll::modify(&self.ep, fd, EventData::new_u64(slot as u64), events)
                .map_err(|e| e.raw_os_error())?;
            self.io[slot].interest = events;
        }
        Ok(())
    }

    /// Writes as much of `out` as the socket takes; arms EPOLLOUT for the rest.
    fn try_send(&mut self, slot: usize) {
        loop {
            let off = self.io[slot].send_off;
            let out = &self.bufs[slot].sending;
            if off >= out.len() {
                self.io[slot].sending = false;
                if let Err(e) = self.set_interest(slot, EventFlags::IN) {
                    self.ready.push(Event::Error(slot, ErrOp::Send, e));
                }
                return;
            }
            let Some(fd) = &self.io[slot].fd else {
                // A free slot: what send on -1 answered.
                self.ready
                    .push(Event::Error(slot, ErrOp::Send, libc::EBADF));
                return;
            };
            match send(fd, &out[off..]) {
                Ok(n) => {
                    self.io[slot].send_off += n;
                    self.ready.push(Event::Sent(slot, n));
                }
                Err(libc::EAGAIN) => {
                    self.io[slot].sending = true;
                    if let Err(e) = self.set_interest(slot, EventFlags::IN | EventFlags::OUT) {
                        self.ready.push(Event::Error(slot, ErrOp::Send, e));
                    }
                    return;
                }
                Err(e) => {
                    self.ready.push(Event::Error(slot, ErrOp::Send, e));
                    return;
                }
            }
        }
    }

    fn on_ready(&mut self, slot: usize, events: EventFlags, out: &mut Vec<Event>) {
        let s = &self.io[slot];
        let Some(fd) = &s.fd else {
            return;
        };
        let (connecting, sending) = (s.connecting, s.sending);
        let errish = events.intersects(EventFlags::ERR | EventFlags::HUP);
        if connecting {
            if events.contains(EventFlags::OUT) || errish {
                let e = so_error(fd);
                self.io[slot].connecting = false;
                if e != 0 {
                    out.push(Event::Error(slot, ErrOp::Connect, e));
                    return;
                }
                out.push(Event::Connected(slot));
                self.try_send(slot);
                out.append(&mut self.ready);
            }
            return;
        }
        if sending && events.contains(EventFlags::OUT) {
            self.try_send(slot);
            out.append(&mut self.ready);
        }
        if events.contains(EventFlags::IN) || errish {
            let Some(fd) = &self.io[slot].fd else {
                return;
            };
            let b = &mut self.bufs[slot];
            match read(fd, &mut b.inbuf[b.in_len..]) {
                Ok(n) => {
                    b.in_len += n;
                    out.push(Event::Recv(slot, n));
                }
                Err(libc::EAGAIN) => {}
                Err(e) => out.push(Event::Error(slot, ErrOp::Recv, e)),
            }
        }
    }
}

impl ClientIo for Epoll {
    #[inline]
    fn out(&mut self, slot: usize) -> &mut Vec<u8> {
        &mut self.bufs[slot].out
    }

    #[inline]
    fn received(&self, slot: usize) -> &[u8] {
        let b = &self.bufs[slot];
        &b.inbuf[..b.in_len]
    }

    #[inline]
    fn consume(&mut self, slot: usize) {
        self.bufs[slot].in_len = 0;
    }

    fn open(&mut self, slot: usize, src: Option<Ipv4Addr>) -> Result<(), i32> {
        if self.io[slot].fd.is_some() {
            return Err(libc::EBUSY);
        }
        // On an error the socket closes when `fd` drops.
        let fd = client_socket(true, src, self.opts.linger0, self.opts.nodelay)?;
        connect(&fd, &self.dst)?;
        epoll::add(
            &self.ep,
            &fd,
            EventData::new_u64(slot as u64),
            EventFlags::OUT,
        )
        .map_err(|e| e.raw_os_error())?;
        self.io[slot] = SlotIo {
            fd: Some(fd),
            interest: EventFlags::OUT,
            connecting: true,
            send_off: 0,
            sending: false,
        };
        self.bufs[slot].stage();
        Ok(())
    }

    fn send(&mut self, slot: usize) {
        self.bufs[slot].stage();
        self.io[slot].send_off = 0;
        self.try_send(slot);
    }

    fn recv(&mut self, _slot: usize) {
        // Level-triggered EPOLLIN stays armed.
    }

    fn close(&mut self, slot: usize) {
        // Dropping the slot's descriptor closes it.
        self.io[slot] = SlotIo::default();
        self.ready.push(Event::Released(slot));
    }

    fn wait(&mut self, timeout_ns: u64, out: &mut Vec<Event>) -> io::Result<()> {
        if !self.ready.is_empty() {
            out.append(&mut self.ready);
        }
        let ms = if out.is_empty() {
            timeout_ns.div_ceil(1_000_000).min(1000) as i64
        } else {
            0
        };
        // Whole milliseconds: rustix passes them to epoll_pwait as they are.
        let ts = rustix::time::Timespec {
            tv_sec: ms / 1000,
            tv_nsec: (ms % 1000) * 1_000_000,
        };
        self.evs.clear();
        let mut evs = std::mem::take(&mut self.evs);
        match epoll::wait(
            &self.ep,
            rustix::buffer::spare_capacity(&mut evs),
            Some(&ts),
        ) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {
                self.evs = evs;
                return Ok(());
            }
            Err(e) => {
                self.evs = evs;
                return Err(e.into());
            }
        }
        for ev in &evs {
            self.on_ready(ev.data.u64() as usize, ev.flags, out);
        }
        self.evs = evs;
        Ok(())
    }

    fn name(&self) -> &'static str {
        "epoll"
    }
}
