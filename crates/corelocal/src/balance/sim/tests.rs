//! Simulator tests: determinism and the §6.5 effect at a small scale (fast in debug builds).

use super::*;

/// 8 cores, half hogged, 256 groups (so migration can finish within a short run), 10 s of
/// arrivals.
fn small(hog: usize, mode: BalancerMode, seed: u64) -> SimConfig {
    let mut c = SimConfig::new(8, hog, mode, seed);
    c.duration_ms = 10_000;
    c.flow_groups = 256;
    c
}

#[test]
fn same_seed_same_bytes() {
    let mut c = small(4, BalancerMode::On, 7);
    c.duration_ms = 3_000;
    let a = run(&c).unwrap();
    let b = run(&c).unwrap();
    assert_eq!(a.to_json(), b.to_json());
    assert_eq!(render_svg(&a), render_svg(&b));
    c.seed = 8;
    let d = run(&c).unwrap();
    assert_ne!(a.to_json(), d.to_json());
    assert!(a.summary.connections > 5_000);
}

#[test]
fn bad_configs_are_refused() {
    let mut c = small(4, BalancerMode::On, 1);
    c.hog = 9;
    assert!(run(&c).is_err());
    let mut c = small(4, BalancerMode::On, 1);
    c.flow_groups = 100;
    assert!(run(&c).is_err());
    let mut c = small(4, BalancerMode::On, 1);
    c.load_pct = 0;
    assert!(run(&c).is_err());
    assert!("sideways".parse::<BalancerMode>().is_err());
    assert_eq!("steal".parse::<BalancerMode>(), Ok(BalancerMode::Steal));
}

/// Seed 000 §6.5 in miniature: with half the cores hogged, no balancer means accept queues
/// overflow and many connections time out at 10 s; with the balancer the median stays near
/// the unloaded median, and migration moves the packet load off the hogged cores.
#[test]
fn balancer_rescues_hogged_cores() {
    let unloaded = run(&small(0, BalancerMode::Off, 3)).unwrap().summary;
    let off = run(&small(4, BalancerMode::Off, 3)).unwrap();
    let on = run(&small(4, BalancerMode::On, 3)).unwrap();
    let (so, sn) = (&off.summary, &on.summary);

    assert!(unloaded.timeouts == 0, "{unloaded:?}");
    assert!(
        (200.0..215.0).contains(&unloaded.latency_p50_ms),
        "{unloaded:?}"
    );

    // Off: the hogged half overflows; many connections time out at 10 s.
    assert!(so.timeout_pct > 10.0, "off: {so:?}");
    assert!(so.syn_drops > 1_000, "off: {so:?}");
    assert_eq!(so.latency_p90_ms, 10_000.0, "off: {so:?}");
    assert_eq!((so.steals, so.migrations), (0, 0));

    // On: no timeouts, median within 10% of the unloaded one.
    assert_eq!(sn.timeouts, 0, "on: {sn:?}");
    assert!(
        sn.latency_p50_ms < unloaded.latency_p50_ms * 1.1,
        "on {sn:?} unloaded {unloaded:?}"
    );
    assert!(sn.latency_p99_ms < 5_000.0, "on: {sn:?}");
    assert!(sn.steals > 100 && sn.migrations > 20, "on: {sn:?}");

    // Migration returns the hogged cores' packet load: their share of packet processing
    // falls from ~half to well below it, and they own fewer groups.
    let first = &on.series[0];
    let last = &on.series[9];
    assert!(first.hogged_packet_share_pct > 30.0, "{first:?}");
    assert!(
        last.hogged_packet_share_pct < first.hogged_packet_share_pct - 15.0,
        "{last:?}"
    );
    assert!(sn.hogged_groups_end < sn.hogged_groups_start);
    // Without migration (stealing only) the packet load stays where it was.
    let steal = run(&small(4, BalancerMode::Steal, 3)).unwrap();
    assert_eq!(steal.summary.migrations, 0);
    assert!(steal.series[9].hogged_packet_share_pct > 40.0);
    assert!(steal.summary.timeout_pct < 1.0, "{:?}", steal.summary);
}

/// Without a hog the balancer does (almost) nothing and costs nothing.
#[test]
fn unloaded_median_equals_balanced_median() {
    let off = run(&small(0, BalancerMode::Off, 5)).unwrap().summary;
    let on = run(&small(0, BalancerMode::On, 5)).unwrap().summary;
    assert_eq!(on.timeouts, 0);
    assert!(
        (on.latency_p50_ms - off.latency_p50_ms).abs() < 2.0,
        "on {on:?} off {off:?}"
    );
    assert!(on.steals * 50 < on.connections, "{on:?}");
}

/// A starved core, modelled honestly: the hogged cores' servers get no CPU at all, and busy
/// state is computed only by running servers (the runtime's `watch`), so a hogged core never
/// reports itself busy. The others find its queue, steal and migrate: the median stays near
/// the unloaded one, while without the balancer a third of the connections time out.
#[test]
fn watchers_rescue_cores_that_never_run() {
    let starved = |mode| {
        let mut c = small(4, mode, 11);
        c.hog_share_pct = 0;
        c.busy_detection = BusyDetection::Watch;
        run(&c).unwrap()
    };
    let off = starved(BalancerMode::Off).summary;
    let on = starved(BalancerMode::On);
    let sn = &on.summary;
    eprintln!("off: {off:?}\non: {sn:?}");
    assert!(off.timeout_pct > 30.0, "off: {off:?}");
    assert!(sn.timeout_pct < 1.0, "on: {sn:?}");
    assert!(sn.latency_p50_ms < 400.0, "on: {sn:?}");
    assert!(sn.steals > 0 && sn.migrations > 0, "on: {sn:?}");
    // Nobody observes on the packet path here: without watchers the hogged cores would never
    // be found busy. The same run with packet-path detection rescues them as well.
    let mut paper = small(4, BalancerMode::On, 11);
    paper.hog_share_pct = 0;
    paper.busy_detection = BusyDetection::PacketPath;
    let sp = run(&paper).unwrap().summary;
    eprintln!("packet path: {sp:?}");
    assert!(sp.timeout_pct < 1.0, "packet path: {sp:?}");
}
