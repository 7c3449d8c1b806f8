//! A deterministic discrete-event simulation of many cores running the Affinity-Accept
//! balancer — the same [`BusyTracker`](super::BusyTracker), [`Balancer`](super::Balancer)
//! and [`FlowGroupTable`](super::FlowGroupTable) the runtime uses — to reproduce seed 000
//! §6.5 ("Load Balancer") at 48 cores and more.
//!
//! # The model
//!
//! - **Cores.** Each core runs softirq work (packet processing for the flow groups it owns)
//!   at full speed and ahead of everything else, and one server process: an accept thread
//!   plus one thread per open connection (at most `inflight_max`), in a FIFO run queue. A
//!   woken accept thread runs next (a sleeper with little CPU time wins the wakeup under a
//!   fair scheduler; an event loop polls its listener first) and accepts until nothing is
//!   left, up to `accept_batch`, then yields. On a *hogged* core a CPU hog (the paper's
//!   parallel `make`) shares the CPU as a fair scheduler would: the server runs at once when
//!   it has work, but gets at most `hog_share_pct`% of each `hog_period_ms` window; then the
//!   hog runs until the next window. Softirq runs at once regardless (and takes that time
//!   from the hog).
//! - **Connections** (the paper's §6.2 workload): Poisson arrivals, a uniformly random flow
//!   group each (the low 12 bits of the source port), whose owner core in the group table
//!   gets the SYN. Then 1 request, `think_ms`, 2 requests, `think_ms`, 3 requests, close.
//!   Packet work (SYN + handshake, each request's receive/transmit) is charged as softirq to
//!   the core owning the group at that moment; application work (accept, each request) to
//!   the core that accepted the connection (the owner, or the stealer).
//! - **Accept queues** of `queue_cap` per core: a SYN arriving at a full queue is dropped
//!   (the kernel never spills it to a sibling); the client retransmits after `syn_rto_ms`,
//!   then 2×, 4×, … (1 s, 3 s, 7 s after the first SYN). A client gives up `client_timeout_ms`
//!   after its first SYN; a timed-out connection counts with latency = the timeout.
//! - **Busy state** ([`BusyDetection`]): either on the packet path (the paper: observed at each
//!   enqueue, dequeue and failed steal) or as corelocal's runtime does it (`watch`, the
//!   default): only running servers observe — the owner when its server runs, and non-busy
//!   cores for every queue nobody observed for 1 ms, also from an idle watch timer — so a
//!   core whose server gets no CPU at all (`hog_share_pct` = 0) is still found busy.
//! - **Balancer**: a core's accept thread asks [`Balancer::choose_accept`](super::Balancer::choose_accept);
//!   an idle accept thread sleeps and is woken by a local enqueue, or — when the enqueueing
//!   core is busy — one sleeping non-busy core is woken (all of them when a core becomes busy);
//!   every 10 ms each core's [`Balancer::migration_tick`](super::Balancer::migration_tick) runs
//!   and a request is applied to the group table at once (packets and SYNs of the group go to
//!   the new core from then on).
//!
//! Output: p50/p90/p99 connection latency, timeouts, steals, migrations, and a per-second
//! series (latency of the connections started that second, throughput, the hogged cores'
//! share of all packet processing, the groups they own). Everything is integer time in
//! nanoseconds and a seeded PCG32: the same config gives byte-identical JSON.

mod engine;
mod rng;
mod svg;

pub use rng::Pcg32;
pub use svg::render_svg;

use serde::Serialize;

/// The most simulated cores.
pub const CORES_MAX: usize = 1024;
/// The most connections one run may create.
pub const CONNS_MAX: u64 = 50_000_000;

/// Which parts of the balancer run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BalancerMode {
    /// Local accept only: no stealing, no migration.
    Off,
    /// Connection stealing, no flow-group migration.
    Steal,
    /// Stealing and migration (the paper's balancer).
    On,
}

