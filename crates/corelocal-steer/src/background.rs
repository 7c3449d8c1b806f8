//! The balancer `steer attach` leaves running: steering alone strands every connection of a
//! stopped or starved worker's CPU, so `attach` (with `--balance on`, the default) starts a
//! `corelocal steer watch --pid PID` in the background, marked with [`MARK`]. It follows the
//! server (reloads, respawns) and exits with it; `detach`, `attach --balance off` and `measure`
//! stop it (SIGTERM: its redirected rows go home first), `status` names it. Its events go to
//! [`log_path`].

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The argument that marks a `watch` started by `attach`.
pub const MARK: &str = "--started-by-attach";
/// Most processes scanned in `/proc` when looking for balancers.
const PROCS_MAX: usize = 1 << 16;
/// How long a balancer gets to put its rows back after SIGTERM.
const STOP_WAIT: Duration = Duration::from_secs(3);

/// Starts the balancer for server `pid` (groups filtered by `listen`) unless one runs; returns
/// its PID.
pub fn start(pid: u32, listen: &[String]) -> std::io::Result<u32> {
    if let Some(&running) = find(pid).first() {
        return Ok(running);
    }
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "steer",
        "watch",
        "--pid",
        &pid.to_string(),
        "--method",
        "ebpf",
        // A PID that is gone does not come back: no waiting for it.
        "--start-timeout-s",
        "1",
        // Re-scans (reloads, respawns) a little less often than an interactive watch.
        "--interval-ms",
        "250",
    ]);
    for l in listen {
        cmd.args(["--listen", l]);
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path(pid))
        .map_or(Stdio::null(), Stdio::from);
    cmd.args([MARK, "--json"])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(Stdio::null())
        // Its own process group: a Ctrl-C in the shell that ran `attach` does not reach it.
        .process_group(0);
    let child = cmd.spawn()?;
    Ok(child.id())
}

/// Where the balancer for server `pid` logs its events (one JSON object per line: `busy`,
/// `recovered`, `redirect`, `home`, and `watch`'s own): `/run/corelocal-steer-PID.log`, or
/// the temporary directory where `/run` cannot be written.
pub fn log_path(pid: u32) -> std::path::PathBuf {
    let name = format!("corelocal-steer-{pid}.log");
    let run = std::path::Path::new("/run");
    let writable = std::fs::metadata(run).is_ok_and(|m| m.is_dir())
        && std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(run.join(&name))
            .is_ok();
    if writable {
        run.join(name)
    } else {
        std::env::temp_dir().join(name)
    }
}

/// PIDs of the balancers `attach` started for server `pid`.
pub fn find(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let want = pid.to_string();
    dir.flatten()
        .take(PROCS_MAX)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| is_balancer_for(&c, &want))
        })
        .collect()
}

/// Whether a NUL-separated command line is `… steer watch --pid PID … --started-by-attach`.
pub fn is_balancer_for(cmdline: &[u8], pid: &str) -> bool {
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let has = |s: &str| args.contains(&s.as_bytes());
    let pid_follows = args
        .windows(2)
        .any(|w| w[0] == b"--pid" && w[1] == pid.as_bytes());
    has("steer") && has("watch") && has(MARK) && pid_follows
}

/// Stops the balancers of server `pid` (SIGTERM, then waits up to 3 s for each to exit).
/// Returns the PIDs stopped.
pub fn stop(pid: u32) -> Vec<u32> {
    let found = find(pid);
    for &p in &found {
        let _ = corelocal::sys::signal::terminate(p as i32);
    }
    let until = Instant::now() + STOP_WAIT;
    while Instant::now() < until && found.iter().any(|p| alive(*p)) {
        std::thread::sleep(Duration::from_millis(10));
    }
    found
}

fn alive(pid: u32) -> bool {
    // A zombie (its parent has not reaped it) is gone for our purposes.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_its_own_command_line_only() {
        let line = |args: &[&str]| args.join("\0").into_bytes();
        let ours = line(&[
            "/usr/bin/corelocal",
            "steer",
            "watch",
            "--pid",
            "42",
            "--method",
            "ebpf",
            MARK,
        ]);
        assert!(is_balancer_for(&ours, "42"));
        assert!(!is_balancer_for(&ours, "4"), "another server");
        let users = line(&["corelocal", "steer", "watch", "--pid", "42"]);
        assert!(!is_balancer_for(&users, "42"), "a watch the user started");
    }
}
