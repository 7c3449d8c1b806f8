//! Backend events: connections established, bytes sent, errors, releases, and received bytes
//! fed to the response parsers.

use super::{AfterClose, ClientIo, Engine, Event, Phase};
use crate::proto::Progress;
use crate::stats::ErrKind;

impl<B: ClientIo> Engine<B> {
    pub(super) fn on_event(&mut self, ev: Event, now: u64) {
        match ev {
            Event::Released(i) => {
                let s = &mut self.slots[i];
                s.open = false;
                s.connected = false;
                s.doomed = false;
                if !s.in_session {
                    s.phase = Phase::Free;
                    self.free.push(i);
                    return;
                }
                s.phase = Phase::Active;
                match s.after {
                    AfterClose::Free => {
                        s.in_session = false;
                        s.phase = Phase::Free;
                        self.free.push(i);
                    }
                    AfterClose::Continue => self.step(i, now),
                    AfterClose::OpenSend => self.open(i, now),
                }
            }
            Event::Connected(i) => {
                let w = self.in_window(now);
                let s = &mut self.slots[i];
                s.connected = true;
                s.last_io = now;
                if w {
                    self.stats.conns += 1;
                    self.stats.lat_connect.record(now - s.conn_start);
                }
            }
            Event::Sent(i, n) => {
                self.slots[i].last_io = now;
                if self.in_window(now) {
                    self.stats.bytes_out += n as u64;
                }
            }
            Event::Error(i, kind, errno) => {
                if self.slots[i].phase == Phase::Closing {
                    return;
                }
                self.error(i, ErrKind::from(kind), errno, now);
            }
            Event::Recv(i, n) => self.on_recv(i, n, now),
        }
    }

    fn on_recv(&mut self, i: usize, n: usize, now: u64) {
        if self.slots[i].phase == Phase::Closing {
            return;
        }
        self.slots[i].last_io = now;
        if self.in_window(now) {
            self.stats.bytes_in += n as u64;
        }
        if n == 0 {
            // The peer closed.
            let s = &mut self.slots[i];
            if s.phase == Phase::AwaitEof {
                self.finish_session(i, now, true);
                return;
            }
            if let Some(p) = s.expect.front_mut() {
                if let Ok(info) = p.eof() {
                    // A close-delimited body ended.
                    self.complete_txn(i, info, now);
                    let s = &mut self.slots[i];
                    s.expect.pop_front();
                    s.doomed = true;
                    if s.expect.is_empty() {
                        self.step(i, now);
                        return;
                    }
                }
                self.error(i, ErrKind::ClosedEarly, 0, now);
            } else if s.in_session {
                self.error(i, ErrKind::ClosedIdle, 0, now);
            } else {
                self.close(i, AfterClose::Free);
            }
            return;
        }
        let mut off = 0;
        loop {
            let buf = self.b.received(i);
            let len = buf.len();
            if off >= len {
                break;
            }
            let s = &mut self.slots[i];
            let Some(p) = s.expect.front_mut() else {
                self.b.consume(i);
                self.error(i, ErrKind::Unexpected, 0, now);
                return;
            };
            match p.feed(&buf[off..len]) {
                Ok(Progress::NeedMore) => off = len,
                Ok(Progress::Done { consumed, info }) => {
                    off += consumed;
                    self.complete_txn(i, info, now);
                    self.slots[i].expect.pop_front();
                }
                Err(_) => {
                    self.b.consume(i);
                    self.error(i, ErrKind::Protocol, 0, now);
                    return;
                }
            }
        }
        self.b.consume(i);
        let s = &self.slots[i];
        if s.expect.is_empty() && s.phase == Phase::Active {
            self.step(i, now);
        } else if !s.expect.is_empty() {
            self.b.recv(i);
        }
    }
}
