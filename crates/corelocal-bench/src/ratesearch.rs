//! `--rate-search`: find the saturating open-loop rate (Affinity-Accept §6.2 searches it
//! first, then runs). Pure: the caller runs each probe and reports what it achieved.

use serde::Serialize;

/// One probe's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Probe {
    /// Offered rate (units/s).
    pub offered: f64,
    /// Achieved rate (units/s).
    pub achieved: f64,
    /// Errors / units.
    pub error_rate: f64,
    /// Corrected p99 latency (µs), if measured.
    pub p99_us: Option<f64>,
    /// Did the server keep up?
    pub ok: bool,
}

/// The search state: grow ×`factor` until a probe fails, then bisect.
#[derive(Debug, Clone, Serialize)]
pub struct RateSearch {
    /// Achieved/offered below this fails a probe.
    pub min_ratio: f64,
    /// Errors/units above this fails a probe.
    pub max_error_rate: f64,
    /// p99 above this (µs) fails a probe, if set.
    pub max_p99_us: Option<f64>,
    /// Stop bisecting when hi/lo is below this.
    pub precision: f64,
    /// Probe budget.
    pub max_probes: usize,
    /// Highest passing rate.
    pub lo: Option<f64>,
    /// Lowest failing rate.
    pub hi: Option<f64>,
    next: Option<f64>,
    /// Every probe so far.
    pub probes: Vec<Probe>,
}

impl RateSearch {
    /// Starts at `start` units/s.
    pub fn new(start: f64, max_probes: usize, max_p99_us: Option<f64>) -> Self {
        RateSearch {
            min_ratio: 0.95,
            max_error_rate: 0.01,
            max_p99_us,
            precision: 1.05,
            max_probes,
            lo: None,
            hi: None,
            next: Some(start.max(1.0)),
            probes: Vec::new(),
        }
    }

    /// The rate to probe next, or None when done.
    pub fn next_rate(&self) -> Option<f64> {
        if self.probes.len() >= self.max_probes {
            return None;
        }
        self.next
    }

    /// Records a probe at the rate `next_rate` returned.
    pub fn record(
        &mut self,
        offered: f64,
        achieved: f64,
        error_rate: f64,
        p99_us: Option<f64>,
    ) -> Probe {
        let ok = achieved >= self.min_ratio * offered
            && error_rate <= self.max_error_rate
            && match (self.max_p99_us, p99_us) {
                (Some(limit), Some(p)) => p <= limit,
                _ => true,
            };
        let p = Probe {
            offered,
            achieved,
            error_rate,
            p99_us,
            ok,
        };
        self.probes.push(p);
        if ok {
            self.lo = Some(self.lo.map_or(offered, |l: f64| l.max(offered)));
        } else {
            self.hi = Some(self.hi.map_or(offered, |h: f64| h.min(offered)));
        }
        self.next = match (self.lo, self.hi) {
            (Some(lo), None) => Some(lo * 2.0),
            (None, Some(hi)) => {
                // Even the start failed: go down, but below the achieved rate.
                let down = (achieved * 0.9).min(hi / 2.0);
                (down >= 1.0).then_some(down)
            }
            (Some(lo), Some(hi)) if hi / lo > self.precision => Some((lo * hi).sqrt()),
            _ => None,
        };
        p
    }

    /// The saturating rate found: the highest rate that passed.
    pub fn result(&self) -> Option<f64> {
        self.lo
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake server that serves at most `cap` units/s.
    fn search(cap: f64, start: f64) -> RateSearch {
        let mut s = RateSearch::new(start, 30, None);
        while let Some(r) = s.next_rate() {
            s.record(r, r.min(cap), 0.0, None);
        }
        s
    }

    #[test]
    fn finds_capacity_within_precision() {
        for cap in [3_000.0, 35_000.0, 123_456.0] {
            let s = search(cap, 1000.0);
            let r = s.result().unwrap();
            assert!((cap * 0.9..=cap / 0.95).contains(&r), "cap {cap} found {r}");
            assert!(s.probes.len() < 30);
        }
    }

    #[test]
    fn start_above_capacity_walks_down() {
        let s = search(2_000.0, 50_000.0);
        let r = s.result().unwrap();
        assert!((1_800.0..=2_000.0 / 0.95).contains(&r), "{r}");
    }

    #[test]
    fn errors_and_latency_fail_a_probe() {
        let mut s = RateSearch::new(1000.0, 10, Some(500.0));
        assert!(!s.record(1000.0, 1000.0, 0.5, None).ok);
        assert!(!s.record(500.0, 500.0, 0.0, Some(900.0)).ok);
        assert!(s.record(250.0, 250.0, 0.0, Some(100.0)).ok);
        assert_eq!(s.result(), Some(250.0));
        let mut s = RateSearch::new(1000.0, 1, None);
        s.record(1000.0, 1000.0, 0.0, None);
        assert_eq!(s.next_rate(), None);
    }
}
