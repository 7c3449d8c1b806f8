//! Tests of the argument parsers.

use super::common::{parse_takeover, Takeover};

#[test]
fn takeover_takes_a_pid_or_a_path() {
    assert_eq!(parse_takeover("4242"), Ok(Takeover::Pid(4242)));
    for path in ["./4242", "/run/corelocal.sock", "up.sock", "-x"] {
        assert_eq!(parse_takeover(path), Ok(Takeover::Socket(path.into())));
    }
    for (bad, why) in [
        ("1", "not a server's process id"),
        ("0", "not a server's process id"),
        ("-5", "not a server's process id"),
        ("99999999999", "out of range"),
        ("", "expected a process id or a unix socket path"),
    ] {
        let e = parse_takeover(bad).unwrap_err();
        assert!(e.contains(why), "{bad:?}: {e}");
    }
}

#[test]
fn balancer_pairs_name_the_bad_part_and_a_right_one() {
    use super::common::{parse_share, parse_watermarks};
    assert_eq!(parse_share("5:1"), Ok((5, 1)));
    assert_eq!(parse_watermarks("75:10"), Ok((75, 10)));
    for (bad, why) in [
        ("0:0", "each share must be 1 to 1000, got 0:0"),
        ("5:1001", "got 5:1001"),
        ("5", "expected LOCAL:REMOTE, e.g. 5:1"),
        ("a:1", "\"a\" is not a whole number"),
    ] {
        let e = parse_share(bad).unwrap_err();
        assert!(e.contains(why), "{bad}: {e}");
    }
    for (bad, why) in [
        ("10:75", "LOW 75 is above HIGH 10"),
        ("10:75", "did you mean 75:10?"),
        ("200:10", "HIGH 200 is not a percentage"),
        ("0:0", "HIGH 0 is not a percentage"),
        ("75", "expected HIGH:LOW percentages"),
    ] {
        let e = parse_watermarks(bad).unwrap_err();
        assert!(e.contains(why), "{bad}: {e}");
    }
}

#[test]
fn cpus_parse_errors_show_the_forms() {
    use super::common::parse_cpus;
    let e = parse_cpus("abc").unwrap_err();
    assert!(
        e.contains("\"abc\"") && e.contains("a cpulist like 0-3,8"),
        "{e}"
    );
    let e = parse_cpus(" ").unwrap_err();
    assert!(e.starts_with("empty CPU set"), "{e}");
}

/// `corelocal serve` with no flags runs what the library calls its recommended configuration
/// (`ServerConfig::recommended`, documented as `corelocal serve`'s defaults): the two must not
/// drift apart.
#[test]
fn the_defaults_are_the_librarys_recommended_config() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        common: super::CommonArgs,
    }
    let cli = Cli::try_parse_from(["serve", "--listen", "127.0.0.1:0"]).unwrap();
    let ours = super::config::server_config(&cli.common).unwrap();
    let cpus = corelocal::cpu::current_affinity().unwrap();
    let lib = corelocal::runtime::ServerConfig::recommended(cli.common.listen.clone(), &cpus);
    assert_eq!(ours.backend, lib.backend);
    assert_eq!(ours.limits, lib.limits);
    assert_eq!(ours.balance, lib.balance);
    assert_eq!(ours.xdp_iface, lib.xdp_iface);
    assert_eq!(ours.gated, lib.gated);
    let (o, l) = (&ours.listen, &lib.listen);
    assert_eq!(o.addrs, l.addrs);
    assert_eq!(o.worker_cpus, l.worker_cpus);
    assert_eq!(o.mode, l.mode);
    assert_eq!(o.steering, l.steering);
    assert_eq!(o.backlog_total, l.backlog_total);
    assert_eq!(o.flow_groups, l.flow_groups);
    assert_eq!(o.defer_accept_s, l.defer_accept_s);
    assert_eq!(o.defer_accept_adaptive, l.defer_accept_adaptive);
    assert_eq!(o.join_existing, l.join_existing);
}
