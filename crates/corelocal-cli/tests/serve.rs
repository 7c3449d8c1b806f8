//! The `corelocal serve` command end to end: flags, serving, stats, bad input, signals.

mod common;

use common::{Served, BIN};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Starts `corelocal serve rpc ARGS` on an ephemeral port, its stats on a piped stdout.
fn serve_rpc(args: &[&str]) -> Served {
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "rpc", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped());
    Served::spawn(cmd, false)
}

/// SIGTERM; the exit code and the stats printed on stdout.
fn terminate(r: Served) -> (i32, String) {
    let (code, _, stdout) = r.terminate_with_stdout();
    (code, stdout)
}

fn rpc(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut v = Vec::new();
    let _ = s.read_to_end(&mut v);
    v
}

#[test]
fn one_shot_rpc_answers_and_closes_then_sigterm_exits_cleanly() {
    let r = serve_rpc(&[
        "--one-shot",
        "--req-size",
        "64",
        "--resp-size",
        "32",
        "--stats-interval",
        "100ms",
        "--json",
    ]);
    for _ in 0..20 {
        let reply = rpc(r.addr, &[b'q'; 64]);
        assert_eq!(reply.len(), 32);
        assert_eq!(reply.last(), Some(&b'\n'));
    }
    std::thread::sleep(Duration::from_millis(300));
    let (code, stdout) = terminate(r);
    assert_eq!(code, 0);
    let last: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("stats lines")).unwrap();
    assert_eq!(last["total"]["accepted"], 20);
    assert_eq!(last["total"]["requests"], 20);
}

#[test]
fn oversized_one_shot_request_is_closed_and_counted_while_others_are_served() {
    let r = serve_rpc(&[
        "--one-shot",
        "--req-size",
        "8",
        "--stats-interval",
        "100ms",
        "--json",
    ]);
    assert_eq!(rpc(r.addr, &[b'a'; 100]), b"");
    assert_eq!(rpc(r.addr, &[b'a'; 8]).len(), 64);
    std::thread::sleep(Duration::from_millis(300));
    let (code, stdout) = terminate(r);
    assert_eq!(code, 0);
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["total"]["errors"]["too_large"], 1);
    assert_eq!(last["total"]["requests"], 1);
}

#[test]
fn keep_alive_rpc_answers_every_request() {
    let r = serve_rpc(&["--req-size", "16", "--resp-size", "16"]);
    let mut s = TcpStream::connect(r.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 16];
    for _ in 0..50 {
        s.write_all(&[b'r'; 16]).unwrap();
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf[15..], b"\n");
    }
    drop(s);
    assert_eq!(terminate(r).0, 0);
}

#[test]
fn stats_lines_report_each_worker() {
    let r = serve_rpc(&["--cpus", "0", "--stats-interval", "50ms"]);
    std::thread::sleep(Duration::from_millis(200));
    let (code, stdout) = terminate(r);
    assert_eq!(code, 0);
    let line = stdout.lines().next().expect("a stats line");
    assert!(line.contains("w0 cpu0 conn/s"), "{line}");
}

fn run_fails_with_2(args: &[&str], expect: &str) {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(expect), "{args:?}: {err}");
}

#[test]
fn invalid_flags_give_a_clear_message_and_exit_2() {
    run_fails_with_2(
        &["serve", "rpc", "--mode", "bogus"],
        "possible values: local, fine, stock",
    );
    run_fails_with_2(&["serve", "rpc", "--cpus", "0-x"], "invalid CPU set");
    run_fails_with_2(&["serve", "rpc", "--req-size", "0"], "--req-size");
    run_fails_with_2(&["serve", "rpc", "--listen", "nowhere"], "expected IP:PORT");
    run_fails_with_2(&["serve", "rpc", "--idle-timeout", "5"], "add a unit");
    run_fails_with_2(&["serve", "nosuchapp"], "unrecognized subcommand");
}

#[test]
fn a_busy_port_is_a_clear_runtime_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let out = Command::new(BIN)
        .args(["serve", "rpc", "--mode", "stock", "--listen", &port])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let port = port.rsplit(':').next().unwrap();
    assert!(err.contains(&format!("port {port} is in use")), "{err}");
}

/// A child that cannot create io rings, as under a container's seccomp profile.
fn without_io_uring(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only calls prctl.
    unsafe {
        cmd.pre_exec(|| {
            corelocal::sys::process::deny_syscall(
                corelocal::sys::process::SYS_IO_URING_SETUP,
                libc::EPERM as u32,
            )
        })
    }
}

#[test]
fn auto_falls_back_to_epoll_with_a_reason_when_io_uring_is_refused() {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "serve",
        "rpc",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        "auto",
        "--one-shot",
    ])
    .stdout(Stdio::null());
    without_io_uring(&mut cmd);
    let r = Served::spawn(cmd, false);
    assert!(r.log.contains("io_uring refused"), "{}", r.log);
    assert!(r.log.contains("backend epoll"), "{}", r.log);
    assert_eq!(rpc(r.addr, &[b'x'; 64]).len(), 64);
    assert_eq!(terminate(r).0, 0);
}

#[test]
fn forcing_uring_where_it_is_refused_is_a_clear_error() {
    let out = without_io_uring(Command::new(BIN).args([
        "serve",
        "rpc",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        "uring",
    ]))
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("io_uring") && err.contains("Operation not permitted"),
        "{err}"
    );
}

#[test]
fn files_gen_writes_the_paper_file_set() {
    let dir = std::env::temp_dir().join(format!("corelocal-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(BIN)
        .args(["files", "gen", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let list = std::fs::read_to_string(dir.join("files.txt")).unwrap();
    let paths: Vec<&str> = list.lines().collect();
    assert_eq!(paths.len(), 30_000);
    let mut total = 0u64;
    for p in &paths {
        let len = std::fs::metadata(dir.join(p.trim_start_matches('/')))
            .unwrap()
            .len();
        assert!((30..=5_670).contains(&len), "{p}: {len}");
        total += len;
    }
    let mean = total / 30_000;
    assert!((650..750).contains(&mean), "mean {mean}");
    std::fs::remove_dir_all(&dir).unwrap();
}
