//! Bad flag values stop `corelocal` before anything starts, with a message that names the
//! flag and the value, says what is wrong and what would be right (issue 22, finding 4).
//! Each case runs the binary and checks the exit status and the message's parts.

mod common;

use common::BIN;
use corelocal::testing::ScratchDir;
use std::path::Path;
use std::process::Command;

/// Runs `corelocal ARGS`, expects exit status `code` and every one of `parts` in its standard
/// error, and that no server started.
fn fails(args: &[&str], code: i32, parts: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .output()
        .expect("run corelocal");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    for part in parts {
        assert!(err.contains(part), "{args:?}: no {part:?} in: {err}");
    }
    assert!(!err.contains("listening on"), "{args:?} started: {err}");
    err
}

/// `serve http` on an ephemeral port with `args`.
fn serve(args: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "serve",
        "http",
        "--listen",
        "127.0.0.1:0",
        "--stats-interval",
        "0",
    ]
    .map(String::from)
    .to_vec();
    v.extend(args.iter().map(|a| a.to_string()));
    v
}

fn serve_fails(args: &[&str], code: i32, parts: &[&str]) -> String {
    let v = serve(args);
    let refs: Vec<&str> = v.iter().map(String::as_str).collect();
    fails(&refs, code, parts)
}

fn show(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn cpus_that_are_not_online_are_named_with_the_usable_ones() {
    let online = corelocal::cpu::online().expect("online CPUs");
    let top = online.max().unwrap();
    let asked = format!("0-{}", top + 6);
    let missing = format!("CPUs {}-{} are not online", top + 1, top + 6);
    let probe = corelocal::cpu::CpuSet::single(top + 1);
    let can_use = corelocal::cpu::unavailable(&probe)
        .expect("CPU beyond the online ones")
        .usable;
    let usable = format!("CPUs this process can use: {can_use}");
    serve_fails(
        &["--cpus", &asked],
        1,
        &[
            &format!("--cpus {asked}: "),
            &missing,
            &usable,
            "leave --cpus out",
        ],
    );
    let one = (top + 3).to_string();
    serve_fails(
        &["--cpus", &one],
        1,
        &[&format!("--cpus {one}: CPU {one} is not online"), &usable],
    );
    serve_fails(&["--cpus", "0-x"], 2, &["\"0-x\"", "a cpulist like 0-3,8"]);
}

#[test]
fn a_missing_or_wrong_root_is_named_with_the_part_that_is_missing() {
    let t = ScratchDir::new("startup-root");
    let missing = t.join("no/www");
    serve_fails(
        &["--root", &show(&missing)],
        1,
        &[
            &format!("--root {}: no such directory", show(&missing)),
            &format!("{} exists, {} does not", show(&t), show(&t.join("no"))),
            "leave --root out to serve the built-in site",
        ],
    );
    let file = t.join("index.html");
    std::fs::write(&file, "hi").unwrap();
    serve_fails(
        &["--root", &show(&file)],
        1,
        &[&format!(
            "--root {}: is a regular file, not a directory",
            show(&file)
        )],
    );
}

#[test]
fn output_files_must_be_files_in_existing_directories() {
    let t = ScratchDir::new("startup-out");
    serve_fails(
        &["--access-log", &show(&t)],
        1,
        &[
            &format!("--access-log {}: is a directory", show(&t)),
            &show(&t.join("access.log")),
            "--access-log off or stderr",
        ],
    );
    let nested = t.join("logs/stats.jsonl");
    serve_fails(
        &["--stats-file", &show(&nested)],
        1,
        &[
            &format!("--stats-file {}: its directory is missing", show(&nested)),
            "create it first",
        ],
    );
    serve_fails(
        &["--upgrade-socket", &show(&t)],
        1,
        &[
            &format!("--upgrade-socket {}: is a directory", show(&t)),
            &show(&t.join("corelocal.sock")),
        ],
    );
}

#[test]
fn listen_addresses_say_what_is_wrong() {
    fails(
        &["serve", "http", "--listen", "localhost:8080"],
        2,
        &["localhost:8080", "host name", "127.0.0.1:8080"],
    );
    fails(
        &["serve", "http", "--listen", "127.0.0.1"],
        2,
        &["no port: write 127.0.0.1:PORT"],
    );
    fails(
        &["serve", "http", "--listen", "127.0.0.1:70000"],
        2,
        &["port 70000 is out of range (0 to 65535)"],
    );
    // 192.0.2.0/24 is TEST-NET-1: never an address of this host.
    fails(
        &[
            "serve",
            "http",
            "--listen",
            "192.0.2.1:8080",
            "--stats-interval",
            "0",
        ],
        1,
        &[
            "--listen 192.0.2.1:8080: 192.0.2.1 is not an address of this host",
            "0.0.0.0 for all addresses",
        ],
    );
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let (a, port) = (addr.to_string(), addr.port());
    fails(
        &[
            "serve",
            "http",
            "--listen",
            &a,
            "--mode",
            "stock",
            "--stats-interval",
            "0",
        ],
        1,
        &[
            &format!("--listen {a}: port {port} is in use"),
            "choose another port",
        ],
    );
    serve_fails(
        &["--metrics", &a],
        1,
        &[&format!("--metrics {a}: port {port} is in use")],
    );
    fails(
        &[
            "serve",
            "kv",
            "--listen",
            "127.0.0.1:11999",
            "--listen",
            "127.0.0.1:11999",
        ],
        1,
        &["--listen 127.0.0.1:11999 is given twice"],
    );
}

#[test]
fn zero_durations_and_counts_are_refused_with_an_example() {
    for (flag, example) in [
        ("--idle-timeout", "60s"),
        ("--migrate-interval", "100ms"),
        ("--takeover-timeout", "10s"),
        ("--header-timeout", "10s"),
    ] {
        serve_fails(
            &[flag, "0"],
            1,
            &[&format!(
                "{flag} 0: must be positive, e.g. {flag} {example}"
            )],
        );
    }
    serve_fails(&["--backlog", "0"], 2, &["'0' for '--backlog", "1..="]);
    serve_fails(
        &["--cache-mb", "99999999999"],
        2,
        &["99999999999", "0..=1048576"],
    );
}

#[test]
fn balancer_pairs_are_checked_when_parsed() {
    serve_fails(
        &["--balance-share", "0:0"],
        2,
        &[
            "'0:0' for '--balance-share",
            "each share must be 1 to 1000",
            "e.g. 5:1",
        ],
    );
    serve_fails(
        &["--busy-watermarks", "10:75"],
        2,
        &[
            "'10:75' for '--busy-watermarks",
            "LOW 75 is above HIGH 10",
            "did you mean 75:10?",
        ],
    );
}

#[test]
fn conflicting_and_missing_targets_are_named() {
    serve_fails(
        &["--mode", "fine", "--steering", "cbpf"],
        1,
        &[
            "--steering cbpf applies to --mode local only",
            "drop --steering",
        ],
    );
    let me = std::process::id().to_string();
    serve_fails(
        &["--mode", "fine", "--takeover", &me],
        1,
        &[
            &format!("--takeover {me} (a process id)"),
            "needs --mode local with eBPF steering (got --mode fine)",
            "--takeover SOCKET",
        ],
    );
    serve_fails(
        &["--steering", "incoming-cpu", "--takeover", &me],
        1,
        &["(got --mode local --steering incoming-cpu)"],
    );
    let mut gone = Command::new("true").spawn().expect("spawn true");
    let dead = gone.id().to_string();
    gone.wait().unwrap();
    serve_fails(
        &["--takeover", &dead],
        1,
        &[
            &format!("--takeover {dead}: no process {dead} is running"),
            "pgrep",
        ],
    );
    let t = ScratchDir::new("startup-takeover");
    serve_fails(
        &["--takeover", &show(&t)],
        1,
        &[
            &format!("--takeover {}: is a directory, not a unix socket", show(&t)),
            "--upgrade-socket",
        ],
    );
    serve_fails(
        &["--xdp-iface", "nosuch0"],
        1,
        &[
            "--xdp-iface nosuch0: no such network interface; interfaces here: ",
            "lo",
        ],
    );
}

#[test]
fn bench_checks_its_flags_before_it_connects() {
    let t = ScratchDir::new("startup-bench");
    let online = corelocal::cpu::online().expect("online CPUs");
    let beyond = (online.max().unwrap() + 4).to_string();
    // Port 1 on loopback refuses: any message below comes before the connect.
    let bench = |args: &[&str], parts: &[&str]| {
        let mut v = vec![
            "bench",
            "rpc",
            "--target",
            "127.0.0.1:1",
            "--progress",
            "never",
        ];
        v.extend_from_slice(args);
        let err = fails(&v, 2, parts);
        assert!(!err.contains("cannot connect"), "{args:?}: {err}");
    };
    bench(
        &["--cpus", &beyond],
        &[
            &format!("--cpus {beyond}: CPU {beyond} is not online"),
            "can use: ",
        ],
    );
    bench(
        &["--json", &show(&t)],
        &[
            &format!("--json {}: is a directory", show(&t)),
            "bench.json",
        ],
    );
    bench(
        &["--server-pid", "2147483647"],
        &["--server-pid 2147483647: no process 2147483647 is running"],
    );
    bench(
        &["--src", "192.0.2.7"],
        &[
            "--src 192.0.2.7: 192.0.2.7 is not an address of this host",
            "--src auto",
        ],
    );
    bench(
        &["--timeout", "0"],
        &["--timeout 0: must be positive, e.g. --timeout 5s"],
    );
    bench(
        &["--msg-size", "99999999999"],
        &["--msg-size 99999999999: must be 1 to 16777216 bytes"],
    );
    bench(
        &["--conns", "100000000"],
        &["--conns 100000000: at most 1000000"],
    );
    bench(
        &["--max-error-rate", "5"],
        &["--max-error-rate 5: a fraction from 0 to 1"],
    );
    fails(
        &["bench", "rpc", "--target", "127.0.0.1"],
        2,
        &["--target 127.0.0.1: no port; write HOST:PORT"],
    );
    fails(
        &["bench", "rpc", "--target", "127.0.0.1:1"],
        2,
        &["cannot connect to 127.0.0.1:1", "is the server running"],
    );
}

#[test]
fn sim_files_top_tune_sweep_and_steer_name_their_bad_values() {
    let t = ScratchDir::new("startup-tools");
    fails(
        &["sim", "--hog-start", "5", "--hog-end", "1"],
        2,
        &["--hog-end 1: before --hog-start 5"],
    );
    fails(
        &["sim", "--cores", "0"],
        2,
        &["--cores 0: a number of cores from 1 to 1024"],
    );
    fails(
        &["sim", "--groups", "1000"],
        2,
        &["--groups 1000: must be a power of two"],
    );
    fails(
        &["sim", "--svg", &show(&t)],
        2,
        &[&format!("--svg {}: is a directory", show(&t))],
    );
    let file = t.join("f");
    std::fs::write(&file, "x").unwrap();
    fails(
        &["files", "gen", "--out", &show(&file.join("site"))],
        1,
        &[
            &format!(
                "--out {}: {} is a file, not a directory",
                show(&file.join("site")),
                show(&file)
            ),
            "created if missing",
        ],
    );
    fails(
        &["top", "--count", "0", "--json"],
        2,
        &["--count 0: at least 1 view"],
    );
    fails(
        &["tune", "--root", &show(&t), "show"],
        2,
        &[&format!("--root {}: not the root of a /sys tree", show(&t))],
    );
    fails(
        &["tune", "plan", "--profile", "rps", "--output", &show(&t)],
        2,
        &[
            &format!("--output {}: is a directory", show(&t)),
            "tune-plan.json",
        ],
    );
    let prefix = t.join("no/sweep");
    fails(
        &["sweep", "--out", &show(&prefix)],
        2,
        &[&format!(
            "--out {}: directory {} does not exist",
            show(&prefix),
            show(&t.join("no"))
        )],
    );
    fails(
        &["steer", "status", "--pid", "2147483647"],
        1,
        &[
            "--pid 2147483647: no process 2147483647 is running",
            "pgrep",
        ],
    );
    fails(
        &["steer", "attach", "--pid", "1", "--listen", "foo"],
        2,
        &["'foo' for '--listen", "expected ADDR:PORT"],
    );
}