impl std::str::FromStr for BalancerMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(BalancerMode::Off),
            "steal" => Ok(BalancerMode::Steal),
            "on" => Ok(BalancerMode::On),
            _ => Err(format!("balancer must be on, off or steal, not {s:?}")),
        }
    }
}

/// Who computes a core's busy state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BusyDetection {
    /// The paper's: on the packet path, at every enqueue (softirq runs whatever the
    /// scheduler does), and at every dequeue.
    PacketPath,
    /// corelocal's runtime: only running servers observe queues — the owner when its server
    /// runs (at most every 200 µs, and at each accept), and every non-busy core whose server
    /// runs (or whose watch timer fires when idle: 1 ms, doubling to 32 ms while every queue
    /// is empty) observes each queue nobody observed for 1 ms. A starved owner never
    /// observes its own queue; others do it for it.
    Watch,
}

impl std::str::FromStr for BusyDetection {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "packet-path" => Ok(BusyDetection::PacketPath),
            "watch" => Ok(BusyDetection::Watch),
            _ => Err(format!(
                "busy detection must be watch or packet-path, not {s:?}"
            )),
        }
    }
}

/// A simulation's parameters. [`SimConfig::new`] gives the defaults used for §6.5.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimConfig {
    /// Number of cores, one server worker each.
    pub cores: usize,
    /// Number of hogged cores (cores `0..hog`).
    pub hog: usize,
    /// CPU share, in percent, the server gets on a hogged core while the hog runs (per
    /// `hog_period_ms` window); 0: none at all (a starved core).
    pub hog_share_pct: u32,
    /// Who computes busy state.
    pub busy_detection: BusyDetection,
    /// The fair scheduler's window on a hogged core, ms.
    pub hog_period_ms: u64,
    /// When the hog starts, ms.
    pub hog_start_ms: u64,
    /// When the hog stops, ms (`None`: never).
    pub hog_end_ms: Option<u64>,
    /// Balancer parts enabled.
    pub balancer: BalancerMode,
    /// RNG seed.
    pub seed: u64,
    /// Connections arrive during `0..duration_ms`; the run continues until they all finished
    /// or timed out.
    pub duration_ms: u64,
    /// Offered load, in percent of the CPU time of all cores (the paper: 50).
    pub load_pct: u32,
    /// Accept-queue capacity per core (the max local accept queue).
    pub queue_cap: u32,
    /// Most open (accepted, unfinished) connections per core.
    pub inflight_max: u32,
    /// Most connections accepted in one turn of the accept thread (an event loop accepts
    /// until EAGAIN; lighttpd stops at 100).
    pub accept_batch: u32,
    /// Number of flow groups (a power of two).
    pub flow_groups: u32,
    /// Softirq cost of a connection's SYN, handshake and first request packets, ns.
    pub syn_softirq_ns: u64,
    /// Softirq cost of each request's packets (request, response, ACKs), ns.
    pub req_softirq_ns: u64,
    /// Application cost of a local accept, ns.
    pub accept_ns: u64,
    /// Application cost of a stolen accept, ns.
    pub steal_ns: u64,
    /// Application cost of a steal attempt that found the victim's queue empty, ns.
    pub steal_fail_ns: u64,
    /// Application cost of serving one request, ns.
    pub req_app_ns: u64,
    /// Client think time between the request batches, ms.
    pub think_ms: u64,
    /// The client gives up this long after its first SYN, ms.
    pub client_timeout_ms: u64,
    /// First SYN retransmission timeout, ms (doubling after each retry).
    pub syn_rto_ms: u64,
    /// The balancer's migration interval, ms (the paper: 100).
    pub migrate_interval_ms: u64,
}

/// Requests per batch (seed 000 §6.2: 1, think, 2, think, 3).
pub const BATCHES: [u32; 3] = [1, 2, 3];

