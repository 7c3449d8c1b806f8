//! `stats` and its sub-commands: memcached 1.6.18's names, order and meanings.

use super::*;
use corelocal::runtime::{Handler, Output, OutputFront};
use std::net::SocketAddr;

const WALL: u64 = 1_700_000_000;

fn service(config: KvConfig) -> (KvService, Instant) {
    let base = Instant::now();
    let svc = KvService::with_clock(config, Duration::from_secs(WALL), base).unwrap();
    (svc, base)
}

fn run(svc: &KvService, input: &str, now: Instant) -> String {
    let mut c = svc.connect(&ConnInfo {
        listener: 0,
        worker: 3,
        peer: None,
        now,
        notify: None,
    });
    let mut out = Output::new();
    let step = c.on_input(input.as_bytes(), &mut out, now);
    assert_eq!(step.consumed, input.len());
    let mut all = Vec::new();
    while let OutputFront::Bytes(b) = out.front() {
        let n = b.len();
        all.extend_from_slice(b);
        out.advance(n);
    }
    String::from_utf8_lossy(&all).into_owned()
}

/// name → value of a `stats` reply, in order.
fn stats(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("STAT "))
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn get(st: &[(String, String)], name: &str) -> String {
    st.iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name}"))
        .1
        .clone()
}

/// memcached 1.6.18's general stats without its LRU maintainer (which we do not have) and
/// with the crawler, in order (t/stats.t counts 83 without the crawler's two).
const GENERAL: &[&str] = &[
    "pid",
    "uptime",
    "time",
    "version",
    "libevent",
    "pointer_size",
    "rusage_user",
    "rusage_system",
    "max_connections",
    "curr_connections",
    "total_connections",
    "rejected_connections",
    "connection_structures",
    "response_obj_oom",
    "response_obj_count",
    "response_obj_bytes",
    "read_buf_count",
    "read_buf_bytes",
    "read_buf_bytes_free",
    "read_buf_oom",
    "reserved_fds",
    "cmd_get",
    "cmd_set",
    "cmd_flush",
    "cmd_touch",
    "cmd_meta",
    "get_hits",
    "get_misses",
    "get_expired",
    "get_flushed",
    "delete_misses",
    "delete_hits",
    "incr_misses",
    "incr_hits",
    "decr_misses",
    "decr_hits",
    "cas_misses",
    "cas_hits",
    "cas_badval",
    "touch_hits",
    "touch_misses",
    "store_too_large",
    "store_no_memory",
    "auth_cmds",
    "auth_errors",
    "bytes_read",
    "bytes_written",
    "limit_maxbytes",
    "accepting_conns",
    "listen_disabled_num",
    "time_in_listen_disabled_us",
    "threads",
    "conn_yields",
    "hash_power_level",
    "hash_bytes",
    "hash_is_expanding",
    "slab_reassign_rescues",
    "slab_reassign_chunk_rescues",
    "slab_reassign_evictions_nomem",
    "slab_reassign_inline_reclaim",
    "slab_reassign_busy_items",
    "slab_reassign_busy_deletes",
    "slab_reassign_running",
    "slabs_moved",
    "lru_crawler_running",
    "lru_crawler_starts",
    "malloc_fails",
    "log_worker_dropped",
    "log_worker_written",
    "log_watcher_skipped",
    "log_watcher_sent",
    "log_watchers",
    "unexpected_napi_ids",
    "round_robin_fallback",
    "bytes",
    "curr_items",
    "total_items",
    "slab_global_page_pool",
    "expired_unfetched",
    "evicted_unfetched",
    "evictions",
    "reclaimed",
    "crawler_reclaimed",
    "crawler_items_checked",
    "lrutail_reflocked",
];

#[test]
fn general_stats_have_memcacheds_names_in_order() {
    let (svc, base) = service(KvConfig::default());
    let st = stats(&run(&svc, "stats\r\n", base));
    let names: Vec<&str> = st.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, GENERAL);
    let (svc, base) = service(KvConfig {
        lru_crawler: false,
        ..KvConfig::default()
    });
    let st = stats(&run(&svc, "stats\r\n", base));
    assert_eq!(st.len(), 83, "t/stats.t's count without the crawler");
    assert!(!st.iter().any(|(k, _)| k.starts_with("lru_crawler")));
}

