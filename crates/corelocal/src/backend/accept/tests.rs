//! The accept policy's decisions, pinned: tables of cases, and properties that hold it to
//! `legacy`, a transcription of the code each backend and the worker ran before the policy
//! was written once (characterization: every decision stays the same).

use super::*;
use proptest::prelude::*;

/// What a backend submits for a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    ArmMultishot,
    CancelMultishot,
    OneShot,
    CancelOneShots,
}

/// The code as it ran in the backends and the worker before, operating on plain state.
mod legacy {
    use super::Act;
    use crate::backend::accept::{
        Multishot, MULTISHOT_ALLOWANCE_MIN_DEFAULT, ONESHOT_INFLIGHT_MAX,
    };

    /// `sys/uring/accept.rs`'s `ListenerState` and its functions.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Uring {
        pub active: bool,
        pub multishot: Multishot,
        pub remaining: Option<u32>,
        pub inflight: u32,
        pub multishot_min: u32,
    }

    impl Uring {
        pub fn new(cap: Option<u32>) -> Self {
            Uring {
                active: false,
                multishot: Multishot::Off,
                remaining: None,
                inflight: 0,
                multishot_min: cap.map_or(MULTISHOT_ALLOWANCE_MIN_DEFAULT, |q| {
                    q.saturating_mul(2).saturating_add(64)
                }),
            }
        }

        pub fn start_accepting(&mut self, budget: Option<u32>, out: &mut Vec<Act>) {
            self.active = true;
            self.remaining = budget.map(|k| self.remaining.unwrap_or(0).saturating_add(k));
            self.arrange_accepts(out);
        }

        fn arrange_accepts(&mut self, out: &mut Vec<Act>) {
            if !self.active {
                return;
            }
            let wide = self.remaining.is_none_or(|r| r >= self.multishot_min);
            self.multishot = match (wide, self.multishot) {
                (true, Multishot::Off) => {
                    out.push(Act::ArmMultishot);
                    Multishot::Armed
                }
                (false, Multishot::Armed) => {
                    out.push(Act::CancelMultishot);
                    Multishot::Cancelling
                }
                (_, m) => m,
            };
            if !wide {
                self.top_up_accepts(out);
            }
        }

        fn top_up_accepts(&mut self, out: &mut Vec<Act>) {
            let Some(remaining) = self.remaining.filter(|_| self.active) else {
                return;
            };
            let want = remaining.min(ONESHOT_INFLIGHT_MAX);
            for _ in self.inflight..want {
                out.push(Act::OneShot);
            }
            self.inflight = self.inflight.max(want);
        }

        pub fn stop_accepting(&mut self, out: &mut Vec<Act>) {
            if !self.active {
                return;
            }
            self.active = false;
            if self.multishot == Multishot::Armed {
                self.multishot = Multishot::Cancelling;
                out.push(Act::CancelMultishot);
            }
            if self.inflight > 0 {
                out.push(Act::CancelOneShots);
            }
        }

        pub fn on_accept_one(&mut self, accepted: bool, out: &mut Vec<Act>) {
            self.inflight = self.inflight.saturating_sub(1);
            if accepted {
                if let Some(r) = self.remaining.as_mut() {
                    *r = r.saturating_sub(1);
                }
            }
            self.arrange_accepts(out);
        }

        /// Returns whether a re-arm was counted.
        pub fn on_accept(
            &mut self,
            accepted: bool,
            cancelled: bool,
            more: bool,
            out: &mut Vec<Act>,
        ) -> bool {
            if !more {
                self.multishot = Multishot::Off;
            }
            if accepted {
                if let Some(r) = self.remaining.as_mut() {
                    *r = r.saturating_sub(1);
                }
            }
            if !more {
                let before = self.multishot;
                self.arrange_accepts(out);
                return !cancelled
                    && self.multishot == Multishot::Armed
                    && before == Multishot::Off;
            } else if accepted {
                self.arrange_accepts(out);
            }
            false
        }
    }

    /// `sys/epoll`'s `ListenerIo` and its functions.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Epoll {
        pub registered: bool,
        pub budget: Option<u32>,
        pub active: bool,
    }

    impl Epoll {
        pub fn accept(&mut self, budget: Option<u32>) {
            self.active = true;
            self.budget = budget.map(|k| self.budget.unwrap_or(0).saturating_add(k));
            self.sync();
        }

        pub fn pause(&mut self) {
            self.active = false;
            self.sync();
        }

        fn sync(&mut self) {
            self.registered = self.active && self.budget != Some(0);
        }

        /// A readiness event with `waiting` connections queued; returns how many were taken.
        pub fn accept_batch(&mut self, waiting: usize, batch_max: usize) -> usize {
            if !self.active {
                return 0;
            }
            let limit = self
                .budget
                .map_or(batch_max, |b| (b as usize).min(batch_max));
            let accepted = waiting.min(limit);
            if let Some(b) = self.budget.as_mut() {
                *b -= accepted as u32;
            }
            self.sync();
            accepted
        }
    }

    /// `runtime/accept.rs`'s `target` and `refill`: the shares pushed per listener.
    #[allow(clippy::too_many_arguments)]
    pub fn refill(
        conns_max: usize,
        batch_max: usize,
        paced: bool,
        allowance: &mut [usize],
        open: usize,
        steal_pending: bool,
        resume: bool,
    ) -> Vec<(usize, u32)> {
        let taken = open + usize::from(steal_pending);
        let room = conns_max.saturating_sub(taken);
        let target = if paced { room.min(batch_max) } else { room };
        let outstanding: usize = allowance.iter().sum();
        let low_mark = if paced { target / 2 } else { target / 4 };
        let low = outstanding == 0 || outstanding < low_mark;
        let extra = if resume || low {
            target.saturating_sub(outstanding)
        } else {
            0
        };
        let n = allowance.len();
        let mut pushed = Vec::new();
        for (i, a) in allowance.iter_mut().enumerate() {
            let share = (extra / n + usize::from(i < extra % n)).min(u32::MAX as usize);
            if share == 0 && !resume {
                continue;
            }
            *a += share;
            pushed.push((i, share as u32));
        }
        pushed
    }
}

