//! Tests of argument building, presets and the summary table.

use super::peers::{preset, site};
use super::*;
use std::path::Path;

#[test]
fn spread_and_median() {
    let s = spread(&[3.0, 1.0, 2.0]).unwrap();
    assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
    assert_eq!(s.spread, 1.0);
    assert_eq!(spread(&[1.0, 2.0, 3.0, 10.0]).unwrap().median, 2.5);
    assert!(spread(&[]).is_none());
}

#[test]
fn ratios_against_the_first_server() {
    let fig = |us: f64, tp: f64| RunFig {
        round: 1,
        txns_per_s: tp,
        conns_per_s: tp,
        server_us_per_txn: Some(us),
        server_us_per_txn_utime: Some(us),
        server_runs_per_txn: None,
        server_cores: None,
        client_us_per_txn: None,
        p50_us: 0.0,
        p99_us: 0.0,
        p999_us: 0.0,
        errors: 0,
        load: String::new(),
        json: String::new(),
        spectrum: vec![],
    };
    let sv = |n: &str| ServerDef {
        name: n.into(),
        proto: "http".into(),
        cmd: "x".into(),
    };
    let sums = summarize(
        &[sv("a"), sv("b")],
        &[
            vec![fig(10.0, 100.0), fig(12.0, 90.0), fig(11.0, 95.0)],
            vec![fig(16.5, 80.0), fig(16.5, 80.0)],
        ],
        &[vec![], vec!["x".into()]],
        0,
    );
    assert_eq!(sums[0].cpu_ratio_vs_baseline, Some(1.0));
    assert_eq!(sums[1].cpu_ratio_vs_baseline, Some(1.5));
    assert_eq!(sums[1].throughput_ratio_vs_baseline, Some(80.0 / 95.0));
    let md = markdown(
        &CompareArgs {
            peer: vec![],
            server: vec![],
            workload: CmpWorkload::Crr,
            rounds: 3,
            duration: Dur(5_000_000_000),
            warmup: Dur(1_000_000_000),
            conns: vec![64],
            baseline: None,
            server_cpu: 1,
            client_cpus: "0".into(),
            port: 8080,
            out: "results/compare".into(),
            corelocal_bin: None,
            floor_bin: None,
            no_netns: false,
            extra: vec![],
        },
        &[ConnsSummary {
            conns: 64,
            baseline: "a".into(),
            servers: sums,
        }],
        "cmd",
        "0.1",
    );
    assert!(
        md.contains("| b | 16.50 (16.50–16.50, ±0%)") && md.contains("| 1.500 |"),
        "{md}"
    );
}

#[test]
fn servers_args_dates() {
    assert_eq!(
        parse_server("mine=http:./srv {port} {cpu}").unwrap().cmd,
        "./srv {port} {cpu}"
    );
    assert!(parse_server("mine=ftp:x").is_err());
    assert!(parse_server("noequals").is_err());
    assert!(parse_server("a b=http:x").is_err());
    assert_eq!(utc_date(0), "1970-01-01");
    assert_eq!(utc_date(1_700_000_000), "2023-11-14");
    assert_eq!(utc_date(951_782_400), "2000-02-29");
    let a = CompareArgs {
        peer: vec![],
        server: vec![],
        workload: CmpWorkload::Ka,
        rounds: 1,
        duration: Dur(1_000_000_000),
        warmup: Dur(0),
        conns: vec![8],
        baseline: None,
        server_cpu: 1,
        client_cpus: "0".into(),
        port: 9,
        out: "r".into(),
        corelocal_bin: None,
        floor_bin: None,
        no_netns: true,
        extra: vec!["--engine".into(), "epoll".into()],
    };
    let v = ba(&a, "http", Path::new("x.json")).unwrap();
    assert_eq!(&v[..5], ["http", "--bursts", "1000", "--think", "0"]);
    assert!(v
        .windows(2)
        .any(|w| w == ["--target", "http://127.0.0.1:9/hello"]));
    assert_eq!(&v[v.len() - 2..], ["--engine", "epoll"]);
    assert!(ba(&a, "kv", Path::new("x")).is_err());
    let v = ba(&a, "sockperf", Path::new("x.json")).unwrap();
    assert_eq!(
        &v[..7],
        [
            "rpc",
            "--proto",
            "sockperf",
            "--msg-size",
            "64",
            "--txns-per-conn",
            "1000"
        ]
    );
    assert_eq!(value_of(&v, "--target"), Some("127.0.0.1:9"));
    let mut c = a.clone();
    c.workload = CmpWorkload::Crr;
    let v = ba(&c, "sockperf", Path::new("x.json")).unwrap();
    assert_eq!(&v[..5], ["crr", "--proto", "sockperf", "--msg-size", "64"]);
    c.workload = CmpWorkload::Kv1;
    assert!(ba(&c, "sockperf", Path::new("x")).is_err());
    assert_eq!(
        parse_server("sp=sockperf:./s {port}").unwrap().proto,
        "sockperf"
    );
    assert!(nginx_conf(Path::new("/t"), 9, None).contains("listen 127.0.0.1:9 reuseport"));
    assert!(lighttpd_conf(Path::new("/t"), 9, None).contains("server.port = 9"));
    let h = h2o_conf(Path::new("/t"), 9, Path::new("/t/www"));
    assert!(
        h.contains("num-threads: 1") && h.contains("  port: 9\n"),
        "{h}"
    );
    assert!(h.contains("file.dir: /t/www"), "{h}");
}

