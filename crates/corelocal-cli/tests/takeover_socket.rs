//! Binary upgrade by socket passing, end to end with the `corelocal` binary: a server started
//! with `--upgrade-socket PATH` hands its listening sockets (SCM_RIGHTS) to `serve …
//! --takeover PATH`, stops accepting and exits 0. Under load (each run in a private network
//! namespace, root; skipped with a reason otherwise, never under CI=true): nothing refused,
//! nothing reset. Without root: a mismatched successor is refused and the old server serves on;
//! upgrades chain on one path; bad arguments and dead peers give clear errors in bounded time.
//! With `CORELOCAL_RECORD=DIR` the load scenarios write `DIR/restart-takeover-socket*.json`.

mod common;

use common::load::{cpus, one_request, outer, under_load};
use common::{Served, TempDir, BIN};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Fixed address of the load scenarios (each runs in its own network namespace).
const ADDR: &str = "127.0.0.1:7410";
/// How long an old server may take to drain and exit after handing over.
const EXIT_LIMIT: Duration = Duration::from_secs(15);

/// `corelocal serve rpc --one-shot --listen ADDR --cpus … EXTRA` (stats off).
fn rpc(addr: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "rpc", "--one-shot", "--listen", addr])
        .args(["--cpus", &cpus(), "--stats-interval", "0"])
        .args(["--drain-timeout", "5s"])
        .args(extra)
        .stdout(Stdio::null());
    cmd
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// Runs a command that must fail fast; returns its output (panics after 20 s).
fn run_bounded(mut cmd: Command) -> Output {
    let started = Instant::now();
    let mut child = cmd.stderr(Stdio::piped()).spawn().expect("spawn corelocal");
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("corelocal did not give up within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The old server hands over under load; returns (tally, RSTs, the old server's summary).
fn socket_takeover_under_load(backend: &str, name: &str, test: &str) {
    if outer(test) {
        return;
    }
    let dir = TempDir::new("takeover-load");
    let sock = dir.0.join("upgrade.sock");
    let extra = ["--backend", backend, "--upgrade-socket", path_str(&sock)];
    let old = Served::spawn(rpc(ADDR, &extra), false);
    let mut successor = None;
    let addr: SocketAddr = ADDR.parse().unwrap();
    let (tally, rsts, summary) = under_load(name, addr, || {
        let new = Served::spawn(
            rpc(ADDR, &["--backend", backend, "--takeover", path_str(&sock)]),
            false,
        );
        let (code, rest) = old.wait_exit(EXIT_LIMIT);
        assert_eq!(code, 0, "old server exit status; its stderr:\n{rest}");
        successor = Some(new);
        rest.lines()
            .find(|l| l.contains("stopped"))
            .unwrap_or_default()
            .to_string()
    });
    let new = successor.unwrap();
    assert!(new.log.contains("received 2 listening sockets") || cpus() == "0");
    assert!(one_request(addr).is_ok(), "the new server serves");
    let (code, rest) = new.terminate();
    assert_eq!(code, 0, "new server exit status: {rest}");
    assert!(tally.served() > 0, "no load got through");
    assert_eq!(
        tally.errors(),
        0,
        "refused/reset/failed during the takeover"
    );
    assert_eq!(rsts, 0, "RSTs sent during the takeover");
    assert!(summary.contains("handed over"), "{summary}");
    assert!(summary.contains("lost at close 0"), "{summary}");
}

#[test]
fn socket_takeover_under_load_loses_nothing() {
    socket_takeover_under_load(
        "auto",
        "takeover-socket",
        "socket_takeover_under_load_loses_nothing",
    );
}

#[test]
fn socket_takeover_under_load_loses_nothing_epoll() {
    socket_takeover_under_load(
        "epoll",
        "takeover-socket-epoll",
        "socket_takeover_under_load_loses_nothing_epoll",
    );
}

/// Starts an old server on an ephemeral port with an upgrade socket at `sock`.
fn old_server(sock: &Path, extra: &[&str]) -> Served {
    let mut args = vec!["--upgrade-socket", path_str(sock)];
    args.extend_from_slice(extra);
    Served::spawn(rpc("127.0.0.1:0", &args), false)
}

#[test]
fn a_mismatched_takeover_is_refused_and_the_old_server_keeps_serving() {
    let dir = TempDir::new("takeover-mismatch");
    let sock = dir.0.join("upgrade.sock");
    let pid_file = dir.0.join("rpc.pid");
    let old = old_server(&sock, &["--pid-file", path_str(&pid_file)]);
    let addr = old.hostport();
    // Written just after the "listening on" line the spawn waits for.
    let old_pid = (0..500)
        .find_map(|_| {
            std::fs::read_to_string(&pid_file).ok().or_else(|| {
                std::thread::sleep(std::time::Duration::from_millis(10));
                None
            })
        })
        .expect("the old server's pid file");
    assert_eq!(old_pid.trim(), old.pid().to_string());
    let refused = run_bounded(rpc(
        &addr,
        &[
            "--mode",
            "fine",
            "--takeover",
            path_str(&sock),
            "--pid-file",
            path_str(&pid_file),
        ],
    ));
    let err = stderr_of(&refused);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert!(err.contains("configuration differs"), "{err}");
    assert!(
        err.contains("mode: this process fine, the running server local"),
        "{err}"
    );
    assert!(one_request(old.addr).is_ok(), "the old server still serves");
    // The refused successor left the old server's pid file as it was, and nothing aside.
    assert_eq!(std::fs::read_to_string(&pid_file).unwrap(), old_pid);
    let names: Vec<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.contains(".tmp-")), "{names:?}");
    // It also still hands over: its steering was restored, its upgrade socket still listens.
    let new = Served::spawn(rpc(&addr, &["--takeover", path_str(&sock)]), false);
    let (code, rest) = old.wait_exit(EXIT_LIMIT);
    assert_eq!(code, 0, "{rest}");
    assert!(
        rest.contains("refused: configuration differs"),
        "old log: {rest}"
    );
    assert!(rest.contains("stopped | handed over"), "old log: {rest}");
    assert!(one_request(new.addr).is_ok(), "the successor serves");
    assert_eq!(new.terminate().0, 0);
}

