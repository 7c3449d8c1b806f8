//! `corelocal serve --daemon --pid-file` through the real binary (issue 26; memcached's `-d
//! -P`, t/daemonize.t): the launching command exits 0 only once the server accepts, the pid
//! file names the detached server (another process, in a session of its own) that `stats`
//! reports, and a SIGTERM stops it and removes the file; a start that fails (port in use, pid
//! file not writable) makes the launcher fail with the server's message and leaves no file;
//! a `--takeover` successor's id stays in the file when the old server exits. Every daemon a
//! test starts is killed when the test ends, whatever happened.

mod common;

use common::{TempDir, BIN};
use corelocal::sys::pidfd;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longer than the launcher's own 60 s wait for the server.
const LAUNCH_LIMIT: Duration = Duration::from_secs(90);
/// How long a stopped server may take to drain and exit.
const EXIT_LIMIT: Duration = Duration::from_secs(30);

/// What a launching command did.
struct Launched {
    code: Option<i32>,
    pid: u32,
    stderr: String,
}

/// Runs `corelocal serve APP ARGS` (stats off) to its exit, stderr kept in a file: a detached
/// server holds none of the test's pipes, and a launcher that hangs is killed.
fn launch(dir: &Path, app: &str, args: &[&str]) -> Launched {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = dir.join(format!("launcher-{n}.err"));
    let mut child = Command::new(BIN)
        .args([
            "serve",
            app,
            "--stats-interval",
            "0",
            "--drain-timeout",
            "1s",
        ])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn corelocal");
    let until = Instant::now() + LAUNCH_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the launcher did not exit within {LAUNCH_LIMIT:?}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Launched {
        code: status.code(),
        pid: child.id(),
        stderr: std::fs::read_to_string(&log).unwrap(),
    }
}

/// A detached server, killed (SIGKILL) on drop unless it has exited; held by pidfd, so the
/// signal cannot reach a process that reused the number.
struct Daemon {
    pid: u32,
    pidfd: OwnedFd,
}

impl Daemon {
    /// The server named by the pid file at `path`, whose text must be its id and a newline.
    fn from_pid_file(path: &Path) -> Daemon {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("pid file {}: {e}", path.display()));
        assert!(text.ends_with('\n'), "pid file text {text:?}");
        let pid: u32 = text
            .trim_end()
            .parse()
            .unwrap_or_else(|_| panic!("pid file text {text:?}"));
        let pidfd = pidfd::pidfd_open(pid).unwrap_or_else(|e| panic!("pid {pid} runs: {e}"));
        Daemon { pid, pidfd }
    }

    fn signal(&self, sig: i32) {
        pidfd::pidfd_send_signal(&self.pidfd, sig).unwrap();
    }

    /// Waits for the exit (bounded; panics after [`EXIT_LIMIT`]).
    fn wait_exit(&self) {
        let until = Instant::now() + EXIT_LIMIT;
        while !pidfd::has_exited(&self.pidfd) {
            assert!(
                Instant::now() < until,
                "pid {} still runs {EXIT_LIMIT:?} after the stop",
                self.pid
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if !pidfd::has_exited(&self.pidfd) {
            let _ = pidfd::pidfd_send_signal(&self.pidfd, libc::SIGKILL);
        }
    }
}

/// Kills the server a pid file names, if any, when dropped (before the file was read).
struct KillNamed(PathBuf);

impl Drop for KillNamed {
    fn drop(&mut self) {
        if let Ok(text) = std::fs::read_to_string(&self.0) {
            if let Ok(pid) = text.trim().parse::<u32>() {
                if let Ok(fd) = pidfd::pidfd_open(pid) {
                    let _ = pidfd::pidfd_send_signal(&fd, libc::SIGKILL);
                }
            }
        }
    }
}

/// The address in the relayed "listening on ADDR" line.
fn listening_addr(stderr: &str) -> SocketAddr {
    let rest = stderr
        .split("listening on ")
        .nth(1)
        .unwrap_or_else(|| panic!("no listening line in: {stderr}"));
    rest.split([' ', ',']).next().unwrap().parse().unwrap()
}

/// Field 6 of /proc/PID/stat (`self` for this process): the session id.
fn session_of(pid: &str) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 1..];
    // state ppid pgrp session
    after_comm
        .split_whitespace()
        .nth(3)
        .unwrap()
        .parse()
        .unwrap()
}

/// The `STAT pid` line of memcached's `stats`.
fn stats_pid(addr: SocketAddr) -> u32 {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"stats\r\n").unwrap();
    let mut got = String::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with("END\r\n") {
        let n = c.read(&mut buf).expect("a stats reply");
        assert!(n > 0, "closed while answering stats: {got:?}");
        got.push_str(std::str::from_utf8(&buf[..n]).unwrap());
    }
    got.lines()
        .find_map(|l| l.strip_prefix("STAT pid "))
        .unwrap_or_else(|| panic!("no pid in {got}"))
        .trim()
        .parse()
        .unwrap()
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// Leftovers of the atomic write (`PATH.tmp-PID`) in `dir`.
fn asides(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect()
}