fn args(w: CmpWorkload) -> CompareArgs {
    CompareArgs {
        peer: vec![],
        server: vec![],
        workload: w,
        rounds: 1,
        duration: Dur(1_000_000_000),
        warmup: Dur(0),
        conns: vec![],
        baseline: None,
        server_cpu: 1,
        client_cpus: "0".into(),
        port: 9,
        out: "r".into(),
        corelocal_bin: None,
        floor_bin: None,
        no_netns: true,
        extra: vec![],
    }
}

/// The bench arguments at the comparison's first concurrency.
fn ba(a: &CompareArgs, proto: &str, json: &Path) -> Result<Vec<String>, String> {
    bench_args(a, proto, a.conns_list()?[0], json)
}

fn value_of<'a>(v: &'a [String], flag: &str) -> Option<&'a str> {
    v.windows(2).find(|w| w[0] == flag).map(|w| w[1].as_str())
}

#[test]
fn new_workloads_build_their_bench_arguments() {
    let j = Path::new("x.json");
    let a = args(CmpWorkload::File64);
    let v = ba(&a, "http", j).unwrap();
    assert_eq!(&v[..5], ["crr", "--proto", "http", "--path", "/64.txt"]);
    assert_eq!(value_of(&v, "--target"), Some("127.0.0.1:9"));
    assert_eq!(value_of(&v, "--conns"), Some("64"));
    assert!(ba(&a, "kv", j).is_err());

    let a = args(CmpWorkload::Sessions);
    let v = ba(&a, "http", j).unwrap();
    assert_eq!(v[0], "http");
    assert_eq!(value_of(&v, "--urls"), Some("paper"));
    assert_eq!(value_of(&v, "--bursts"), Some("1,2,3"));
    assert_eq!(value_of(&v, "--think"), Some("100ms"));
    assert_eq!(value_of(&v, "--target"), Some("http://127.0.0.1:9/"));
    assert_eq!(v.iter().filter(|x| *x == "--target").count(), 1);
    assert_eq!(value_of(&v, "--conns"), Some("1000"));
    let mut b = args(CmpWorkload::Sessions);
    b.conns = vec![300];
    assert_eq!(
        value_of(&ba(&b, "http", j).unwrap(), "--conns"),
        Some("300")
    );

    for (w, n) in [(CmpWorkload::Kv1, "1"), (CmpWorkload::Kv100, "100")] {
        let v = ba(&args(w), "kv", j).unwrap();
        assert_eq!(v[0], "kv");
        assert_eq!(value_of(&v, "--txns-per-conn"), Some(n));
        assert_eq!(value_of(&v, "--get-ratio"), Some("1"));
        assert_eq!(value_of(&v, "--target"), Some("127.0.0.1:9"));
        assert!(ba(&args(w), "http", j).is_err());
    }
    // The existing kv workload stays keep-alive without a per-connection limit.
    let v = ba(&args(CmpWorkload::Kv), "kv", j).unwrap();
    assert_eq!(value_of(&v, "--txns-per-conn"), None);
    assert_eq!(CmpWorkload::Kv100.name(), "kv100");
    // Meta-protocol rows and their text-protocol companions.
    for (w, ratio, meta, name) in [
        (CmpWorkload::KvMeta, "1", true, "kv-meta"),
        (CmpWorkload::KvMetaSet, "0", true, "kv-meta-set"),
        (CmpWorkload::KvMetaMix, "0.9", true, "kv-meta-mix"),
        (CmpWorkload::KvSet, "0", false, "kv-set"),
        (CmpWorkload::KvMix, "0.9", false, "kv-mix"),
    ] {
        let v = ba(&args(w), "kv", j).unwrap();
        assert_eq!(v[0], "kv", "{name}");
        assert_eq!(value_of(&v, "--get-ratio"), Some(ratio), "{name}");
        assert_eq!(value_of(&v, "--keys"), Some("1000"), "{name}");
        assert_eq!(v.iter().any(|x| x == "--meta"), meta, "{name}");
        assert_eq!(value_of(&v, "--txns-per-conn"), None, "{name}");
        assert_eq!(w.name(), name);
        assert!(ba(&args(w), "http", j).is_err(), "{name}");
    }
    assert!(CmpWorkload::File64.needs_fileset() && !CmpWorkload::Crr.needs_fileset());
}

