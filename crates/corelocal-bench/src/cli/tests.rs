//! Tests of argument parsing: durations, source specs, targets, URL lists and flag errors.

use super::*;
use clap::Parser;
use std::net::{Ipv4Addr, SocketAddrV4};

#[derive(Debug, clap::Parser)]
struct T {
    #[command(flatten)]
    c: Command,
}

#[test]
fn durations() {
    assert_eq!("100ms".parse::<Dur>().unwrap().ns(), 100_000_000);
    assert_eq!("1.5s".parse::<Dur>().unwrap().ns(), 1_500_000_000);
    assert_eq!("2".parse::<Dur>().unwrap().ns(), 2_000_000_000);
    assert_eq!("2m".parse::<Dur>().unwrap().ns(), 120_000_000_000);
    assert_eq!("250us".parse::<Dur>().unwrap().ns(), 250_000);
    assert!("10 parsecs".parse::<Dur>().is_err());
    assert!("-1s".parse::<Dur>().is_err());
    assert!("".parse::<Dur>().is_err());
    assert_eq!(Dur(100_000_000).to_string(), "100ms");
    assert_eq!(Dur(3_000_000_000).to_string(), "3s");
}

#[test]
fn source_specs() {
    let t: SocketAddrV4 = "127.0.0.1:80".parse().unwrap();
    assert_eq!(SrcSpec::Auto.addrs(&t).len(), 200);
    assert!(SrcSpec::Auto
        .addrs(&"10.1.1.1:80".parse().unwrap())
        .is_empty());
    let s: SrcSpec = "127.0.0.0/8".parse().unwrap();
    let a = s.addrs(&t);
    assert_eq!(a.len(), 4064); // 4096 addresses from 127.0.0.1, less each /24's .0 and .255
    assert_eq!(a[0], Ipv4Addr::new(127, 0, 0, 1));
    assert!(a.iter().all(|x| x.octets()[3] != 0 && x.octets()[3] != 255));
    let r: SrcSpec = "127.0.0.2-127.0.0.4".parse().unwrap();
    assert_eq!(r.addrs(&t).len(), 3);
    assert_eq!("127.0.0.9".parse::<SrcSpec>().unwrap().addrs(&t).len(), 1);
    assert!("127.0.0.9-127.0.0.1".parse::<SrcSpec>().is_err());
    assert!("1.2.3.4/40".parse::<SrcSpec>().is_err());
    assert!("nonsense".parse::<SrcSpec>().is_err());
}

#[test]
fn targets_and_url_lists() {
    let (a, hp, p) = resolve("http://127.0.0.1:8080/x/y").unwrap();
    assert_eq!(
        (a.port(), hp.as_str(), p.as_str()),
        (8080, "127.0.0.1:8080", "/x/y")
    );
    assert_eq!(resolve("127.0.0.1:7000").unwrap().0.port(), 7000);
    assert!(resolve("https://127.0.0.1/").is_err());
    assert!(resolve("127.0.0.1").is_err());
    assert_eq!(
        parse_urls("# c\n/a\n\nhttp://h:1/b\n").unwrap(),
        vec!["/a", "/b"]
    );
    assert!(parse_urls("a b\n").is_err());
}

#[test]
fn invalid_flags_are_clear_errors() {
    let e = T::try_parse_from(["t", "rpc", "--target", "127.0.0.1:1", "--cpus", "x"]).unwrap_err();
    assert!(e.to_string().contains("--cpus"), "{e}");
    let e = T::try_parse_from(["t", "crr", "--target", "127.0.0.1:1", "--duration", "ten"])
        .unwrap_err();
    assert!(e.to_string().contains("bad duration"), "{e}");
    let t = T::try_parse_from(["t", "kv", "--target", "127.0.0.1:1", "--get-ratio", "2"]).unwrap();
    assert!(execute(t.c).unwrap_err().contains("--get-ratio"));
    let t = T::try_parse_from(["t", "http", "--target", "127.0.0.1:1", "--bursts", "1,0"]).unwrap();
    assert!(execute(t.c).unwrap_err().contains("--bursts"));
    let t = T::try_parse_from(["t", "rpc", "--target", "127.0.0.1:1", "--rate=-5"]).unwrap();
    assert!(execute(t.c).unwrap_err().contains("--rate"));
    for (args, want) in [
        (
            &["rpc", "--proto", "sockperf", "--msg-size", "13"][..],
            "14..=65507",
        ),
        (
            &["rpc", "--proto", "sockperf", "--msg-size", "65508"][..],
            "14..=65507",
        ),
        (
            &["rpc", "--proto", "sockperf", "--resp-size", "100"][..],
            "--resp-size",
        ),
        (
            &["crr", "--proto", "sockperf", "--close", "server"][..],
            "never close",
        ),
    ] {
        let mut v = vec!["t"];
        v.extend_from_slice(args);
        v.extend_from_slice(&["--target", "127.0.0.1:1"]);
        let e = execute(T::try_parse_from(v).unwrap().c).unwrap_err();
        assert!(e.contains(want), "{args:?}: {e}");
    }
    let t = T::try_parse_from([
        "t",
        "http",
        "--target",
        "http://127.0.0.1:8/",
        "--bursts",
        "1,2,3",
        "--think",
        "100ms",
    ])
    .unwrap();
    match t.c.workload {
        Workload::Http(h) => assert_eq!((h.bursts, h.think.ns()), (vec![1, 2, 3], 100_000_000)),
        _ => unreachable!(),
    }
}

