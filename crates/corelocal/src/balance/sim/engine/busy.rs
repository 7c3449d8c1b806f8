//! Busy detection: the tracker's observations of a queue and the wakeups they call for,
//! and `watch` (running servers sample their own queue and watch the others).

use super::{Ev, Sim, SAMPLE_NS, STALE_NS, WATCH_MAX_NS, WATCH_MIN_NS};
use crate::balance::sim::{BalancerMode, BusyDetection};
use crate::balance::BusyChange;

impl Sim {
    pub(super) fn watching(&self) -> bool {
        self.cfg.busy_detection == BusyDetection::Watch && self.cfg.balancer != BalancerMode::Off
    }

    /// `watch`: `core`'s server is about to run a job: it samples its own queue if due and,
    /// when not busy, watches the others.
    pub(super) fn server_turn(&mut self, core: usize) {
        if !self.watching() {
            return;
        }
        if self.now_ns.saturating_sub(self.cores[core].observed_ns) >= SAMPLE_NS {
            self.observe(core);
        }
        self.watch_others(core);
    }

    /// `watch`: a non-busy core observes every queue nobody observed for [`STALE_NS`]
    /// (at most every [`SAMPLE_NS`]); returns whether any watched queue held connections.
    fn watch_others(&mut self, core: usize) -> bool {
        if self.busy.is_busy(core) || self.now_ns - self.cores[core].watched_ns < SAMPLE_NS {
            return false;
        }
        self.cores[core].watched_ns = self.now_ns;
        let mut queued = false;
        for w in (0..self.cfg.cores).filter(|&w| w != core) {
            if self.now_ns.saturating_sub(self.cores[w].observed_ns) >= STALE_NS {
                self.observe(w);
            }
            queued |= !self.cores[w].accq.is_empty() || self.busy.is_busy(w);
        }
        queued
    }

    /// `watch`: an idle core's timer. The watch itself needs the core's server to run (a
    /// hogged core's may not); the interval doubles while every queue it saw was empty.
    pub(super) fn on_watch_timer(&mut self, core: usize) {
        let idle = self.cores[core].current.is_none() && self.cores[core].runq.is_empty();
        let c = &self.cores[core];
        let mut interval = c.watch_interval_ns;
        if idle && self.now_ns - c.watched_ns >= interval && self.server_may_run(core) {
            let queued = self.watch_others(core);
            interval = if queued {
                WATCH_MIN_NS
            } else {
                (interval * 2).min(WATCH_MAX_NS)
            };
            self.cores[core].watch_interval_ns = interval;
        }
        let next = self.now_ns + interval;
        if next <= self.hard_end_ns {
            self.schedule(next, Ev::Watch(core as u32));
        }
    }

    /// One busy-tracker observation of `core`'s queue, and the wakeups it calls for.
    pub(super) fn observe(&mut self, core: usize) {
        self.cores[core].observed_ns = self.now_ns;
        let len = self.cores[core].accq.len() as u32;
        let change = self.cores[core]
            .tracker
            .observe(&self.busy, len, self.cfg.queue_cap);
        // Under `watch`, as in the runtime, a queue still above the high watermark wakes the
        // stealers again at each observation (nobody else will: the owner may be starved).
        let high = u64::from(self.cfg.queue_cap)
            * u64::from(self.cfg.balance_config().busy_high_pct)
            / 100;
        let still_over = self.watching() && self.busy.is_busy(core) && u64::from(len) > high;
        if (change == Some(BusyChange::BecameBusy) || still_over)
            && self.cfg.balancer != BalancerMode::Off
        {
            // Wake every sleeping non-busy accept thread: they may steal now.
            for w in 0..self.cfg.cores {
                if w != core && !self.busy.is_busy(w) {
                    self.wake_accept(w);
                }
            }
        }
    }

    /// A connection entered a busy core's queue and its own thread is not waiting for it:
    /// wake one sleeping non-busy accept thread (round-robin) to steal it.
    pub(super) fn wake_one_stealer(&mut self, except: usize) {
        let n = self.cfg.cores;
        for step in 0..n {
            let w = (self.wake_cursor + step) % n;
            if w != except && !self.busy.is_busy(w) && self.wake_accept(w) {
                self.wake_cursor = (w + 1) % n;
                return;
            }
        }
    }
}