#[test]
fn file_set_configs_serve_the_generated_root() {
    let root = Path::new("/tmp/site");
    let n = nginx_conf(Path::new("/t"), 9, Some(root));
    assert!(n.contains("root /tmp/site;"), "{n}");
    assert!(
        n.contains("location / { }") && n.contains("open_file_cache max=8000"),
        "{n}"
    );
    assert!(!n.contains("/hello"), "{n}");
    assert_eq!(n.matches('{').count(), n.matches('}').count(), "{n}");
    let h = nginx_conf(Path::new("/t"), 9, None);
    assert!(
        h.contains("location = /hello") && !h.contains("root "),
        "{h}"
    );
    assert_eq!(h.matches('{').count(), h.matches('}').count(), "{h}");
    let l = lighttpd_conf(Path::new("/t"), 9, Some(root));
    assert!(l.contains("server.document-root = \"/tmp/site\""), "{l}");
    assert!(lighttpd_conf(Path::new("/t"), 9, None).contains("server.document-root = \"/t/www\""));
}

#[test]
fn presets_pick_the_file_set_for_corelocal_http() {
    let work = std::env::temp_dir().join(format!("cl-cmp-test-{}", std::process::id()));
    let mut a = args(CmpWorkload::File64);
    a.corelocal_bin = Some("/bin/corelocal".into());
    let d = preset("corelocal-http", &a, &work).unwrap();
    assert!(!d.cmd.contains("--root"), "{}", d.cmd);
    a.workload = CmpWorkload::Crr;
    let d = preset("corelocal-http", &a, &work).unwrap();
    assert!(d.cmd.contains("--root"), "{}", d.cmd);
    a.workload = CmpWorkload::Kv1;
    assert!(preset("corelocal-kv", &a, &work)
        .unwrap()
        .cmd
        .contains("serve kv"));
    assert!(preset("nope", &a, &work).is_err());
    let d = preset("corelocal-sockperf", &a, &work).unwrap();
    assert_eq!(d.proto, "sockperf");
    assert!(
        d.cmd
            .contains("serve sockperf --listen 127.0.0.1:{port} --cpus {cpu}"),
        "{}",
        d.cmd
    );
    if which("sockperf").is_some() {
        let d = preset("sockperf", &a, &work).unwrap();
        assert!(
            d.cmd.contains(" server -f ") && d.cmd.ends_with("/feed.txt -F epoll --nonblocked"),
            "{}",
            d.cmd
        );
        let feed = work.join("sockperf/feed.txt");
        assert_eq!(std::fs::read_to_string(feed).unwrap(), "T:127.0.0.1:9\n");
    }
    // No file set for workloads that do not need it; a failing generator is a clear error.
    assert_eq!(site(&a, &work).unwrap(), None);
    a.workload = CmpWorkload::Sessions;
    a.corelocal_bin = Some("/nonexistent/corelocal".into());
    let e = site(&a, &work).unwrap_err();
    assert!(e.contains("files gen"), "{e}");
    let _ = std::fs::remove_dir_all(&work);
}

fn parse(args: &[&str]) -> Result<CompareArgs, String> {
    let mut v = vec!["bench".to_string(), "compare".to_string()];
    v.extend(args.iter().map(|s| s.to_string()));
    match crate::cli::Standalone::try_parse_args(&v)?.workload {
        crate::cli::Workload::Compare(a) => Ok(a),
        w => Err(format!("parsed as {w:?}")),
    }
}