#[test]
fn a_daemon_serves_once_the_launcher_returns_and_sigterm_removes_its_pid_file() {
    for backend in ["auto", "epoll"] {
        let dir = TempDir::new("daemon-kv");
        let pid_file = dir.0.join("kv.pid");
        let _guard = KillNamed(pid_file.clone());
        let launched = launch(
            &dir.0,
            "kv",
            &[
                "--listen",
                "127.0.0.1:0",
                "--backend",
                backend,
                "--daemon",
                "--pid-file",
                path_str(&pid_file),
            ],
        );
        assert_eq!(launched.code, Some(0), "{backend}: {}", launched.stderr);
        // The launcher returned: the server accepts now, with no retry.
        let addr = listening_addr(&launched.stderr);
        TcpStream::connect(addr).expect("the daemon accepts once the launcher returned");
        let daemon = Daemon::from_pid_file(&pid_file);
        assert_ne!(daemon.pid, launched.pid, "the server is another process");
        let sid = session_of(&daemon.pid.to_string());
        assert_eq!(
            sid, daemon.pid,
            "{backend}: the daemon leads its own session"
        );
        assert_ne!(sid, session_of("self"), "{backend}: not the test's session");
        assert_eq!(stats_pid(addr), daemon.pid, "{backend}: stats pid");
        assert!(asides(&dir.0).is_empty(), "{:?}", asides(&dir.0));
        daemon.signal(libc::SIGTERM);
        daemon.wait_exit();
        assert!(
            !pid_file.exists(),
            "{backend}: the pid file outlived the server"
        );
        assert!(
            TcpStream::connect(addr).is_err(),
            "{backend}: still accepting"
        );
    }
}

#[test]
fn a_daemon_on_a_port_in_use_fails_in_the_launcher_and_leaves_no_pid_file() {
    let dir = TempDir::new("daemon-in-use");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let pid_file = dir.0.join("kv.pid");
    let _guard = KillNamed(pid_file.clone());
    let launched = launch(
        &dir.0,
        "kv",
        &[
            "--listen",
            &addr,
            "--daemon",
            "--pid-file",
            path_str(&pid_file),
        ],
    );
    let err = &launched.stderr;
    assert_eq!(launched.code, Some(1), "{err}");
    assert!(err.contains("is in use"), "{err}");
    assert!(err.contains("exited before serving"), "{err}");
    assert!(!pid_file.exists(), "a pid file was left: {err}");
    assert!(asides(&dir.0).is_empty(), "{:?}", asides(&dir.0));
}

#[test]
fn a_pid_file_that_cannot_be_written_stops_the_start() {
    let dir = TempDir::new("daemon-pid-dir");
    let pid_file = dir.0.join("missing-dir/x.pid");
    for daemon in [false, true] {
        let mut args = vec!["--listen", "127.0.0.1:0", "--pid-file", path_str(&pid_file)];
        if daemon {
            args.push("--daemon");
        }
        let launched = launch(&dir.0, "rpc", &args);
        let err = &launched.stderr;
        assert_eq!(launched.code, Some(1), "daemon {daemon}: {err}");
        assert!(err.contains("--pid-file"), "daemon {daemon}: {err}");
        assert!(!err.contains("listening on"), "daemon {daemon}: {err}");
    }
}

#[test]
fn without_daemon_the_pid_file_names_the_server_until_it_stops() {
    let dir = TempDir::new("pid-file-http");
    let pid_file = dir.0.join("http.pid");
    let served = common::Served::start("http", &["--pid-file", path_str(&pid_file)]);
    // Written once serving, just after the "listening on" line.
    let until = Instant::now() + Duration::from_secs(30);
    while !pid_file.exists() {
        assert!(Instant::now() < until, "no pid file: {}", served.log);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        std::fs::read_to_string(&pid_file).unwrap(),
        format!("{}\n", served.pid())
    );
    let (code, rest) = served.terminate();
    assert_eq!(code, 0, "{rest}");
    assert!(!pid_file.exists(), "the pid file outlived the server");
}

#[test]
fn a_daemon_taking_over_by_socket_keeps_its_pid_in_the_file() {
    let dir = TempDir::new("daemon-takeover");
    let pid_file = dir.0.join("rpc.pid");
    let sock = dir.0.join("upgrade.sock");
    let _guard = KillNamed(pid_file.clone());
    let both = [
        "--daemon",
        "--pid-file",
        path_str(&pid_file),
        "--upgrade-socket",
        path_str(&sock),
    ];
    let mut args = vec!["--listen", "127.0.0.1:0"];
    args.extend_from_slice(&both);
    let first = launch(&dir.0, "rpc", &args);
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    let old = Daemon::from_pid_file(&pid_file);
    let addr = listening_addr(&first.stderr).to_string();
    let mut args = vec!["--listen", &addr, "--takeover", path_str(&sock)];
    args.extend_from_slice(&both);
    let second = launch(&dir.0, "rpc", &args);
    assert_eq!(second.code, Some(0), "{}", second.stderr);
    let new = Daemon::from_pid_file(&pid_file);
    assert_ne!(new.pid, old.pid);
    old.wait_exit();
    // The old server exited after the successor wrote the file: it left it.
    let new_again = Daemon::from_pid_file(&pid_file);
    assert_eq!(new_again.pid, new.pid);
    TcpStream::connect(&addr).expect("the successor serves");
    new.signal(libc::SIGTERM);
    new.wait_exit();
    assert!(!pid_file.exists(), "the pid file outlived the successor");
}
