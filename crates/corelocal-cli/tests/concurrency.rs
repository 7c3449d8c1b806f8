//! One server process holds more connections than RLIMIT_NOFILE allows it descriptors: with
//! io_uring, accepted connections live in each ring's direct-descriptor table, not in the
//! process's fd table (MegaPipe's lightweight sockets).

mod common;

use common::{last_stats, Served, BIN};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HOLD: &str = env!("CARGO_BIN_EXE_corelocal-hold");
const PER_HOLDER: usize = 11_000;

fn nofile_soft() -> u64 {
    corelocal::sys::process::nofile_limit().unwrap().0
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn wait_line(child: &mut Child, prefix: &str) -> String {
    let stdout = child.stdout.as_mut().unwrap();
    let mut reader = BufReader::new(stdout);
    loop {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "holder exited early"
        );
        if line.starts_with(prefix) {
            return line;
        }
    }
}

#[test]
fn one_process_holds_more_connections_than_its_fd_limit() {
    let total = 2 * PER_HOLDER;
    if nofile_soft() >= total as u64 {
        eprintln!(
            "skipping: RLIMIT_NOFILE {} is not below {total}",
            nofile_soft()
        );
        return;
    }
    let stats = std::env::temp_dir().join(format!("corelocal-conc-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&stats);
    let mut cmd = Command::new(BIN);
    cmd.args([
        "serve",
        "rpc",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        "uring",
        "--mode",
        "fine",
    ])
    .args([
        "--stats-interval",
        "200ms",
        "--idle-timeout",
        "10m",
        "--stats-file",
    ])
    .arg(&stats)
    .stdout(Stdio::null());
    let server = Served::spawn(cmd, false);
    assert!(server.log.contains("backend uring"), "{}", server.log);
    let addr = server.hostport();
    let mut holders: Vec<Child> = (0..2)
        .map(|_| {
            Command::new(HOLD)
                .args([&addr, &PER_HOLDER.to_string(), "64", "120"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for h in &mut holders {
        assert_eq!(
            wait_line(h, "verified").trim(),
            format!("verified {PER_HOLDER}")
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while last_stats(&stats)["total"]["open"].as_u64() != Some(total as u64) {
        assert!(
            Instant::now() < deadline,
            "open: {}",
            last_stats(&stats)["total"]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The server's own fd table stays small: listeners, rings, eventfds — no connections.
    let fds = open_fds(server.child.id());
    assert!(fds < 100, "server has {fds} descriptors open");
    for mut h in holders {
        drop(h.stdin.take());
        h.wait().unwrap();
    }
    assert_eq!(server.terminate().0, 0);
    let _ = std::fs::remove_file(&stats);
}
