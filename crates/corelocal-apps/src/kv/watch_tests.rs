//! memcached's `watch`: the log stream through the runtime's notify hook (driven by hand
//! here: `on_notify` is what the worker calls after a notify), lines in memcached's format,
//! the skipped accounting, the limits and the stats.

use super::tests::service;
use super::*;
use corelocal::backend::{ConnKey, Wake};
use corelocal::runtime::notify::{NotifyHub, NotifyRef};
use corelocal::runtime::{Handler, Output, OutputFront};
use std::sync::atomic::AtomicUsize;

/// Counts the worker wake-ups the notifies asked for.
#[derive(Default)]
struct Wakes(AtomicUsize);
impl Wake for Wakes {
    fn wake(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// A worker's hub, and its wake-ups.
fn hub() -> (Arc<NotifyHub>, Arc<Wakes>) {
    let wakes = Arc::new(Wakes::default());
    (Arc::new(NotifyHub::new(wakes.clone())), wakes)
}

/// A connection as a worker makes it: with a notifier (connection `id`).
fn conn(svc: &KvService, hub: &Arc<NotifyHub>, id: u32, now: Instant) -> KvConn {
    svc.connect(&ConnInfo {
        listener: 0,
        worker: 0,
        peer: Some("10.1.2.3:4567".parse().unwrap()),
        now,
        notify: Some(NotifyRef::new(hub, 0, ConnKey::new(id, id))),
    })
}

fn text(out: &mut Output) -> String {
    let mut all = Vec::new();
    while let OutputFront::Bytes(b) = out.front() {
        let n = b.len();
        all.extend_from_slice(b);
        out.advance(n);
    }
    String::from_utf8(all).unwrap()
}

fn input(c: &mut KvConn, s: &str, now: Instant) -> String {
    let mut out = Output::new();
    let step = c.on_input(s.as_bytes(), &mut out, now);
    assert_eq!(step.consumed, s.len());
    text(&mut out)
}

/// What the worker sends after a notify (with `room` bytes of output room).
fn notified(c: &mut KvConn, room: u64, now: Instant) -> String {
    let mut out = Output::new();
    out.set_limit(room);
    c.on_notify(&mut out, now);
    text(&mut out)
}

/// The lines without their `ts=… gid=… ` heads (checked to be there).
fn bodies(lines: &str) -> Vec<String> {
    lines
        .lines()
        .map(|l| {
            let rest = l.strip_prefix("ts=").expect(l);
            let (_, rest) = rest.split_once(" gid=").expect(l);
            rest.split_once(' ').expect(l).1.to_string()
        })
        .collect()
}

#[test]
fn fetchers_and_mutations_stream_in_memcacheds_format() {
    let (svc, now) = service(KvConfig::default());
    let (hub, wakes) = hub();
    let mut w = conn(&svc, &hub, 1, now);
    let mut c = conn(&svc, &hub, 2, now);
    let cfd = c.cfd();
    assert_eq!(input(&mut w, "watch fetchers mutations\r\n", now), "");
    assert_eq!(wakes.0.load(Ordering::Relaxed), 1, "the OK is notified");
    assert_eq!(notified(&mut w, u64::MAX, now), "OK\r\n");
    input(&mut c, "set n,foo 0 0 4\r\nvbar\r\nget n,foo\r\n", now);
    let class = svc.store().class_of(b"n,foo", 0, b"vbar");
    assert_eq!(
        bodies(&notified(&mut w, u64::MAX, now)),
        [
            format!("type=item_get key=n%2Cfoo status=not_found clsid=0 cfd={cfd} size=0"),
            format!(
                "type=item_store key=n%2Cfoo status=stored cmd=set ttl=0 clsid={class} \
                 cfd={cfd} size=4"
            ),
            format!("type=item_get key=n%2Cfoo status=found clsid={class} cfd={cfd} size=4"),
        ]
    );
    // A watcher reads no more commands.
    assert_eq!(input(&mut w, "version\r\n", now), "");
    let stats = input(&mut c, "stats\r\n", now);
    assert!(stats.contains("STAT log_watchers 1\r\n"), "{stats}");
    assert!(stats.contains("STAT log_watcher_sent 3\r\n"), "{stats}");
    drop(w);
    let stats = input(&mut c, "stats\r\n", now);
    assert!(stats.contains("STAT log_watchers 0\r\n"), "{stats}");
}

#[test]
fn a_watcher_that_falls_behind_gets_a_skipped_count() {
    let (svc, now) = service(KvConfig {
        watcher_buf_bytes: 300,
        ..KvConfig::default()
    });
    let (hub, _) = hub();
    let mut w = conn(&svc, &hub, 1, now);
    let mut c = conn(&svc, &hub, 2, now);
    input(&mut w, "watch\r\n", now);
    // The output has room for the OK and part of the first line only.
    let first = notified(&mut w, 30, now);
    assert_eq!(first, "OK\r\n");
    for _ in 0..10 {
        input(&mut c, "get somekey\r\n", now);
    }
    let got = notified(&mut w, u64::MAX, now);
    let fits = got.lines().count();
    assert!((1..10).contains(&fits), "{got}");
    input(&mut c, "get other\r\n", now);
    let after = bodies(&notified(&mut w, u64::MAX, now).replace("skipped=", "ts=0 gid=0 skipped="));
    assert_eq!(after.len(), 2);
    assert_eq!(after[0], format!("skipped={}", 10 - fits));
    assert!(after[1].starts_with("type=item_get key=other status=not_found"));
    let stats = input(&mut c, "stats\r\n", now);
    let skipped = format!("STAT log_watcher_skipped {}\r\n", 10 - fits);
    assert!(stats.contains(&skipped), "{stats}");
}

#[test]
fn connevents_log_opens_and_closes_with_their_reason() {
    let (svc, now) = service(KvConfig::default());
    let (hub, _) = hub();
    let mut w = conn(&svc, &hub, 1, now);
    input(&mut w, "watch connevents\r\n", now);
    notified(&mut w, u64::MAX, now);
    let ok = conn(&svc, &hub, 2, now);
    let (ok_cfd, mut bad) = (ok.cfd(), conn(&svc, &hub, 3, now));
    let bad_cfd = bad.cfd();
    drop(ok);
    let mut out = Output::new();
    bad.on_input(b"GET / HTTP/1.1\r\n", &mut out, now);
    drop(bad);
    let head = "rip=10.1.2.3 rport=4567 transport=tcp";
    assert_eq!(
        bodies(&notified(&mut w, u64::MAX, now)),
        [
            format!("type=conn_new {head} cfd={ok_cfd}"),
            format!("type=conn_new {head} cfd={bad_cfd}"),
            format!("type=conn_close {head} reason=normal cfd={ok_cfd}"),
            format!("type=conn_close {head} reason=error cfd={bad_cfd}"),
        ]
    );
}

#[test]
fn watch_refusals_are_memcacheds() {
    let (hub, _) = hub();
    let (svc, now) = service(KvConfig {
        watch_enabled: false,
        ..KvConfig::default()
    });
    let refused = "CLIENT_ERROR watch commands not allowed\r\n";
    assert_eq!(
        input(&mut conn(&svc, &hub, 1, now), "watch\r\n", now),
        refused
    );
    let (svc, now) = service(KvConfig::default());
    let mut c = conn(&svc, &hub, 1, now);
    assert_eq!(input(&mut c, "watch bogus\r\n", now), "ERROR\r\n");
    assert_eq!(
        input(&mut c, "mn\r\nwatch\r\n", now),
        "MN\r\nERROR cannot pipeline other commands before watch\r\n"
    );
    let mut watchers: Vec<KvConn> = (0..watch::WATCHERS_MAX as u32)
        .map(|i| conn(&svc, &hub, 10 + i, now))
        .collect();
    for w in &mut watchers {
        assert_eq!(input(w, "watch evictions\r\n", now), "");
    }
    assert_eq!(
        input(&mut c, "watch\r\n", now),
        "WATCHER_TOO_MANY log watcher limit reached\r\n"
    );
}

#[test]
fn evictions_are_logged() {
    let (svc, now) = service(KvConfig {
        memory_bytes_max: 2 << 20,
        stripes: 1,
        ..KvConfig::default()
    });
    let (hub, _) = hub();
    let mut w = conn(&svc, &hub, 1, now);
    let mut c = conn(&svc, &hub, 2, now);
    input(&mut w, "watch evictions\r\n", now);
    notified(&mut w, u64::MAX, now);
    let value = "v".repeat(100_000);
    for i in 0..40 {
        input(
            &mut c,
            &format!("set k{i} 0 0 100000 noreply\r\n{value}\r\n"),
            now,
        );
    }
    let lines = bodies(&notified(&mut w, u64::MAX, now));
    assert!(!lines.is_empty());
    assert!(
        lines[0].starts_with("type=eviction key=k0 fetch=no ttl=-1 la=0 clsid="),
        "{lines:?}"
    );
    assert!(lines[0].ends_with(" size=100000"), "{lines:?}");
}

/// memcached's `-R`: a connection runs `reqs_per_event` requests, then yields the rest of its
/// input to the worker's next turn, counted in `conn_yields` (issue_61.t).
#[test]
fn requests_per_event_yield_and_count() {
    let mut config = KvConfig::default();
    config.report.reqs_per_event = 2;
    let (svc, now) = service(config);
    let (hub, _) = hub();
    let mut c = conn(&svc, &hub, 1, now);
    let input = "mn\r\nmn\r\nmn\r\nmn\r\nmn\r\n";
    let mut out = Output::new();
    let mut at = 0;
    let mut steps = Vec::new();
    loop {
        let step = c.on_input(&input.as_bytes()[at..], &mut out, now);
        at += step.consumed;
        steps.push((step.requests, step.yielded));
        if !step.yielded {
            break;
        }
    }
    assert_eq!(steps, [(2, true), (2, true), (1, false)]);
    assert_eq!(text(&mut out), "MN\r\n".repeat(5));
    let stats = input_all(&mut c, "stats\r\n", now);
    assert!(stats.contains("STAT conn_yields 2\r\n"), "{stats}");
}

fn input_all(c: &mut KvConn, s: &str, now: Instant) -> String {
    let mut out = Output::new();
    let step = c.on_input(s.as_bytes(), &mut out, now);
    assert!(!step.yielded && step.consumed == s.len());
    text(&mut out)
}
