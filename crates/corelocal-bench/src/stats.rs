//! Counters, HDR latency histograms, errors by kind and errno, per-second timeline.

use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;

/// Highest latency recorded (ns); larger values are clamped.
pub const MAX_LATENCY_NS: u64 = 100_000_000_000;

/// A latency histogram in nanoseconds (3 significant digits).
#[derive(Debug, Clone)]
pub struct Lat(pub Histogram<u64>);

impl Default for Lat {
    fn default() -> Self {
        Lat(Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("valid histogram bounds"))
    }
}

impl Lat {
    /// Records one value (ns), clamped to the histogram's range.
    pub fn record(&mut self, ns: u64) {
        let _ = self.0.record(ns.clamp(1, MAX_LATENCY_NS));
    }

    /// Records `ns` as if samples were taken every `interval_ns` (coordinated-omission
    /// correction for a closed loop with a known expected interval).
    pub fn record_corrected(&mut self, ns: u64, interval_ns: u64) {
        let _ = self
            .0
            .record_correct(ns.clamp(1, MAX_LATENCY_NS), interval_ns.max(1));
    }

    /// Adds another histogram.
    pub fn merge(&mut self, other: &Lat) {
        let _ = self.0.add(&other.0);
    }

    /// Percentile summary in microseconds.
    pub fn summary(&self) -> LatSummary {
        let h = &self.0;
        let us = |v: u64| v as f64 / 1000.0;
        if h.is_empty() {
            return LatSummary::default();
        }
        LatSummary {
            count: h.len(),
            mean_us: h.mean() / 1000.0,
            p50_us: us(h.value_at_quantile(0.50)),
            p90_us: us(h.value_at_quantile(0.90)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }

    /// The percentile spectrum: (quantile, latency µs) at [`spectrum_quantiles`]; empty when
    /// nothing was recorded. Quantiles past 1 − 1/count all read the maximum.
    pub fn spectrum(&self) -> Vec<(f64, f64)> {
        let h = &self.0;
        if h.is_empty() {
            return Vec::new();
        }
        spectrum_quantiles()
            .into_iter()
            .map(|q| (q, h.value_at_quantile(q) as f64 / 1000.0))
            .collect()
    }

    /// Points of the CDF: (latency µs, fraction ≤), for plotting.
    pub fn cdf(&self) -> Vec<(f64, f64)> {
        let h = &self.0;
        if h.is_empty() {
            return Vec::new();
        }
        let total = h.len() as f64;
        let mut pts = Vec::new();
        let mut seen = 0u64;
        for v in h.iter_log(h.min().max(1), 1.05) {
            seen += v.count_since_last_iteration();
            pts.push((v.value_iterated_to() as f64 / 1000.0, seen as f64 / total));
        }
        pts
    }
}

/// Decades of 1/(1−p) the percentile spectrum covers: to 99.999%.
pub const SPECTRUM_DECADES: u32 = 5;
/// Spectrum points per decade.
pub const SPECTRUM_STEPS: u32 = 20;

/// The quantiles of the percentile spectrum: 1 − 10^(−i/20) for i = 0..=100, i.e. 0, …, 90%, …,
/// 99%, …, 99.999%, evenly spaced on the log 1/(1−p) axis the spectrum is drawn on. A fixed grid
/// (not the histogram's own buckets) lets `compare` take medians point by point across runs.
pub fn spectrum_quantiles() -> Vec<f64> {
    (0..=SPECTRUM_DECADES * SPECTRUM_STEPS)
        .map(|i| 1.0 - 10f64.powf(-(i as f64) / SPECTRUM_STEPS as f64))
        .collect()
}

/// Latency percentiles (µs).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct LatSummary {
    /// Samples.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Maximum.
    pub max_us: f64,
}

/// What an error happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrKind {
    /// socket()/setsockopt()/bind() failed.
    Socket,
    /// connect() failed.
    Connect,
    /// send() failed.
    Send,
    /// recv() failed.
    Recv,
    /// The server closed before the response was complete.
    ClosedEarly,
    /// The server closed an idle keep-alive connection.
    ClosedIdle,
    /// A malformed response.
    Protocol,
    /// Data arrived that no request asked for.
    Unexpected,
    /// No progress within the timeout.
    Timeout,
    /// HTTP 4xx/5xx.
    HttpStatus,
}