impl SimConfig {
    /// Defaults: 100 µs of softirq per SYN and per request, 20 µs accept, 150 µs per
    /// request, 100 ms think, 10 s client timeout, 1 s SYN RTO, 128 per-core queue, 256 open
    /// connections per core (4× what 50% load keeps open), 4096 groups, 50% load, the server
    /// gets 10% of a hogged core (20 ms windows), 60 s.
    pub fn new(cores: usize, hog: usize, balancer: BalancerMode, seed: u64) -> Self {
        SimConfig {
            cores,
            hog,
            hog_share_pct: 10,
            busy_detection: BusyDetection::Watch,
            hog_period_ms: 20,
            hog_start_ms: 0,
            hog_end_ms: None,
            balancer,
            seed,
            duration_ms: 60_000,
            load_pct: 50,
            queue_cap: 128,
            inflight_max: 256,
            accept_batch: 100,
            flow_groups: 4096,
            syn_softirq_ns: 100_000,
            req_softirq_ns: 100_000,
            accept_ns: 20_000,
            steal_ns: 30_000,
            steal_fail_ns: 5_000,
            req_app_ns: 150_000,
            think_ms: 100,
            client_timeout_ms: 10_000,
            syn_rto_ms: 1_000,
            migrate_interval_ms: 100,
        }
    }

    /// CPU time one connection costs when everything runs at full speed, ns.
    pub fn cpu_per_conn_ns(&self) -> u64 {
        let reqs: u64 = BATCHES.iter().map(|&b| u64::from(b)).sum();
        self.syn_softirq_ns
            + (reqs - 1) * self.req_softirq_ns
            + self.accept_ns
            + reqs * self.req_app_ns
    }

    /// Offered connections per second.
    pub fn offered_conn_per_s(&self) -> f64 {
        self.cores as f64 * f64::from(self.load_pct) / 100.0 * 1e9 / self.cpu_per_conn_ns() as f64
    }

    /// The balancer config the cores run.
    pub fn balance_config(&self) -> super::BalanceConfig {
        let mut c = super::BalanceConfig::new(self.cores);
        c.flow_groups = self.flow_groups;
        c.steal_enabled = self.balancer != BalancerMode::Off;
        c.migrate_enabled = self.balancer == BalancerMode::On;
        c.migrate_interval_ns = self.migrate_interval_ms * 1_000_000;
        c
    }

    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |s: &str| Err(s.to_string());
        if self.cores == 0 || self.cores > CORES_MAX {
            return bad(&format!("cores must be 1..={CORES_MAX}"));
        }
        if self.hog > self.cores {
            return bad("hog must not exceed cores");
        }
        if self.hog_share_pct > 100 {
            return bad("hog share must be 0..=100 %");
        }
        if self.hog_period_ms == 0 || self.hog_period_ms > 1_000 {
            return bad("hog period must be 1..=1000 ms");
        }
        if self.load_pct == 0 || self.load_pct > 100 {
            return bad("load must be 1..=100 %");
        }
        if self.duration_ms == 0 || self.duration_ms > 3_600_000 {
            return bad("duration must be 1 ms ..= 1 h");
        }
        if self.queue_cap == 0 || self.queue_cap > 65_536 {
            return bad("queue cap must be 1..=65536");
        }
        if self.inflight_max == 0 || self.inflight_max > 1_000_000 {
            return bad("inflight max must be 1..=1000000");
        }
        if self.accept_batch == 0 || self.accept_batch > 65_536 {
            return bad("accept batch must be 1..=65536");
        }
        let costs = [
            self.syn_softirq_ns,
            self.req_softirq_ns,
            self.accept_ns,
            self.steal_ns,
            self.steal_fail_ns,
            self.req_app_ns,
        ];
        if costs.iter().any(|&c| c == 0 || c > 1_000_000_000) {
            return bad("costs must be 1 ns ..= 1 s");
        }
        if self.think_ms > 10_000 {
            return bad("think time must be at most 10 s");
        }
        if self.client_timeout_ms == 0 || self.client_timeout_ms > 600_000 {
            return bad("client timeout must be 1 ms ..= 600 s");
        }
        if self.syn_rto_ms == 0 || self.migrate_interval_ms == 0 {
            return bad("syn rto and migrate interval must be positive");
        }
        if self.migrate_interval_ms > 60_000 {
            return bad("migrate interval must be at most 60 s");
        }
        let expected = self.offered_conn_per_s() * self.duration_ms as f64 / 1e3;
        if expected > CONNS_MAX as f64 / 2.0 {
            return bad("too many connections for one run: lower cores, load or duration");
        }
        self.balance_config().validate().map_err(|e| e.to_string())
    }
}