/// How the io_uring backend drives the policy (`sys/uring/accept.rs`).
fn uring_start(p: &mut ListenerAccept, budget: Option<u32>, out: &mut Vec<Act>) {
    p.allow(budget);
    uring_arrange(p, out);
}

fn uring_arrange(p: &mut ListenerAccept, out: &mut Vec<Act>) -> bool {
    let a = p.arrange();
    if a.arm_multishot {
        out.push(Act::ArmMultishot);
    }
    if a.cancel_multishot {
        out.push(Act::CancelMultishot);
    }
    for _ in 0..a.oneshots {
        out.push(Act::OneShot);
    }
    a.arm_multishot
}

fn uring_stop(p: &mut ListenerAccept, out: &mut Vec<Act>) {
    let pause = p.pause();
    if pause.cancel_multishot {
        out.push(Act::CancelMultishot);
    }
    if pause.cancel_oneshots {
        out.push(Act::CancelOneShots);
    }
}

fn uring_on_accept(
    p: &mut ListenerAccept,
    accepted: bool,
    cancelled: bool,
    more: bool,
    out: &mut Vec<Act>,
) -> bool {
    p.on_multishot(accepted, more);
    if !more {
        let armed = uring_arrange(p, out);
        return armed && !cancelled;
    }
    if accepted {
        uring_arrange(p, out);
    }
    false
}

fn uring_on_accept_one(p: &mut ListenerAccept, accepted: bool, out: &mut Vec<Act>) {
    p.on_oneshot(accepted);
    uring_arrange(p, out);
}

