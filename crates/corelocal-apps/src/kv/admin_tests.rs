//! Operational commands and options: shutdown (-A), cache_memlimit, lru_crawler (crawl,
//! metadump, the background crawler), watch, ASCII authentication (-Y), the connection limit
//! (-c), idle kicks.

use super::*;
use corelocal::runtime::{CloseReason, Handler, Next, Output, OutputFront};
use std::sync::Mutex;

use super::tests::{conn, service};

/// Feeds `input` to `c` in one call: (reply, consumed, next).
fn feed(c: &mut KvConn, input: &str, now: Instant) -> (String, usize, Next) {
    let mut out = Output::new();
    let step = c.on_input(input.as_bytes(), &mut out, now);
    let mut all = Vec::new();
    while let OutputFront::Bytes(b) = out.front() {
        let n = b.len();
        all.extend_from_slice(b);
        out.advance(n);
    }
    (
        String::from_utf8_lossy(&all).into_owned(),
        step.consumed,
        step.next,
    )
}

fn run(svc: &KvService, input: &str, now: Instant) -> String {
    feed(&mut conn(svc, now), input, now).0
}

#[test]
fn shutdown_needs_enabling_then_calls_the_hook_and_closes() {
    let (svc, base) = service(KvConfig::default());
    assert_eq!(
        run(&svc, "shutdown\r\n", base),
        "ERROR: shutdown not enabled\r\n"
    );
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let (svc, base) = service(KvConfig {
        shutdown_enabled: true,
        shutdown: Some(ShutdownHook(Arc::new(move |g| {
            seen.lock().unwrap().push(g)
        }))),
        ..KvConfig::default()
    });
    assert_eq!(
        run(&svc, "shutdown foo\r\n", base),
        "CLIENT_ERROR invalid shutdown mode\r\n"
    );
    let (out, _, next) = feed(&mut conn(&svc, base), "shutdown\r\nversion\r\n", base);
    assert_eq!((out.as_str(), next), ("", Next::Close(CloseReason::Done)));
    feed(&mut conn(&svc, base), "shutdown graceful\r\n", base);
    assert_eq!(*calls.lock().unwrap(), [false, true]);
    let st = run(&svc, "stats settings\r\n", base);
    assert!(st.contains("STAT shutdown_command yes\r\n"));
}

#[test]
fn cache_memlimit_bounds_and_effect() {
    let (svc, base) = service(KvConfig::default());
    assert_eq!(
        run(
            &svc,
            "cache_memlimit 7\r\ncache_memlimit x\r\ncache_memlimit 1000000001\r\ncache_memlimit 8 noreply\r\n\
             cache_memlimit\r\ncache_memlimit 9\r\n",
            base
        ),
        "MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\nERROR\r\n\
         MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes\r\nERROR\r\nOK\r\n"
    );
    let st = run(&svc, "stats settings\r\nstats\r\n", base);
    assert!(st.contains("STAT maxbytes 9437184\r\n"), "{st}");
    assert!(st.contains("STAT limit_maxbytes 9437184\r\n"), "{st}");
    // A lower limit is reached by evicting: 9 MiB hold fewer than 12 items of 1 MiB.
    let (svc, base) = service(KvConfig {
        memory_bytes_max: 64 << 20,
        item_bytes_max: 2 << 20,
        stripes: 1,
        ..KvConfig::default()
    });
    run(&svc, "cache_memlimit 9\r\n", base);
    let v = "v".repeat(1 << 20);
    for i in 0..12 {
        run(&svc, &format!("set k{i} 0 0 {}\r\n{v}\r\n", v.len()), base);
    }
    let st = run(&svc, "stats\r\n", base);
    assert!(st.contains("STAT evictions 4\r\n"), "{st}");
}

