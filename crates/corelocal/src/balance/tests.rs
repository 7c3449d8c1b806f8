//! Unit and property tests of every balancer rule. Each rule's test fails when the rule is
//! removed or changed (noted per test).

use super::*;
use proptest::prelude::*;

const CAP: u32 = 128;

fn cfg(workers: usize) -> BalanceConfig {
    BalanceConfig::new(workers)
}

/// Marks `worker` busy in `set` through a tracker (one observation above the high watermark).
fn make_busy(set: &BusySet, c: &BalanceConfig, worker: usize) -> BusyTracker {
    let mut t = BusyTracker::new(worker, c);
    assert_eq!(t.observe(set, CAP, CAP), Some(BusyChange::BecameBusy));
    t
}

#[test]
fn defaults_are_the_papers() {
    let c = cfg(48);
    assert_eq!(c.busy_high_pct, 75);
    assert_eq!(c.busy_low_pct, 10);
    assert_eq!(c.ewma_alpha_inv, 0, "0 = 1/(2·max local queue)");
    assert_eq!((c.share_local, c.share_remote), (5, 1));
    assert_eq!(c.migrate_interval_ns, 100_000_000);
    assert_eq!(c.flow_groups, 4096);
    assert!(c.validate().is_ok());
    let mut bad = c.clone();
    bad.flow_groups = 4095;
    assert!(bad.validate().is_err());
    let mut bad = c.clone();
    bad.busy_low_pct = 80;
    assert!(bad.validate().is_err());
    let mut bad = c;
    bad.workers = 0;
    assert!(bad.validate().is_err());
}

/// Rule: busy when length > 75% of the max local queue (96 of 128 is not busy, 97 is).
#[test]
fn busy_when_length_exceeds_high_watermark() {
    let c = cfg(4);
    let set = BusySet::new(4);
    let mut t = BusyTracker::new(1, &c);
    assert_eq!(t.observe(&set, 96, CAP), None);
    assert!(!set.is_busy(1));
    assert_eq!(t.observe(&set, 97, CAP), Some(BusyChange::BecameBusy));
    assert!(set.is_busy(1) && t.is_busy());
    assert_eq!(set.count(), 1);
    assert_eq!(t.transitions(), 1);
}

/// Rule: α = 1/(2·max local queue), one update per observation.
#[test]
fn ewma_alpha_is_one_over_twice_the_queue() {
    let c = cfg(2);
    let set = BusySet::new(2);
    let mut t = BusyTracker::new(0, &c);
    t.observe(&set, 64, CAP);
    assert!((t.ewma() - 64.0 / 256.0).abs() < 1e-3, "ewma {}", t.ewma());
    t.observe(&set, 64, CAP);
    let want = 0.25 + (64.0 - 0.25) / 256.0;
    assert!((t.ewma() - want).abs() < 1e-3, "ewma {}", t.ewma());
    // Configurable α.
    let mut c4 = cfg(2);
    c4.ewma_alpha_inv = 4;
    let mut t = BusyTracker::new(0, &c4);
    t.observe(&set, 64, CAP);
    assert!((t.ewma() - 16.0).abs() < 1e-3);
}

/// Rule: a busy worker becomes non-busy only when the EWMA drops below 10%. Removing the
/// low watermark (clearing at once below 75%) or changing α changes the observation count.
#[test]
fn non_busy_only_when_ewma_below_low_watermark() {
    let c = cfg(2);
    let set = BusySet::new(2);
    let mut t = BusyTracker::new(0, &c);
    for _ in 0..2000 {
        t.observe(&set, CAP, CAP);
    }
    assert!(t.is_busy() && t.ewma() > 127.0);
    // Below the high watermark but above the low one: stays busy however long.
    for _ in 0..5000 {
        assert_eq!(t.observe(&set, 50, CAP), None);
    }
    assert!(t.is_busy() && set.is_busy(0));
    assert!((t.ewma() - 50.0).abs() < 1.0);
    // Empty queue: the EWMA decays by (1 - 1/256) per observation, from ~50 to 12.8:
    // ln(50/12.8) · 256 ≈ 349 observations.
    let mut n = 0;
    loop {
        n += 1;
        let before = t.ewma();
        if let Some(ch) = t.observe(&set, 0, CAP) {
            assert_eq!(ch, BusyChange::BecameNonBusy);
            assert!(before >= 12.8 && t.ewma() < 12.8);
            break;
        }
        assert!(n < 10_000);
    }
    assert!((340..=360).contains(&n), "cleared after {n} observations");
    assert!(!set.is_busy(0));
}

