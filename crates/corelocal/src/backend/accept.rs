//! Accept policy, pure (no sockets, no rings; a leaf like its parent): every decision about
//! how many connections to take, written once and used by the worker and both backends.
//!
//! - [`Refill`]: the worker's side: how large the allowances may grow (the room below the
//!   connection limit, at most a turn's batch with the balancer on) and when they are topped
//!   up, split evenly over the worker's listeners.
//! - [`ListenerAccept`]: a backend's side, per listener: the allowance it was given
//!   ([`Op::Accept`](super::Op::Accept)'s `budget`, kept across pauses), how many connections
//!   one readiness event may take (epoll), and whether the listener runs a multishot accept or
//!   at most [`ONESHOT_INFLIGHT_MAX`] one-shot accepts, with the arms and cancels that follow
//!   (io_uring). The backends keep only the mechanics: `accept4` calls, SQEs and CQEs.

/// One-shot accepts kept in flight per listener when accepting with a budget.
pub const ONESHOT_INFLIGHT_MAX: u32 = 4;
/// A listener whose backlog cannot be read accepts multishot only with this much allowance.
pub const MULTISHOT_ALLOWANCE_MIN_DEFAULT: u32 = 8192;

/// The worker's allowance arithmetic (see the worker's accept path): how many connections may
/// be outstanding (allowed, not yet seen), and how many to add when topping up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refill {
    /// Open connections per worker at most.
    pub conns_max: usize,
    /// With pacing (the balancer on): at most this many outstanding.
    pub batch_max: usize,
    /// Whether the balancer paces accepting.
    pub paced: bool,
}

impl Refill {
    /// Outstanding connections allowed with `taken` open (or stolen and in flight): the room
    /// below the limit, and with pacing at most `batch_max`.
    pub fn target(&self, taken: usize) -> usize {
        let room = self.conns_max.saturating_sub(taken);
        if self.paced {
            room.min(self.batch_max)
        } else {
            room
        }
    }

    /// How many to add to `outstanding` to reach `target`: all of it on `resume`, or once
    /// the allowances ran below a quarter of the target (half, when paced: a turn's batch);
    /// else none.
    pub fn extra(&self, target: usize, outstanding: usize, resume: bool) -> usize {
        let low_mark = if self.paced { target / 2 } else { target / 4 };
        let low = outstanding == 0 || outstanding < low_mark;
        if resume || low {
            target.saturating_sub(outstanding)
        } else {
            0
        }
    }

    /// Listener `i`'s share of `extra` over `n` listeners: even, the first `extra % n` one
    /// more; at most `u32::MAX`.
    pub fn share(extra: usize, n: usize, i: usize) -> u32 {
        (extra / n + usize::from(i < extra % n)).min(u32::MAX as usize) as u32
    }

    /// How many to add to listener `i`'s allowance `have` (of `n` listeners): its share of
    /// `target`, topped up on its own low mark. Per listener, because connections need not
    /// arrive evenly: with one sum for all, a busy listener at 0 beside an idle one holding
    /// its half never reached the low mark, and the busy one stopped accepting for good.
    pub fn listener_extra(
        &self,
        target: usize,
        n: usize,
        i: usize,
        have: usize,
        resume: bool,
    ) -> u32 {
        let want = Refill::share(target, n, i) as usize;
        self.extra(want, have, resume).min(u32::MAX as usize) as u32
    }
}

/// A listener's multishot accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Multishot {
    /// None armed.
    Off,
    /// Armed: every connection that arrives is accepted.
    Armed,
    /// Cancelled; its last completion has not arrived yet.
    Cancelling,
}

/// What to submit for a listener after [`ListenerAccept::arrange`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Arrange {
    /// Arm a multishot accept.
    pub arm_multishot: bool,
    /// Cancel the multishot accept.
    pub cancel_multishot: bool,
    /// One-shot accepts to add.
    pub oneshots: u32,
}

/// What to cancel after [`ListenerAccept::pause`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pause {
    /// Cancel the multishot accept.
    pub cancel_multishot: bool,
    /// Cancel every one-shot accept in flight.
    pub cancel_oneshots: bool,
}

/// One listener's accept state in a backend. See the module docs.
///
/// Multishot while the allowance is unlimited or large (at least `multishot_min`: more than
/// one pass of the kernel's accept loop can take, twice the backlog plus margin, so that the
/// multishot accept is cancelled in time); else at most `min(remaining, ONESHOT_INFLIGHT_MAX)`
/// one-shot accepts in flight: exact, never more connections than allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerAccept {
    /// Accepting (not paused).
    active: bool,
    /// Connections still allowed (`None`: no limit); kept across pauses.
    remaining: Option<u32>,
    multishot: Multishot,
    /// One-shot accepts in flight.
    inflight: u32,
    multishot_min: u32,
}