/// The whole-run figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Connections started.
    pub connections: u64,
    /// Connections served completely within the client timeout.
    pub completed: u64,
    /// Connections the client gave up on.
    pub timeouts: u64,
    /// `timeouts / connections`, percent.
    pub timeout_pct: f64,
    /// Median connection latency (first SYN to last response; timeouts count as the
    /// timeout), ms.
    pub latency_p50_ms: f64,
    /// 90th percentile latency, ms.
    pub latency_p90_ms: f64,
    /// 99th percentile latency, ms.
    pub latency_p99_ms: f64,
    /// SYNs dropped at a full accept queue (ListenOverflows).
    pub syn_drops: u64,
    /// SYN retransmissions.
    pub syn_retransmits: u64,
    /// Connections accepted by a core other than the one whose queue held them.
    pub steals: u64,
    /// Steal attempts that found the victim's queue empty.
    pub steal_failures: u64,
    /// Flow groups moved.
    pub migrations: u64,
    /// Busy ↔ non-busy transitions, all cores.
    pub busy_transitions: u64,
    /// Flow groups owned by the hogged cores at the start.
    pub hogged_groups_start: u64,
    /// Flow groups owned by the hogged cores at the end.
    pub hogged_groups_end: u64,
    /// The hogged cores' share of all softirq (packet) time over the run, percent.
    pub hogged_packet_share_pct: f64,
    /// Share of the completed connections that hogged cores served (accepted), percent.
    pub served_on_hogged_pct: f64,
    /// Median latency of the completed connections served by hogged cores, ms.
    pub served_on_hogged_p50_ms: f64,
    /// Median latency of the completed connections served by the other cores, ms.
    pub served_on_others_p50_ms: f64,
    /// Offered connections per second.
    pub offered_conn_per_s: f64,
    /// Events processed.
    pub events: u64,
}

/// One second of the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Second {
    /// Start of the second, s.
    pub t_s: u64,
    /// Connections started.
    pub arrivals: u64,
    /// Connections completed.
    pub completed: u64,
    /// Connections whose client gave up during this second.
    pub timeouts: u64,
    /// Median latency of the connections started in this second, ms (0 if none).
    pub p50_ms: f64,
    /// 90th percentile of the same, ms.
    pub p90_ms: f64,
    /// 99th percentile of the same, ms.
    pub p99_ms: f64,
    /// Stolen connections.
    pub steals: u64,
    /// Flow groups moved.
    pub migrations: u64,
    /// SYNs dropped at full queues.
    pub syn_drops: u64,
    /// Busy cores at the end of the second.
    pub busy_cores: u64,
    /// Flow groups owned by the hogged cores at the end of the second.
    pub hogged_groups: u64,
    /// The hogged cores' share of all softirq time in this second, percent.
    pub hogged_packet_share_pct: f64,
    /// Softirq time on the hogged cores, percent of their CPU time (what the hog loses).
    pub hogged_packet_cpu_pct: f64,
}

/// A run's result: the config, the summary and the per-second series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimReport {
    /// What was simulated.
    pub config: SimConfig,
    /// Whole-run figures.
    pub summary: Summary,
    /// One entry per second.
    pub series: Vec<Second>,
}

impl SimReport {
    /// Pretty JSON (deterministic: same report, same bytes).
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("report serialises");
        s.push('\n');
        s
    }
}

/// Runs one simulation. Deterministic: the same config gives the same report.
pub fn run(cfg: &SimConfig) -> Result<SimReport, String> {
    cfg.validate()?;
    Ok(engine::Sim::new(cfg.clone()).run())
}

#[cfg(test)]
mod tests;
