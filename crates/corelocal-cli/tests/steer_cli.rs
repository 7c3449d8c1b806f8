//! `corelocal steer` from the command line: `watch` as a service says why it stopped with
//! its exit status (0 signal, 3 the server exited, 4 refused, 6 no server) and logs one JSON
//! event per line; `--detach-on-exit` leaves the kernel's hash. Root and nginx (inside a
//! private network namespace; under `CI=true` these never skip).

use corelocal::testing::{inside_private_netns, set_up_loopback, sh, ScratchDir};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_corelocal");

fn have_nginx() -> bool {
    let ok = Command::new("sh")
        .args(["-c", "command -v nginx"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "nginx is not installed and CI=true forbids skipping"
        );
        eprintln!("skipping: nginx is not installed");
    }
    ok
}

/// nginx with two workers on the first two CPUs (or one, unpinned, when `reuseport` is
/// false); returns its master's PID file.
fn nginx(dir: &ScratchDir, port: u16, reuseport: bool) -> std::path::PathBuf {
    let d = dir.display();
    let rp = if reuseport { " reuseport" } else { "" };
    std::fs::write(
        dir.join("nginx.conf"),
        format!(
            "worker_processes 2;\nworker_cpu_affinity 01 10;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log;\nevents {{ worker_connections 256; }}\n\
             http {{ access_log off; client_body_temp_path {d}/body;\n\
             server {{ listen 127.0.0.1:{port}{rp}; location / {{ return 200 \"ok\\n\"; }} }} }}\n"
        ),
    )
    .unwrap();
    sh(&format!(
        "chmod 0777 {d}; nginx -e {d}/error.log -p {d} -c {d}/nginx.conf"
    ));
    let pid_file = dir.join("nginx.pid");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&pid_file).map_or(true, |t| t.trim().is_empty()) {
        assert!(Instant::now() < deadline, "nginx did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    pid_file
}

fn pid_in(file: &std::path::Path) -> u32 {
    std::fs::read_to_string(file)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn wait_exit(child: &mut std::process::Child, within: Duration) -> i32 {
    let deadline = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st.code().unwrap_or(-1);
        }
        assert!(Instant::now() < deadline, "watch did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn watch_exit_statuses_and_json_events() {
    if !inside_private_netns("watch_exit_statuses_and_json_events") {
        return;
    }
    if !have_nginx() {
        return;
    }
    set_up_loopback(None);
    let dir = ScratchDir::new("corelocal-steer-cli");

    // 6: nothing names a server within the start timeout.
    let out = Command::new(BIN)
        .args(["steer", "watch", "--start-timeout-s", "1", "--pid-file"])
        .arg(dir.join("missing.pid"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(6), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no server"));

    // 0 on SIGTERM, one JSON object per line, and --detach-on-exit detaches.
    let pid_file = nginx(&dir, 18301, true);
    let pid = pid_in(&pid_file);
    let mut watch = Command::new(BIN)
        .args(["steer", "watch", "--json", "--detach-on-exit", "--pid-file"])
        .arg(&pid_file)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = sh(&format!("{BIN} steer status --pid {pid}"));
        if st.contains("method ebpf") {
            break;
        }
        assert!(Instant::now() < deadline, "watch never attached: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
    sh(&format!("kill -TERM {}", watch.id()));
    assert_eq!(wait_exit(&mut watch, Duration::from_secs(10)), 0);
    let mut stdout = String::new();
    std::io::Read::read_to_string(watch.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    let events: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    for k in ["target", "attached", "detached", "stopping"] {
        assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
    }
    assert!(events
        .iter()
        .all(|e| e["ts"].as_str().is_some_and(|t| t.ends_with('Z'))));
    assert!(sh(&format!("{BIN} steer status --pid {pid}")).contains("kernel hash"));

    // 3: watching by PID, the server stops for good.
    let mut watch = Command::new(BIN)
        .args(["steer", "watch", "--pid", &pid.to_string()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    sh(&format!("kill -QUIT {pid}"));
    assert_eq!(wait_exit(&mut watch, Duration::from_secs(10)), 3);

    // 4: refused (not reuseport), nothing changed.
    let plain = ScratchDir::new("corelocal-steer-cli-plain");
    let pid_file = nginx(&plain, 18302, false);
    let out = Command::new(BIN)
        .args(["steer", "watch", "--pid-file"])
        .arg(&pid_file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not reuseport"));
    sh(&format!("kill -QUIT {}", pid_in(&pid_file)));
}