/// What happens to a listener in a backend.
#[derive(Debug, Clone, Copy)]
enum Event {
    Accept(Option<u32>),
    Pause,
    /// A multishot CQE: (accepted, cancelled, more).
    Multishot(bool, bool, bool),
    /// A one-shot CQE: accepted.
    OneShot(bool),
    /// An epoll readiness event with this many connections queued.
    Ready(usize),
}

fn budget() -> impl Strategy<Value = Option<u32>> {
    prop_oneof![
        Just(None),
        (0u32..10).prop_map(Some),
        (300u32..400).prop_map(Some),
        Just(Some(u32::MAX - 3)),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        budget().prop_map(Event::Accept),
        Just(Event::Pause),
        (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(a, c, m)| {
            // A cancelled CQE accepted nothing.
            Event::Multishot(a && !c, c, m)
        }),
        any::<bool>().prop_map(Event::OneShot),
        (0usize..100).prop_map(Event::Ready),
    ]
}

proptest! {
    /// io_uring: every arm, cancel and one-shot, every re-arm counted, and the state after each
    /// event, as before.
    #[test]
    fn uring_decisions_are_unchanged(
        cap in prop_oneof![Just(None), (0u32..200).prop_map(Some)],
        events in proptest::collection::vec(event(), 0..60),
    ) {
        let mut old = legacy::Uring::new(cap);
        let mut new = ListenerAccept::new(ListenerAccept::multishot_min(cap));
        for e in events {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            match e {
                Event::Accept(k) => {
                    old.start_accepting(k, &mut a);
                    uring_start(&mut new, k, &mut b);
                }
                Event::Pause => {
                    old.stop_accepting(&mut a);
                    uring_stop(&mut new, &mut b);
                }
                Event::Multishot(acc, can, more) => {
                    let ra = old.on_accept(acc, can, more, &mut a);
                    let rb = uring_on_accept(&mut new, acc, can, more, &mut b);
                    prop_assert_eq!(ra, rb);
                }
                Event::OneShot(acc) => {
                    old.on_accept_one(acc, &mut a);
                    uring_on_accept_one(&mut new, acc, &mut b);
                }
                Event::Ready(_) => continue,
            }
            prop_assert_eq!(&a, &b, "after {:?}", e);
            prop_assert_eq!(old.active, new.is_active());
            prop_assert_eq!(old.remaining, new.remaining());
            prop_assert_eq!(old.multishot, new.multishot());
            prop_assert_eq!(old.inflight, new.inflight());
            prop_assert_eq!(
                old.multishot == Multishot::Off && old.inflight == 0,
                new.is_settled()
            );
        }
    }

    /// epoll: the registration and every batch, as before.
    #[test]
    fn epoll_decisions_are_unchanged(
        batch_max in 1usize..100,
        events in proptest::collection::vec(event(), 0..60),
    ) {
        let mut old = legacy::Epoll { registered: false, budget: None, active: false };
        let mut new = ListenerAccept::new(MULTISHOT_ALLOWANCE_MIN_DEFAULT);
        for e in events {
            match e {
                Event::Accept(k) => {
                    old.accept(k);
                    new.allow(k);
                }
                Event::Pause => {
                    old.pause();
                    new.pause();
                }
                Event::Ready(waiting) => {
                    let a = old.accept_batch(waiting, batch_max);
                    let b = new.batch(batch_max).map_or(0, |limit| {
                        let n = waiting.min(limit);
                        new.took(n as u32);
                        n
                    });
                    prop_assert_eq!(a, b);
                }
                _ => continue,
            }
            prop_assert_eq!(old.registered, new.wants_readiness(), "after {:?}", e);
            prop_assert_eq!(old.budget, new.remaining());
        }
    }

    /// The worker: every share pushed, as before.
    #[test]
    fn worker_refills_are_unchanged(
        conns_max in 1usize..300,
        batch_max in 1usize..40,
        paced in any::<bool>(),
        mut allowance in proptest::collection::vec(0usize..50, 1..5),
        open in 0usize..320,
        steal_pending in any::<bool>(),
        resume in any::<bool>(),
    ) {
        let mut ours = allowance.clone();
        let old = legacy::refill(
            conns_max, batch_max, paced, &mut allowance, open, steal_pending, resume,
        );
        let r = Refill { conns_max, batch_max, paced };
        let target = r.target(open + usize::from(steal_pending));
        let extra = r.extra(target, ours.iter().sum(), resume);
        let mut new = Vec::new();
        let n = ours.len();
        for (i, a) in ours.iter_mut().enumerate() {
            let share = Refill::share(extra, n, i);
            if share == 0 && !resume {
                continue;
            }
            *a += share as usize;
            new.push((i, share));
        }
        prop_assert_eq!(old, new);
        prop_assert_eq!(allowance, ours);
    }
}

