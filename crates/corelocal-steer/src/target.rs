//! Which process is the server: a PID, a PID file (nginx's `pid` directive, HAProxy's `-p`)
//! or a systemd unit's `MainPID` — re-read by `watch` so it follows binary upgrades and
//! restarts.

use std::path::PathBuf;
use std::process::Command;

/// Where the server's PID comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PidSource {
    /// A fixed PID.
    Pid(u32),
    /// A PID file, read again on every look.
    PidFile(PathBuf),
    /// A systemd unit: `systemctl show -p MainPID --value UNIT` (0 when it is not running).
    Unit {
        /// The unit name.
        name: String,
        /// The `systemctl` to run (tests substitute a fake one).
        systemctl: PathBuf,
    },
}

impl PidSource {
    /// A unit, looked up with the `systemctl` on `PATH`.
    pub fn unit(name: &str) -> PidSource {
        PidSource::Unit {
            name: name.to_string(),
            systemctl: PathBuf::from("systemctl"),
        }
    }

    /// The PID it names now, if that process is alive; `Err` when it cannot be read at all
    /// (no such file is `Ok(None)`: the server is stopped).
    pub fn current(&self) -> Result<Option<u32>, String> {
        let pid = match self {
            PidSource::Pid(p) => Some(*p),
            PidSource::PidFile(path) => match std::fs::read_to_string(path) {
                Ok(text) => parse_pid_file(&text),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(format!("pid file {}: {e}", path.display())),
            },
            PidSource::Unit { name, systemctl } => {
                let out = Command::new(systemctl)
                    .args(["show", "-p", "MainPID", "--value", name])
                    .output()
                    .map_err(|e| format!("{} show {name}: {e}", systemctl.display()))?;
                if !out.status.success() {
                    return Err(format!(
                        "{} show -p MainPID {name}: {}",
                        systemctl.display(),
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                }
                parse_main_pid(&String::from_utf8_lossy(&out.stdout))
            }
        };
        Ok(pid.filter(|&p| alive(p)))
    }

    /// For log lines: `pid 123`, `pid file /run/nginx.pid`, `unit nginx.service`.
    pub fn describe(&self) -> String {
        match self {
            PidSource::Pid(p) => format!("pid {p}"),
            PidSource::PidFile(path) => format!("pid file {}", path.display()),
            PidSource::Unit { name, .. } => format!("unit {name}"),
        }
    }

    /// Whether it can name a different process later (a file or a unit can; a PID cannot).
    pub fn follows(&self) -> bool {
        !matches!(self, PidSource::Pid(_))
    }
}

/// Whether process `pid` exists (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => text
            .rfind(')')
            .and_then(|i| text.get(i + 1..))
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// A PID file's PID: the first line, trimmed; `None` when empty, not a number, or 0.
pub fn parse_pid_file(text: &str) -> Option<u32> {
    text.lines()
        .next()?
        .trim()
        .parse()
        .ok()
        .filter(|&p: &u32| p > 0)
}

/// `systemctl show -p MainPID [--value]` output (`1234` or `MainPID=1234`); 0 means the unit
/// has no main process.
pub fn parse_main_pid(text: &str) -> Option<u32> {
    let line = text.lines().find(|l| !l.trim().is_empty())?.trim();
    let v = line.strip_prefix("MainPID=").unwrap_or(line);
    v.parse().ok().filter(|&p: &u32| p > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_files_and_main_pid() {
        assert_eq!(parse_pid_file("1234\n"), Some(1234));
        assert_eq!(parse_pid_file("  77  \nextra"), Some(77));
        assert_eq!(parse_pid_file(""), None);
        assert_eq!(parse_pid_file("0\n"), None);
        assert_eq!(parse_pid_file("nginx\n"), None);
        assert_eq!(parse_main_pid("4321\n"), Some(4321));
        assert_eq!(parse_main_pid("MainPID=4321\n"), Some(4321));
        assert_eq!(parse_main_pid("0\n"), None);
        assert_eq!(parse_main_pid(""), None);
    }

    #[test]
    fn sources_name_live_processes_only() {
        let me = std::process::id();
        assert_eq!(PidSource::Pid(me).current(), Ok(Some(me)));
        assert!(alive(me));
        assert!(!alive(0));
        let dir = corelocal::testing::ScratchDir::new("steer-target");
        let file = dir.join("x.pid");
        let src = PidSource::PidFile(file.clone());
        assert_eq!(src.current(), Ok(None), "no file: stopped");
        std::fs::write(&file, format!("{me}\n")).unwrap();
        assert_eq!(src.current(), Ok(Some(me)));
        // A fake systemctl prints MainPID.
        let fake = dir.join("systemctl");
        std::fs::write(&fake, format!("#!/bin/sh\necho {me}\n")).unwrap();
        std::process::Command::new("chmod")
            .args(["+x", &fake.display().to_string()])
            .status()
            .unwrap();
        let unit = PidSource::Unit {
            name: "nginx.service".into(),
            systemctl: fake,
        };
        assert_eq!(unit.current(), Ok(Some(me)));
        assert!(unit.follows() && !PidSource::Pid(me).follows());
    }
}
