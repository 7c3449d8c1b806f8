//! Measurement: finished and failed sessions, errors, timeouts and completed transactions.

use super::{AfterClose, ClientIo, Engine, Phase, Unit};
use crate::stats::ErrKind;
use std::sync::atomic::Ordering;

impl<B: ClientIo> Engine<B> {
    pub(super) fn finish_session(&mut self, i: usize, now: u64, ok: bool) {
        let w = self.in_window(now);
        let s = &mut self.slots[i];
        s.in_session = false;
        s.expect.clear();
        if ok {
            self.stats.sessions_total += 1;
            self.stats.tick(now).sessions += 1;
            if w {
                self.stats.sessions += 1;
                self.stats.lat_session.record(now - s.sess_start);
                if let Some(t) = s.sess_intended {
                    self.stats.lat_session_co.record(now - t);
                }
            }
            if self.plan.unit == Unit::Session {
                self.plan.progress.fetch_add(1, Ordering::Relaxed);
            }
        }
        if s.open {
            self.close(i, AfterClose::Free);
        } else {
            s.phase = Phase::Free;
            self.free.push(i);
        }
    }

    pub(super) fn fail_session(&mut self, i: usize, now: u64) {
        self.finish_session(i, now, false);
    }

    pub(super) fn error(&mut self, i: usize, kind: ErrKind, errno: i32, now: u64) {
        if kind == ErrKind::Connect && errno == libc::EADDRNOTAVAIL && self.spread_sources(i, now) {
            // No SYN left this host: connect again, from a source address.
            self.close(i, AfterClose::OpenSend);
            return;
        }
        let w = self.in_window(now);
        self.stats.error(kind, errno, now, w);
        if self.slots[i].in_session {
            self.fail_session(i, now);
        } else if self.slots[i].open && self.slots[i].phase != Phase::Closing {
            self.close(i, AfterClose::Free);
        }
    }

    pub(super) fn scan_timeouts(&mut self, now: u64) {
        for i in 0..self.slots.len() {
            let s = &self.slots[i];
            if s.in_session
                && matches!(s.phase, Phase::Active | Phase::AwaitEof)
                && now.saturating_sub(s.last_io) > self.plan.timeout_ns
            {
                self.error(i, ErrKind::Timeout, libc::ETIMEDOUT, now);
            }
        }
    }

    pub(super) fn complete_txn(&mut self, i: usize, info: crate::proto::RespInfo, now: u64) {
        let w = self.in_window(now);
        let st = &mut self.stats;
        let s = &mut self.slots[i];
        st.txns_total += 1;
        st.tick(now).txns += 1;
        match info.hit {
            Some(true) => st.hits += 1,
            Some(false) => st.misses += 1,
            None => {}
        }
        if info.hit.is_none()
            && info.status == 0
            && matches!(s.expect.front(), Some(crate::proto::Parser::Kv(_)))
        {
            st.stores += 1;
        }
        if w {
            st.txns += 1;
            st.lat_txn.record(now - s.txn_start);
            if let Some(t) = s.txn_intended {
                st.lat_txn_co.record(now - t);
            }
            if info.status > 0 {
                st.status[(info.status / 100).min(5) as usize] += 1;
            }
        }
        if info.server_closes {
            s.doomed = true;
        }
        if self.plan.unit == Unit::Txn {
            self.plan.progress.fetch_add(1, Ordering::Relaxed);
        }
        if info.status >= 400 {
            self.stats
                .error(ErrKind::HttpStatus, info.status as i32, now, w);
        }
    }
}
