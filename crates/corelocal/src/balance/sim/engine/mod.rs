//! The event loop of the simulator (see the module docs of [`super`] for the model).
//!
//! Layout: this file holds the simulator's state (events, jobs, connections, cores, the
//! per-second series), its setup and the event loop; `events` handles each event; `sched`
//! runs a core (kicks, the hog's share of the CPU, picking the next job); `accept` is the
//! accept thread (local accepts and steals); `busy` the busy detection and the wakeups it calls
//! for; `report` records each connection's outcome and builds the report.

mod accept;
mod busy;
mod events;
mod report;
mod sched;

use super::rng::Pcg32;
use super::{SimConfig, SimReport, CONNS_MAX};
use crate::balance::{Balancer, BusySet, BusyTracker, FlowGroupTable};
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
    /// Index into [`BATCHES`](super::BATCHES) of the next batch to serve.
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
}
