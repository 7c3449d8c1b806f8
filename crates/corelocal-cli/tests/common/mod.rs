//! Shared by the end-to-end tests: start `corelocal serve …` on ephemeral ports, find external
//! tools (skip with a reason when missing, fail under `CI=true`), run them with a time limit.

#![allow(dead_code)]

pub mod load;
pub mod synflood;

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_corelocal");

/// A running `corelocal serve APP`.
pub struct Served {
    /// The server process.
    pub child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Where its metrics endpoint listens (with `--metrics`).
    pub metrics: Option<SocketAddr>,
    /// Standard error up to and including the "listening on" line.
    pub log: String,
    stderr: Option<BufReader<ChildStderr>>,
}

fn addr_after(line: &str, marker: &str) -> Option<SocketAddr> {
    let rest = line.split(marker).nth(1)?;
    rest.split([' ', ',', '/'])
        .find(|s| !s.is_empty())?
        .parse()
        .ok()
}

impl Served {
    /// Starts `corelocal serve APP --listen 127.0.0.1:0 ARGS` (stats printing off) and waits
    /// for its "listening on" line (and "metrics on" line when ARGS has `--metrics`).
    pub fn start(app: &str, args: &[&str]) -> Served {
        Served::start_at(app, "127.0.0.1:0", args)
    }