/// The high watermark is tested first: a queue above it keeps the worker busy even while the
/// slow EWMA still reads below 10%; once the length falls back, the low EWMA clears it.
#[test]
fn queue_above_high_watermark_keeps_busy_despite_low_ewma() {
    let c = cfg(2);
    let set = BusySet::new(2);
    let mut t = BusyTracker::new(0, &c);
    assert_eq!(t.observe(&set, 100, CAP), Some(BusyChange::BecameBusy));
    assert!(t.ewma() < 12.8);
    assert_eq!(t.observe(&set, 100, CAP), None);
    assert!(t.is_busy());
    assert_eq!(t.observe(&set, 10, CAP), Some(BusyChange::BecameNonBusy));
}

#[test]
fn busy_set_words_and_round_robin_search() {
    let set = BusySet::new(130);
    assert_eq!(set.word_count(), 3);
    assert_eq!(set.next_busy_from(0, 0), None);
    assert!(!set.any_other(5));
    for w in [3, 64, 129] {
        set.set(w, true);
    }
    assert_eq!(set.word(1), 1);
    assert_eq!(set.count(), 3);
    assert_eq!(set.next_busy_from(0, 0), Some(3));
    assert_eq!(set.next_busy_from(4, 0), Some(64));
    assert_eq!(set.next_busy_from(65, 0), Some(129));
    assert_eq!(set.next_busy_from(129, 129), Some(3), "wraps, skips self");
    assert_eq!(set.next_busy_from(2, 3), Some(64), "skips self");
    set.set(64, false);
    set.set(129, false);
    assert_eq!(set.next_busy_from(5, 0), Some(3), "wraps to the start word");
    assert_eq!(set.next_busy_from(5, 3), None);
    assert!(!set.any_other(3) && set.any_other(0));
}

/// Rule: non-busy workers accept local:remote at 5:1 when both are available.
#[test]
fn five_local_to_one_stolen() {
    let c = cfg(4);
    let set = BusySet::new(4);
    let _victim = make_busy(&set, &c, 3);
    let mut b = Balancer::new(0, &c);
    let mut seq = String::new();
    for _ in 0..18 {
        match b.choose_accept(&set, true) {
            AcceptFrom::Local => {
                b.record_local();
                seq.push('L');
            }
            AcceptFrom::Steal(v) => {
                assert_eq!(v, 3);
                b.record_steal(v, true);
                seq.push('S');
            }
            AcceptFrom::Nothing => unreachable!(),
        }
    }
    assert_eq!(seq, "LLLLLSLLLLLSLLLLLS");
    assert_eq!(b.stats().accepted_stolen, 3);
    assert_eq!(b.stats().accepted_local, 15);
    assert_eq!(b.stolen_from(3), 3);
}

/// A configured share (3:2) is honoured too.
#[test]
fn configured_share() {
    let mut c = cfg(2);
    c.share_local = 3;
    c.share_remote = 2;
    let set = BusySet::new(2);
    let _victim = make_busy(&set, &c, 1);
    let mut b = Balancer::new(0, &c);
    let mut seq = String::new();
    for _ in 0..10 {
        match b.choose_accept(&set, true) {
            AcceptFrom::Local => {
                b.record_local();
                seq.push('L');
            }
            AcceptFrom::Steal(v) => {
                b.record_steal(v, true);
                seq.push('S');
            }
            AcceptFrom::Nothing => unreachable!(),
        }
    }
    assert_eq!(seq, "LLSLSLLSLS");
}

/// With nothing local ready, a non-busy worker steals from a busy one at once; with nobody
/// busy it has nothing to do.
#[test]
fn steals_when_local_empty() {
    let c = cfg(3);
    let set = BusySet::new(3);
    let mut b = Balancer::new(0, &c);
    assert_eq!(b.choose_accept(&set, false), AcceptFrom::Nothing);
    assert_eq!(b.choose_accept(&set, true), AcceptFrom::Local);
    let _victim = make_busy(&set, &c, 2);
    for _ in 0..3 {
        assert_eq!(b.choose_accept(&set, false), AcceptFrom::Steal(2));
        b.record_steal(2, false);
    }
    // Steals made with nothing local ready cost no credit: the next 5 local accepts are
    // followed by a steal as usual.
    assert_eq!(b.choose_accept(&set, true), AcceptFrom::Local);
}