#[test]
fn conns_take_a_list() {
    let a = parse(&["--peer", "floor", "--conns", "16,64,256,1024"]).unwrap();
    assert_eq!(a.conns_list().unwrap(), [16, 64, 256, 1024]);
    // Repeating the flag works too, in the order given.
    let a = parse(&["--conns", "256", "--conns", "16"]).unwrap();
    assert_eq!(a.conns_list().unwrap(), [256, 16]);
    assert_eq!(parse(&[]).unwrap().conns_list().unwrap(), [64]);
    assert_eq!(
        parse(&["--workload", "sessions"])
            .unwrap()
            .conns_list()
            .unwrap(),
        [1000]
    );
    assert!(parse(&["--conns", "16,x"]).is_err());
    for bad in ["0,16", "16,16"] {
        let e = parse(&["--conns", bad]).unwrap().conns_list().unwrap_err();
        assert!(e.contains("--conns"), "{e}");
    }
    let many: Vec<String> = (1..=17).map(|c| c.to_string()).collect();
    assert!(parse(&["--conns", &many.join(",")])
        .unwrap()
        .conns_list()
        .is_err());
    // Each concurrency reaches its runs' bench arguments.
    let a = parse(&["--conns", "16,1024", "--port", "9"]).unwrap();
    for c in a.conns_list().unwrap() {
        let v = bench_args(&a, "http", c, Path::new("x.json")).unwrap();
        assert_eq!(value_of(&v, "--conns"), Some(c.to_string().as_str()));
    }
    // One concurrency keeps the old run file names; several tag each run with its own.
    assert_eq!(run_name(64, false, 2, "nginx"), "r2-nginx");
    assert_eq!(run_name(256, true, 2, "nginx"), "c256-r2-nginx");
}

#[test]
fn baseline_is_named_or_first() {
    let sv = |n: &str| ServerDef {
        name: n.into(),
        proto: "http".into(),
        cmd: "x".into(),
    };
    let servers = [sv("corelocal"), sv("nginx"), sv("floor")];
    assert_eq!(parse(&[]).unwrap().baseline_index(&servers), Ok(0));
    let a = parse(&["--baseline", "floor"]).unwrap();
    assert_eq!(a.baseline_index(&servers), Ok(2));
    let e = parse(&["--baseline", "apache"])
        .unwrap()
        .baseline_index(&servers)
        .unwrap_err();
    assert!(e.contains("apache") && e.contains("nginx"), "{e}");
}

fn fig(round: usize, us: f64, tp: f64, p99: f64) -> RunFig {
    RunFig {
        round,
        txns_per_s: tp,
        conns_per_s: tp,
        server_us_per_txn: Some(us),
        server_us_per_txn_utime: Some(us),
        server_runs_per_txn: None,
        server_cores: None,
        client_us_per_txn: None,
        p50_us: p99 / 4.0,
        p99_us: p99,
        p999_us: p99 * 2.0,
        errors: 0,
        load: String::new(),
        json: String::new(),
        spectrum: vec![(0.0, p99 / 8.0), (0.9, p99 / 2.0), (0.99, p99)],
    }
}

