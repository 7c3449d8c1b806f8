//! The event loop of the simulator (see the module docs of [`super`] for the model).

use super::rng::Pcg32;
use super::{
    BalancerMode, BusyDetection, Second, SimConfig, SimReport, Summary, BATCHES, CONNS_MAX,
};
use crate::balance::{AcceptFrom, Balancer, BusyChange, BusySet, BusyTracker, FlowGroupTable};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

const NS_PER_MS: u64 = 1_000_000;
const NS_PER_S: u64 = 1_000_000_000;
/// Period of the migration / sampling tick.
const TICK_NS: u64 = 10 * NS_PER_MS;
/// `watch` busy detection: a running owner samples its own queue at most this often …
const SAMPLE_NS: u64 = 200_000;
/// … and a queue nobody observed for this long is observed by a non-busy core that runs.
const STALE_NS: u64 = NS_PER_MS;
/// An idle core's watch timer: from this …
const WATCH_MIN_NS: u64 = NS_PER_MS;
/// … doubling up to this while every queue it watched was empty.
const WATCH_MAX_NS: u64 = 32 * NS_PER_MS;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The next connection arrives.
    Arrival,
    /// Connection sends (or retransmits) its SYN.
    Syn(u32),
    /// A core finished its current job.
    CoreDone(u32),
    /// A connection's think time is over: it sends its next batch.
    Think(u32),
    /// Migration tick / per-second sample.
    Tick,
    /// A hogged core's server may run again (new scheduling window).
    Resume(u32),
    /// `watch` busy detection: an idle core's timer to watch the other queues.
    Watch(u32),
}

#[derive(Debug, Clone, Copy)]
enum Job {
    /// Softirq: `first` = SYN + handshake + first request; otherwise a later batch's packets.
    Soft { conn: u32, first: bool },
    /// Accept of `conn` (`live`: the client still waits).
    Accept { conn: u32, live: bool },
    /// A steal attempt that found the victim's queue empty.
    StealFail,
    /// Serving `conn`'s current batch.
    App { conn: u32 },
}

#[derive(Debug, Clone)]
struct Conn {
    t0_ns: u64,
    group: u32,
    /// Index into [`BATCHES`] of the next batch to serve.
    batch: u8,
    syn_tries: u8,
    app_core: u32,
    done: bool,
}

/// The accept thread's entry in a run queue.
const ACCEPT: u32 = u32::MAX;

/// What a core's accept thread is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AcceptState {
    /// Waiting for a connection (local enqueue) or a wakeup to steal.
    Sleeping,
    /// Ready: its [`ACCEPT`] entry is in the run queue.
    Queued,
    /// Running: accepts until nothing is left, up to this many more.
    Bursting(u32),
    /// The core has `inflight_max` open connections: waits for one to close.
    Blocked,
}

#[derive(Debug)]
struct Core {
    soft: VecDeque<Job>,
    /// Ready server work in FIFO order: connection ids, and [`ACCEPT`] for the accept thread.
    runq: VecDeque<u32>,
    accq: VecDeque<u32>,
    current: Option<Job>,
    /// The accept thread's state.
    accept: AcceptState,
    inflight: u32,
    /// Start of the current hog scheduling window and the server's CPU used in it.
    window_start_ns: u64,
    window_used_ns: u64,
    /// The hog holds the CPU (for server work) until then; a Resume event is pending.
    server_blocked_until_ns: u64,
    tracker: BusyTracker,
    bal: Balancer,
    /// `watch`: when this core's queue was last observed, and when this core last watched
    /// the others and how long until its idle timer fires again.
    observed_ns: u64,
    watched_ns: u64,
    watch_interval_ns: u64,
}

/// Per-second counters, indexed by second.
#[derive(Debug, Default)]
struct Series {
    arrivals: Vec<u64>,
    completed: Vec<u64>,
    timeouts: Vec<u64>,
    steals: Vec<u64>,
    migrations: Vec<u64>,
    syn_drops: Vec<u64>,
    busy_cores: Vec<u64>,
    hogged_groups: Vec<u64>,
    soft_ns_all: Vec<u64>,
    soft_ns_hogged: Vec<u64>,
    /// Latencies (µs) of the connections started in each second.
    latency_us: Vec<Vec<u32>>,
    /// Latencies (µs) of completed connections served on hogged / other cores.
    served_hogged_us: Vec<u32>,
    served_other_us: Vec<u32>,
}