    /// As [`Served::start`], listening on `listen`; stats printing is off unless ARGS sets
    /// `--stats-interval`.
    pub fn start_at(app: &str, listen: &str, args: &[&str]) -> Served {
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", app, "--listen", listen]);
        if !args.contains(&"--stats-interval") {
            cmd.args(["--stats-interval", "0"]);
        }
        cmd.args(args).stdout(Stdio::null());
        Served::spawn(cmd, args.contains(&"--metrics"))
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Spawns a prepared `corelocal serve …` command (its stdout is the caller's choice; stdin
    /// is closed and stderr read here) and waits for the "listening on" line, and for the
    /// "metrics on" line when `want_metrics`. Lines read meanwhile are kept in `log`.
    pub fn spawn(mut cmd: Command, want_metrics: bool) -> Served {
        let mut child = cmd
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn corelocal");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let (mut addr, mut metrics, mut log) = (None, None, String::new());
        while addr.is_none() || (want_metrics && metrics.is_none()) {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap_or(0) == 0 {
                panic!("corelocal serve exited early: {log}");
            }
            addr = addr.or_else(|| addr_after(&line, "listening on "));
            metrics = metrics.or_else(|| addr_after(&line, "metrics on http://"));
            log += &line;
        }
        Served {
            child,
            addr: addr.unwrap(),
            metrics,
            log,
            stderr: Some(stderr),
        }
    }

    /// Host and port, for URLs and `--servers=`.
    pub fn hostport(&self) -> String {
        self.addr.to_string()
    }

    /// SIGTERM, then waits (at most 10 s, then SIGKILL); returns the exit code and the rest of
    /// stderr.
    pub fn terminate(self) -> (i32, String) {
        let (code, rest, _) = self.terminate_with_stdout();
        (code, rest)
    }

    /// As [`Served::terminate`], also returning standard output when it was piped.
    pub fn terminate_with_stdout(mut self) -> (i32, String, String) {
        // SAFETY: sending SIGTERM to our own child process, which has not been reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let code = wait_bounded(&mut self.child, Duration::from_secs(10));
        let mut rest = String::new();
        if let Some(mut e) = self.stderr.take() {
            let _ = e.read_to_string(&mut rest);
        }
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        (code, rest, out)
    }
}

impl Served {
    /// Waits (at most `limit`, then SIGKILL and panic) for the server to exit on its own, e.g.
    /// after handing its sockets to a successor; returns the exit code and the rest of stderr.
    pub fn wait_exit(mut self, limit: Duration) -> (i32, String) {
        let end = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let mut rest = String::new();
                if let Some(mut e) = self.stderr.take() {
                    let _ = e.read_to_string(&mut rest);
                }
                return (status.code().unwrap_or(-1), rest);
            }
            if Instant::now() > end {
                panic!("corelocal did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Served {
    /// Reads standard error until a line containing `needle` (returned with the lines before
    /// it); panics at EOF, and kills the server if the line has not come within `limit` (so
    /// a missing line fails the test instead of hanging it).
    pub fn wait_line(&mut self, needle: &str, limit: Duration) -> String {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (pid, flag) = (self.pid() as i32, done.clone());
        let watchdog = std::thread::spawn(move || {
            let end = Instant::now() + limit;
            while Instant::now() < end {
                if flag.load(std::sync::atomic::Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // Kill(2) on our own child's pid; a reaped pid could only be reused by a
            // later child of this test, which the test kills anyway.
            // SAFETY: the conditions above hold.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        });
        let stderr = self.stderr.as_mut().expect("stderr read already");
        let mut seen = String::new();
        let found = loop {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap_or(0) == 0 {
                break false;
            }
            seen += &line;
            if line.contains(needle) {
                break true;
            }
        };
        done.store(true, std::sync::atomic::Ordering::Release);
        let _ = watchdog.join();
        assert!(found, "no line with {needle:?} within {limit:?}:\n{seen}");
        seen
    }
}

fn wait_bounded(child: &mut Child, limit: Duration) -> i32 {
    let end = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return status.code().unwrap_or(-1);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("corelocal did not exit within {limit:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A field of `/proc/PID/status` in KiB (`VmRSS`, `VmHWM`, …); 0 when unreadable.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Resident memory of `pid` in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// CPU time (utime + stime) of `pid` in clock ticks (USER_HZ, 100 per second).
pub fn cpu_ticks(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    corelocal::procfs::parse_pid_stat(&text).map_or(0, |(u, s)| u + s)
}

/// The last JSON line of a `--stats-file` (Null when there is none yet).
pub fn last_stats(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// With `CORELOCAL_RECORD=DIR`, writes `json` (one line) to `DIR/NAME.json`; always prints it.
pub fn record(name: &str, json: &serde_json::Value) {
    eprintln!("RECORD {name} {json}");
    if let Ok(dir) = std::env::var("CORELOCAL_RECORD") {
        let path = std::path::Path::new(&dir).join(format!("{name}.json"));
        std::fs::write(&path, format!("{json}\n")).expect("writing the record");
    }
}

/// True under CI (`CI=true`), where a missing tool is a failure, not a skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether `check` holds; when not, prints why the test is skipped, or panics under CI.
pub fn require(what: &str, check: bool) -> bool {
    if check {
        return true;
    }
    if in_ci() {
        panic!("{what} is missing, and CI=true: .ci/run must install it");
    }
    eprintln!("SKIP: {what} is not installed");
    false
}

/// Whether every program in `programs` is on PATH (see [`require`]).
pub fn need(programs: &[&str]) -> bool {
    programs.iter().all(|p| require(p, have(p)))
}

/// The first of `names` on PATH (Debian renames libmemcached's tools memc*).
pub fn first_of(names: &[&str]) -> Option<String> {
    names.iter().find(|n| have(n)).map(|n| n.to_string())
}

/// Whether Python 3 can import `module`.
pub fn python_has(module: &str) -> bool {
    have("python3")
        && Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// Runs `program ARGS` under `timeout` (SIGKILL 2 s after the limit); returns its output.
pub fn run(limit_s: u32, program: &str, args: &[&str]) -> Output {
    let out = Command::new("timeout")
        .args(["-k", "2", &limit_s.to_string(), program])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawn timeout");
    assert_ne!(
        out.status.code(),
        Some(124),
        "{program} {args:?} ran past {limit_s} s"
    );
    out
}

/// Runs `program ARGS` (time-limited) and returns stdout; panics with stderr when it fails.
pub fn run_ok(limit_s: u32, program: &str, args: &[&str]) -> String {
    let out = run(limit_s, program, args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A fresh temporary directory (removed on drop).
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    /// Creates `corelocal-e2e-TAG-PID-N` under the system temp dir.
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "corelocal-e2e-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `GET PATH` over a plain socket to `addr`; returns the whole response.
pub fn http_get(addr: SocketAddr, path: &str) -> String {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut v = Vec::new();
    let _ = s.read_to_end(&mut v);
    String::from_utf8_lossy(&v).into_owned()
}

/// Deterministic binary garbage (NULs, high bytes, stray CR/LF), never starting like a method.
pub fn garbage(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut v: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    v[0] = 0;
    v
}

/// The TLS tests' certificates (corelocal-apps/tests/tls: CA, chains, keys).
pub fn certs() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../corelocal-apps/tests/tls")
}

/// One of [`certs`]' files, as a path string for a command line.
pub fn cert_path(name: &str) -> String {
    certs().join(name).to_str().unwrap().to_string()
}
