//! Scheduling: taking units (quota, open-loop arrivals), starting sessions on free slots,
//! asking scripts for their next step and issuing requests.

use super::{AfterClose, ClientIo, Engine, Phase, Unit};
use crate::workload::{Step, StepIo};
use std::cmp::Reverse;

impl<B: ClientIo> Engine<B> {
    fn take_unit(&mut self, now: u64) -> Option<Option<u64>> {
        if self.stopping || self.quota == Some(0) {
            return None;
        }
        let intended = match &mut self.arrivals {
            Some(a) => Some(a.take_due(now)?),
            None => None,
        };
        if let Some(q) = &mut self.quota {
            *q -= 1;
        }
        Some(intended)
    }

    pub(super) fn dispatch(&mut self, now: u64) {
        while let Some(Reverse((t, i))) = self.timers.peek().copied() {
            if t > now {
                break;
            }
            self.timers.pop();
            if self.slots[i].phase == Phase::Thinking {
                self.slots[i].phase = Phase::Active;
                self.step(i, now);
            }
        }
        while let Some(&i) = self.parked.front() {
            if self.slots[i].phase != Phase::Parked {
                self.parked.pop_front();
                continue;
            }
            if self.quota == Some(0) {
                self.parked.pop_front();
                self.end_session_quietly(i);
                continue;
            }
            match self.take_unit(now) {
                Some(intended) => {
                    self.parked.pop_front();
                    self.issue(i, now, intended);
                }
                None => break,
            }
        }
        // At most one start per slot per turn: a slot whose open fails at once (no socket,
        // no source address) is free again immediately and must not spin this loop.
        let mut starts_left = self.slots.len();
        while let Some(&i) = self.free.last() {
            if starts_left == 0 {
                break;
            }
            starts_left -= 1;
            let intended = match self.plan.unit {
                Unit::Session => match self.take_unit(now) {
                    Some(t) => t,
                    None => break,
                },
                Unit::Txn => {
                    if self.stopping || self.quota == Some(0) {
                        break;
                    }
                    None
                }
            };
            self.free.pop();
            let s = &mut self.slots[i];
            s.script.reset();
            s.in_session = true;
            s.sess_start = now;
            s.sess_intended = intended;
            s.phase = Phase::Active;
            self.step(i, now);
        }
    }

    /// Asks the script what to do next and does it.
    pub(super) fn step(&mut self, i: usize, now: u64) {
        loop {
            let s = &mut self.slots[i];
            let out = self.b.out(i);
            out.clear();
            let step = s.script.next(StepIo {
                out,
                expect: &mut s.expect,
                rng: &mut s.rng,
            });
            match step {
                Step::Send => {
                    if s.expect.is_empty() {
                        // A script that sends nothing expecting nothing: treat as the end.
                        self.finish_session(i, now, true);
                        return;
                    }
                    if self.plan.unit == Unit::Txn {
                        if self.quota == Some(0) || self.stopping {
                            self.slots[i].expect.clear();
                            self.end_session_quietly(i);
                            return;
                        }
                        match self.take_unit(now) {
                            Some(intended) => self.issue(i, now, intended),
                            None => {
                                self.slots[i].phase = Phase::Parked;
                                self.parked.push_back(i);
                            }
                        }
                    } else {
                        self.issue(i, now, None);
                    }
                    return;
                }
                Step::Think(ns) => {
                    s.phase = Phase::Thinking;
                    self.timers.push(Reverse((now + ns, i)));
                    return;
                }
                Step::Disconnect => {
                    if s.open {
                        self.close(i, AfterClose::Continue);
                        return;
                    }
                }
                Step::Close => {
                    self.finish_session(i, now, true);
                    return;
                }
                Step::AwaitClose => {
                    if s.open && s.connected && !s.doomed {
                        s.phase = Phase::AwaitEof;
                        s.last_io = now;
                        self.b.recv(i);
                    } else {
                        self.finish_session(i, now, true);
                    }
                    return;
                }
            }
        }
    }

    /// Sends the request in `out` (opening a connection if needed).
    fn issue(&mut self, i: usize, now: u64, intended: Option<u64>) {
        let s = &mut self.slots[i];
        s.txn_start = now;
        s.txn_intended = intended.or(if self.plan.unit == Unit::Session {
            s.sess_intended
        } else {
            None
        });
        s.last_io = now;
        s.phase = Phase::Active;
        if s.open && s.doomed {
            self.close(i, AfterClose::OpenSend);
            return;
        }
        if s.open {
            self.b.send(i);
        } else {
            self.open(i, now);
        }
    }
}