#[test]
fn multishot_needs_twice_the_backlog_and_a_margin() {
    for (cap, min) in [
        (None, 8192),
        (Some(0), 64),
        (Some(128), 320),
        (Some(4096), 8256),
        (Some(u32::MAX), u32::MAX),
    ] {
        assert_eq!(ListenerAccept::multishot_min(cap), min, "cap {cap:?}");
    }
}

/// `arrange` from a fresh listener given an allowance, with a threshold of 320.
#[test]
fn arrange_picks_multishot_or_one_shots_by_the_allowance() {
    for (budget, arm, oneshots) in [
        (None, true, 0),
        (Some(320), true, 0),
        (Some(1_000_000), true, 0),
        (Some(319), false, 4),
        (Some(4), false, 4),
        (Some(3), false, 3),
        (Some(1), false, 1),
        (Some(0), false, 0),
    ] {
        let mut p = ListenerAccept::new(320);
        p.allow(budget);
        let a = p.arrange();
        let want = Arrange {
            arm_multishot: arm,
            cancel_multishot: false,
            oneshots,
        };
        assert_eq!(a, want, "budget {budget:?}");
        assert_eq!(p.arrange(), Arrange::default(), "nothing more: {budget:?}");
    }
}

#[test]
fn a_shrinking_allowance_cancels_multishot_and_goes_one_shot() {
    let mut p = ListenerAccept::new(10);
    p.allow(Some(10));
    assert!(p.arrange().arm_multishot);
    p.on_multishot(true, true); // 9 left: below the threshold
    let a = p.arrange();
    assert_eq!(
        a,
        Arrange {
            arm_multishot: false,
            cancel_multishot: true,
            oneshots: 4
        }
    );
    assert_eq!(p.multishot(), Multishot::Cancelling);
    // The cancelled accept's last CQE: nothing to re-arm, the one-shots stay.
    p.on_multishot(false, false);
    assert_eq!(p.arrange(), Arrange::default());
    assert!(!p.is_settled());
    for left in (0..4).rev() {
        p.on_oneshot(true);
        let a = p.arrange();
        // 9 - k left after k accepts: topped up to 4 in flight while at least 4 remain.
        let remaining = p.remaining().unwrap();
        assert_eq!(a.oneshots, u32::from(remaining >= 4), "left {left}");
    }
}

#[test]
fn a_pause_cancels_what_is_in_flight_and_keeps_the_allowance() {
    let mut p = ListenerAccept::new(320);
    assert_eq!(p.pause(), Pause::default(), "never started");
    p.allow(Some(2));
    assert_eq!(p.arrange().oneshots, 2);
    assert_eq!(
        p.pause(),
        Pause {
            cancel_multishot: false,
            cancel_oneshots: true
        }
    );
    assert_eq!(p.pause(), Pause::default(), "already paused");
    assert_eq!(p.arrange(), Arrange::default(), "paused: nothing");
    p.on_oneshot(false);
    p.on_oneshot(false);
    assert!(p.is_settled());
    p.allow(Some(0));
    assert_eq!(p.remaining(), Some(2));
    assert_eq!(p.arrange().oneshots, 2);

    let mut m = ListenerAccept::new(320);
    m.allow(None);
    assert!(m.arrange().arm_multishot);
    assert_eq!(
        m.pause(),
        Pause {
            cancel_multishot: true,
            cancel_oneshots: false
        }
    );
    assert_eq!(m.multishot(), Multishot::Cancelling);
    assert!(!m.is_settled());
    m.on_multishot(false, false);
    assert!(m.is_settled());
}

