//! The client engine: one pinned thread runs many connection slots through a [`ClientIo`]
//! backend (io_uring or epoll, in [`corelocal::sys::client`], which also defines the
//! [`Event`]s, the [`SockOpts`] and the rules on which slot buffer may be touched when). This
//! module holds no syscalls: it is the state machine that turns backend events into script
//! steps, measurements and new I/O.
//!
//! Layout: this file holds the [`Engine`] and its slot state; `plan` a thread's [`Plan`];
//! `run` the main loop; `schedule` arrivals, quota and script steps; `conn` opening and
//! closing connections; `measure` session ends, errors, timeouts and what a transaction
//! records; `events` the handling of backend events and received bytes.

mod conn;
mod events;
mod measure;
mod plan;
mod run;
mod schedule;

pub use corelocal::sys::client::{ClientIo, ErrOp, Event, SockOpts};
pub use plan::{OpenLoop, Plan, Unit};

use crate::stats::Stats;
use crate::workload::{Arrivals, Rng, Script};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Free,
    Active,
    Thinking,
    Parked,
    AwaitEof,
    Closing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterClose {
    Free,
    Continue,
    OpenSend,
}

struct Slot {
    phase: Phase,
    open: bool,
    connected: bool,
    in_session: bool,
    doomed: bool,
    after: AfterClose,
    script: Box<dyn Script>,
    rng: Rng,
    expect: VecDeque<crate::proto::Parser>,
    txn_start: u64,
    txn_intended: Option<u64>,
    sess_start: u64,
    sess_intended: Option<u64>,
    conn_start: u64,
    last_io: u64,
    /// Whether its connection was opened from a source address of `plan.src`.
    bound_src: bool,
}

/// The per-thread engine state.
pub struct Engine<B: ClientIo> {
    b: B,
    plan: Plan,
    slots: Vec<Slot>,
    free: Vec<usize>,
    parked: VecDeque<usize>,
    timers: BinaryHeap<Reverse<(u64, usize)>>,
    arrivals: Option<Arrivals>,
    quota: Option<u64>,
    stopping: bool,
    src_next: usize,
    /// Whether connections bind a source address from `plan.src` (see `Plan::src_on_demand`).
    src_active: bool,
    /// What was measured.
    pub stats: Stats,
    events: Vec<Event>,
}

impl<B: ClientIo> Engine<B> {
    /// An engine over backend `b`.
    pub fn new(b: B, plan: Plan) -> Self {
        let mut rng = Rng::new(plan.seed);
        let slots = (0..plan.slots)
            .map(|_| Slot {
                phase: Phase::Free,
                open: false,
                connected: false,
                in_session: false,
                doomed: false,
                after: AfterClose::Free,
                script: (plan.script)(),
                rng: Rng::new(rng.next_u64()),
                expect: VecDeque::new(),
                txn_start: 0,
                txn_intended: None,
                sess_start: 0,
                sess_intended: None,
                conn_start: 0,
                last_io: 0,
                bound_src: false,
            })
            .collect();
        let now = plan.origin.elapsed().as_nanos() as u64;
        let arrivals = plan
            .open_loop
            .map(|o| Arrivals::new(o.rate, o.exponential, now, plan.seed ^ 0xA5A5));
        Engine {
            b,
            free: (0..plan.slots).rev().collect(),
            parked: VecDeque::new(),
            timers: BinaryHeap::new(),
            arrivals,
            quota: plan.quota,
            stopping: false,
            src_next: plan.src_offset,
            src_active: !plan.src_on_demand,
            slots,
            plan,
            stats: Stats::default(),
            events: Vec::with_capacity(1024),
        }
    }

    /// The backend's name.
    pub fn backend_name(&self) -> &'static str {
        self.b.name()
    }

    fn now(&self) -> u64 {
        self.plan.origin.elapsed().as_nanos() as u64
    }

    fn in_window(&self, t: u64) -> bool {
        t >= self.plan.warmup_end_ns && t <= self.plan.end_ns
    }

    fn busy(&self) -> bool {
        self.slots.iter().any(|s| s.in_session || s.open)
    }
}
