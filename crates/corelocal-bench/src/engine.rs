//! The client engine: one pinned thread runs many connection slots through a [`Backend`]
//! (io_uring or epoll, in [`crate::sys`]). This module holds no syscalls: it is the state
//! machine that turns backend events into script steps, measurements and new I/O.

use crate::proto::Progress;
use crate::stats::{ErrKind, Stats};
use crate::workload::{Arrivals, Rng, Script, Step, StepIo};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// One slot's buffers, owned by the backend (their addresses stay put while I/O is in flight).
#[derive(Debug)]
pub struct ConnBuf {
    /// Bytes to send; the backend sends all of it, then the engine clears it.
    pub out: Vec<u8>,
    /// Receive buffer.
    pub inbuf: Box<[u8]>,
    /// Valid bytes in `inbuf`.
    pub in_len: usize,
}

impl ConnBuf {
    /// Buffers with a receive capacity of `cap`.
    pub fn new(cap: usize) -> Self {
        ConnBuf {
            out: Vec::with_capacity(256),
            inbuf: vec![0; cap.max(64)].into_boxed_slice(),
            in_len: 0,
        }
    }
}

/// What the backend reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The connection is established.
    Connected(usize),
    /// `n` bytes of `out` were sent (the backend sends the rest by itself).
    Sent(usize, usize),
    /// `n` bytes were appended to `inbuf` (0: the peer closed).
    Recv(usize, usize),
    /// An operation failed with this errno.
    Error(usize, ErrKind, i32),
    /// After `close`: the slot's socket is gone and its buffers are free.
    Released(usize),
}

/// Socket settings every connection gets.
#[derive(Debug, Clone)]
pub struct SockOpts {
    /// Server address.
    pub target: SocketAddrV4,
    /// Source addresses to spread connections over (empty: the kernel picks).
    pub src: Arc<[Ipv4Addr]>,
    /// SO_LINGER 0: close sends RST, no TIME_WAIT.
    pub linger0: bool,
    /// TCP_NODELAY.
    pub nodelay: bool,
}

/// An I/O backend: io_uring or epoll.
pub trait Backend {
    /// The slot's buffers.
    fn buf(&mut self, slot: usize) -> &mut ConnBuf;
    /// Opens a socket from source address `src`, connects, sends `out`, arms a receive.
    fn open(&mut self, slot: usize, src: Option<Ipv4Addr>) -> Result<(), i32>;
    /// Sends `out` and arms a receive.
    fn send(&mut self, slot: usize);
    /// Arms a receive (no-op when one is armed).
    fn recv(&mut self, slot: usize);
    /// Closes the socket (cancelling what is in flight); a `Released` event follows.
    fn close(&mut self, slot: usize);
    /// Submits queued work and waits up to `timeout_ns` for events.
    fn wait(&mut self, timeout_ns: u64, events: &mut Vec<Event>) -> std::io::Result<()>;
    /// The backend's name for the report.
    fn name(&self) -> &'static str;
}

/// What counts as one unit of work for `--requests` and for open-loop arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A request/response transaction (rpc, kv).
    Txn,
    /// A session (a connection for crr, an httperf session for http).
    Session,
}

/// Open-loop arrivals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpenLoop {
    /// Units per second (this thread's share).
    pub rate: f64,
    /// Poisson arrivals instead of evenly spaced.
    pub exponential: bool,
}

