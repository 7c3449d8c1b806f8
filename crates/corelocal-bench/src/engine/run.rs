//! The engine's main loop: dispatch, stop and drain, wait for and hand out backend events.

use super::{ClientIo, Engine, Phase, Unit};
use std::cmp::Reverse;
use std::sync::atomic::Ordering;

impl<B: ClientIo> Engine<B> {
    /// Runs until the end time, the quota, or a stop request; then closes every connection.
    pub fn run(&mut self) -> std::io::Result<()> {
        let mut next_scan = 0u64;
        let mut closed_all = false;
        let mut stop_at = u64::MAX;
        let mut events = std::mem::take(&mut self.events);
        let mut cpu_start = None;
        let mut cpu_end = None;
        loop {
            let now = self.now();
            if cpu_start.is_none() && now >= self.plan.warmup_end_ns {
                cpu_start = Some(corelocal::sys::process::thread_cpu_ns());
            }
            if !self.stopping
                && (now >= self.plan.end_ns
                    || self.plan.stop.load(Ordering::Relaxed)
                    || self.quota_done_and_idle())
            {
                self.stopping = true;
                stop_at = now;
                cpu_end = Some(corelocal::sys::process::thread_cpu_ns());
            }
            if self.stopping {
                if !closed_all
                    && (now >= self.plan.end_ns || self.plan.stop.load(Ordering::Relaxed))
                {
                    // Time is up: in-flight work no longer counts; close everything.
                    closed_all = true;
                    for i in 0..self.slots.len() {
                        self.abandon(i);
                    }
                }
                if !self.busy() || now > stop_at + 2_000_000_000 {
                    break;
                }
                if !closed_all && self.quota_done_and_idle() {
                    closed_all = true;
                    for i in 0..self.slots.len() {
                        self.abandon(i);
                    }
                }
            } else {
                self.dispatch(now);
            }
            if now >= next_scan {
                self.scan_timeouts(now);
                next_scan = now + 100_000_000;
            }
            let timeout = self.next_deadline(now, next_scan).saturating_sub(now);
            self.b.wait(timeout, &mut events)?;
            let now = self.now();
            for ev in events.drain(..) {
                self.on_event(ev, now);
            }
        }
        self.events = events;
        if let (Some(a), Some(b)) = (cpu_start, cpu_end) {
            self.stats.client_cpu_ns = b.saturating_sub(a);
        }
        Ok(())
    }

    fn quota_done_and_idle(&self) -> bool {
        self.quota == Some(0)
            && !self
                .slots
                .iter()
                .any(|s| s.in_session && s.phase != Phase::Parked)
    }

    fn next_deadline(&self, now: u64, next_scan: u64) -> u64 {
        let mut d = next_scan.min(self.plan.end_ns).min(now + 50_000_000);
        if let Some(Reverse((t, _))) = self.timers.peek() {
            d = d.min(*t);
        }
        if let Some(a) = &self.arrivals {
            let waiting = !self.parked.is_empty()
                || (self.plan.unit == Unit::Session && !self.free.is_empty());
            if waiting {
                d = d.min(a.peek());
            }
        }
        d.max(now)
    }
}