#[test]
fn table_per_concurrency_against_a_named_baseline() {
    let sv = |n: &str| ServerDef {
        name: n.into(),
        proto: "http".into(),
        cmd: "x".into(),
    };
    let servers = [sv("corelocal"), sv("nginx"), sv("floor")];
    let at = |conns: usize, k: f64| {
        let runs = vec![
            vec![fig(1, 10.0 * k, 100.0, 40.0), fig(2, 12.0 * k, 90.0, 50.0)],
            vec![fig(1, 16.0 * k, 80.0, 80.0), fig(2, 16.0 * k, 80.0, 60.0)],
            vec![fig(1, 14.0 * k, 85.0, 70.0), fig(2, 15.0 * k, 85.0, 70.0)],
        ];
        ConnsSummary {
            conns,
            baseline: "floor".into(),
            servers: summarize(&servers, &runs, &[vec![], vec![], vec![]], 2),
        }
    };
    let by_conns = [at(16, 1.0), at(1024, 2.0)];
    let s = &by_conns[1].servers;
    // Ratios against floor (index 2), not against the first server.
    assert_eq!(s[2].cpu_ratio_vs_baseline, Some(1.0));
    assert_eq!(s[1].cpu_ratio_vs_baseline, Some(32.0 / 29.0));
    assert_eq!(s[0].p99_us.unwrap().median, 45.0);
    assert_eq!(s[0].p999_us.unwrap().median, 90.0);
    let mut a = parse(&["--conns", "16,1024", "--baseline", "floor"]).unwrap();
    a.rounds = 2;
    let md = markdown(&a, &by_conns, "cmd", "0.1");
    // The headline: one row per concurrency, one column per server.
    assert!(
        md.contains(
            "ratio vs floor):\n\n| conns | corelocal | nginx | floor |\n|---|---|---|---|\n"
        ),
        "{md}"
    );
    assert!(
        md.contains("| 16 | 11.00 (0.759) | 16.00 (1.103) | 14.50 (1.000) |"),
        "{md}"
    );
    assert!(
        md.contains("| 1024 | 22.00 (0.759) | 32.00 (1.103) | 29.00 (1.000) |"),
        "{md}"
    );
    // Per concurrency and server: spread, ratio, throughput, p50, p99 and p99.9.
    assert!(
        md.contains(
            "| 1024 | nginx | 32.00 (32.00–32.00, ±0%) | 32.00 (32.00–32.00, ±0%) | 1.103 | \
             80 (80–80, ±0%) | 0.941 | 17.5 (15.0–20.0) | 70.0 (60.0–80.0) | 140.0 (120.0–160.0) | 0 |"
        ),
        "{md}"
    );
    assert!(md.contains("| 16 | corelocal | 2 | 90 |"), "{md}");
    assert!(
        md.contains("client on CPU 0 (16, 1024 connections)"),
        "{md}"
    );
    // 2 headline rows + 6 summary rows + 12 runs.
    assert_eq!(
        md.lines()
            .filter(|l| l.starts_with("| 16 |") || l.starts_with("| 1024 |"))
            .count(),
        20,
        "{md}"
    );
}

#[test]
fn percentile_plot_has_one_median_series_per_server() {
    let runs = [
        fig(1, 1.0, 1.0, 40.0),
        fig(2, 1.0, 1.0, 100.0),
        fig(3, 1.0, 1.0, 60.0),
    ];
    let m = median_spectrum(&runs);
    assert_eq!(m, [(0.0, 7.5), (0.9, 30.0), (0.99, 60.0)]);
    // A run on another grid (or from before the spectrum existed) is left out, not mixed in.
    let mut odd = fig(4, 1.0, 1.0, 1000.0);
    odd.spectrum[1].0 = 0.5;
    let mut none = fig(5, 1.0, 1.0, 1000.0);
    none.spectrum.clear();
    let more = [runs[0].clone(), runs[1].clone(), runs[2].clone(), odd, none];
    assert_eq!(median_spectrum(&more), m);
    assert!(median_spectrum(&[]).is_empty());
    let sv = |n: &str| ServerDef {
        name: n.into(),
        proto: "http".into(),
        cmd: "x".into(),
    };
    let c = ConnsSummary {
        conns: 64,
        baseline: "a".into(),
        servers: summarize(
            &[sv("a"), sv("b")],
            &[runs.to_vec(), vec![fig(1, 1.0, 1.0, 500.0)]],
            &[vec![], vec![]],
            0,
        ),
    };
    let svg = percentile_svg(&args(CmpWorkload::Crr), &c);
    assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
    assert!(
        svg.contains(">a</text>") && svg.contains(">b</text>"),
        "{svg}"
    );
    assert!(
        svg.contains("64 connections") && svg.contains(">99.9%<"),
        "{svg}"
    );
    assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
}

/// Both kv floors answer one `END` per request line, pipelined or not, and close on EOF:
/// a floor that answered wrongly would make every kv comparison against it meaningless.
#[test]
fn kv_floor_presets_answer_each_get_and_close_on_eof() {
    use std::io::{Read, Write};
    let work = std::env::temp_dir().join(format!("corelocal-kv-floors-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    for name in ["kv-floor", "kv-uring-floor"] {
        let def = preset(name, &args(CmpWorkload::Kv1), &work).unwrap();
        let (server, mut conn) = start_preset(&def);
        conn.write_all(b"get a\r\n").unwrap();
        let mut first = [0u8; 5];
        conn.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"END\r\n", "{name}");
        conn.write_all(b"get b\r\nget c\r\nget d\r\n").unwrap();
        conn.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        conn.read_to_end(&mut rest).unwrap();
        drop(server);
        assert_eq!(rest, b"END\r\n".repeat(3), "{name}");
    }
    std::fs::remove_dir_all(&work).unwrap();
}