#[test]
fn upgrades_chain_on_one_path() {
    let dir = TempDir::new("takeover-chain");
    let sock = dir.0.join("upgrade.sock");
    let mut current = old_server(&sock, &["--mode", "fine"]);
    let addr = current.hostport();
    for generation in 1..=2 {
        let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "upgrade socket mode {mode:o}");
        let args = ["--mode", "fine", "--takeover", path_str(&sock)];
        let mut cmd = rpc(&addr, &args);
        cmd.args(["--upgrade-socket", path_str(&sock)]);
        let next = Served::spawn(cmd, false);
        let (code, rest) = current.wait_exit(EXIT_LIMIT);
        assert_eq!(code, 0, "generation {generation}: {rest}");
        assert!(
            one_request(next.addr).is_ok(),
            "generation {generation} serves"
        );
        current = next;
        // The successor listens on the same path once the old server gave it up.
        let until = Instant::now() + Duration::from_secs(5);
        while !sock.exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            sock.exists(),
            "generation {generation} has no upgrade socket"
        );
    }
    assert_eq!(current.terminate().0, 0);
    assert!(!sock.exists(), "the upgrade socket is removed at exit");
}

#[test]
fn takeover_arguments_and_dead_peers_give_clear_errors() {
    let dir = TempDir::new("takeover-errors");
    let expect = |args: &[&str], code: i32, needle: &str| {
        let out = run_bounded(rpc("127.0.0.1:0", args));
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    };
    expect(&["--takeover", "1"], 2, "not a server's process id");
    expect(&["--takeover", "99999999999"], 2, "out of range");
    let missing = dir.0.join("missing.sock");
    expect(&["--takeover", path_str(&missing)], 1, "no such socket");
    // A socket file nobody listens on: what a killed server leaves.
    let stale = dir.0.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    expect(&["--takeover", path_str(&stale)], 1, "stale");
    // A regular file is never replaced.
    let file = dir.0.join("file");
    std::fs::write(&file, "keep").unwrap();
    expect(&["--upgrade-socket", path_str(&file)], 1, "not a socket");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    // A live upgrade socket is refused; a stale one is replaced.
    let sock = dir.0.join("upgrade.sock");
    let old = old_server(&sock, &[]);
    expect(
        &["--upgrade-socket", path_str(&sock)],
        1,
        "another server listens",
    );
    let replaced = old_server(&stale, &[]);
    assert!(stale.exists());
    drop(replaced);
    // A stopped (or hung) old server: the new one gives up after --takeover-timeout, and the
    // old one, once running again, still serves.
    let pid = old.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let started = Instant::now();
    let args = ["--takeover", path_str(&sock), "--takeover-timeout", "300ms"];
    let out = run_bounded(rpc(&old.hostport(), &args));
    assert!(Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap()
        .success());
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("timed out"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "gave up too late"
    );
    assert!(one_request(old.addr).is_ok(), "the old server serves on");
    assert_eq!(old.terminate().0, 0);
    assert!(!sock.exists(), "the upgrade socket is removed at exit");
}