#[test]
fn lru_crawler_crawl_and_metadump() {
    let (svc, base) = service(KvConfig {
        stripes: 1,
        ..KvConfig::default()
    });
    let later = base + Duration::from_secs(5);
    run(
        &svc,
        "set a 0 2 1\r\na\r\nset b 0 100 1\r\nb\r\nset c%d 0 0 1\r\nc\r\nget b\r\n",
        base,
    );
    assert_eq!(
        run(&svc, "lru_crawler metadump all\r\n", base),
        "key=b exp=1700000100 la=1700000000 cas=2 fetch=yes cls=1 size=61\n\
         key=c%25d exp=-1 la=1700000000 cas=3 fetch=no cls=1 size=63\n\
         key=a exp=1700000002 la=1700000000 cas=1 fetch=no cls=1 size=61\nEND\r\n"
    );
    assert_eq!(run(&svc, "lru_crawler metadump 2\r\n", base), "END\r\n");
    assert_eq!(
        run(
            &svc,
            "lru_crawler metadump 1,x\r\nlru_crawler crawl 64\r\n",
            base
        ),
        "BADCLASS invalid class id\r\nBADCLASS invalid class id\r\n"
    );
    // Five seconds later `a` has expired: the crawl (a thread) reclaims it.
    assert_eq!(run(&svc, "lru_crawler crawl all\r\n", later), "OK\r\n");
    for _ in 0..200 {
        if run(&svc, "stats\r\n", later).contains("STAT crawler_reclaimed 1\r\n") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = run(&svc, "stats\r\nstats items\r\n", later);
    assert!(st.contains("STAT crawler_reclaimed 1\r\n"), "{st}");
    assert!(st.contains("STAT curr_items 2\r\n"), "{st}");
    assert!(st.contains("STAT expired_unfetched 1\r\n"), "{st}");
    assert!(st.contains("STAT items:1:crawler_reclaimed 1\r\n"), "{st}");
    assert_eq!(
        run(
            &svc,
            "lru_crawler sleep 2000000\r\nlru_crawler sleep 10\r\nlru_crawler tocrawl x\r\n\
             lru_crawler disable\r\nlru_crawler enable\r\nlru_crawler\r\n",
            later
        ),
        "CLIENT_ERROR sleep must be one second or less\r\nOK\r\n\
         CLIENT_ERROR bad command line format\r\nOK\r\nOK\r\nERROR\r\n"
    );
    let (svc, base) = service(KvConfig {
        lru_crawler: false,
        ..KvConfig::default()
    });
    assert_eq!(
        run(&svc, "lru_crawler crawl all\r\n", base),
        "CLIENT_ERROR lru crawler disabled\r\n"
    );
    let (svc, base) = service(KvConfig {
        dump_enabled: false,
        ..KvConfig::default()
    });
    assert_eq!(
        run(&svc, "lru_crawler metadump all\r\n", base),
        "ERROR metadump not allowed\r\n"
    );
}

/// The background crawler reclaims expired items nobody reads (real clock: ~2 s).
#[test]
fn background_crawler_reclaims_expired_items() {
    let svc = KvService::new(KvConfig::default()).unwrap();
    let now = Instant::now();
    run(&svc, "set gone 0 1 1\r\nx\r\nset kept 0 0 1\r\ny\r\n", now);
    let deadline = Instant::now() + Duration::from_secs(6);
    loop {
        let st = run(&svc, "stats\r\n", Instant::now());
        if st.contains("STAT curr_items 1\r\n") {
            assert!(st.contains("STAT crawler_reclaimed 1\r\n"), "{st}");
            assert!(!st.contains("STAT lru_crawler_starts 0\r\n"), "{st}");
            break;
        }
        assert!(Instant::now() < deadline, "not reclaimed: {st}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A connection with no notifier (a UDP one, or one made outside a worker) cannot stream.
#[test]
fn watch_is_refused_without_a_notifier() {
    let (svc, base) = service(KvConfig::default());
    assert_eq!(
        run(&svc, "watch\r\nwatch fetchers noreply\r\nmn\r\n", base),
        "CLIENT_ERROR watch commands not allowed\r\nMN\r\n"
    );
}

/// memcached's t/ascii-auth.t, condensed, plus the refusals.
#[test]
fn ascii_authentication() {
    let (svc, base) = service(KvConfig {
        auth: parse_auth_file(b"foo:bar\nbaaaz:quux\n").unwrap(),
        ..KvConfig::default()
    });
    let mut c = conn(&svc, base);
    // A set is the authentication request: "hi" is not "user pass".
    let (out, _, _) = feed(&mut c, "set foo 0 0 2\r\nhi\r\n", base);
    assert_eq!(out, "CLIENT_ERROR bad authentication token format\r\n");
    let (out, ..) = feed(&mut c, "get foo\r\n", base);
    assert_eq!(out, "CLIENT_ERROR unauthenticated\r\n");
    let (out, ..) = feed(&mut c, "set foo 0 0 7\r\nfoo bab\r\n", base);
    assert_eq!(out, "CLIENT_ERROR authentication failure\r\n");
    // Split across reads.
    let (out, n, _) = feed(&mut c, "set foo 0 0 7\r\nfoo", base);
    assert_eq!((out.as_str(), n), ("", 15));
    // The runtime gives back what was not consumed, with what came next.
    let (out, ..) = feed(
        &mut c,
        "foo bar\r\nset toast 0 0 2\r\nhi\r\nget toast\r\n",
        base,
    );
    assert_eq!(out, "STORED\r\nSTORED\r\nVALUE toast 0 2\r\nhi\r\nEND\r\n");
    let (out, ..) = feed(
        &mut conn(&svc, base),
        "set x 0 0 10\r\nbaaaz quux\r\nmn\r\n",
        base,
    );
    assert_eq!(out, "STORED\r\nMN\r\n");
    let (out, ..) = feed(
        &mut conn(&svc, base),
        "set x 0 0 3\r\nabcde\r\nset x 0 0 1\r\na\r\n",
        base,
    );
    assert_eq!(
        out,
        "CLIENT_ERROR bad command line termination\r\nCLIENT_ERROR unauthenticated\r\n\
         CLIENT_ERROR bad authentication token format\r\n"
    );
    let st = run(
        &svc,
        "set x 0 0 7\r\nfoo bar\r\nstats\r\nstats settings\r\n",
        base,
    );
    assert!(st.contains("STAT auth_cmds 4\r\n"), "{st}");
    assert!(st.contains("STAT auth_errors 1\r\n"), "{st}");
    assert!(st.contains("STAT auth_enabled_ascii yes\r\n"), "{st}");
    assert!(parse_auth_file(b"nocolon\n").is_err());
    assert!(parse_auth_file(b"\n").is_err());
    assert_eq!(
        parse_auth_file(b"a:b:c\r\n").unwrap(),
        [(b"a".to_vec(), b"b:c".to_vec())]
    );
}

/// memcached -c: connections over the limit are told so and closed.
#[test]
fn connection_limit() {
    let (svc, base) = service(KvConfig {
        conn_limit: 2,
        ..KvConfig::default()
    });
    let a = conn(&svc, base);
    let _b = conn(&svc, base);
    let mut c = conn(&svc, base);
    // Told at accept, before it sends anything.
    let mut greeting = Output::new();
    let next = c.on_connect(&mut greeting, base);
    assert_eq!(next, Next::Close(CloseReason::Done));
    assert_eq!(greeting.byte_len(), 33);
    let (out, _, next) = feed(&mut c, "version\r\n", base);
    assert_eq!(out, "");
    assert_eq!(next, Next::Close(CloseReason::Done));
    drop(c);
    drop(a);
    // Under the limit nothing is said first.
    let mut d = conn(&svc, base);
    let mut greeting = Output::new();
    assert_eq!(d.on_connect(&mut greeting, base), Next::Read);
    assert!(greeting.is_empty());
    drop(d);
    let st = run(&svc, "stats\r\n", base);
    assert!(st.contains("STAT rejected_connections 1\r\n"), "{st}");
    assert!(st.contains("STAT max_connections 2\r\n"), "{st}");
    assert!(st.contains("STAT curr_connections 2\r\n"), "{st}");
}

#[test]
fn idle_kicks_are_counted_when_a_timeout_is_set() {
    let (svc, base) = service(KvConfig {
        report: Report {
            idle_timeout_secs: 1,
            ..Report::default()
        },
        ..KvConfig::default()
    });
    let long_ago = Instant::now() - Duration::from_secs(2);
    drop(conn(&svc, long_ago));
    drop(conn(&svc, Instant::now()));
    let st = run(&svc, "stats\r\n", base);
    assert!(
        st.contains("STAT auth_errors 0\r\nSTAT idle_kicks 1\r\nSTAT bytes_read"),
        "{st}"
    );
    let (svc, base) = service(KvConfig::default());
    assert!(!run(&svc, "stats\r\n", base).contains("idle_kicks"));
}

/// memcached's debug build moves its clock with `debugtime` (t/expirations.t); ours only
/// with `debug_time`, else `ERROR` as memcached's release build.
#[test]
fn debugtime_moves_the_clock_only_when_enabled() {
    let (svc, base) = service(KvConfig::default());
    assert_eq!(run(&svc, "debugtime 3\r\n", base), "ERROR\r\n");
    let (svc, base) = service(KvConfig {
        debug_time: true,
        ..KvConfig::default()
    });
    // The clock is read once per read of input: the next one sees the move.
    assert_eq!(
        run(
            &svc,
            "set foo 0 3 6\r\nfooval\r\ndebugtime 2\r\ndebugtime -1\r\n",
            base
        ),
        "STORED\r\nOK\r\nERROR\r\n"
    );
    assert_eq!(
        run(&svc, "get foo\r\n", base),
        "VALUE foo 0 6\r\nfooval\r\nEND\r\n"
    );
    assert_eq!(run(&svc, "debugtime 1\r\n", base), "OK\r\n");
    assert_eq!(run(&svc, "get foo\r\n", base), "END\r\n");
}

/// Started without the crawler (`-o no_lru_crawler`, `no_modern`): crawl and metadump are
/// refused until `lru_crawler enable`; a metadump after other commands in the same read is
/// refused (its stream would interleave with their replies).
#[test]
fn crawler_enable_and_metadump_alone() {
    let (svc, base) = service(KvConfig {
        lru_crawler: false,
        ..KvConfig::default()
    });
    let st = run(&svc, "stats settings\r\nstats\r\n", base);
    assert!(st.contains("STAT lru_crawler no\r\n") && !st.contains("lru_crawler_running"));
    assert_eq!(
        run(
            &svc,
            "lru_crawler metadump all\r\nlru_crawler enable\r\n",
            base
        ),
        "CLIENT_ERROR lru crawler disabled\r\nOK\r\n"
    );
    let st = run(&svc, "stats settings\r\nstats\r\n", base);
    assert!(st.contains("STAT lru_crawler yes\r\n") && st.contains("lru_crawler_running"));
    assert_eq!(
        run(&svc, "mg foo v\r\nlru_crawler metadump all\r\n", base),
        "EN\r\nERROR cannot pipeline other commands before metadump\r\n"
    );
    assert_eq!(run(&svc, "lru_crawler metadump all\r\n", base), "END\r\n");
}

/// memcached's t/strtol-testing.t and the slab commands: we have no slab pages to move.
#[test]
fn slabs_commands() {
    let (svc, base) = service(KvConfig::default());
    assert_eq!(
        run(
            &svc,
            "slabs automove invalid\r\nslabs automove 3\r\nslabs automove 2\r\n\
             slabs automove 1 noreply\r\nslabs automove ratio x\r\nslabs automove ratio 0.5\r\n\
             slabs reassign 1 2\r\nslabs reassign 1\r\nslabs\r\n",
            base
        ),
        "CLIENT_ERROR bad command line format\r\nERROR\r\nOK\r\nERROR\r\nOK\r\n\
         CLIENT_ERROR slab reassignment disabled\r\nERROR\r\nERROR\r\n"
    );
    assert!(run(&svc, "stats settings\r\n", base).contains("STAT slab_automove 1\r\n"));
}
