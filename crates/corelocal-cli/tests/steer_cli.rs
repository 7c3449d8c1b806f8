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

/// Fresh one-shot requests from a thread pinned to `cpu`: how many were answered in full
/// within `timeout` each.
fn answered_from(cpu: usize, port: u16, n: usize, timeout: Duration) -> usize {
    use std::io::{Read, Write};
    std::thread::scope(|s| {
        s.spawn(|| {
            corelocal::cpu::pin_current_thread(&corelocal::cpu::CpuSet::single(cpu)).unwrap();
            (0..n)
                .filter(|_| {
                    let start = Instant::now();
                    let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                        return false;
                    };
                    let _ = c.set_read_timeout(Some(timeout));
                    let _ = c.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
                    let mut body = String::new();
                    let _ = c.read_to_string(&mut body);
                    body.ends_with("ok\n") && start.elapsed() <= timeout
                })
                .count()
        })
        .join()
        .unwrap()
    })
}

/// Stops nginx (and so its balancer) however the test ends.
struct QuitOnDrop(u32);

impl Drop for QuitOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-QUIT", &self.0.to_string()])
            .status();
    }
}

fn balancer_pids(pid: u32) -> Vec<u32> {
    corelocal_steer::background::find(pid)
}

/// The balancer `attach` started for `pid`, once `/proc` shows it (within 2 s).
fn wait_balancer(pid: u32) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let found = balancer_pids(pid);
        if !found.is_empty() || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 33: `steer attach` leaves a balancer running by default: `status` names it, a
/// stopped worker's CPU is served by the other worker, `detach` stops it (and the steering);
/// `--balance off` starts none; the balancer exits with the server.
#[test]
fn attach_leaves_a_balancer_that_routes_around_a_stopped_worker() {
    if !inside_private_netns("attach_leaves_a_balancer_that_routes_around_a_stopped_worker") {
        return;
    }
    if !have_nginx() {
        return;
    }
    set_up_loopback(None);
    let dir = ScratchDir::new("corelocal-steer-cli-balance");
    let pid = pid_in(&nginx(&dir, 18303, true));
    let _stop = QuitOnDrop(pid);
    let out = sh(&format!("{BIN} steer attach --pid {pid}"));
    assert!(out.contains("balancer: pid"), "{out}");
    let balancer = wait_balancer(pid);
    assert_eq!(balancer.len(), 1, "{out}");
    let st = sh(&format!("{BIN} steer status --pid {pid}"));
    assert!(
        st.contains(&format!("balancer: running (pid {}", balancer[0])),
        "{st}"
    );
    // Give the balancer its first look, then stop the worker pinned to CPU 0.
    std::thread::sleep(Duration::from_millis(300));
    let worker = sh(&format!("pgrep -P {pid}"))
        .split_whitespace()
        .map(|p| p.parse::<u32>().unwrap())
        .find(|&p| sh(&format!("taskset -pc {p}")).trim().ends_with(": 0"))
        .expect("a worker pinned to CPU 0");
    sh(&format!("kill -STOP {worker}"));
    let ok = answered_from(0, 18303, 20, Duration::from_secs(1));
    sh(&format!("kill -CONT {worker}"));
    assert!(
        ok >= 19,
        "{ok} of 20 answered with the worker on CPU 0 stopped"
    );
    let st = sh(&format!("{BIN} steer status --pid {pid}"));
    assert!(st.contains("redirected to another CPU's worker"), "{st}");
    let out = sh(&format!("{BIN} steer detach --pid {pid}"));
    assert!(out.contains("stopped the balancer"), "{out}");
    assert!(balancer_pids(pid).is_empty());
    let out = sh(&format!("{BIN} steer attach --pid {pid} --balance off"));
    assert!(out.contains("balancer: off"), "{out}");
    assert!(balancer_pids(pid).is_empty());
    // With a balancer again: it leaves with the server.
    sh(&format!("{BIN} steer attach --pid {pid}"));
    let b = wait_balancer(pid);
    assert_eq!(b.len(), 1, "{b:?}");
    sh(&format!("kill -QUIT {pid}"));
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{}/cmdline", b[0])).exists()
        && std::fs::read(format!("/proc/{}/cmdline", b[0])).is_ok_and(|c| !c.is_empty())
    {
        assert!(
            Instant::now() < deadline,
            "the balancer {} outlived the server: {:?} {}",
            b[0],
            std::fs::read_to_string(format!("/proc/{}/stat", b[0])),
            sh("ps -eo pid,ppid,stat,args | grep -E 'nginx|steer' | grep -v grep")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("the balancer left {:?} after the server", t0.elapsed());
}
