//! Running a core: kicking an idle core, the hog's share of a hogged core's CPU, and
//! picking the next job (softirq first, then the accept thread and the run queue).

use super::{AcceptState, Ev, Job, Sim, ACCEPT, NS_PER_MS};
use crate::balance::sim::BATCHES;

impl Sim {
    pub(super) fn kick(&mut self, core: usize) {
        if self.cores[core].current.is_none() {
            self.kicks.push_back(core as u32);
        }
    }

    pub(super) fn drain_kicks(&mut self) {
        let limit = 64 * self.cfg.cores + 1024;
        let mut n = 0;
        while let Some(core) = self.kicks.pop_front() {
            n += 1;
            assert!(n <= limit, "kick storm");
            if self.cores[core as usize].current.is_none() {
                self.pick(core as usize);
            }
        }
    }

    fn hog_active(&self, core: usize) -> bool {
        core < self.cfg.hog && self.now_ns >= self.hog_start_ns && self.now_ns < self.hog_end_ns
    }

    /// Whether `core`'s server may run now. On a hogged core a fair scheduler gives the
    /// server (which sleeps often, so it wins each wakeup) the CPU at once, but no more than
    /// `hog_share_pct`% of each `hog_period_ms` window; once that is used up the hog runs
    /// until the next window (softirq still runs at once).
    pub(super) fn server_may_run(&mut self, core: usize) -> bool {
        if !self.hog_active(core) {
            return true;
        }
        let period = self.cfg.hog_period_ms * NS_PER_MS;
        let c = &mut self.cores[core];
        if self.now_ns < c.server_blocked_until_ns {
            return false;
        }
        let window = self.now_ns - self.now_ns % period;
        if window != c.window_start_ns {
            c.window_start_ns = window;
            c.window_used_ns = 0;
        }
        let quota = period * u64::from(self.cfg.hog_share_pct) / 100;
        if c.window_used_ns < quota {
            return true;
        }
        c.server_blocked_until_ns = window + period;
        let t = window + period;
        self.schedule(t, Ev::Resume(core as u32));
        false
    }

    /// Charges `cost_ns` of server work on `core` to its hog window.
    fn charge_server(&mut self, core: usize, cost_ns: u64) {
        if self.hog_active(core) {
            self.cores[core].window_used_ns += cost_ns;
        }
    }

    fn start(&mut self, core: usize, job: Job, dur_ns: u64) {
        debug_assert!(self.cores[core].current.is_none());
        self.cores[core].current = Some(job);
        let t = self.now_ns + dur_ns.max(1);
        self.schedule(t, Ev::CoreDone(core as u32));
    }

    /// Chooses and starts `core`'s next job, or leaves it idle.
    pub(super) fn pick(&mut self, core: usize) {
        let mut guard = self.cores[core].runq.len() + 8;
        loop {
            guard -= 1;
            assert!(guard > 0, "pick loop bound");
            if let Some(job) = self.cores[core].soft.pop_front() {
                let Job::Soft { conn, first } = job else {
                    unreachable!("only softirq jobs in the softirq queue")
                };
                let cost = if first {
                    self.cfg.syn_softirq_ns
                } else {
                    let b = BATCHES[self.conns[conn as usize].batch as usize];
                    u64::from(b) * self.cfg.req_softirq_ns
                };
                let sec = Self::sec(self.now_ns);
                self.s.soft_ns_all[sec] += cost;
                if core < self.cfg.hog {
                    self.s.soft_ns_hogged[sec] += cost;
                }
                self.start(core, job, cost);
                return;
            }
            let bursting = matches!(self.cores[core].accept, AcceptState::Bursting(_));
            if self.cores[core].runq.is_empty() && !bursting {
                return; // idle
            }
            if !self.server_may_run(core) {
                return; // the hog runs; a Resume event comes at the next window
            }
            self.server_turn(core);
            if let AcceptState::Bursting(left) = self.cores[core].accept {
                match self.try_accept(core) {
                    Some((job, cost, more)) => {
                        let c = &mut self.cores[core];
                        c.accept = if c.inflight >= self.cfg.inflight_max {
                            AcceptState::Blocked
                        } else if !more {
                            AcceptState::Sleeping
                        } else if left > 1 {
                            AcceptState::Bursting(left - 1)
                        } else {
                            // Batch limit: back of the queue, behind the ready connections.
                            c.runq.push_back(ACCEPT);
                            AcceptState::Queued
                        };
                        self.charge_server(core, cost);
                        self.start(core, job, cost);
                        return;
                    }
                    None => {
                        self.cores[core].accept = AcceptState::Sleeping;
                        continue;
                    }
                }
            }
            let conn = self.cores[core].runq.pop_front().expect("non-empty");
            if conn == ACCEPT {
                debug_assert_eq!(self.cores[core].accept, AcceptState::Queued);
                self.cores[core].accept = if self.cores[core].inflight >= self.cfg.inflight_max {
                    AcceptState::Blocked
                } else {
                    AcceptState::Bursting(self.cfg.accept_batch)
                };
                continue;
            }
            if self.expired(conn) {
                self.conn_closed(core);
                self.timeout(conn);
                continue;
            }
            let b = BATCHES[self.conns[conn as usize].batch as usize];
            let cost = u64::from(b) * self.cfg.req_app_ns;
            self.charge_server(core, cost);
            self.start(core, Job::App { conn }, cost);
            return;
        }
    }
}
