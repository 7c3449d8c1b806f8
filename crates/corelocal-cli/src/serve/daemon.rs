//! `--daemon` (memcached `-d`): run in the background, the way an init script or systemd's
//! `Type=forking` expect it, and better than memcached, whose command exits 0 before it binds.
//!
//! [`detach`] runs first thing in `serve`, while the process has one thread (a fork is only
//! safe then; `corelocal::sys::process::fork_single_threaded` checks it). The launching
//! process waits on a pipe; the forked server starts a new session, works from `/` (the
//! relative paths given were made absolute before the fork, so they mean what they meant),
//! has /dev/null as standard input and output, and its standard error is the pipe while it
//! starts: every start-up message (a warning, the error that stops it) reaches the launcher,
//! which copies it to its own stderr. Once the server serves ([`ready`]: listeners bound,
//! workers started, the takeover done, the `--pid-file` written), its stderr and stdout move
//! to /dev/null or `--log-file`, then it writes one NUL byte to the pipe and closes it: the
//! launcher exits 0. If the pipe ends without the NUL (the server failed and exited), the
//! launcher exits non-zero, after the server's own message; if nothing comes for
//! [`READY_TIMEOUT`], it kills the server and says so.

use super::args::App;
use super::common::{CommonArgs, Takeover};
use corelocal::sys::{pidfd, process};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `--log-file -`: the daemon's messages go where the command's standard error went.
const LOG_TO_STDERR: &str = "-";

/// How long the launcher waits for the server to serve.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// What a daemonized server holds until it serves: the pipe to its launcher, and where its
/// output goes then.
struct Pending {
    status: OwnedFd,
    output: OwnedFd,
}

static PENDING: Mutex<Option<Pending>> = Mutex::new(None);

/// Which process returns from [`detach`].
pub(super) enum Detached {
    /// The launcher, done: exit with this code.
    Launcher(ExitCode),
    /// The server, detached: start it, then call [`ready`].
    Server,
}

/// `--daemon`: forks; the launcher waits for the server and returns its exit code, the server
/// returns detached. Nothing to do without `--daemon`.
pub(super) fn detach(app: &mut App) -> Result<Detached, String> {
    if !app.common().daemon {
        return Ok(Detached::Server);
    }
    absolute_paths(app)?;
    let common = app.common();
    // Opened before the fork: a log file that cannot be opened stops the launcher itself.
    let output: OwnedFd = match &common.log_file {
        // The command's own standard error, kept (a systemd unit's journal).
        Some(path) if path.as_os_str() == LOG_TO_STDERR => {
            use std::os::fd::AsFd;
            io::stderr()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| format!("--log-file -: standard error: {e}"))?
        }
        Some(path) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("--log-file {}: cannot open it: {e}", path.display()))?
            .into(),
        None => dev_null()?,
    };
    let (read, write) = process::pipe().map_err(|e| format!("--daemon: pipe: {e}"))?;
    match process::fork_single_threaded().map_err(|e| format!("--daemon: {e}"))? {
        process::Forked::Parent { child } => {
            drop(write);
            drop(output);
            Ok(Detached::Launcher(wait_for_server(child, read)))
        }
        process::Forked::Child => {
            drop(read);
            // Nobody reads the pipe if this fails: the launcher sees it end and says so.
            become_daemon(&write).map_err(|e| format!("--daemon: {e}"))?;
            *PENDING.lock().unwrap_or_else(|p| p.into_inner()) = Some(Pending {
                status: write,
                output,
            });
            Ok(Detached::Server)
        }
    }
}

fn dev_null() -> Result<OwnedFd, String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|e| format!("--daemon: /dev/null: {e}"))
}

/// The forked server: a new session (no controlling terminal), `/` as working directory,
/// /dev/null as stdin and stdout, the pipe as stderr until it serves.
fn become_daemon(status: &OwnedFd) -> io::Result<()> {
    process::new_session()?;
    std::env::set_current_dir("/")?;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    process::redirect(process::Stdio::In, &null)?;
    process::redirect(process::Stdio::Out, &null)?;
    process::redirect(process::Stdio::Err, status)
}

/// The server serves: its output moves to /dev/null or `--log-file`, then the launcher is told
/// (it exits 0). Nothing to do unless this is a daemon that has not told yet.
pub(super) fn ready() {
    let Some(pending) = PENDING.lock().unwrap_or_else(|p| p.into_inner()).take() else {
        return;
    };
    // Stdout and stderr first: once the launcher is gone, a write to the pipe would fail
    // (EPIPE), and a failed eprintln! panics.
    let moved = process::redirect(process::Stdio::Out, &pending.output)
        .and_then(|()| process::redirect(process::Stdio::Err, &pending.output));
    let mut status = File::from(pending.status);
    match moved {
        Ok(()) => {
            let _ = status.write_all(&[0]);
        }
        // Stderr is still the pipe: the launcher prints this and reports a failure (it sees
        // no NUL); the server serves on, without its output.
        Err(e) => corelocal::log_line!("corelocal serve: --daemon: moving the output away: {e}"),
    }
}