pub(super) struct Sim {
    cfg: SimConfig,
    now_ns: u64,
    seq: u64,
    heap: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    cores: Vec<Core>,
    conns: Vec<Conn>,
    busy: BusySet,
    table: FlowGroupTable,
    rng: Pcg32,
    next_arrival_ns: f64,
    mean_interarrival_ns: f64,
    arrivals_end_ns: u64,
    hard_end_ns: u64,
    timeout_ns: u64,
    hog_start_ns: u64,
    hog_end_ns: u64,
    kicks: VecDeque<u32>,
    wake_cursor: usize,
    s: Series,
    events: u64,
    syn_drops: u64,
    syn_retransmits: u64,
    steals: u64,
    steal_failures: u64,
    migrations: u64,
}

impl Sim {
    pub(super) fn new(cfg: SimConfig) -> Self {
        let bcfg = cfg.balance_config();
        let n = cfg.cores;
        let busy = BusySet::new(n);
        let cores = (0..n)
            .map(|c| Core {
                soft: VecDeque::new(),
                runq: VecDeque::new(),
                accq: VecDeque::with_capacity(cfg.queue_cap as usize),
                current: None,
                accept: AcceptState::Sleeping,
                inflight: 0,
                window_start_ns: 0,
                window_used_ns: 0,
                server_blocked_until_ns: 0,
                tracker: BusyTracker::new(c, &bcfg),
                bal: Balancer::new(c, &bcfg),
                observed_ns: 0,
                watched_ns: 0,
                watch_interval_ns: WATCH_MIN_NS,
            })
            .collect();
        let timeout_ns = cfg.client_timeout_ms * NS_PER_MS;
        let arrivals_end_ns = cfg.duration_ms * NS_PER_MS;
        let hard_end_ns = arrivals_end_ns + timeout_ns + 2 * NS_PER_S;
        let secs = hard_end_ns.div_ceil(NS_PER_S) as usize + 1;
        let zeros = vec![0u64; secs];
        let s = Series {
            arrivals: zeros.clone(),
            completed: zeros.clone(),
            timeouts: zeros.clone(),
            steals: zeros.clone(),
            migrations: zeros.clone(),
            syn_drops: zeros.clone(),
            busy_cores: zeros.clone(),
            hogged_groups: zeros.clone(),
            soft_ns_all: zeros.clone(),
            soft_ns_hogged: zeros,
            latency_us: vec![Vec::new(); secs],
            served_hogged_us: Vec::new(),
            served_other_us: Vec::new(),
        };
        let mean_interarrival_ns = 1e9 / cfg.offered_conn_per_s();
        let hog_start_ns = cfg.hog_start_ms * NS_PER_MS;
        let hog_end_ns = cfg.hog_end_ms.map_or(u64::MAX, |ms| ms * NS_PER_MS);
        Sim {
            rng: Pcg32::new(cfg.seed, 0x5eed),
            table: FlowGroupTable::new(cfg.flow_groups, n),
            cfg,
            now_ns: 0,
            seq: 0,
            heap: BinaryHeap::new(),
            cores,
            conns: Vec::new(),
            busy,
            next_arrival_ns: 0.0,
            mean_interarrival_ns,
            arrivals_end_ns,
            hard_end_ns,
            timeout_ns,
            hog_start_ns,
            hog_end_ns,
            kicks: VecDeque::new(),
            wake_cursor: 0,
            s,
            events: 0,
            syn_drops: 0,
            syn_retransmits: 0,
            steals: 0,
            steal_failures: 0,
            migrations: 0,
        }
    }

    fn sec(t_ns: u64) -> usize {
        (t_ns / NS_PER_S) as usize
    }

