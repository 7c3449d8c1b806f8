//! Two private network namespaces joined by a multi-queue veth pair, created with `ip` and
//! deleted when the guard drops (also on error, panic and SIGINT/SIGTERM, which only set a
//! flag). Namespaces are named `clsweep-PID-N-{s,r}`; ones left by a process that no longer
//! exists (a SIGKILLed run) are removed by [`remove_stale`].

use std::process::Command;
use std::time::{Duration, Instant};

/// Name prefix of every namespace this crate creates.
pub const PREFIX: &str = "clsweep-";
/// The sending side's interface (in the sender namespace).
pub const SEND_IF: &str = "clsw0";
/// The receiving side's interface (in the receiver namespace): RPS is set on its RX queues.
pub const RECV_IF: &str = "clsw1";
/// Sender address.
pub const SEND_ADDR: [u8; 4] = [10, 213, 0, 1];
/// Receiver address.
pub const RECV_ADDR: [u8; 4] = [10, 213, 0, 2];
/// The most veth queues asked for.
pub const QUEUES_MAX: usize = 64;
/// The longest one `ip` command may take.
const IP_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `ip ARGS`, bounded in time; the error carries ip's stderr.
pub fn ip(args: &[&str]) -> Result<String, String> {
    let mut child = Command::new("ip")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run ip (iproute2): {e}"))?;
    let deadline = Instant::now() + IP_TIMEOUT;
    loop {
        if child.try_wait().map_err(|e| e.to_string())?.is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("ip {}: timed out", args.join(" ")));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// One network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates namespace `name` with `lo` up.
    pub fn create(name: &str) -> Result<Netns, String> {
        ip(&["netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
        };
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name (under /run/netns).
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("corelocal sweep: warning: {e}");
        }
    }
}

/// The sender and receiver namespaces and the veth between them.
#[derive(Debug)]
pub struct VethPair {
    /// Namespace of the sending side.
    pub sender: Netns,
    /// Namespace of the receiving side.
    pub receiver: Netns,
    /// RX (= TX) queues of each veth end.
    pub queues: usize,
}

fn addr(a: [u8; 4]) -> String {
    format!("{}.{}.{}.{}/24", a[0], a[1], a[2], a[3])
}

impl VethPair {
    /// Creates `clsweep-PID-N-s` and `-r` (N counts pairs made by this process), a veth with
    /// `queues` queues per direction, the addresses, and brings everything up.
    pub fn create(queues: usize) -> Result<VethPair, String> {
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let q = queues.clamp(1, QUEUES_MAX).to_string();
        let base = format!("{PREFIX}{}-{seq}", std::process::id());
        let sender = Netns::create(&format!("{base}-s"))?;
        let receiver = Netns::create(&format!("{base}-r"))?;
        let (s, r) = (sender.name(), receiver.name());
        ip(&[
            "-n",
            s,
            "link",
            "add",
            SEND_IF,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "type",
            "veth",
            "peer",
            "name",
            RECV_IF,
            "netns",
            r,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
        ])?;
        ip(&["-n", s, "addr", "add", &addr(SEND_ADDR), "dev", SEND_IF])?;
        ip(&["-n", r, "addr", "add", &addr(RECV_ADDR), "dev", RECV_IF])?;
        ip(&["-n", s, "link", "set", SEND_IF, "up"])?;
        ip(&["-n", r, "link", "set", RECV_IF, "up"])?;
        Ok(VethPair {
            sender,
            receiver,
            queues: queues.clamp(1, QUEUES_MAX),
        })
    }
}

/// The pid in a namespace name made by this crate (`clsweep-PID-...`).
pub fn owner_pid(name: &str) -> Option<u32> {
    owner_pid_with(PREFIX, name)
}

/// The pid in a namespace name `PREFIX PID-...`.
pub fn owner_pid_with(prefix: &str, name: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.split('-').next()?.parse().ok()
}

/// Deletes `clsweep-*` namespaces whose creating process is gone; returns their names.
pub fn remove_stale() -> Vec<String> {
    remove_stale_with(PREFIX)
}

/// Deletes namespaces named `prefix PID-...` whose creating process is gone; returns their
/// names.
pub fn remove_stale_with(prefix: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten().take(4096) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner_pid_with(prefix, &name) else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if ip(&["netns", "del", &name]).is_ok() {
            removed.push(name);
        }
    }
    removed
}

/// Namespaces of this crate that exist now (for tests and diagnostics).
pub fn ours() -> Vec<String> {
    ours_with(PREFIX)
}

/// Namespaces whose name starts with `prefix` that exist now.
pub fn ours_with(prefix: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return Vec::new();
    };
    entries
        .flatten()
        .take(4096)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_parses_our_names_only() {
        assert_eq!(owner_pid("clsweep-1234-0-s"), Some(1234));
        assert_eq!(owner_pid("clsweep-x-0-s"), None);
        assert_eq!(owner_pid("corelocal-tune-1"), None);
        assert_eq!(addr(RECV_ADDR), "10.213.0.2/24");
    }
}