/// One thread's plan.
pub struct Plan {
    /// Connection slots (maximum concurrency).
    pub slots: usize,
    /// Unit of work.
    pub unit: Unit,
    /// Units to start in total (None: until the end time).
    pub quota: Option<u64>,
    /// Open loop, or closed loop when None.
    pub open_loop: Option<OpenLoop>,
    /// Clock origin shared by all threads.
    pub origin: Instant,
    /// Measurement starts (ns since origin).
    pub warmup_end_ns: u64,
    /// Stop at (ns since origin).
    pub end_ns: u64,
    /// A session without progress for this long fails with a timeout.
    pub timeout_ns: u64,
    /// Seed of this thread's randomness.
    pub seed: u64,
    /// Makes one script per slot.
    pub script: Box<dyn Fn() -> Box<dyn Script> + Send>,
    /// Source addresses (round-robin).
    pub src: Arc<[Ipv4Addr]>,
    /// Use `src` only once the kernel's ephemeral ports run out (`--src auto`): binding a
    /// source address costs two more operations per connection, which a run that leaves no
    /// TIME_WAIT behind on the client (the server closes first) never needs.
    pub src_on_demand: bool,
    /// Index of the first source address this thread uses.
    pub src_offset: usize,
    /// Units completed (for the progress display).
    pub progress: Arc<AtomicU64>,
    /// Set to stop early.
    pub stop: Arc<AtomicBool>,
}

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
pub struct Engine<B: Backend> {
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

impl<B: Backend> Engine<B> {
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
                cpu_start = Some(crate::sys::thread_cpu_ns());
            }
            if !self.stopping
                && (now >= self.plan.end_ns
                    || self.plan.stop.load(Ordering::Relaxed)
                    || self.quota_done_and_idle())
            {
                self.stopping = true;
                stop_at = now;
                cpu_end = Some(crate::sys::thread_cpu_ns());
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

    fn dispatch(&mut self, now: u64) {
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
    fn step(&mut self, i: usize, now: u64) {
        loop {
            let s = &mut self.slots[i];
            let buf = self.b.buf(i);
            buf.out.clear();
            let step = s.script.next(StepIo {
                out: &mut buf.out,
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

    fn open(&mut self, i: usize, now: u64) {
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
        self.b.buf(i).in_len = 0;
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
    fn spread_sources(&mut self, i: usize, now: u64) -> bool {
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

    fn close(&mut self, i: usize, after: AfterClose) {
        let s = &mut self.slots[i];
        s.phase = Phase::Closing;
        s.after = after;
        self.b.close(i);
    }

    /// Ends a session without counting it (quota reached / time up).
    fn end_session_quietly(&mut self, i: usize) {
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
    fn abandon(&mut self, i: usize) {
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

    fn finish_session(&mut self, i: usize, now: u64, ok: bool) {
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

    fn fail_session(&mut self, i: usize, now: u64) {
        self.finish_session(i, now, false);
    }

    fn error(&mut self, i: usize, kind: ErrKind, errno: i32, now: u64) {
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

    fn scan_timeouts(&mut self, now: u64) {
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

    fn complete_txn(&mut self, i: usize, info: crate::proto::RespInfo, now: u64) {
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

    fn on_event(&mut self, ev: Event, now: u64) {
        match ev {
            Event::Released(i) => {
                let s = &mut self.slots[i];
                s.open = false;
                s.connected = false;
                s.doomed = false;
                if !s.in_session {
                    s.phase = Phase::Free;
                    self.free.push(i);
                    return;
                }
                s.phase = Phase::Active;
                match s.after {
                    AfterClose::Free => {
                        s.in_session = false;
                        s.phase = Phase::Free;
                        self.free.push(i);
                    }
                    AfterClose::Continue => self.step(i, now),
                    AfterClose::OpenSend => self.open(i, now),
                }
            }
            Event::Connected(i) => {
                let w = self.in_window(now);
                let s = &mut self.slots[i];
                s.connected = true;
                s.last_io = now;
                if w {
                    self.stats.conns += 1;
                    self.stats.lat_connect.record(now - s.conn_start);
                }
            }
            Event::Sent(i, n) => {
                self.slots[i].last_io = now;
                if self.in_window(now) {
                    self.stats.bytes_out += n as u64;
                }
            }
            Event::Error(i, kind, errno) => {
                if self.slots[i].phase == Phase::Closing {
                    return;
                }
                self.error(i, kind, errno, now);
            }
            Event::Recv(i, n) => self.on_recv(i, n, now),
        }
    }

    fn on_recv(&mut self, i: usize, n: usize, now: u64) {
        if self.slots[i].phase == Phase::Closing {
            return;
        }
        self.slots[i].last_io = now;
        if self.in_window(now) {
            self.stats.bytes_in += n as u64;
        }
        if n == 0 {
            // The peer closed.
            let s = &mut self.slots[i];
            if s.phase == Phase::AwaitEof {
                self.finish_session(i, now, true);
                return;
            }
            if let Some(p) = s.expect.front_mut() {
                if let Ok(info) = p.eof() {
                    // A close-delimited body ended.
                    self.complete_txn(i, info, now);
                    let s = &mut self.slots[i];
                    s.expect.pop_front();
                    s.doomed = true;
                    if s.expect.is_empty() {
                        self.step(i, now);
                        return;
                    }
                }
                self.error(i, ErrKind::ClosedEarly, 0, now);
            } else if s.in_session {
                self.error(i, ErrKind::ClosedIdle, 0, now);
            } else {
                self.close(i, AfterClose::Free);
            }
            return;
        }
        let mut off = 0;
        loop {
            let buf = self.b.buf(i);
            let len = buf.in_len;
            if off >= len {
                break;
            }
            let s = &mut self.slots[i];
            let Some(p) = s.expect.front_mut() else {
                buf.in_len = 0;
                self.error(i, ErrKind::Unexpected, 0, now);
                return;
            };
            match p.feed(&buf.inbuf[off..len]) {
                Ok(Progress::NeedMore) => off = len,
                Ok(Progress::Done { consumed, info }) => {
                    off += consumed;
                    self.complete_txn(i, info, now);
                    self.slots[i].expect.pop_front();
                }
                Err(_) => {
                    self.b.buf(i).in_len = 0;
                    self.error(i, ErrKind::Protocol, 0, now);
                    return;
                }
            }
        }
        self.b.buf(i).in_len = 0;
        let s = &self.slots[i];
        if s.expect.is_empty() && s.phase == Phase::Active {
            self.step(i, now);
        } else if !s.expect.is_empty() {
            self.b.recv(i);
        }
    }
}
