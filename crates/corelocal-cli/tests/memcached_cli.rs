//! `corelocal memcached` as a process (issue 37): memcached's exit statuses and messages, the
//! binary under memcached's names (a link called `memcached` or `memcached-debug`), a
//! memcached.conf read as Debian's unit reads it, and a set and a get against the server it
//! starts. Option by option mapping: `src/memcached/tests.rs`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_corelocal");

/// A directory of this test's own, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("corelocal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `program args`: exit status, stdout, stderr.
fn run(program: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(program).args(args).output().expect("run");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn refusals_exit_as_memcached_and_name_the_option() {
    let bin = std::path::Path::new(BIN);
    for (args, code, part) in [
        (&["memcached", "-z"][..], 1, "invalid option -- 'z'"),
        (
            &["memcached", "-c", "0"][..],
            1,
            "Maximum connections must be greater than 0",
        ),
        (&["memcached", "-S"][..], 64, "-S: not supported"),
        (
            &["memcached", "-B", "http"][..],
            64,
            "Invalid value for binding protocol: http",
        ),
        (&["memcached", "-I", "256m"][..], 64, "1/2 of memory max"),
        (
            &["memcached", "-o", "ext_path=/x:1G"][..],
            64,
            "-o ext_path: not supported",
        ),
        // A `serve kv` option after `--` is checked by serve kv.
        (
            &["memcached", "--", "--backend", "nope"][..],
            64,
            "--backend",
        ),
    ] {
        let (status, stdout, stderr) = run(bin, args);
        assert_eq!(status, Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(part), "{args:?}: no {part:?} in {stderr}");
        assert!(stdout.is_empty(), "{args:?}: stdout {stdout}");
    }
}

#[test]
fn the_binary_named_memcached_is_the_memcached_command() {
    let dir = Scratch::new("memcached-names");
    for name in ["memcached", "memcached-debug"] {
        let link = dir.0.join(name);
        std::os::unix::fs::symlink(BIN, &link).expect("link");
        let (status, stdout, _) = run(&link, &["-V"]);
        assert_eq!(status, Some(0));
        assert!(
            stdout.starts_with("memcached 1.6.18 (corelocal "),
            "{stdout}"
        );
        let (status, stdout, _) = run(&link, &["-h"]);
        assert_eq!(status, Some(0));
        assert!(stdout.contains("-p, --port=<num>"), "{stdout}");
    }
    let (status, stdout, _) = run(std::path::Path::new(BIN), &["memcached", "-V"]);
    assert_eq!(status, Some(0));
    assert!(stdout.starts_with("memcached 1.6.18"), "{stdout}");
}

/// Reads lines from the server's stderr until one contains `want` (10 s at most).
fn wait_line(reader: &mut impl BufRead, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = String::new();
    while Instant::now() < deadline {
        let mut line = String::new();
        if reader.read_line(&mut line).expect("server output") == 0 {
            break;
        }
        seen.push_str(&line);
        if line.contains(want) {
            return seen;
        }
    }
    panic!("no {want:?} from the server: {seen}");
}

#[test]
fn a_memcached_conf_serves_a_set_and_a_get() {
    let dir = Scratch::new("memcached-conf");
    let conf = dir.0.join("memcached.conf");
    let port_file = dir.0.join("ports");
    std::fs::write(
        &conf,
        "# as Debian ships it\n-d\nlogfile /var/log/memcached.log\n-m 16\n-p -1\n-u memcache\n\
         -l 127.0.0.1\n-c 64   # connections\n",
    )
    .expect("conf");
    let mut server = Command::new(BIN)
        .args(["memcached", "--config-file"])
        .arg(&conf)
        .args(["-U", "0"])
        .env("MEMCACHED_PORT_FILENAME", &port_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start");
    let mut err = BufReader::new(server.stderr.take().expect("stderr"));
    let said = wait_line(&mut err, "listening on");
    assert!(said.contains("-u memcache: no effect"), "{said}");
    assert!(
        said.contains("`logfile /var/log/memcached.log` ignored"),
        "{said}"
    );
    assert!(!said.contains("--daemon"), "{said}");
    let ports = std::fs::read_to_string(&port_file).expect("port file");
    let port: u16 = ports
        .lines()
        .find_map(|l| l.strip_prefix("TCP INET: "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no TCP port in {ports:?}"));
    let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"set k 0 0 2\r\nhi\r\nget k\r\nstats settings\r\n")
        .expect("send");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"END\r\n") || !String::from_utf8_lossy(&got).contains("STAT maxconns") {
        let n = c.read(&mut buf).expect("read");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let got = String::from_utf8_lossy(&got);
    assert!(
        got.starts_with("STORED\r\nVALUE k 0 2\r\nhi\r\nEND\r\n"),
        "{got}"
    );
    assert!(got.contains("STAT maxbytes 16777216\r\n"), "{got}");
    drop(c);
    // memcached writes nothing on stdout; a stop's summary goes to stderr too.
    let pid = server.id().to_string();
    Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    let status = server.wait().expect("wait");
    let mut stdout = String::new();
    server
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut stdout)
        .expect("stdout");
    assert!(status.success(), "{status}");
    assert_eq!(stdout, "");
}

/// `-d` with `-- --log-file -`, as the units run it: the command exits once the server
/// serves, the pid file names the server, and what the server says after that (its stop)
/// still reaches the command's standard error (a unit's journal).
#[test]
fn a_daemon_logs_to_the_commands_stderr_with_log_file_dash() {
    let dir = Scratch::new("memcached-daemon");
    let (pid_file, ports, log) = (dir.0.join("pid"), dir.0.join("ports"), dir.0.join("log"));
    let status = Command::new(BIN)
        .args([
            "memcached",
            "-d",
            "-l",
            "127.0.0.1",
            "-p",
            "-1",
            "-U",
            "0",
            "-P",
        ])
        .arg(&pid_file)
        .args(["--", "--log-file", "-"])
        .env("MEMCACHED_PORT_FILENAME", &ports)
        .stderr(std::fs::File::create(&log).expect("log"))
        .status()
        .expect("run");
    assert!(status.success(), "{status}");
    let pid = std::fs::read_to_string(&pid_file).expect("pid file");
    let pid = pid.trim().to_string();
    Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    let deadline = Instant::now() + Duration::from_secs(10);
    while pid_file.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!pid_file.exists(), "the server did not stop");
    let said = std::fs::read_to_string(&log).expect("log");
    assert!(said.contains("listening on"), "{said}");
    assert!(said.contains("signal 15"), "{said}");
}
