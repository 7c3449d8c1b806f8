//! Tests of argument building, presets and the summary table.

use super::peers::site;
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
        server_cores: None,
        client_us_per_txn: None,
        p50_us: 0.0,
        p99_us: 0.0,
        errors: 0,
        load: String::new(),
        json: String::new(),
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
            conns: Some(64),
            server_cpu: 1,
            client_cpus: "0".into(),
            port: 8080,
            out: "results".into(),
            corelocal_bin: None,
            floor_bin: None,
            no_netns: false,
            extra: vec![],
        },
        &sums,
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
        conns: Some(8),
        server_cpu: 1,
        client_cpus: "0".into(),
        port: 9,
        out: "r".into(),
        corelocal_bin: None,
        floor_bin: None,
        no_netns: true,
        extra: vec!["--engine".into(), "epoll".into()],
    };
    let v = bench_args(&a, "http", Path::new("x.json")).unwrap();
    assert_eq!(&v[..5], ["http", "--bursts", "1000", "--think", "0"]);
    assert!(v
        .windows(2)
        .any(|w| w == ["--target", "http://127.0.0.1:9/hello"]));
    assert_eq!(&v[v.len() - 2..], ["--engine", "epoll"]);
    assert!(bench_args(&a, "kv", Path::new("x")).is_err());
    let v = bench_args(&a, "sockperf", Path::new("x.json")).unwrap();
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
    let v = bench_args(&c, "sockperf", Path::new("x.json")).unwrap();
    assert_eq!(&v[..5], ["crr", "--proto", "sockperf", "--msg-size", "64"]);
    c.workload = CmpWorkload::Kv1;
    assert!(bench_args(&c, "sockperf", Path::new("x")).is_err());
    assert_eq!(
        parse_server("sp=sockperf:./s {port}").unwrap().proto,
        "sockperf"
    );
    assert!(nginx_conf(Path::new("/t"), 9, None).contains("listen 127.0.0.1:9 reuseport"));
    assert!(lighttpd_conf(Path::new("/t"), 9, None).contains("server.port = 9"));
}

fn args(w: CmpWorkload) -> CompareArgs {
    CompareArgs {
        peer: vec![],
        server: vec![],
        workload: w,
        rounds: 1,
        duration: Dur(1_000_000_000),
        warmup: Dur(0),
        conns: None,
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

fn value_of<'a>(v: &'a [String], flag: &str) -> Option<&'a str> {
    v.windows(2).find(|w| w[0] == flag).map(|w| w[1].as_str())
}

#[test]
fn new_workloads_build_their_bench_arguments() {
    let j = Path::new("x.json");
    let a = args(CmpWorkload::File64);
    let v = bench_args(&a, "http", j).unwrap();
    assert_eq!(&v[..5], ["crr", "--proto", "http", "--path", "/64.txt"]);
    assert_eq!(value_of(&v, "--target"), Some("127.0.0.1:9"));
    assert_eq!(value_of(&v, "--conns"), Some("64"));
    assert!(bench_args(&a, "kv", j).is_err());

    let a = args(CmpWorkload::Sessions);
    let v = bench_args(&a, "http", j).unwrap();
    assert_eq!(v[0], "http");
    assert_eq!(value_of(&v, "--urls"), Some("paper"));
    assert_eq!(value_of(&v, "--bursts"), Some("1,2,3"));
    assert_eq!(value_of(&v, "--think"), Some("100ms"));
    assert_eq!(value_of(&v, "--target"), Some("http://127.0.0.1:9/"));
    assert_eq!(v.iter().filter(|x| *x == "--target").count(), 1);
    assert_eq!(value_of(&v, "--conns"), Some("1000"));
    let mut b = args(CmpWorkload::Sessions);
    b.conns = Some(300);
    assert_eq!(
        value_of(&bench_args(&b, "http", j).unwrap(), "--conns"),
        Some("300")
    );

    for (w, n) in [(CmpWorkload::Kv1, "1"), (CmpWorkload::Kv100, "100")] {
        let v = bench_args(&args(w), "kv", j).unwrap();
        assert_eq!(v[0], "kv");
        assert_eq!(value_of(&v, "--txns-per-conn"), Some(n));
        assert_eq!(value_of(&v, "--get-ratio"), Some("1"));
        assert_eq!(value_of(&v, "--target"), Some("127.0.0.1:9"));
        assert!(bench_args(&args(w), "http", j).is_err());
    }
    // The existing kv workload stays keep-alive without a per-connection limit.
    let v = bench_args(&args(CmpWorkload::Kv), "kv", j).unwrap();
    assert_eq!(value_of(&v, "--txns-per-conn"), None);
    assert_eq!(CmpWorkload::Kv100.name(), "kv100");
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