impl From<corelocal::sys::client::ErrOp> for ErrKind {
    fn from(op: corelocal::sys::client::ErrOp) -> Self {
        use corelocal::sys::client::ErrOp;
        match op {
            ErrOp::Socket => ErrKind::Socket,
            ErrOp::Connect => ErrKind::Connect,
            ErrOp::Send => ErrKind::Send,
            ErrOp::Recv => ErrKind::Recv,
        }
    }
}

/// Per-second buckets.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Tick {
    /// Completed request/response transactions.
    pub txns: u64,
    /// Completed sessions (connections, for crr).
    pub sessions: u64,
    /// Errors.
    pub errors: u64,
}

/// Everything one client thread measured.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Transactions completed in the measurement window.
    pub txns: u64,
    /// Sessions completed in the window.
    pub sessions: u64,
    /// Connections established in the window.
    pub conns: u64,
    /// Bytes sent / received in the window.
    pub bytes_out: u64,
    /// Bytes received in the window.
    pub bytes_in: u64,
    /// memcached get hits (whole run).
    pub hits: u64,
    /// memcached get misses (whole run).
    pub misses: u64,
    /// memcached stores (whole run).
    pub stores: u64,
    /// HTTP status classes 1xx..5xx at index 1..5, other at 0 (window).
    pub status: [u64; 6],
    /// Transactions / sessions completed over the whole run including warm-up.
    pub txns_total: u64,
    /// Sessions over the whole run.
    pub sessions_total: u64,
    /// Errors over the whole run by (kind, errno).
    pub errors: BTreeMap<(ErrKind, i32), u64>,
    /// Errors in the window.
    pub errors_window: u64,
    /// Request → response latency.
    pub lat_txn: Lat,
    /// Intended start → response (open loop only).
    pub lat_txn_co: Lat,
    /// Session start → session end.
    pub lat_session: Lat,
    /// Intended session start → session end (open loop only).
    pub lat_session_co: Lat,
    /// connect() → established.
    pub lat_connect: Lat,
    /// Per second since the run's start (warm-up included).
    pub timeline: Vec<Tick>,
    /// CPU time the client threads used in the window (ns).
    pub client_cpu_ns: u64,
    /// When this thread started spreading source addresses (`--src auto` ran out of ports).
    pub src_spread_at_ns: Option<u64>,
}

impl Stats {
    /// The timeline bucket for time `ns` since start (grows as needed, bounded by run length).
    pub fn tick(&mut self, ns: u64) -> &mut Tick {
        let s = (ns / 1_000_000_000) as usize;
        if self.timeline.len() <= s {
            self.timeline.resize(s + 1, Tick::default());
        }
        &mut self.timeline[s]
    }

    /// Counts an error at time `ns`.
    pub fn error(&mut self, kind: ErrKind, errno: i32, ns: u64, in_window: bool) {
        *self.errors.entry((kind, errno)).or_insert(0) += 1;
        self.tick(ns).errors += 1;
        if in_window {
            self.errors_window += 1;
        }
    }