#[test]
fn a_readiness_batch_takes_at_most_the_allowance() {
    for (budget, batch, watch) in [
        (None, Some(64), true),
        (Some(0), Some(0), false),
        (Some(5), Some(5), true),
        (Some(100), Some(64), true),
    ] {
        let mut p = ListenerAccept::new(MULTISHOT_ALLOWANCE_MIN_DEFAULT);
        assert_eq!(p.batch(64), None, "paused");
        assert!(!p.wants_readiness());
        p.allow(budget);
        assert_eq!(p.batch(64), batch, "budget {budget:?}");
        assert_eq!(p.wants_readiness(), watch, "budget {budget:?}");
    }
    let mut p = ListenerAccept::new(MULTISHOT_ALLOWANCE_MIN_DEFAULT);
    p.allow(Some(5));
    p.took(5);
    assert!(!p.wants_readiness(), "allowance used up");
    p.allow(Some(1));
    assert!(p.wants_readiness());
}

#[test]
fn refill_tops_up_below_the_low_mark_and_splits_evenly() {
    let free = Refill {
        conns_max: 100,
        batch_max: 16,
        paced: false,
    };
    let paced = Refill {
        paced: true,
        ..free
    };
    // (refill, taken, outstanding, resume) -> (target, extra)
    for (r, taken, outstanding, resume, target, extra) in [
        (free, 0, 0, false, 100, 100),
        (free, 10, 30, false, 90, 0),
        (free, 10, 21, false, 90, 69),
        (free, 10, 22, false, 90, 0),
        (free, 10, 30, true, 90, 60),
        (free, 100, 0, false, 0, 0),
        (free, 120, 0, true, 0, 0),
        (paced, 0, 8, false, 16, 0),
        (paced, 0, 7, false, 16, 9),
        (paced, 95, 0, false, 5, 5),
    ] {
        assert_eq!(r.target(taken), target, "{r:?} {taken}");
        assert_eq!(
            r.extra(target, outstanding, resume),
            extra,
            "{r:?} {outstanding}"
        );
    }
    let shares: Vec<u32> = (0..3).map(|i| Refill::share(10, 3, i)).collect();
    assert_eq!(shares, [4, 3, 3]);
    assert_eq!(Refill::share(usize::MAX, 1, 0), u32::MAX);
}

#[test]
fn a_busy_listener_is_topped_up_beside_an_idle_one() {
    // Balancer on, batch 16, two listeners: connections arrive on the second only.
    let paced = Refill {
        conns_max: 100_000,
        batch_max: 16,
        paced: true,
    };
    let target = paced.target(0);
    assert_eq!(paced.listener_extra(target, 2, 0, 0, true), 8);
    assert_eq!(paced.listener_extra(target, 2, 1, 0, true), 8);
    // The second took its 8; the first still holds 8: the second is refilled all the same.
    assert_eq!(paced.listener_extra(target, 2, 0, 8, false), 0);
    assert_eq!(paced.listener_extra(target, 2, 1, 0, false), 8);
    // Above its own low mark (half its share, when paced), nothing is added.
    assert_eq!(paced.listener_extra(target, 2, 1, 4, false), 0);
    assert_eq!(paced.listener_extra(target, 2, 1, 3, false), 5);
    // The sum never goes past the target: each listener stays within its share.
    let near_limit = paced.target(99_997);
    assert_eq!(near_limit, 3);
    let shares: u32 = (0..2)
        .map(|i| paced.listener_extra(near_limit, 2, i, 0, true))
        .sum();
    assert_eq!(shares, 3);
}
