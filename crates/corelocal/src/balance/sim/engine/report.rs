//! Outcomes: a connection's latency, timeout or completion, and the final [`SimReport`]
//! with its per-second series and summary.

use super::{Sim, NS_PER_S};
use crate::balance::sim::{Second, SimReport, Summary};

impl Sim {
    fn record(&mut self, conn: u32, latency_ns: u64) {
        let t0 = self.conns[conn as usize].t0_ns;
        let us = (latency_ns / 1_000).min(u64::from(u32::MAX)) as u32;
        self.s.latency_us[Self::sec(t0)].push(us);
    }

    pub(super) fn timeout(&mut self, conn: u32) {
        debug_assert!(!self.conns[conn as usize].done);
        self.conns[conn as usize].done = true;
        let deadline = self.deadline(conn);
        let last = self.s.timeouts.len() - 1;
        self.s.timeouts[Self::sec(deadline).min(last)] += 1;
        self.record(conn, self.timeout_ns);
    }

    pub(super) fn complete(&mut self, conn: u32) {
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

    pub(super) fn report(mut self, hogged_groups_start: u64) -> SimReport {
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