    fn schedule(&mut self, t_ns: u64, ev: Ev) {
        debug_assert!(t_ns >= self.now_ns, "event in the past");
        self.seq += 1;
        self.heap.push(Reverse((t_ns, self.seq, ev)));
    }

    fn hogged_groups(&self) -> u64 {
        (0..self.cfg.hog)
            .map(|c| self.table.groups_of(c).len() as u64)
            .sum()
    }

    pub(super) fn run(mut self) -> SimReport {
        let hogged_groups_start = self.hogged_groups();
        self.schedule(0, Ev::Arrival);
        self.schedule(0, Ev::Tick);
        if self.watching() {
            for core in 0..self.cfg.cores {
                self.schedule(WATCH_MIN_NS, Ev::Watch(core as u32));
            }
        }
        let events_max = CONNS_MAX * 64;
        while let Some(Reverse((t, _, ev))) = self.heap.pop() {
            if t > self.hard_end_ns {
                break;
            }
            self.now_ns = t;
            self.events += 1;
            assert!(self.events <= events_max, "event limit reached");
            match ev {
                Ev::Arrival => self.on_arrival(),
                Ev::Syn(conn) => self.send_syn(conn),
                Ev::CoreDone(core) => self.on_core_done(core as usize),
                Ev::Think(conn) => self.on_think(conn),
                Ev::Tick => self.on_tick(),
                Ev::Resume(core) => self.kick(core as usize),
                Ev::Watch(core) => self.on_watch_timer(core as usize),
            }
            self.drain_kicks();
        }
        // Connections still unresolved at the end waited past their deadline (the run lasts
        // until every deadline has passed): they timed out.
        for id in 0..self.conns.len() as u32 {
            if !self.conns[id as usize].done {
                debug_assert!(self.deadline(id) <= self.hard_end_ns);
                self.timeout(id);
            }
        }
        self.report(hogged_groups_start)
    }

    fn deadline(&self, conn: u32) -> u64 {
        self.conns[conn as usize].t0_ns + self.timeout_ns
    }

    fn expired(&self, conn: u32) -> bool {
        self.now_ns >= self.deadline(conn)
    }

    fn on_arrival(&mut self) {
        let id = self.conns.len() as u32;
        assert!((id as u64) < CONNS_MAX, "connection limit reached");
        let group = self.rng.below(self.cfg.flow_groups);
        self.conns.push(Conn {
            t0_ns: self.now_ns,
            group,
            batch: 0,
            syn_tries: 0,
            app_core: u32::MAX,
            done: false,
        });
        self.s.arrivals[Self::sec(self.now_ns)] += 1;
        self.send_syn(id);
        self.next_arrival_ns += self.rng.exp(self.mean_interarrival_ns);
        let next = (self.next_arrival_ns as u64).max(self.now_ns);
        if next < self.arrivals_end_ns {
            self.schedule(next, Ev::Arrival);
        }
    }

    /// The group's owner gets the SYN (softirq).
    fn send_syn(&mut self, conn: u32) {
        let core = self.table.owner(self.conns[conn as usize].group);
        self.cores[core]
            .soft
            .push_back(Job::Soft { conn, first: true });
        self.kick(core);
    }

    fn kick(&mut self, core: usize) {
        if self.cores[core].current.is_none() {
            self.kicks.push_back(core as u32);
        }
    }

