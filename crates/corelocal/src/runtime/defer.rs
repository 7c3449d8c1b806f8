//! `TCP_DEFER_ACCEPT` switched by each worker with its own load (sans-IO: time is passed in).
//!
//! Deferring accept until the request arrives saves the worker a wake-up per connection when
//! it batches (0.83–0.85× server CPU for one-shot HTTP at saturation), but when the worker is
//! mostly idle it moves the worker's wake-up onto the request's path: without it, the
//! handshake's last ACK wakes the worker while the client is still sending, and the request
//! finds it awake (on a VM ~25 µs of median latency at half load, results/latency/README.md).
//! So a worker defers while it batches and stops deferring while it sleeps about once per
//! connection. The signal is sleeps per accepted connection over a window: ~0.1–0.5 when it
//! batches, ~1 when it is mostly idle (either way round, so the two thresholds keep a gap).

use std::time::{Duration, Instant};

/// How long the worker counts before deciding again.
pub const DEFER_WINDOW: Duration = Duration::from_millis(100);
/// A wait that lasted this long slept (one that found completions ready returns in a few µs).
pub const SLEPT_MIN: Duration = Duration::from_micros(20);
/// Deferring: above this many sleeps per 100 accepted connections the worker is mostly idle.
const OFF_ABOVE_PER_100: u64 = 70;
/// Not deferring: below this many sleeps per 100 accepted connections the worker batches.
const ON_BELOW_PER_100: u64 = 60;
/// Not deferring: the fewest connections in a window that turn deferring back on.
const ACCEPTS_MIN: u64 = 32;

/// One worker's switch (see the module docs).
#[derive(Debug, Clone)]
pub struct DeferSwitch {
    on: bool,
    window_end: Instant,
    sleeps: u32,
    accepts: u32,
}

impl DeferSwitch {
    /// A switch in state `on` (the listener's configured state), its first window from `now`.
    pub fn new(on: bool, now: Instant) -> DeferSwitch {
        DeferSwitch {
            on,
            window_end: now + DEFER_WINDOW,
            sleeps: 0,
            accepts: 0,
        }
    }

    /// Whether the worker's listeners defer accept now.
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// The worker waited for completions this long.
    pub fn waited(&mut self, waited: Duration) {
        if waited >= SLEPT_MIN {
            self.sleeps = self.sleeps.saturating_add(1);
        }
    }

    /// The worker took a connection (accepted or stolen).
    pub fn accepted(&mut self) {
        self.accepts = self.accepts.saturating_add(1);
    }

    /// Once per window: the new state when it changes (the caller sets the listeners).
    pub fn decide(&mut self, now: Instant) -> Option<bool> {
        if now < self.window_end {
            return None;
        }
        let (sleeps, accepts) = (u64::from(self.sleeps), u64::from(self.accepts));
        self.window_end = now + DEFER_WINDOW;
        self.sleeps = 0;
        self.accepts = 0;
        let want = if self.on {
            sleeps * 100 <= OFF_ABOVE_PER_100 * accepts
        } else {
            accepts >= ACCEPTS_MIN && sleeps * 100 < ON_BELOW_PER_100 * accepts
        };
        if want == self.on {
            return None;
        }
        self.on = want;
        Some(want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives one window: `accepts` connections and `sleeps` long waits (plus short ones).
    fn window(s: &mut DeferSwitch, t: &mut Instant, accepts: u32, sleeps: u32) -> Option<bool> {
        for _ in 0..accepts {
            s.accepted();
            s.waited(Duration::from_micros(2));
        }
        for _ in 0..sleeps {
            s.waited(SLEPT_MIN);
        }
        *t += DEFER_WINDOW;
        s.decide(*t)
    }

    #[test]
    fn a_batching_worker_keeps_deferring_and_an_idle_one_stops() {
        let mut t = Instant::now();
        let mut s = DeferSwitch::new(true, t);
        // Saturated: ~0.13 sleeps per connection (results/oneshot/ab-defer-accept-crr.md).
        assert_eq!(window(&mut s, &mut t, 3000, 400), None);
        assert!(s.is_on());
        // Half load: ~1 sleep per connection.
        assert_eq!(window(&mut s, &mut t, 776, 750), Some(false));
        // Not deferring, half load reads ~1.1: stays off.
        assert_eq!(window(&mut s, &mut t, 776, 850), None);
        // Not deferring at saturation reads ~0.45: back on.
        assert_eq!(window(&mut s, &mut t, 2800, 1260), Some(true));
    }

    #[test]
    fn the_gap_between_the_thresholds_holds_either_state() {
        let mut t = Instant::now();
        let mut on = DeferSwitch::new(true, t);
        let mut off = DeferSwitch::new(false, t);
        // 0.65 sleeps per connection: between 0.6 and 0.7.
        assert_eq!(window(&mut on, &mut t, 1000, 650), None);
        let mut t2 = t;
        assert_eq!(window(&mut off, &mut t2, 1000, 650), None);
        assert!(on.is_on() && !off.is_on());
    }

    #[test]
    fn few_connections_never_turn_deferring_on_and_an_idle_worker_turns_it_off() {
        let mut t = Instant::now();
        let mut off = DeferSwitch::new(false, t);
        assert_eq!(window(&mut off, &mut t, 10, 0), None, "too few to tell");
        let mut on = DeferSwitch::new(true, t);
        assert_eq!(
            window(&mut on, &mut t, 0, 3),
            Some(false),
            "sleeping, no connections"
        );
        let mut busy = DeferSwitch::new(true, t);
        assert_eq!(
            window(&mut busy, &mut t, 0, 0),
            None,
            "keep-alive work only"
        );
    }

    #[test]
    fn nothing_is_decided_before_the_window_ends() {
        let t = Instant::now();
        let mut s = DeferSwitch::new(true, t);
        s.waited(SLEPT_MIN);
        assert_eq!(s.decide(t + DEFER_WINDOW / 2), None);
        assert_eq!(s.decide(t + DEFER_WINDOW), Some(false));
    }
}