/// The launcher: copies what the server writes to the pipe to stderr until the NUL that says
/// it serves (exit 0), the end of the pipe (it exited: non-zero), or [`READY_TIMEOUT`].
fn wait_for_server(child: u32, status: OwnedFd) -> ExitCode {
    let until = Instant::now() + READY_TIMEOUT;
    let mut status = File::from(status);
    let mut buf = [0u8; 4096];
    let mut stderr = io::stderr().lock();
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return give_up(child);
        }
        match process::wait_readable(&status, left) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => return launcher_fail(&format!("waiting for the server (pid {child}): {e}")),
        }
        let n = match status.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return launcher_fail(&format!("reading from the server (pid {child}): {e}")),
        };
        if n == 0 {
            return exited(child);
        }
        if let Some(end) = buf[..n].iter().position(|&b| b == 0) {
            let _ = stderr.write_all(&buf[..end]);
            return ExitCode::SUCCESS;
        }
        let _ = stderr.write_all(&buf[..n]);
    }
}

/// How long the launcher waits for the server's exit once the pipe ended without the NUL (a
/// process closes its descriptors a moment before it can be reaped).
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// The pipe ended without the NUL: the server exited while starting (or, should moving its
/// output away have failed, serves without telling: it said why on the pipe).
fn exited(child: u32) -> ExitCode {
    let until = Instant::now() + EXIT_WAIT;
    loop {
        match process::wait_child(child, false) {
            Ok(Some(status)) => {
                corelocal::log_line!(
                    "corelocal serve: --daemon: the server (pid {child}) exited before serving \
                     ({status})"
                );
                return match status.code() {
                    Some(code) if code != 0 => ExitCode::from(u8::try_from(code).unwrap_or(1)),
                    _ => ExitCode::FAILURE,
                };
            }
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                return launcher_fail(&format!(
                    "the server (pid {child}) stopped reporting without saying it serves; it \
                     still runs"
                ))
            }
            Err(e) => {
                return launcher_fail(&format!(
                    "the server (pid {child}) stopped reporting before serving ({e})"
                ))
            }
        }
    }
}

/// No word within [`READY_TIMEOUT`]: the server is killed (a half-started server holding the
/// port, with no pid file, would only be in the way of the next try).
fn give_up(child: u32) -> ExitCode {
    let killed = pidfd::pidfd_open(child)
        .and_then(|fd| pidfd::pidfd_send_signal(&fd, libc::SIGKILL))
        .map(|()| "killed it (SIGKILL)".to_string())
        .unwrap_or_else(|e| format!("could not kill it: {e}"));
    launcher_fail(&format!(
        "the server (pid {child}) did not report serving within {}s; {killed}",
        READY_TIMEOUT.as_secs()
    ))
}

fn launcher_fail(message: &str) -> ExitCode {
    corelocal::log_line!("corelocal serve: --daemon: {message}");
    ExitCode::FAILURE
}

/// Makes every path the user gave absolute, so that the daemon's `chdir("/")` keeps its
/// meaning (an abstract socket name, `@…`, is no path).
fn absolute_paths(app: &mut App) -> Result<(), String> {
    let mut paths: Vec<(&str, &mut PathBuf)> = Vec::new();
    let common: &mut CommonArgs = match app {
        App::Http(a) => {
            if let Some(root) = &mut a.root {
                paths.push(("--root", root));
            }
            if !matches!(a.access_log.as_str(), "off" | "stderr") {
                let mut path = PathBuf::from(&a.access_log);
                make_absolute("--access-log", &mut path)?;
                a.access_log = path.to_string_lossy().into_owned();
            }
            &mut a.common
        }
        App::Kv(a) => {
            for (flag, path) in [
                ("--auth-file", &mut a.auth_file),
                ("--port-file", &mut a.port_file),
                ("--memory-file", &mut a.memory_file),
            ] {
                if let Some(p) = path {
                    paths.push((flag, p));
                }
            }
            &mut a.common
        }
        App::Rpc(a) => &mut a.common,
        App::Sockperf(a) => &mut a.common,
    };
    for (flag, path) in [
        ("--stats-file", &mut common.stats_file),
        ("--upgrade-socket", &mut common.upgrade_socket),
        ("--pid-file", &mut common.pid_file),
        ("--log-file", &mut common.log_file),
    ] {
        if let Some(p) = path.as_mut().filter(|p| p.as_os_str() != LOG_TO_STDERR) {
            paths.push((flag, p));
        }
    }
    if let Some(Takeover::Socket(p)) = &mut common.takeover {
        paths.push(("--takeover", p));
    }
    for (flag, path) in paths {
        make_absolute(flag, path)?;
    }
    Ok(())
}

fn make_absolute(flag: &str, path: &mut PathBuf) -> Result<(), String> {
    if path.is_absolute() || path.as_os_str().as_encoded_bytes().starts_with(b"@") {
        return Ok(());
    }
    *path = std::path::absolute(&*path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    Ok(())
}