/// `execute` of `bench WORKLOAD --target 127.0.0.1:1 ARGS`: its error (validation comes
/// before the target is probed).
fn bench_error(workload: &str, args: &[&str]) -> String {
    let mut v = vec!["t", workload, "--target", "127.0.0.1:1"];
    v.extend_from_slice(args);
    execute(T::try_parse_from(v).unwrap().c).unwrap_err()
}

#[test]
fn bad_values_are_named_with_what_would_be_right() {
    let scratch = corelocal::testing::ScratchDir::new("bench-flags");
    let dir = scratch.display().to_string();
    let file = scratch.join("f");
    std::fs::write(&file, "x").unwrap();
    let under_file = file.join("x.json").display().to_string();
    let missing = scratch.join("gone").display().to_string();
    for (workload, args, want) in [
        ("rpc", &["--cpus", "0-8000"][..], "--cpus 0-8000: CPUs"),
        ("rpc", &["--cpus", "0-8000"][..], "not online on this host"),
        ("rpc", &["--conns", "0"][..], "--conns 0: at least 1"),
        (
            "rpc",
            &["--conns", "2000000"][..],
            "--conns 2000000: at most 1000000",
        ),
        (
            "rpc",
            &["--duration", "0"][..],
            "--duration 0: must be positive, e.g. --duration 10s",
        ),
        (
            "rpc",
            &["--timeout", "0"][..],
            "--timeout 0: must be positive",
        ),
        (
            "rpc",
            &["--requests", "0"][..],
            "--requests 0: must be at least 1",
        ),
        (
            "rpc",
            &["--recv-buf", "1"][..],
            "--recv-buf 1: must be 64 to 16777216",
        ),
        (
            "rpc",
            &["--max-error-rate", "5"][..],
            "--max-error-rate 5: a fraction from 0 to 1",
        ),
        (
            "rpc",
            &["--rate-search", "--search-probes", "0"][..],
            "--search-probes 0",
        ),
        (
            "rpc",
            &["--rate-search", "--search-start", "0"][..],
            "--search-start 0",
        ),
        (
            "rpc",
            &["--msg-size", "0"][..],
            "--msg-size 0: must be 1 to 16777216",
        ),
        (
            "rpc",
            &["--resp-size", "99999999999"][..],
            "--resp-size 99999999999",
        ),
        (
            "crr",
            &["--proto", "rpc", "--msg-size", "99999999999"][..],
            "--msg-size 99999999999",
        ),
        (
            "rpc",
            &["--server-pid", "2147483647"][..],
            "--server-pid 2147483647: no process",
        ),
        (
            "rpc",
            &["--server-stats", &missing][..],
            "no such file; give the file the server",
        ),
        (
            "rpc",
            &["--json", &dir][..],
            "is a directory; give a file path such as",
        ),
        (
            "rpc",
            &["--md", &under_file][..],
            "is a file, not a directory",
        ),
        (
            "rpc",
            &["--src", "192.0.2.1"][..],
            "--src 192.0.2.1: 192.0.2.1 is not an address of this host",
        ),
        (
            "kv",
            &["--keys", "0"][..],
            "--keys 0: the key space needs at least 1 key",
        ),
        (
            "kv",
            &["--get-ratio", "1.5"][..],
            "--get-ratio 1.5: a fraction from 0 to 1",
        ),
        (
            "kv",
            &["--value-size", "2000000000"][..],
            "--value-size 2000000000: at most",
        ),
        ("kv", &["--key-prefix", "a b"][..], "--key-prefix \"a b\""),
        (
            "http",
            &["--bursts", "1,0"][..],
            "--bursts 1,0: every burst needs at least 1",
        ),
        ("http", &["--urls", &missing][..], "cannot read it"),
    ] {
        let e = bench_error(workload, args);
        assert!(e.contains(want), "{workload} {args:?}: {e}");
    }
}

#[test]
fn targets_say_what_is_missing() {
    for (target, want) in [
        ("127.0.0.1", "--target 127.0.0.1: no port; write HOST:PORT"),
        (
            "127.0.0.1:99999",
            "port \"99999\" is not a number from 1 to 65535",
        ),
        ("ftp://127.0.0.1:21/", "unsupported scheme"),
        (
            "no-such-host.invalid:80",
            "cannot resolve host \"no-such-host.invalid\"",
        ),
    ] {
        let e = resolve(target).unwrap_err();
        assert!(e.contains(want), "{target}: {e}");
    }
}