#[test]
fn counters_bytes_and_flushes() {
    let (svc, base) = service(KvConfig {
        item_bytes_max: 1024,
        ..KvConfig::default()
    });
    let big = "B".repeat(2048);
    let input = format!(
        "set a 0 0 1\r\n1\r\nset x 0 2678400 1\r\nx\r\nget x\r\nset too 0 0 2048\r\n{big}\r\n\
         me a\r\nflush_all\r\nget a\r\n"
    );
    let out = run(&svc, &input, base);
    // Counted when a read's commands are done: this call's bytes are in the next stats.
    let st = stats(&run(&svc, "stats\r\n", base));
    // An absolute expiry before the start: expired at once, counted as such when read.
    assert_eq!(get(&st, "get_expired"), "1");
    // flush_all kills lazily: the next get finds the item dead and counts it (t/stats.t).
    assert_eq!(get(&st, "get_flushed"), "1");
    assert_eq!(get(&st, "cmd_flush"), "1");
    assert_eq!(get(&st, "store_too_large"), "1");
    assert_eq!(get(&st, "cmd_meta"), "1");
    assert_eq!(get(&st, "reclaimed"), "2");
    assert_eq!(get(&st, "expired_unfetched"), "1");
    assert_eq!(get(&st, "bytes_read"), input.len().to_string());
    assert_eq!(get(&st, "bytes_written"), out.len().to_string());
    assert_eq!(get(&st, "curr_items"), "0");
    let st = stats(&run(&svc, "stats reset\r\nstats\r\n", base));
    for k in [
        "get_flushed",
        "store_too_large",
        "reclaimed",
        "cmd_flush",
        "bytes_read",
    ] {
        assert_eq!(get(&st, k), "0", "{k} after stats reset");
    }
}

#[test]
fn settings_report_the_configuration() {
    let (svc, base) = service(KvConfig {
        cas_enabled: false,
        flush_enabled: false,
        evictions: false,
        dump_enabled: false,
        shutdown_enabled: true,
        report: Report {
            threads: 7,
            max_connections: 99,
            tcp_port: 4242,
            ..Report::default()
        },
        ..KvConfig::default()
    });
    let st = stats(&run(&svc, "verbosity 5\r\nstats settings\r\n", base));
    for (k, v) in [
        ("maxbytes", "67108864"),
        ("maxconns", "99"),
        ("tcpport", "4242"),
        ("verbosity", "2"),
        ("evictions", "off"),
        ("cas_enabled", "no"),
        ("flush_enabled", "no"),
        ("dump_enabled", "no"),
        ("shutdown_command", "yes"),
        ("num_threads", "7"),
        ("domain_socket", "NULL"),
        ("auth_enabled_sasl", "no"),
        ("item_size_max", "1048576"),
    ] {
        assert_eq!(get(&st, k), v, "{k}");
    }
    let st = stats(&run(&svc, "stats\r\n", base));
    assert_eq!(
        (get(&st, "threads"), get(&st, "max_connections")),
        ("7".into(), "99".into())
    );
}

#[test]
fn items_slabs_sizes_and_cachedump() {
    let (svc, base) = service(KvConfig::default());
    let v600 = "x".repeat(600);
    let input = format!(
        "set a 5 100 2\r\nhi\r\nset b 0 0 2\r\nhi\r\nset big 0 0 600\r\n{v600}\r\n\
         ms Zm9v 1 b\r\nx\r\nstats items\r\nstats slabs\r\nstats sizes\r\n\
         stats cachedump 1 0\r\nstats cachedump 1 1\r\nstats cachedump 64 1\r\nstats cachedump 1\r\n"
    );
    let out = run(&svc, &input, base);
    let st = stats(&out);
    // a (66 bytes), b (62) and the binary key (63) in class 1 (96-byte chunks), big (667) in
    // class 10 (752).
    assert_eq!(get(&st, "items:1:number"), "3");
    assert_eq!(get(&st, "items:1:mem_requested"), "191");
    assert_eq!(get(&st, "items:10:number"), "1");
    assert_eq!(get(&st, "1:chunk_size"), "96");
    assert_eq!(get(&st, "1:used_chunks"), "3");
    assert_eq!(get(&st, "1:total_chunks"), "10922");
    assert_eq!(get(&st, "10:chunk_size"), "752");
    assert_eq!(get(&st, "active_slabs"), "2");
    assert_eq!(get(&st, "total_malloced"), (2u64 << 20).to_string());
    assert!(out.contains("STAT sizes_status disabled\r\n"), "{out}");
    // cachedump: binary keys left out; the limit; bad class and missing arguments.
    assert!(
        out.contains("ITEM b [2 b; 0 s]\r\nITEM a [2 b; 1700000100 s]\r\nEND\r\n"),
        "{out}"
    );
    assert!(out.contains("END\r\nITEM b [2 b; 0 s]\r\nEND\r\n"), "{out}");
    assert!(out.ends_with("CLIENT_ERROR Illegal slab id\r\nCLIENT_ERROR bad command line\r\n"));
    let out = run(&svc, "stats sizes_enable\r\nstats sizes\r\n", base);
    assert_eq!(
        out,
        "STAT sizes_status enabled\r\nEND\r\nSTAT 64 2\r\nSTAT 96 1\r\nSTAT 672 1\r\nEND\r\n"
    );
    let (svc, base) = service(KvConfig {
        dump_enabled: false,
        ..KvConfig::default()
    });
    assert_eq!(
        run(&svc, "stats cachedump 1 1\r\n", base),
        "CLIENT_ERROR stats cachedump not allowed\r\n"
    );
}