impl ListenerAccept {
    /// A paused listener with no allowance that accepts multishot only with at least
    /// `multishot_min` allowed.
    pub fn new(multishot_min: u32) -> Self {
        ListenerAccept {
            active: false,
            remaining: None,
            multishot: Multishot::Off,
            inflight: 0,
            multishot_min,
        }
    }

    /// The multishot threshold for a listener of backlog `cap` (`None`: unknown): twice the
    /// backlog plus 64, or [`MULTISHOT_ALLOWANCE_MIN_DEFAULT`].
    pub fn multishot_min(cap: Option<u32>) -> u32 {
        cap.map_or(MULTISHOT_ALLOWANCE_MIN_DEFAULT, |c| {
            c.saturating_mul(2).saturating_add(64)
        })
    }

    /// [`Op::Accept`](super::Op::Accept): accepting, with `budget` added to what is left
    /// (`None`: no limit from now on).
    pub fn allow(&mut self, budget: Option<u32>) {
        self.active = true;
        self.remaining = budget.map(|k| self.remaining.unwrap_or(0).saturating_add(k));
    }

    /// [`Op::AcceptPause`](super::Op::AcceptPause): what to cancel (nothing when already
    /// paused); the allowance is kept.
    pub fn pause(&mut self) -> Pause {
        if !self.active {
            return Pause::default();
        }
        self.active = false;
        let cancel_multishot = self.multishot == Multishot::Armed;
        if cancel_multishot {
            self.multishot = Multishot::Cancelling;
        }
        Pause {
            cancel_multishot,
            cancel_oneshots: self.inflight > 0,
        }
    }

    /// Whether accepting (not paused).
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// Connections still allowed (`None`: no limit).
    pub fn remaining(&self) -> Option<u32> {
        self.remaining
    }

    /// The multishot accept's state.
    pub fn multishot(&self) -> Multishot {
        self.multishot
    }

    /// One-shot accepts in flight.
    pub fn inflight(&self) -> u32 {
        self.inflight
    }

    /// Nothing of this listener can still complete: no multishot accept (a cancelled one
    /// counts until its last completion) and no one-shot accept in flight.
    pub fn is_settled(&self) -> bool {
        self.multishot == Multishot::Off && self.inflight == 0
    }

    /// A readiness-based backend (epoll): whether the listener is to be watched (accepting
    /// with budget left).
    pub fn wants_readiness(&self) -> bool {
        self.active && self.remaining != Some(0)
    }

    /// A readiness-based backend (epoll): how many connections one readiness event may take,
    /// at most `max`; `None` when paused (nothing to do).
    pub fn batch(&self, max: usize) -> Option<usize> {
        self.active
            .then(|| self.remaining.map_or(max, |r| (r as usize).min(max)))
    }

    /// `n` connections were accepted outside multishot and one-shot accounting (a readiness
    /// event's batch).
    pub fn took(&mut self, n: u32) {
        if let Some(r) = self.remaining.as_mut() {
            *r = r.saturating_sub(n);
        }
    }

    /// A completion-based backend (io_uring): multishot while the allowance is unlimited or
    /// at least `multishot_min`, else the multishot accept cancelled and
    /// `min(remaining, ONESHOT_INFLIGHT_MAX)` one-shot accepts in flight. Nothing while paused.
    pub fn arrange(&mut self) -> Arrange {
        let mut out = Arrange::default();
        if !self.active {
            return out;
        }
        let wide = self.remaining.is_none_or(|r| r >= self.multishot_min);
        match (wide, self.multishot) {
            (true, Multishot::Off) => {
                out.arm_multishot = true;
                self.multishot = Multishot::Armed;
            }
            (false, Multishot::Armed) => {
                out.cancel_multishot = true;
                self.multishot = Multishot::Cancelling;
            }
            _ => {}
        }
        if let (false, Some(remaining)) = (wide, self.remaining) {
            let want = remaining.min(ONESHOT_INFLIGHT_MAX);
            out.oneshots = want.saturating_sub(self.inflight);
            self.inflight = self.inflight.max(want);
        }
        out
    }

    /// A multishot accept's completion: `accepted` a connection, `more` to come (else it
    /// ended; [`arrange`](Self::arrange) decides whether to re-arm).
    pub fn on_multishot(&mut self, accepted: bool, more: bool) {
        if !more {
            self.multishot = Multishot::Off;
        }
        if accepted {
            self.took(1);
        }
    }

    /// A one-shot accept's completion: `accepted` a connection (else failed or cancelled).
    pub fn on_oneshot(&mut self, accepted: bool) {
        self.inflight = self.inflight.saturating_sub(1);
        if accepted {
            self.took(1);
        }
    }
}

#[cfg(test)]
mod tests;
