//! Connection lifecycle: opening (with source addresses spread on demand), closing, and
//! ending or abandoning a slot's session.

use super::{AfterClose, ClientIo, Engine, Phase};
use crate::stats::ErrKind;

impl<B: ClientIo> Engine<B> {
    pub(super) fn open(&mut self, i: usize, now: u64) {
        let src = if self.plan.src.is_empty() || !self.src_active {
            None
        } else {
            let a = self.plan.src[self.src_next % self.plan.src.len()];
            self.src_next = self.src_next.wrapping_add(1);
            Some(a)
        };
        let s = &mut self.slots[i];
        s.conn_start = now;
        s.connected = false;
        s.doomed = false;
        self.b.consume(i);
        self.slots[i].bound_src = src.is_some();
        let mut opened = self.b.open(i, src);
        if opened == Err(libc::EADDRNOTAVAIL) && self.spread_sources(i, now) {
            opened = self.open_again(i);
        }
        match opened {
            Ok(()) => self.slots[i].open = true,
            Err(e) => {
                let w = self.in_window(now);
                self.stats.error(ErrKind::Socket, e, now, w);
                self.fail_session(i, now);
            }
        }
    }

    /// Slot `i` found no ephemeral port with no source address bound: spread connections over
    /// the source addresses from now on (once), and say whether `i` may retry from one. False
    /// when it was bound already or there is nothing to spread over (`--src none`).
    pub(super) fn spread_sources(&mut self, i: usize, now: u64) -> bool {
        if self.slots[i].bound_src || !self.plan.src_on_demand || self.plan.src.is_empty() {
            return false;
        }
        if !self.src_active {
            self.src_active = true;
            self.stats.src_spread_at_ns = Some(now);
        }
        true
    }

    fn open_again(&mut self, i: usize) -> Result<(), i32> {
        let a = self.plan.src[self.src_next % self.plan.src.len()];
        self.src_next = self.src_next.wrapping_add(1);
        self.slots[i].bound_src = true;
        self.b.open(i, Some(a))
    }

    pub(super) fn close(&mut self, i: usize, after: AfterClose) {
        let s = &mut self.slots[i];
        s.phase = Phase::Closing;
        s.after = after;
        self.b.close(i);
    }

    /// Ends a session without counting it (quota reached / time up).
    pub(super) fn end_session_quietly(&mut self, i: usize) {
        let s = &mut self.slots[i];
        s.in_session = false;
        s.expect.clear();
        if s.open {
            self.close(i, AfterClose::Free);
        } else {
            s.phase = Phase::Free;
            self.free.push(i);
        }
    }

    /// At the end of the run: drop whatever the slot does.
    pub(super) fn abandon(&mut self, i: usize) {
        let s = &mut self.slots[i];
        if s.phase == Phase::Closing {
            s.in_session = false;
            s.after = AfterClose::Free;
            return;
        }
        if s.in_session || s.open {
            self.end_session_quietly(i);
        }
    }
}
