//! The epoll backend: non-blocking sockets, level-triggered readiness (the fallback and the
//! baseline; it does what crr_client does).

use super::{close, connect, cvt_int, read, send, so_error, sockaddr};
use crate::engine::{Backend, ConnBuf, Event, SockOpts};
use crate::stats::ErrKind;
use std::io;
use std::net::Ipv4Addr;

#[derive(Debug, Clone, Copy, Default)]
struct SlotIo {
    fd: i32,
    interest: u32,
    connecting: bool,
    send_off: usize,
    sending: bool,
}

/// epoll backend.
pub struct Epoll {
    ep: i32,
    opts: SockOpts,
    dst: libc::sockaddr_in,
    bufs: Vec<ConnBuf>,
    io: Vec<SlotIo>,
    ready: Vec<Event>,
    evs: Vec<libc::epoll_event>,
}

impl Epoll {
    /// A backend with `slots` connection slots and `recv_buf` bytes of receive buffer each.
    pub fn new(slots: usize, recv_buf: usize, opts: SockOpts) -> io::Result<Self> {
        // SAFETY: plain syscall.
        let ep = cvt_int(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        Ok(Epoll {
            ep,
            dst: sockaddr(opts.target),
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
            evs: vec![libc::epoll_event { events: 0, u64: 0 }; 512],
        })
    }

    fn ctl(&self, op: i32, fd: i32, events: u32, slot: usize) -> Result<(), i32> {
        let mut ev = libc::epoll_event {
            events,
            u64: slot as u64,
        };
        // SAFETY: `ev` is a live epoll_event; the kernel validates the descriptors.
        let r = unsafe { libc::epoll_ctl(self.ep, op, fd, &mut ev) };
        if r < 0 {
            Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO))
        } else {
            Ok(())
        }
    }

    fn set_interest(&mut self, slot: usize, events: u32) -> Result<(), i32> {
        let s = self.io[slot];
        if s.interest != events {
            self.ctl(libc::EPOLL_CTL_MOD, s.fd, events, slot)?;
            self.io[slot].interest = events;
        }
        Ok(())
    }

    /// Writes as much of `out` as the socket takes; arms EPOLLOUT for the rest.
    fn try_send(&mut self, slot: usize) {
        let fd = self.io[slot].fd;
        loop {
            let off = self.io[slot].send_off;
            let out = &self.bufs[slot].out;
            if off >= out.len() {
                self.io[slot].sending = false;
                if let Err(e) = self.set_interest(slot, libc::EPOLLIN as u32) {
                    self.ready.push(Event::Error(slot, ErrKind::Send, e));
                }
                return;
            }
            match send(fd, &out[off..]) {
                Ok(n) => {
                    self.io[slot].send_off += n;
                    self.ready.push(Event::Sent(slot, n));
                }
                Err(libc::EAGAIN) => {
                    self.io[slot].sending = true;
                    if let Err(e) = self.set_interest(slot, (libc::EPOLLIN | libc::EPOLLOUT) as u32)
                    {
                        self.ready.push(Event::Error(slot, ErrKind::Send, e));
                    }
                    return;
                }
                Err(e) => {
                    self.ready.push(Event::Error(slot, ErrKind::Send, e));
                    return;
                }
            }
        }
    }

    fn on_ready(&mut self, slot: usize, events: u32, out: &mut Vec<Event>) {
        let s = self.io[slot];
        if s.fd < 0 {
            return;
        }
        let errish = events & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
        if s.connecting {
            if events & libc::EPOLLOUT as u32 != 0 || errish {
                self.io[slot].connecting = false;
                let e = so_error(s.fd);
                if e != 0 {
                    out.push(Event::Error(slot, ErrKind::Connect, e));
                    return;
                }
                out.push(Event::Connected(slot));
                self.try_send(slot);
                out.append(&mut self.ready);
            }
            return;
        }
        if s.sending && events & libc::EPOLLOUT as u32 != 0 {
            self.try_send(slot);
            out.append(&mut self.ready);
        }
        if events & libc::EPOLLIN as u32 != 0 || errish {
            let b = &mut self.bufs[slot];
            match read(s.fd, &mut b.inbuf[b.in_len..]) {
                Ok(n) => {
                    b.in_len += n;
                    out.push(Event::Recv(slot, n));
                }
                Err(libc::EAGAIN) => {}
                Err(e) => out.push(Event::Error(slot, ErrKind::Recv, e)),
            }
        }
    }
}

impl Backend for Epoll {
    fn buf(&mut self, slot: usize) -> &mut ConnBuf {
        &mut self.bufs[slot]
    }

    fn open(&mut self, slot: usize, src: Option<Ipv4Addr>) -> Result<(), i32> {
        let fd = super::client_socket(true, src, self.opts.linger0, self.opts.nodelay)?;
        if let Err(e) = connect(fd, &self.dst) {
            close(fd);
            return Err(e);
        }
        if let Err(e) = self.ctl(libc::EPOLL_CTL_ADD, fd, libc::EPOLLOUT as u32, slot) {
            close(fd);
            return Err(e);
        }
        self.io[slot] = SlotIo {
            fd,
            interest: libc::EPOLLOUT as u32,
            connecting: true,
            send_off: 0,
            sending: false,
        };
        Ok(())
    }

    fn send(&mut self, slot: usize) {
        self.io[slot].send_off = 0;
        self.try_send(slot);
    }

    fn recv(&mut self, _slot: usize) {
        // Level-triggered EPOLLIN stays armed.
    }

    fn close(&mut self, slot: usize) {
        let fd = self.io[slot].fd;
        if fd >= 0 {
            close(fd);
        }
        self.io[slot] = SlotIo {
            fd: -1,
            ..Default::default()
        };
        self.ready.push(Event::Released(slot));
    }

    fn wait(&mut self, timeout_ns: u64, out: &mut Vec<Event>) -> io::Result<()> {
        if !self.ready.is_empty() {
            out.append(&mut self.ready);
        }
        let ms = if out.is_empty() {
            timeout_ns.div_ceil(1_000_000).min(1000) as i32
        } else {
            0
        };
        // SAFETY: `evs` is a live buffer of `len` epoll_events.
        let n =
            unsafe { libc::epoll_wait(self.ep, self.evs.as_mut_ptr(), self.evs.len() as i32, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok(());
            }
            return Err(e);
        }
        for k in 0..n as usize {
            let ev = self.evs[k];
            self.on_ready(ev.u64 as usize, ev.events, out);
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "epoll"
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        for s in &self.io {
            if s.fd >= 0 {
                close(s.fd);
            }
        }
        close(self.ep);
    }
}