    /// Total errors over the run.
    pub fn error_total(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Adds another thread's stats.
    pub fn merge(&mut self, o: &Stats) {
        self.txns += o.txns;
        self.sessions += o.sessions;
        self.conns += o.conns;
        self.bytes_out += o.bytes_out;
        self.bytes_in += o.bytes_in;
        self.hits += o.hits;
        self.misses += o.misses;
        self.stores += o.stores;
        for i in 0..6 {
            self.status[i] += o.status[i];
        }
        self.txns_total += o.txns_total;
        self.sessions_total += o.sessions_total;
        for (k, v) in &o.errors {
            *self.errors.entry(*k).or_insert(0) += v;
        }
        self.errors_window += o.errors_window;
        self.client_cpu_ns += o.client_cpu_ns;
        self.src_spread_at_ns = match (self.src_spread_at_ns, o.src_spread_at_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.lat_txn.merge(&o.lat_txn);
        self.lat_txn_co.merge(&o.lat_txn_co);
        self.lat_session.merge(&o.lat_session);
        self.lat_session_co.merge(&o.lat_session_co);
        self.lat_connect.merge(&o.lat_connect);
        if self.timeline.len() < o.timeline.len() {
            self.timeline.resize(o.timeline.len(), Tick::default());
        }
        for (a, b) in self.timeline.iter_mut().zip(&o.timeline) {
            a.txns += b.txns;
            a.sessions += b.sessions;
            a.errors += b.errors;
        }
    }
}

/// The name of an errno (`ECONNREFUSED`), or `E<n>`.
pub fn errno_name(e: i32) -> String {
    let name = match e {
        0 => "EOF",
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::EPIPE => "EPIPE",
        libc::ECANCELED => "ECANCELED",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ECONNABORTED => "ECONNABORTED",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENOBUFS => "ENOBUFS",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::EINPROGRESS => "EINPROGRESS",
        _ => return format!("E{e}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_known_data() {
        let mut l = Lat::default();
        for us in 1..=1000u64 {
            l.record(us * 1000);
        }
        let s = l.summary();
        assert_eq!(s.count, 1000);
        assert!((s.p50_us - 500.0).abs() < 1.0, "{s:?}");
        assert!((s.p99_us - 990.0).abs() < 1.5, "{s:?}");
        assert!((s.max_us - 1000.0).abs() < 1.0, "{s:?}");
        let cdf = l.cdf();
        assert!((cdf.last().unwrap().1 - 1.0).abs() < 1e-9);
        assert!(cdf.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        // Merged and corrected histograms (what reports plot) count every sample once: the
        // CDF ends at exactly 1 and never leaves [0, 1].
        let mut m = Lat::default();
        m.record_corrected(400_000, 10_000);
        m.merge(&l);
        let cdf = m.cdf();
        assert_eq!(cdf.last().unwrap().1, 1.0);
        assert!(cdf.iter().all(|p| (0.0..=1.0).contains(&p.1)), "{cdf:?}");
        assert_eq!(Lat::default().summary(), LatSummary::default());
    }

    #[test]
    fn corrected_recording_fills_the_gap() {
        let mut l = Lat::default();
        l.record_corrected(100_000, 10_000); // a 100 µs stall with a 10 µs interval
        assert_eq!(l.summary().count, 10);
        l.record(0); // clamped
        l.record(u64::MAX);
        assert_eq!(l.summary().count, 12);
    }

    #[test]
    fn merge_and_timeline() {
        let mut a = Stats::default();
        a.tick(2_500_000_000).txns += 3;
        a.error(ErrKind::Connect, libc::ECONNREFUSED, 0, true);
        let mut b = Stats::default();
        b.tick(0).txns += 1;
        b.error(ErrKind::Connect, libc::ECONNREFUSED, 0, false);
        b.txns = 5;
        a.merge(&b);
        assert_eq!(a.timeline.len(), 3);
        assert_eq!(
            a.timeline[0],
            Tick {
                txns: 1,
                sessions: 0,
                errors: 2
            }
        );
        assert_eq!(a.timeline[2].txns, 3);
        assert_eq!(a.errors[&(ErrKind::Connect, libc::ECONNREFUSED)], 2);
        assert_eq!((a.errors_window, a.error_total(), a.txns), (1, 2, 5));
        assert_eq!(errno_name(libc::ECONNRESET), "ECONNRESET");
        assert_eq!(errno_name(9999), "E9999");
    }
}
