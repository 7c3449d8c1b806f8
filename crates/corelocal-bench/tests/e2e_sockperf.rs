//! `bench rpc|crr --proto sockperf` against the real sockperf server (`--tcp -i -p`, and the
//! address-list form with epoll that `bench compare` runs): exact message counts on both sides
//! (the server's own "Total N messages received and handled" on SIGINT), every engine.
//! Needs sockperf: skipped with a reason when missing, a failure under CI=true
//! (.ci/run installs it). No assertion is on a measured speed.

use clap::Parser;
use corelocal_bench::cli::{to_spec, Command};
use corelocal_bench::report::Report;
use corelocal_bench::runner::{run_once, Overrides};
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The tests here run one at a time: each picks its sockperf server's port by binding port 0
/// and letting it go, so two at once could pick the same port; the second sockperf then fails
/// to bind, and its probe and its bench reach the first one's server (seen once in CI: a
/// server with no count to print).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(flatten)]
    c: Command,
}

fn run(args: &[&str]) -> Report {
    let mut v = vec!["bench"];
    v.extend_from_slice(args);
    v.extend_from_slice(&["--progress", "never", "--cpus", "0", "--timeout", "10s"]);
    let spec = to_spec(Cli::try_parse_from(v).expect("args parse").c.workload).expect("spec");
    run_once(&spec, Overrides::default()).expect("run")
}

fn have_sockperf() -> bool {
    let found = std::process::Command::new("sockperf")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found && std::env::var("CI").as_deref() == Ok("true") {
        panic!("sockperf is not installed but CI=true: .ci/run must install it (apt-get install sockperf)");
    }
    if !found {
        eprintln!("SKIP: sockperf is not installed");
    }
    found
}

/// `sockperf server --tcp` on a free loopback port.
struct SockperfServer {
    child: Child,
    port: u16,
}

impl SockperfServer {
    /// With `feed`, the form `bench compare`'s preset runs: an address list (`-f`), which gets
    /// sockperf's epoll loop; else `--tcp -i -p`, which blocks in recvfrom() per connection.
    fn start(feed: Option<&std::path::Path>) -> SockperfServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = std::process::Command::new("sockperf");
        match feed {
            Some(path) => {
                std::fs::write(path, corelocal_bench::compare::sockperf_feed(port)).unwrap();
                cmd.arg("server")
                    .arg("-f")
                    .arg(path)
                    .args(["-F", "epoll", "--nonblocked"])
            }
            None => cmd.args([
                "server",
                "--tcp",
                "-i",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ]),
        };
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sockperf server");
        let end = Instant::now() + Duration::from_secs(10);
        // The probe sends nothing, so the server's message count stays the bench's.
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < end, "sockperf server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        SockperfServer { child, port }
    }

    fn target(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGINT, then the count sockperf prints: "Total N messages received and handled".
    fn stop_and_count(mut self) -> u64 {
        // SAFETY: signalling our own child process, which has not been reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let mut out = String::new();
        let mut stdout = self.child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || {
            let _ = stdout.read_to_string(&mut out);
            out
        });
        let end = Instant::now() + Duration::from_secs(10);
        while !matches!(self.child.try_wait(), Ok(Some(_))) {
            if Instant::now() > end {
                let _ = self.child.kill();
                panic!("sockperf server did not exit on SIGINT");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = reader.join().unwrap();
        out.split("Total ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no message count in sockperf's output: {out}"))
    }
}

impl Drop for SockperfServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn engines() -> Vec<&'static str> {
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map(|s| s.trim() != "0")
        .unwrap_or(false);
    if disabled {
        vec!["epoll"]
    } else {
        vec!["uring", "uring-fd", "epoll"]
    }
}

#[test]
fn rpc_proto_sockperf_exact_counts_against_sockperf_server() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !have_sockperf() {
        return;
    }
    let feed = std::env::temp_dir().join(format!("corelocal-sockperf-feed-{}", std::process::id()));
    for engine in engines() {
        for (size, requests, conns, list) in [
            ("64", 3000u64, "4", None),
            ("65507", 200, "4", None),
            ("64", 3000, "64", Some(feed.as_path())),
        ] {
            let srv = SockperfServer::start(list);
            let r = run(&[
                "rpc",
                "--proto",
                "sockperf",
                "--target",
                &srv.target(),
                "--msg-size",
                size,
                "--txns-per-conn",
                "0",
                "--conns",
                conns,
                "--requests",
                &requests.to_string(),
                "--engine",
                engine,
            ]);
            let handled = srv.stop_and_count();
            assert_eq!(
                r.errors.total, 0,
                "{engine} -m {size}: {:?}",
                r.errors.by_kind
            );
            assert_eq!(r.throughput.txns, requests, "{engine} -m {size}");
            assert_eq!(r.latency.txn.count, requests);
            let bytes = requests * size.parse::<u64>().unwrap();
            assert_eq!(
                (r.throughput.bytes_out, r.throughput.bytes_in),
                (bytes, bytes)
            );
            assert_eq!(
                handled, requests,
                "{engine} -m {size} --conns {conns}: sockperf's own count"
            );
        }
    }
    let _ = std::fs::remove_file(&feed);
}

#[test]
fn crr_proto_sockperf_one_message_per_connection() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !have_sockperf() {
        return;
    }
    let srv = SockperfServer::start(None);
    let r = run(&[
        "crr",
        "--proto",
        "sockperf",
        "--target",
        &srv.target(),
        "--msg-size",
        "100",
        "--conns",
        "4",
        "--requests",
        "300",
    ]);
    let handled = srv.stop_and_count();
    assert_eq!(r.errors.total, 0, "{:?}", r.errors.by_kind);
    assert_eq!((r.throughput.units, r.throughput.txns), (300, 300));
    assert_eq!(r.throughput.bytes_in, 300 * 100);
    assert_eq!(handled, 300);
}