/// Rule: victims are chosen round-robin among busy workers, starting one past the last.
#[test]
fn round_robin_victims_from_one_past_the_last() {
    let c = cfg(8);
    let set = BusySet::new(8);
    let _t: Vec<_> = [2, 5, 7].iter().map(|&w| make_busy(&set, &c, w)).collect();
    let mut b = Balancer::new(0, &c);
    let mut got = Vec::new();
    for _ in 0..5 {
        match b.choose_accept(&set, false) {
            AcceptFrom::Steal(v) => got.push(v),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, [2, 5, 7, 2, 5]);
    // Last victim 5: a newly busy 6 is next (one past the last), then 7.
    let _t6 = make_busy(&set, &c, 6);
    assert_eq!(b.choose_accept(&set, false), AcceptFrom::Steal(6));
    assert_eq!(b.choose_accept(&set, false), AcceptFrom::Steal(7));
    assert_eq!(b.choose_accept(&set, false), AcceptFrom::Steal(2));
}

/// Rule: busy workers never steal (and never steal from non-busy workers).
#[test]
fn busy_workers_never_steal() {
    let c = cfg(4);
    let set = BusySet::new(4);
    let _t: Vec<_> = [0, 1, 2].iter().map(|&w| make_busy(&set, &c, w)).collect();
    let mut b = Balancer::new(0, &c);
    for _ in 0..20 {
        assert_eq!(b.choose_accept(&set, true), AcceptFrom::Local);
        b.record_local();
        assert_eq!(b.choose_accept(&set, false), AcceptFrom::Nothing);
    }
    // Worker 3 is not busy: worker 1's ... and worker 3's balancer steals only from busy ones.
    let mut b3 = Balancer::new(3, &c);
    for _ in 0..6 {
        match b3.choose_accept(&set, false) {
            AcceptFrom::Steal(v) => assert!(set.is_busy(v)),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn switches_turn_stealing_and_migration_off() {
    let mut c = cfg(2);
    c.steal_enabled = false;
    c.migrate_enabled = false;
    let set = BusySet::new(2);
    let _v = make_busy(&set, &c, 1);
    let mut b = Balancer::new(0, &c);
    for _ in 0..12 {
        assert_eq!(b.choose_accept(&set, true), AcceptFrom::Local);
        b.record_local();
    }
    assert_eq!(b.choose_accept(&set, false), AcceptFrom::Nothing);
    b.record_steal(1, false); // e.g. a steal on the idle path made by the runtime
    assert_eq!(b.migration_tick(&set, 0), None);
    assert_eq!(b.migration_tick(&set, 100_000_000), None);
}

/// Rule: every 100 ms a non-busy worker moves one group from the victim it stole most from.
#[test]
fn migration_every_interval_from_top_victim() {
    let c = cfg(6);
    let set = BusySet::new(6);
    let mut b = Balancer::new(0, &c);
    let ms = 1_000_000u64;
    assert_eq!(b.migration_tick(&set, 0), None, "starts the interval grid");
    for _ in 0..3 {
        b.record_steal(2, false);
    }
    for _ in 0..5 {
        b.record_steal(4, false);
    }
    b.record_steal(5, true);
    assert_eq!(b.migration_tick(&set, 50 * ms), None, "not yet 100 ms");
    assert_eq!(
        b.migration_tick(&set, 100 * ms),
        Some(MigrationRequest { from: 4, to: 0 })
    );
    assert_eq!(b.migration_tick(&set, 150 * ms), None);
    // Counts restarted: no steals in (100, 200] → nothing to move.
    assert_eq!(b.migration_tick(&set, 200 * ms), None);
    // Ties go to the first victim after this worker.
    b.record_steal(5, false);
    b.record_steal(3, false);
    assert_eq!(
        b.migration_tick(&set, 300 * ms),
        Some(MigrationRequest { from: 3, to: 0 })
    );
    assert_eq!(b.stats().migrations_requested, 2);
    assert_eq!(b.stolen_from(4), 5);
    // A stalled caller: the next deadline stays on the grid.
    b.record_steal(1, false);
    assert_eq!(
        b.migration_tick(&set, 1_050 * ms),
        Some(MigrationRequest { from: 1, to: 0 })
    );
    b.record_steal(1, false);
    assert_eq!(b.migration_tick(&set, 1_099 * ms), None);
    assert!(b.migration_tick(&set, 1_100 * ms).is_some());
}

/// Rule: busy workers do not take flow groups (and their interval counts restart).
#[test]
fn busy_workers_do_not_migrate() {
    let c = cfg(3);
    let set = BusySet::new(3);
    let mut b = Balancer::new(0, &c);
    b.migration_tick(&set, 0);
    b.record_steal(1, false);
    let mut t0 = make_busy(&set, &c, 0);
    assert_eq!(b.migration_tick(&set, 100_000_000), None);
    assert_eq!(b.stolen_this_interval(1), 0);
    // Non-busy again: migrates again.
    for _ in 0..1000 {
        t0.observe(&set, 0, CAP);
    }
    assert!(!set.is_busy(0));
    b.record_steal(1, false);
    assert!(b.migration_tick(&set, 200_000_000).is_some());
}

#[test]
fn flow_group_table_moves_one_group() {
    let mut t = FlowGroupTable::new(4096, 48);
    t.check();
    assert_eq!(t.groups_of(0).len(), 86);
    assert_eq!(t.groups_of(47).len(), 85);
    assert_eq!(t.group_of_hash(0xdead_beef), 0xeef);
    let mv = t.migrate(MigrationRequest { from: 5, to: 20 }).unwrap();
    assert_eq!((mv.from, mv.to), (5, 20));
    assert_eq!(t.owner(mv.group), 20);
    assert_eq!(t.groups_of(5).len(), 85);
    assert_eq!(t.groups_of(20).len(), 86);
    assert_eq!((t.moves(), t.moved_in(20), t.moved_out(5)), (1, 1, 1));
    t.check();
    assert_eq!(t.migrate(MigrationRequest { from: 7, to: 7 }), None);
    // Drain a worker completely, then it has nothing to give.
    let mut small = FlowGroupTable::new(4, 2);
    assert!(small.migrate(MigrationRequest { from: 0, to: 1 }).is_some());
    assert!(small.migrate(MigrationRequest { from: 0, to: 1 }).is_some());
    assert_eq!(small.migrate(MigrationRequest { from: 0, to: 1 }), None);
    assert_eq!(small.groups_of(1).len(), 4);
    small.check();
}

#[derive(Debug, Clone)]
enum Op {
    Observe { worker: usize, len: u32 },
    Accept { worker: usize, local_ready: bool },
    Tick { worker: usize, dt_ms: u64 },
}

fn op(workers: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..workers, 0..=CAP + 1).prop_map(|(worker, len)| Op::Observe { worker, len }),
        (0..workers, any::<bool>()).prop_map(|(worker, local_ready)| Op::Accept {
            worker,
            local_ready
        }),
        (0..workers, 0u64..300).prop_map(|(worker, dt_ms)| Op::Tick { worker, dt_ms }),
    ]
}

fn ops() -> impl Strategy<Value = (usize, Vec<Op>)> {
    (2usize..=130).prop_flat_map(|n| (Just(n), proptest::collection::vec(op(n), 1..400)))
}

proptest! {
    /// Invariants under any interleaving: a steal's victim is busy and not the stealer, the
    /// stealer is not busy; the tracker and the bit agree; migration requests come from
    /// non-busy workers, name a victim stolen from, and the table stays valid.
    #[test]
    fn never_steal_from_non_busy((n, ops) in ops()) {
        let c = BalanceConfig::new(n);
        let set = BusySet::new(n);
        let mut trackers: Vec<_> = (0..n).map(|w| BusyTracker::new(w, &c)).collect();
        let mut bals: Vec<_> = (0..n).map(|w| Balancer::new(w, &c)).collect();
        let mut table = FlowGroupTable::new(256, n);
        let mut now_ns = 0u64;
        for op in ops {
            match op {
                Op::Observe { worker, len } => {
                    trackers[worker].observe(&set, len, CAP);
                    let ewma = trackers[worker].ewma();
                    prop_assert!((0.0..=f64::from(CAP) + 1.0).contains(&ewma));
                }
                Op::Accept { worker, local_ready } => {
                    match bals[worker].choose_accept(&set, local_ready) {
                        AcceptFrom::Steal(v) => {
                            prop_assert!(v != worker && v < n);
                            prop_assert!(set.is_busy(v), "stole from non-busy {}", v);
                            prop_assert!(!set.is_busy(worker), "busy worker stole");
                            bals[worker].record_steal(v, local_ready);
                        }
                        AcceptFrom::Local => {
                            prop_assert!(local_ready);
                            bals[worker].record_local();
                        }
                        AcceptFrom::Nothing => prop_assert!(!local_ready),
                    }
                }
                Op::Tick { worker, dt_ms } => {
                    now_ns += dt_ms * 1_000_000;
                    let counts: Vec<u32> =
                        (0..n).map(|v| bals[worker].stolen_this_interval(v)).collect();
                    if let Some(req) = bals[worker].migration_tick(&set, now_ns) {
                        prop_assert_eq!(req.to, worker);
                        prop_assert!(!set.is_busy(worker));
                        let max = *counts.iter().max().unwrap();
                        prop_assert!(max > 0 && counts[req.from] == max);
                        if let Some(mv) = table.migrate(req) {
                            prop_assert_eq!(table.owner(mv.group), worker);
                        }
                    }
                }
            }
            for (w, t) in trackers.iter().enumerate() {
                prop_assert_eq!(t.is_busy(), set.is_busy(w));
            }
        }
        table.check();
    }

    /// Under permanent imbalance (a victim always busy, local always ready) the accepted
    /// local:remote ratio is share_local:share_remote, off by at most one steal at any time.
    #[test]
    fn share_converges(local in 1u32..10, remote in 1u32..10, accepts in 1usize..2000,
                       victim in 1usize..8) {
        let mut c = BalanceConfig::new(8);
        c.share_local = local;
        c.share_remote = remote;
        let set = BusySet::new(8);
        let _v = make_busy(&set, &c, victim);
        let mut b = Balancer::new(0, &c);
        let (mut l, mut s) = (0u64, 0u64);
        for _ in 0..accepts {
            match b.choose_accept(&set, true) {
                AcceptFrom::Local => { b.record_local(); l += 1; }
                AcceptFrom::Steal(v) => { prop_assert_eq!(v, victim); b.record_steal(v, true); s += 1; }
                AcceptFrom::Nothing => prop_assert!(false),
            }
            // l·remote − s·local stays within one share: the ratio converges to local:remote.
            let diff = (l * u64::from(remote)) as i64 - (s * u64::from(local)) as i64;
            prop_assert!(diff >= 0 && diff < i64::from(local + remote), "l {} s {}", l, s);
        }
    }

    /// Round robin: with a fixed busy set, any |B| consecutive steals visit every busy worker
    /// exactly once.
    #[test]
    fn round_robin_is_fair(n in 2usize..200, busy in proptest::collection::btree_set(0usize..200, 1..20),
                           me in 0usize..200, rounds in 1usize..4) {
        let me = me % n;
        let busy: std::collections::BTreeSet<usize> =
            busy.into_iter().map(|w| w % n).filter(|&w| w != me).collect();
        prop_assume!(!busy.is_empty());
        let c = BalanceConfig::new(n);
        let set = BusySet::new(n);
        for &w in &busy { set.set(w, true); }
        let mut b = Balancer::new(me, &c);
        for _ in 0..rounds {
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..busy.len() {
                match b.choose_accept(&set, false) {
                    AcceptFrom::Steal(v) => { prop_assert!(seen.insert(v)); }
                    other => prop_assert!(false, "{:?}", other),
                }
            }
            prop_assert_eq!(&seen, &busy);
        }
    }

    /// The table maps every group to a valid worker after any sequence of moves.
    #[test]
    fn table_stays_valid(n in 1usize..70, log_groups in 0u32..12,
                         moves in proptest::collection::vec((0usize..70, 0usize..70, any::<bool>()), 0..300)) {
        let groups = 1u32 << log_groups;
        let mut t = FlowGroupTable::new(groups, n);
        for (a, b, direct) in moves {
            let (from, to) = (a % n, b % n);
            if direct {
                let g = (a as u32 * 7919 + b as u32) & (groups - 1);
                t.assign(g, to);
                prop_assert_eq!(t.owner(g), to);
            } else {
                let before = t.groups_of(from).len();
                match t.migrate(MigrationRequest { from, to }) {
                    Some(mv) => {
                        prop_assert_eq!(t.groups_of(from).len(), before - 1);
                        prop_assert_eq!(t.owner(mv.group), to);
                    }
                    None => prop_assert!(from == to || before == 0),
                }
            }
            for g in 0..groups { prop_assert!(t.owner(g) < n); }
            let total: usize = (0..n).map(|w| t.groups_of(w).len()).sum();
            prop_assert_eq!(total, groups as usize);
        }
        t.check();
    }
}

mod health_rules {
    //! The stall rules and redirect targets, driven with simulated time.
    use super::super::health::*;
    use super::super::redirect::*;
    use super::super::{BalanceConfig, BusySet};

    const MS: u64 = 1_000_000;

    fn idle(len: u32) -> Observation {
        Observation {
            queue_len: len,
            queue_cap: 511,
            accepted: None,
            activity: Activity::Idle,
        }
    }

    fn with(len: u32, activity: Activity, accepted: Option<u64>) -> Observation {
        Observation {
            queue_len: len,
            queue_cap: 511,
            accepted,
            activity,
        }
    }

    fn health(workers: usize, worker: usize) -> (BusySet, WorkerHealth) {
        let c = BalanceConfig::new(workers);
        (
            BusySet::new(workers),
            WorkerHealth::new(worker, &c, StallConfig::default()),
        )
    }

    /// Rule: a stopped thread is busy at the first observation, empty queue or not, and is
    /// back the first time it runs with its queue empty. (Fails without the liveness rule.)
    #[test]
    fn stopped_worker_is_busy_at_once_and_back_when_running() {
        let (set, mut h) = health(2, 1);
        assert_eq!(h.observe(&set, idle(0), 0), None);
        let change = h.observe(&set, with(0, Activity::Stopped, None), MS);
        assert_eq!(
            change,
            Some(HealthChange {
                busy: true,
                reason: BusyReason::NotRunning
            })
        );
        assert!(set.is_busy(1) && !set.is_busy(0));
        // Still stopped, a connection queued meanwhile: stays busy, same reason, no change.
        assert_eq!(
            h.observe(&set, with(1, Activity::Stopped, None), 2 * MS),
            None
        );
        // Continued but not yet drained: still busy.
        assert_eq!(
            h.observe(
                &set,
                with(1, Activity::Working { progress: 9 }, None),
                3 * MS
            ),
            None
        );
        assert!(set.is_busy(1));
        // Drained: back at once (first stall, no hold).
        let back = h.observe(&set, idle(0), 4 * MS);
        assert_eq!(
            back,
            Some(HealthChange {
                busy: false,
                reason: BusyReason::NotRunning
            })
        );
        assert!(!set.is_busy(1));
    }

    /// Rule: working without progress for the stall window (starved or blocked) is not
    /// running; progress within the window keeps it running. (Fails without `Liveness`.)
    #[test]
    fn no_progress_for_the_window_is_not_running() {
        let cfg = StallConfig::default();
        let mut l = Liveness::default();
        let w = |p| Activity::Working { progress: p };
        assert_eq!(l.observe(w(10), 0, &cfg), Some(true));
        assert_eq!(l.observe(w(10), 4 * MS, &cfg), Some(true));
        assert_eq!(
            l.observe(w(11), 5 * MS, &cfg),
            Some(true),
            "progress resets the wait"
        );
        assert_eq!(l.observe(w(11), 9 * MS, &cfg), Some(true));
        assert_eq!(
            l.observe(w(11), 10 * MS, &cfg),
            Some(false),
            "5 ms without progress"
        );
        assert_eq!(l.observe(Activity::Idle, 11 * MS, &cfg), Some(true));
        assert_eq!(
            l.observe(w(11), 12 * MS, &cfg),
            Some(true),
            "idle restarts the wait"
        );
        assert_eq!(l.observe(Activity::Unknown, 30 * MS, &cfg), None);
    }

    /// Rule: a queue non-empty at every observation for the stall window while nothing is
    /// accepted is busy (stalled) — at 1 queued connection, not at 384. Accepts by the owner
    /// restart the window. (Fails without the queue stall rule.)
    #[test]
    fn queue_not_drained_for_the_window_is_stalled() {
        let (set, mut h) = health(2, 0);
        let run = |p| Activity::Working { progress: p };
        // Running (progress grows) but not accepting: stalled after 5 ms.
        assert_eq!(h.observe(&set, with(1, run(1), Some(7)), 0), None);
        assert_eq!(h.observe(&set, with(2, run(2), Some(7)), 4 * MS), None);
        let c = h.observe(&set, with(2, run(3), Some(7)), 5 * MS);
        assert_eq!(
            c.map(|c| (c.busy, c.reason)),
            Some((true, BusyReason::Stalled))
        );
        // A healthy worker under load: non-empty at every look, but accepting.
        let (set2, mut ok) = health(2, 1);
        for i in 0..20u64 {
            assert_eq!(ok.observe(&set2, with(3, run(i), Some(i)), i * MS), None);
        }
        assert!(!set2.is_busy(1));
        // An empty look restarts the window too.
        let (set3, mut h3) = health(2, 1);
        assert_eq!(h3.observe(&set3, idle(1), 0), None);
        assert_eq!(h3.observe(&set3, idle(0), 3 * MS), None);
        assert_eq!(h3.observe(&set3, idle(1), 4 * MS), None);
        assert_eq!(h3.observe(&set3, idle(1), 8 * MS), None);
        assert!(h3.observe(&set3, idle(1), 9 * MS).is_some());
    }

    /// Rule: the paper's watermark still applies, reported as `queue`.
    #[test]
    fn watermark_is_reason_queue() {
        let (set, mut h) = health(2, 0);
        let c = h.observe(&set, with(400, Activity::Idle, Some(1)), 0);
        assert_eq!(c.map(|c| c.reason), Some(BusyReason::Queue));
        assert_eq!(h.busy(), Some(BusyReason::Queue));
    }

    /// Rule: a worker that stalls again soon after recovering must stay healthy for a hold
    /// that doubles per repeat; a stall long after starts afresh. (Fails without damping.)
    #[test]
    fn repeated_stalls_are_damped() {
        let (set, mut h) = health(2, 1);
        let stop = with(0, Activity::Stopped, None);
        let mut t = 0;
        // First stall: back at once.
        h.observe(&set, stop, t);
        t += MS;
        assert!(h.observe(&set, idle(0), t).is_some_and(|c| !c.busy));
        // Second, 10 ms later: 50 ms hold.
        t += 10 * MS;
        assert!(h.observe(&set, stop, t).is_some_and(|c| c.busy));
        t += MS;
        assert_eq!(h.observe(&set, idle(0), t), None);
        assert_eq!(h.observe(&set, idle(0), t + 49 * MS), None);
        assert!(h
            .observe(&set, idle(0), t + 50 * MS)
            .is_some_and(|c| !c.busy));
        t += 50 * MS;
        // Third: 100 ms, and a relapse during the hold restarts it.
        assert!(h.observe(&set, stop, t + MS).is_some_and(|c| c.busy));
        t += 2 * MS;
        assert_eq!(h.observe(&set, idle(0), t), None);
        assert_eq!(
            h.observe(&set, idle(1), t + 60 * MS),
            None,
            "queued: not healthy"
        );
        assert_eq!(h.observe(&set, idle(0), t + 61 * MS), None);
        assert_eq!(h.observe(&set, idle(0), t + 160 * MS), None);
        assert!(h
            .observe(&set, idle(0), t + 161 * MS)
            .is_some_and(|c| !c.busy));
        // A stall long after: back at once again.
        t += 161 * MS + 31_000 * MS;
        assert!(h.observe(&set, stop, t).is_some_and(|c| c.busy));
        assert!(h.observe(&set, idle(0), t + MS).is_some_and(|c| !c.busy));
        assert_eq!(h.busy_counts()[BusyReason::NotRunning.index()], 4);
    }

    fn places(cpus: &[(usize, usize, usize)]) -> Vec<WorkerPlace> {
        cpus.iter()
            .map(|&(cpu, llc, node)| WorkerPlace { cpu, llc, node })
            .collect()
    }

    /// Rule: a CPU's SYNs go to its own non-busy workers; when all are busy, to the closest
    /// tier's non-busy workers, spread; when everyone is busy, home. (Fails if a tier or the
    /// all-busy fallback is removed.)
    #[test]
    fn targets_prefer_home_then_llc_then_node_then_any() {
        // 8 workers on CPUs 0..8: LLCs {0-3}, {4-7}; nodes {0-3} = 0, {4-7} = 1.
        let p = places(&(0..8).map(|c| (c, c / 4 * 4, c / 4)).collect::<Vec<_>>());
        let set = BusySet::new(8);
        assert_eq!(
            cpu_targets(&p, &set, 2, 16),
            CpuTargets {
                workers: vec![2],
                redirected: false
            }
        );
        set.set(2, true);
        let t = cpu_targets(&p, &set, 2, 16);
        assert_eq!(
            t.workers,
            vec![3, 0, 1],
            "same LLC, from one past the busy worker"
        );
        assert!(t.redirected);
        for w in [0, 1, 3] {
            set.set(w, true);
        }
        assert_eq!(cpu_targets(&p, &set, 2, 16).workers, vec![4, 5, 6, 7]);
        assert_eq!(
            cpu_targets(&p, &set, 2, 2).workers,
            vec![4, 5],
            "at most max"
        );
        for w in 4..8 {
            set.set(w, true);
        }
        assert_eq!(
            cpu_targets(&p, &set, 2, 16),
            CpuTargets {
                workers: vec![2],
                redirected: false
            },
            "all busy: home, never refused"
        );
        // No worker on the CPU: nothing (the kernel's hash).
        let none = cpu_targets(&p[..4], &BusySet::new(4), 6, 16);
        assert!(none.workers.is_empty() && !none.redirected);
    }

    /// Rule: several workers on one CPU: the non-busy ones keep it; neighbours on the same
    /// CPU are not a redirect target for each other.
    #[test]
    fn shared_cpu_keeps_its_free_workers() {
        let p = places(&[(0, 0, 0), (0, 0, 0), (1, 0, 0)]);
        let set = BusySet::new(3);
        set.set(0, true);
        assert_eq!(cpu_targets(&p, &set, 0, 16).workers, vec![1]);
        set.set(1, true);
        assert_eq!(cpu_targets(&p, &set, 0, 16).workers, vec![2]);
    }

    /// Rule: when every worker is busy, a CPU whose worker is not running leans on the
    /// workers that are only busy; a CPU whose worker is only busy stays home.
    #[test]
    fn not_running_leans_on_merely_busy_workers() {
        let p = places(&[(0, 0, 0), (1, 0, 0)]);
        let busy = BusySet::new(2);
        let severe = BusySet::new(2);
        busy.set(0, true);
        busy.set(1, true);
        severe.set(0, true);
        let t = cpu_targets_tiered(&p, &[&busy, &severe], 0, 16);
        assert_eq!((t.workers, t.redirected), (vec![1], true));
        let t = cpu_targets_tiered(&p, &[&busy, &severe], 1, 16);
        assert_eq!((t.workers, t.redirected), (vec![1], false));
        severe.set(1, true);
        let t = cpu_targets_tiered(&p, &[&busy, &severe], 0, 16);
        assert_eq!(
            (t.workers, t.redirected),
            (vec![0], false),
            "all down: home"
        );
    }

    #[test]
    fn longest_run_of_workers() {
        assert_eq!(longest_run(&[]), None);
        assert_eq!(longest_run(&[5]), Some((5, 1)));
        assert_eq!(longest_run(&[7, 1, 2, 3, 9, 8]), Some((1, 3)));
        assert_eq!(longest_run(&[4, 0, 5, 1]), Some((0, 2)));
    }

    #[test]
    fn stall_config_ranges() {
        assert!(StallConfig::default().validate().is_ok());
        let bad = StallConfig {
            stall_after_ns: 0,
            ..StallConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = StallConfig {
            recover_hold_min_ns: 10,
            recover_hold_max_ns: 1,
            ..StallConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}

mod starvation {
    use super::super::health::*;
    use super::super::{BalanceConfig, BusySet};

    const MS: u64 = 1_000_000;

    fn obs(len: u32, activity: Activity) -> Observation {
        Observation {
            queue_len: len,
            queue_cap: 511,
            accepted: None,
            activity,
        }
    }

    /// Rule: a thread that just waited 400 ms for a CPU is not running for 400 ms more, even
    /// while idle with an empty queue (a 2 s wait: 500 ms at most); short waits change
    /// nothing. (Fails without `note_run_wait`'s hold.)
    #[test]
    fn a_long_runqueue_wait_keeps_the_worker_busy_as_long_again() {
        let set = BusySet::new(2);
        let mut h = WorkerHealth::new(0, &BalanceConfig::new(2), StallConfig::default());
        h.note_run_wait(1_000 * MS, 0);
        h.note_run_wait(1_001 * MS, MS);
        assert_eq!(
            h.observe(&set, obs(0, Activity::Idle), MS),
            None,
            "1 ms wait: fine"
        );
        h.note_run_wait(1_041 * MS, MS);
        assert_eq!(
            h.observe(&set, obs(0, Activity::Idle), MS),
            None,
            "40 ms: a busy host, not starvation"
        );
        h.note_run_wait(1_441 * MS, 2 * MS);
        let c = h.observe(&set, obs(0, Activity::Idle), 2 * MS);
        assert_eq!(
            c.map(|c| (c.busy, c.reason)),
            Some((true, BusyReason::NotRunning))
        );
        assert_eq!(h.observe(&set, obs(0, Activity::Idle), 401 * MS), None);
        assert!(h
            .observe(&set, obs(0, Activity::Idle), 402 * MS)
            .is_some_and(|c| !c.busy));
        h.note_run_wait(3_441 * MS, 403 * MS);
        assert!(h
            .observe(&set, obs(0, Activity::Idle), 403 * MS)
            .is_some_and(|c| c.busy));
        assert_eq!(h.observe(&set, obs(0, Activity::Idle), 902 * MS), None);
        assert_eq!(
            h.observe(&set, obs(0, Activity::Idle), 903 * MS),
            None,
            "500 ms cap"
        );
        // A repeat within the flap memory: 50 ms of looking healthy first.
        assert!(h
            .observe(&set, obs(0, Activity::Idle), 953 * MS)
            .is_some_and(|c| !c.busy));
    }

    /// Rule: without accept counts, a queue that shrinks between looks is being drained: no
    /// stall however long it stays non-empty. (Fails without the shrink test.)
    #[test]
    fn a_shrinking_queue_is_not_stalled() {
        let set = BusySet::new(2);
        let mut h = WorkerHealth::new(1, &BalanceConfig::new(2), StallConfig::default());
        for i in 0..30u64 {
            let len = if i % 3 == 2 { 2 } else { 4 };
            assert_eq!(
                h.observe(&set, obs(len, Activity::Idle), i * MS),
                None,
                "look {i}"
            );
        }
        for i in 30..36u64 {
            h.observe(&set, obs(4, Activity::Idle), i * MS);
        }
        assert_eq!(h.busy(), Some(BusyReason::Stalled));
    }
}