/// A preset's server process, killed when dropped — also when an assertion fails first, so a
/// failing test does not leave it running (and holding the test's output open).
struct PresetServer(std::process::Child);

impl Drop for PresetServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a preset's server on a free port (its `{cpu}` is 0), returns it and a connection.
fn start_preset(def: &ServerDef) -> (PresetServer, std::net::TcpStream) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cmd = def
        .cmd
        .replace("{port}", &port.to_string())
        .replace("{cpu}", "0");
    let mut words = cmd.split_whitespace();
    let server = PresetServer(
        std::process::Command::new(words.next().unwrap())
            .args(words)
            .spawn()
            .unwrap(),
    );
    let conn = (0..200)
        .find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        })
        .unwrap_or_else(|| panic!("{} did not listen", def.name));
    conn.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    (server, conn)
}

/// The io_uring HTTP floor answers a request head split across reads (it counts
/// "\r\n\r\n", not reads), closes after the answer in one-shot mode (the FIN linked to
/// the answer) and answers pipelined heads on one connection with `keepalive`.
#[test]
fn http_uring_floor_answers_whole_heads_once_or_kept_alive() {
    use std::io::{Read, Write};
    let work = std::env::temp_dir().join(format!("corelocal-http-floor-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    const CLOSE: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n";
    const KA: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nhello\n";

    let def = preset("http-uring-floor", &args(CmpWorkload::Crr), &work).unwrap();
    let (server, mut conn) = start_preset(&def);
    conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r").unwrap();
    // Nothing before the head ends (a floor answering per read would answer here).
    conn.set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    let early = conn.read(&mut [0u8; 64]);
    assert!(
        matches!(&early, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
            || e.kind() == std::io::ErrorKind::TimedOut),
        "answered before the head ended: {early:?}"
    );
    conn.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    conn.write_all(b"\n").unwrap();
    let mut got = Vec::new();
    conn.read_to_end(&mut got).unwrap();
    assert_eq!(got, CLOSE, "{}", String::from_utf8_lossy(&got));
    drop(server);

    let def = preset("http-uring-floor", &args(CmpWorkload::Ka), &work).unwrap();
    assert!(def.cmd.ends_with(" keepalive"), "{}", def.cmd);
    let (server, mut conn) = start_preset(&def);
    conn.write_all(b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n")
        .unwrap();
    let mut two = vec![0u8; 2 * KA.len()];
    conn.read_exact(&mut two).unwrap();
    assert_eq!(two, [KA, KA].concat());
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    conn.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    drop(server);
    std::fs::remove_dir_all(&work).unwrap();
}

#[test]
fn bad_flags_are_named_before_any_round() {
    let ok = CompareArgs {
        server_cpu: 0,
        ..args(CmpWorkload::Crr)
    };
    assert_eq!(check_args(&ok), Ok(()));
    let scratch = corelocal::testing::ScratchDir::new("compare-flags");
    let file = scratch.join("f");
    std::fs::write(&file, "x").unwrap();
    for (a, want) in [
        (
            CompareArgs {
                rounds: 0,
                ..ok.clone()
            },
            "--rounds 0: must be 1 to 50",
        ),
        (
            CompareArgs {
                server_cpu: 8000,
                ..ok.clone()
            },
            "--server-cpu 8000: CPU 8000 is not online",
        ),
        (
            CompareArgs {
                client_cpus: "x".into(),
                ..ok.clone()
            },
            "--client-cpus x: invalid CPU set",
        ),
        (
            CompareArgs {
                client_cpus: "7999".into(),
                ..ok.clone()
            },
            "--client-cpus 7999: CPU 7999",
        ),
        (
            CompareArgs {
                corelocal_bin: Some(scratch.join("none")),
                ..ok.clone()
            },
            "--corelocal-bin",
        ),
        (
            CompareArgs {
                out: file.clone(),
                ..ok.clone()
            },
            "is a file, not a directory",
        ),
    ] {
        let e = check_args(&a).unwrap_err();
        assert!(e.contains(want), "{want}: {e}");
    }
}