    fn drain_kicks(&mut self) {
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
    fn server_may_run(&mut self, core: usize) -> bool {
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
    fn pick(&mut self, core: usize) {
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

    /// One accept by the accept thread: the balancer chooses local or a victim. Returns the
    /// job, its cost and whether the thread goes on accepting; `None` when there is nothing.
    fn try_accept(&mut self, core: usize) -> Option<(Job, u64, bool)> {
        let local_ready = !self.cores[core].accq.is_empty();
        match self.cores[core].bal.choose_accept(&self.busy, local_ready) {
            AcceptFrom::Local => {
                let (job, cost) = self.accept_local(core);
                Some((job, cost, true))
            }
            AcceptFrom::Steal(victim) => {
                if let Some(conn) = self.cores[victim].accq.pop_front() {
                    self.observe(victim);
                    self.cores[core].bal.record_steal(victim, local_ready);
                    self.steals += 1;
                    self.s.steals[Self::sec(self.now_ns)] += 1;
                    Some((self.accept_job(core, conn), self.cfg.steal_ns, true))
                } else {
                    // The busy bit was stale; the failed attempt observes the empty queue.
                    self.observe(victim);
                    self.steal_failures += 1;
                    if local_ready {
                        let (job, cost) = self.accept_local(core);
                        Some((job, cost, true))
                    } else {
                        Some((Job::StealFail, self.cfg.steal_fail_ns, false))
                    }
                }
            }
            AcceptFrom::Nothing => None,
        }
    }

    /// A connection accepted by `core` closed (done or timed out): a blocked accept thread
    /// may go on.
    fn conn_closed(&mut self, core: usize) {
        let c = &mut self.cores[core];
        c.inflight -= 1;
        if c.accept == AcceptState::Blocked && c.inflight < self.cfg.inflight_max {
            c.accept = AcceptState::Sleeping;
            self.wake_accept(core);
        }
    }

    /// Makes `core`'s sleeping accept thread ready (it queues behind the ready connections).
    /// Returns whether it was sleeping.
    fn wake_accept(&mut self, core: usize) -> bool {
        let c = &mut self.cores[core];
        if c.accept != AcceptState::Sleeping {
            return false;
        }
        c.accept = AcceptState::Queued;
        // A woken accept thread (a sleeper with little CPU time) runs next, as a fair
        // scheduler's wakeup preemption (or an event loop polling its listener first) gives.
        c.runq.push_front(ACCEPT);
        self.kick(core);
        true
    }

    fn accept_local(&mut self, core: usize) -> (Job, u64) {
        let conn = self.cores[core]
            .accq
            .pop_front()
            .expect("local queue non-empty");
        self.observe(core);
        self.cores[core].bal.record_local();
        (self.accept_job(core, conn), self.cfg.accept_ns)
    }

    fn accept_job(&mut self, core: usize, conn: u32) -> Job {
        let live = !self.expired(conn);
        if live {
            self.cores[core].inflight += 1;
        }
        Job::Accept { conn, live }
    }

    fn watching(&self) -> bool {
        self.cfg.busy_detection == BusyDetection::Watch && self.cfg.balancer != BalancerMode::Off
    }

    /// `watch`: `core`'s server is about to run a job: it samples its own queue if due and,
    /// when not busy, watches the others.
    fn server_turn(&mut self, core: usize) {
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
    fn on_watch_timer(&mut self, core: usize) {
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
    fn observe(&mut self, core: usize) {
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
    fn wake_one_stealer(&mut self, except: usize) {
        let n = self.cfg.cores;
        for step in 0..n {
            let w = (self.wake_cursor + step) % n;
            if w != except && !self.busy.is_busy(w) && self.wake_accept(w) {
                self.wake_cursor = (w + 1) % n;
                return;
            }
        }
    }

    fn on_core_done(&mut self, core: usize) {
        let job = self.cores[core].current.take().expect("a running job");
        match job {
            Job::Soft { conn, first: true } => self.on_syn_processed(core, conn),
            Job::Soft { conn, first: false } => {
                if !self.conns[conn as usize].done {
                    let app = self.conns[conn as usize].app_core as usize;
                    self.cores[app].runq.push_back(conn);
                    self.kick(app);
                }
            }
            Job::Accept { conn, live } => {
                if live {
                    self.conns[conn as usize].app_core = core as u32;
                    self.cores[core].runq.push_back(conn);
                } else {
                    self.timeout(conn);
                }
            }
            Job::StealFail => {}
            Job::App { conn } => self.on_batch_served(core, conn),
        }
        self.pick(core);
    }

    fn on_syn_processed(&mut self, core: usize, conn: u32) {
        if self.conns[conn as usize].done {
            return;
        }
        if self.expired(conn) {
            self.timeout(conn);
            return;
        }
        if self.cores[core].accq.len() >= self.cfg.queue_cap as usize {
            // Full queue: the SYN is dropped; the client retransmits after 1 s, 2 s, 4 s...
            self.syn_drops += 1;
            self.s.syn_drops[Self::sec(self.now_ns)] += 1;
            if !self.watching() {
                self.observe(core);
            }
            let c = &mut self.conns[conn as usize];
            c.syn_tries += 1;
            let backoff = (1u64 << c.syn_tries.min(20)) - 1;
            let next = c.t0_ns + backoff * self.cfg.syn_rto_ms * NS_PER_MS;
            if next < self.deadline(conn) {
                self.syn_retransmits += 1;
                self.schedule(next, Ev::Syn(conn));
            } else {
                self.timeout(conn);
            }
            return;
        }
        self.cores[core].accq.push_back(conn);
        let own_thread_waits = self.wake_accept(core);
        if self.watching() {
            return; // the kernel wakes the owner only; busy state is the watchers' business
        }
        self.observe(core);
        if !own_thread_waits && self.busy.is_busy(core) && self.cfg.balancer != BalancerMode::Off {
            self.wake_one_stealer(core);
        }
    }

    fn on_batch_served(&mut self, core: usize, conn: u32) {
        let batch = self.conns[conn as usize].batch as usize;
        debug_assert_eq!(self.conns[conn as usize].app_core as usize, core);
        if batch + 1 == BATCHES.len() {
            self.conn_closed(core);
            if self.now_ns > self.deadline(conn) {
                self.timeout(conn);
            } else {
                self.complete(conn);
            }
        } else {
            self.conns[conn as usize].batch += 1;
            let t = self.now_ns + self.cfg.think_ms * NS_PER_MS;
            self.schedule(t, Ev::Think(conn));
        }
    }

    fn on_think(&mut self, conn: u32) {
        if self.expired(conn) {
            let app = self.conns[conn as usize].app_core as usize;
            self.conn_closed(app);
            self.timeout(conn);
            return;
        }
        let owner = self.table.owner(self.conns[conn as usize].group);
        self.cores[owner]
            .soft
            .push_back(Job::Soft { conn, first: false });
        self.kick(owner);
    }

    fn on_tick(&mut self) {
        let now = self.now_ns;
        for core in 0..self.cfg.cores {
            if let Some(req) = self.cores[core].bal.migration_tick(&self.busy, now) {
                if self.table.migrate(req).is_some() {
                    self.migrations += 1;
                    self.s.migrations[Self::sec(now)] += 1;
                }
            }
        }
        if now % NS_PER_S == 0 && now > 0 {
            let sec = Self::sec(now) - 1;
            self.s.busy_cores[sec] = self.busy.count() as u64;
            self.s.hogged_groups[sec] = self.hogged_groups();
        }
        if now + TICK_NS <= self.hard_end_ns {
            self.schedule(now + TICK_NS, Ev::Tick);
        }
    }

    fn record(&mut self, conn: u32, latency_ns: u64) {
        let t0 = self.conns[conn as usize].t0_ns;
        let us = (latency_ns / 1_000).min(u64::from(u32::MAX)) as u32;
        self.s.latency_us[Self::sec(t0)].push(us);
    }

    fn timeout(&mut self, conn: u32) {
        debug_assert!(!self.conns[conn as usize].done);
        self.conns[conn as usize].done = true;
        let deadline = self.deadline(conn);
        let last = self.s.timeouts.len() - 1;
        self.s.timeouts[Self::sec(deadline).min(last)] += 1;
        self.record(conn, self.timeout_ns);
    }

    fn complete(&mut self, conn: u32) {
        debug_assert!(!self.conns[conn as usize].done);
        self.conns[conn as usize].done = true;
        self.s.completed[Self::sec(self.now_ns)] += 1;
        let lat = self.now_ns - self.conns[conn as usize].t0_ns;
        self.record(conn, lat);
        let us = (lat / 1_000).min(u64::from(u32::MAX)) as u32;
        if (self.conns[conn as usize].app_core as usize) < self.cfg.hog {
            self.s.served_hogged_us.push(us);
        } else {
            self.s.served_other_us.push(us);
        }
    }

    fn report(mut self, hogged_groups_start: u64) -> SimReport {
        let secs = self.s.arrivals.len();
        let hogged_groups_end = self.hogged_groups();
        // The last (partial) second's sample, and seconds after the last tick.
        let mut series = Vec::with_capacity(secs);
        let mut all: Vec<u32> = Vec::with_capacity(self.conns.len());
        for sec in 0..secs {
            let lat = &mut self.s.latency_us[sec];
            lat.sort_unstable();
            all.extend_from_slice(lat);
            let soft_all = self.s.soft_ns_all[sec];
            let soft_hog = self.s.soft_ns_hogged[sec];
            series.push(Second {
                t_s: sec as u64,
                arrivals: self.s.arrivals[sec],
                completed: self.s.completed[sec],
                timeouts: self.s.timeouts[sec],
                p50_ms: percentile_ms(lat, 50.0),
                p90_ms: percentile_ms(lat, 90.0),
                p99_ms: percentile_ms(lat, 99.0),
                steals: self.s.steals[sec],
                migrations: self.s.migrations[sec],
                syn_drops: self.s.syn_drops[sec],
                busy_cores: self.s.busy_cores[sec],
                hogged_groups: self.s.hogged_groups[sec],
                hogged_packet_share_pct: ratio_pct(soft_hog, soft_all),
                hogged_packet_cpu_pct: ratio_pct(soft_hog, self.cfg.hog as u64 * NS_PER_S),
            });
        }
        // Trim the idle tail: keep up to the last second with any activity.
        while series.len() > 1 {
            let last = series.last().expect("non-empty");
            if last.arrivals + last.completed + last.timeouts == 0 {
                series.pop();
            } else {
                break;
            }
        }
        all.sort_unstable();
        let connections = self.conns.len() as u64;
        let timeouts: u64 = self.s.timeouts.iter().sum();
        let completed: u64 = self.s.completed.iter().sum();
        assert_eq!(
            timeouts + completed,
            connections,
            "every connection resolved once"
        );
        assert_eq!(all.len() as u64, connections);
        let soft_all: u64 = self.s.soft_ns_all.iter().sum();
        let soft_hog: u64 = self.s.soft_ns_hogged.iter().sum();
        let busy_transitions = self.cores.iter().map(|c| c.tracker.transitions()).sum();
        self.table.check();
        self.s.served_hogged_us.sort_unstable();
        self.s.served_other_us.sort_unstable();
        let served_hogged = self.s.served_hogged_us.len() as u64;
        SimReport {
            summary: Summary {
                connections,
                completed,
                timeouts,
                timeout_pct: round3(ratio_pct(timeouts, connections)),
                latency_p50_ms: percentile_ms(&all, 50.0),
                latency_p90_ms: percentile_ms(&all, 90.0),
                latency_p99_ms: percentile_ms(&all, 99.0),
                syn_drops: self.syn_drops,
                syn_retransmits: self.syn_retransmits,
                steals: self.steals,
                steal_failures: self.steal_failures,
                migrations: self.migrations,
                busy_transitions,
                hogged_groups_start,
                hogged_groups_end,
                hogged_packet_share_pct: round3(ratio_pct(soft_hog, soft_all)),
                served_on_hogged_pct: ratio_pct(served_hogged, completed),
                served_on_hogged_p50_ms: percentile_ms(&self.s.served_hogged_us, 50.0),
                served_on_others_p50_ms: percentile_ms(&self.s.served_other_us, 50.0),
                offered_conn_per_s: round3(self.cfg.offered_conn_per_s()),
                events: self.events,
            },
            config: self.cfg,
            series,
        }
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn ratio_pct(num: u64, den: u64) -> f64 {
    if den == 0 {
        0.0
    } else {
        round3(num as f64 * 100.0 / den as f64)
    }
}

/// Nearest-rank percentile of sorted µs values, in ms.
fn percentile_ms(sorted_us: &[u32], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted_us.len() as f64).ceil() as usize;
    let idx = rank.clamp(1, sorted_us.len()) - 1;
    f64::from(sorted_us[idx]) / 1000.0
}