/// memcached's t/stats-detail.t, condensed.
#[test]
fn detail_counts_per_prefix() {
    let (svc, base) = service(KvConfig::default());
    let r = |i: &str| run(&svc, i, base);
    assert_eq!(r("stats detail dump\r\n"), "END\r\n");
    assert_eq!(
        r("stats detail\r\nstats detail x\r\n"),
        "CLIENT_ERROR usage: stats detail on|off|dump\r\n".repeat(2)
    );
    assert_eq!(r("stats detail on\r\n"), "OK\r\n");
    r("set foo:123 0 0 6\r\nfooval\r\nget foo:123\r\nget foo:124\r\ndelete foo:125\r\nset nodelim 0 0 1\r\nx\r\n");
    assert_eq!(
        r("stats detail dump\r\n"),
        "PREFIX foo get 2 hit 1 set 1 del 1\r\nEND\r\n"
    );
    assert_eq!(
        r("stats reset\r\nstats detail dump\r\n"),
        "RESET\r\nEND\r\n"
    );
    assert_eq!(r("stats detail off\r\n"), "OK\r\n");
    r("get foo:1\r\n");
    assert_eq!(r("stats detail dump\r\n"), "END\r\n");
}

/// memcached -M: a full store refuses new items instead of evicting.
#[test]
fn no_evictions_refuses_when_full() {
    let (svc, base) = service(KvConfig {
        memory_bytes_max: 4096,
        item_bytes_max: 1024,
        stripes: 1,
        evictions: false,
        ..KvConfig::default()
    });
    let v = "v".repeat(900);
    let mut input = String::new();
    for i in 0..8 {
        input += &format!("set k{i} 0 0 900\r\n{v}\r\n");
    }
    let out = run(&svc, &input, base);
    assert!(
        out.starts_with("STORED\r\nSTORED\r\nSTORED\r\nSERVER_ERROR"),
        "{out}"
    );
    assert!(
        out.ends_with("SERVER_ERROR out of memory storing object\r\n"),
        "{out}"
    );
    let st = stats(&run(&svc, "stats\r\nstats items\r\n", base));
    assert_eq!(get(&st, "evictions"), "0");
    assert_ne!(get(&st, "store_no_memory"), "0");
    assert_ne!(get(&st, "items:12:outofmemory"), "0");
}

/// `stats conns`: the listener, then each live connection with memcached's states.
#[test]
fn stats_conns_lists_the_listener_and_live_connections() {
    let (svc, base) = service(KvConfig {
        report: Report {
            threads: 2,
            listen: vec!["127.0.0.1:11311".parse().unwrap()],
            ..Report::default()
        },
        ..KvConfig::default()
    });
    let info = |port: u16, worker: usize| ConnInfo {
        listener: 0,
        worker,
        peer: Some(SocketAddr::from(([127, 0, 0, 1], port))),
        now: base,
        notify: None,
    };
    let fresh = svc.connect(&info(5001, 0));
    let mut nread = svc.connect(&info(5002, 1));
    let mut out = Output::new();
    let step = nread.on_input(b"set foo 0 0 6\r\nab", &mut out, base);
    assert_eq!(step.consumed, 17);
    let mut asking = svc.connect(&info(5003, 1));
    let later = base + Duration::from_secs(3);
    let mut out = Output::new();
    asking.on_input(b"stats conns\r\n", &mut out, later);
    let mut text = Vec::new();
    while let OutputFront::Bytes(b) = out.front() {
        let n = b.len();
        text.extend_from_slice(b);
        out.advance(n);
    }
    assert_eq!(
        String::from_utf8(text).unwrap(),
        "STAT 1:addr tcp:127.0.0.1:11311\r\nSTAT 1:state conn_listening\r\n\
         STAT 1:secs_since_last_cmd 3\r\n\
         STAT 17:addr tcp:127.0.0.1:5001\r\nSTAT 17:listen_addr tcp:127.0.0.1:11311\r\n\
         STAT 17:state conn_new_cmd\r\nSTAT 17:secs_since_last_cmd 3\r\n\
         STAT 18:addr tcp:127.0.0.1:5002\r\nSTAT 18:listen_addr tcp:127.0.0.1:11311\r\n\
         STAT 18:state conn_nread\r\nSTAT 18:secs_since_last_cmd 3\r\n\
         STAT 19:addr tcp:127.0.0.1:5003\r\nSTAT 19:listen_addr tcp:127.0.0.1:11311\r\n\
         STAT 19:state conn_parse_cmd\r\nSTAT 19:secs_since_last_cmd 0\r\n\
         END\r\n"
    );
    // The data completes: between commands; a closed connection leaves the list.
    let mut out = Output::new();
    nread.on_input(b"cdef\r\n", &mut out, later);
    drop(fresh);
    let st = run(&svc, "stats conns\r\n", later);
    assert!(st.contains("STAT 18:state conn_read\r\n"), "{st}");
    assert!(st.contains("STAT 19:state conn_read\r\n"), "{st}");
    assert!(!st.contains("STAT 17:"), "{st}");
    // The connection `run` opened is listed as the one asking.
    assert!(st.contains("STAT 20:state conn_parse_cmd\r\n"), "{st}");
}
