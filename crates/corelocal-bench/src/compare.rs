//! `corelocal bench compare`: A B A B rounds against several servers, each run in a fresh
//! network namespace (`unshare -n`, lo up) so TIME_WAIT and other state of the last run cannot
//! skew the next, client and server pinned; medians, spread and ratios of the server's CPU
//! time per operation. Not run by CI (needs root and minutes); people run it.

use crate::cli::Dur;
use serde::Serialize;
use serde_json::Value;
use std::fmt::Write as _;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command as Proc, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// Which comparison to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum CmpWorkload {
    /// One request per connection (HTTP `GET /hello` with `Connection: close`, or one RPC).
    Crr,
    /// Keep-alive request/response: 1,000 sequential requests per connection (sockperf peers:
    /// 64-byte ping-pong messages).
    Ka,
    /// memcached gets over keep-alive connections.
    Kv,
    /// One request per connection for the paper's 64-byte `/64.txt` (nginx and lighttpd serve
    /// the file set written by `corelocal files gen`; corelocal-http its built-in copy).
    File64,
    /// The paper's session workload over its 30,000 files: `bench http --urls paper`, bursts
    /// 1,2,3 with 100 ms think time, closed loop (default 1,000 connections).
    Sessions,
    /// memcached gets, one transaction per connection.
    Kv1,
    /// memcached gets, 100 transactions per connection.
    Kv100,
}

impl CmpWorkload {
    /// Short name used in file names.
    pub fn name(self) -> &'static str {
        match self {
            CmpWorkload::Crr => "crr",
            CmpWorkload::Ka => "ka",
            CmpWorkload::Kv => "kv",
            CmpWorkload::File64 => "file64",
            CmpWorkload::Sessions => "sessions",
            CmpWorkload::Kv1 => "kv1",
            CmpWorkload::Kv100 => "kv100",
        }
    }

    /// Whether HTTP peers must serve the paper's file set (rather than `/hello`).
    pub fn needs_fileset(self) -> bool {
        matches!(self, CmpWorkload::File64 | CmpWorkload::Sessions)
    }
}

/// `compare` arguments.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct CompareArgs {
    /// A preset server: floor (shared/tools/floor_server), nginx, lighttpd, corelocal-rpc,
    /// corelocal-http, memcached, corelocal-kv, sockperf, corelocal-sockperf (Debian peers are
    /// installed when missing). Repeat; the first is the baseline of the ratios.
    #[arg(long)]
    pub peer: Vec<String>,
    /// A custom server: NAME=PROTO:COMMAND with PROTO http|rpc|kv|sockperf and {port} {cpu} in COMMAND,
    /// e.g. 'mine=http:./srv {port} {cpu}'. The command must stay in the foreground.
    #[arg(long)]
    pub server: Vec<String>,
    /// Workload.
    #[arg(long, value_enum, default_value = "crr")]
    pub workload: CmpWorkload,
    /// Rounds (each runs every server once, in order).
    #[arg(long, default_value = "3")]
    pub rounds: usize,
    /// Measured length of each run.
    #[arg(long, default_value = "5s")]
    pub duration: Dur,
    /// Warm-up of each run.
    #[arg(long, default_value = "1s")]
    pub warmup: Dur,
    /// Client connections (default 64; 1,000 for `sessions`, whose clients mostly think).
    #[arg(long)]
    pub conns: Option<usize>,
    /// CPU of the server (one worker / process).
    #[arg(long, default_value = "1")]
    pub server_cpu: usize,
    /// CPUs of the client.
    #[arg(long, default_value = "0")]
    pub client_cpus: String,
    /// Port the servers listen on (inside each namespace).
    #[arg(long, default_value = "8080")]
    pub port: u16,
    /// Output directory.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// The corelocal binary (default: `corelocal` next to this program, else on PATH).
    #[arg(long)]
    pub corelocal_bin: Option<PathBuf>,
    /// floor_server binary (default: built with gcc from shared/tools/floor_server.c).
    #[arg(long)]
    pub floor_bin: Option<PathBuf>,
    /// Run without network namespaces (no root needed; state carries over between runs).
    #[arg(long)]
    pub no_netns: bool,
    /// Extra arguments for every `bench` run (after --), e.g. -- --engine epoll.
    #[arg(last = true)]
    pub extra: Vec<String>,
}

/// The hidden per-run command executed inside the namespace.
#[derive(Debug, Clone, clap::Args)]
pub struct RoundArgs {
    /// Server command (run with `sh -c exec …`, pinned with taskset).
    #[arg(long)]
    pub server_cmd: String,
    /// Port to wait for.
    #[arg(long)]
    pub port: u16,
    /// Server CPU.
    #[arg(long)]
    pub server_cpu: usize,
    /// The bench arguments.
    #[arg(last = true)]
    pub bench: Vec<String>,
}

impl CompareArgs {
    /// Client connections of each run.
    pub fn conns(&self) -> usize {
        self.conns.unwrap_or(match self.workload {
            CmpWorkload::Sessions => 1000,
            _ => 64,
        })
    }
}

/// A server to compare.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ServerDef {
    /// Name in the tables.
    pub name: String,
    /// Protocol it speaks: http, rpc, kv, sockperf.
    pub proto: String,
    /// Command with {port} and {cpu}.
    pub cmd: String,
}

/// Parses `NAME=PROTO:COMMAND`.
pub fn parse_server(s: &str) -> Result<ServerDef, String> {
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("--server {s:?}: expected NAME=PROTO:COMMAND"))?;
    let (proto, cmd) = rest
        .split_once(':')
        .ok_or_else(|| format!("--server {s:?}: expected NAME=PROTO:COMMAND"))?;
    if !matches!(proto, "http" | "rpc" | "kv" | "sockperf") {
        return Err(format!(
            "--server {s:?}: PROTO must be http, rpc, kv or sockperf"
        ));
    }
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        || cmd.trim().is_empty()
    {
        return Err(format!(
            "--server {s:?}: NAME must be [A-Za-z0-9_-]+ and COMMAND non-empty"
        ));
    }
    Ok(ServerDef {
        name: name.into(),
        proto: proto.into(),
        cmd: cmd.into(),
    })
}

fn shared_dir() -> Option<PathBuf> {
    let mut cands = Vec::new();
    if let Some(d) = std::env::var_os("CORELOCAL_SHARED") {
        cands.push(PathBuf::from(d));
    }
    if let Ok(cwd) = std::env::current_dir() {
        cands.push(cwd.join("../shared"));
        cands.push(cwd.join("shared"));
    }
    cands.push(PathBuf::from("/work/shared"));
    cands
        .into_iter()
        .find(|d| d.join("tools/floor_server.c").is_file())
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Finds `name`, installing Debian package `package` first when it is missing and we are root
/// (the peers come from Debian).
fn which_or_install(name: &str, package: &str) -> Result<PathBuf, String> {
    if let Some(p) = which(name) {
        return Ok(p);
    }
    if corelocal::sys::process::is_root() {
        eprintln!("compare: {name} missing; apt-get install {package}");
        let _ = std::process::Command::new("apt-get")
            .args(["install", "-y", "-qq", package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status();
    }
    which(name).ok_or_else(|| format!("{name} not installed (apt-get install {package})"))
}

/// The lighttpd configuration used for the comparison: one process, static files under `root`
/// (`DIR/www` with `/hello` when `None`).
pub fn lighttpd_conf(dir: &Path, port: u16, root: Option<&Path>) -> String {
    let d = dir.display();
    let www = root.map_or_else(|| format!("{d}/www"), |r| r.display().to_string());
    format!(
        "server.document-root = \"{www}\"\nserver.bind = \"127.0.0.1\"\nserver.port = {port}\n\
         server.pid-file = \"{d}/lighttpd.pid\"\nserver.errorlog = \"{d}/error.log\"\n\
         server.max-fds = 16384\nserver.max-connections = 8192\n\
         server.max-keep-alive-requests = 1000000\nserver.max-keep-alive-idle = 60\n\
         mimetype.assign = (\"\" => \"text/plain\")\n"
    )
}

fn floor_bin(a: &CompareArgs, work: &Path) -> Result<PathBuf, String> {
    if let Some(b) = &a.floor_bin {
        return Ok(b.clone());
    }
    if let Some(b) = which("floor_server") {
        return Ok(b);
    }
    let src = shared_dir()
        .ok_or("cannot find shared/tools/floor_server.c (set CORELOCAL_SHARED or --floor-bin)")?;
    let bin = work.join("floor_server");
    let st = Proc::new("gcc")
        .args(["-O2", "-pthread"])
        .arg(src.join("tools/floor_server.c"))
        .arg("-o")
        .arg(&bin)
        .status()
        .map_err(|e| format!("gcc: {e}"))?;
    if !st.success() {
        return Err("building floor_server failed".into());
    }
    Ok(bin)
}

fn corelocal_bin(a: &CompareArgs) -> PathBuf {
    if let Some(b) = &a.corelocal_bin {
        return b.clone();
    }
    if let Ok(me) = std::env::current_exe() {
        let sib = me.with_file_name("corelocal");
        if sib.is_file() {
            return sib;
        }
    }
    which("corelocal").unwrap_or_else(|| PathBuf::from("corelocal"))
}

/// The nginx configuration used for the comparison (one worker, no master, reuseport): `/hello`
/// answered from the config, or with `root` static files from that directory (sendfile, an open
/// file cache of 8,000 entries: well under `worker_rlimit_nofile`, or a full cache of the
/// 30,000 files runs out of descriptors and answers 500).
pub fn nginx_conf(dir: &Path, port: u16, root: Option<&Path>) -> String {
    let d = dir.display();
    let location = match root {
        None => {
            "location = /hello { default_type text/plain; return 200 \"hello\\n\"; }".to_string()
        }
        Some(r) => format!(
            "root {};\n    sendfile on; tcp_nopush on;\n\
             \x20   open_file_cache max=8000 inactive=60s; open_file_cache_valid 60s;\n\
             \x20   types {{ text/plain txt; text/html html; }} default_type text/plain;\n\
             \x20   location / {{ }}",
            r.display()
        ),
    };
    format!(
        "worker_processes 1;\nmaster_process off;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         worker_rlimit_nofile 20000;\nevents {{ worker_connections 16384; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 1000000;\n  keepalive_timeout 60s;\n\
         \x20 client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;\n\
         \x20 uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;\n\
         \x20 server {{\n    listen 127.0.0.1:{port} reuseport backlog=4096;\n\
         \x20   {location}\n  }}\n}}\n"
    )
}

/// The address list of the sockperf preset: one TCP address. `sockperf server --tcp -i IP -p
/// PORT` waits in a blocking `recvfrom()` on one connection at a time (its "recvfrom" handler,
/// taken whenever it has a single address on the command line), so 64 connections are served
/// round-robin at several times the CPU per message; only an address list (`-f`) gets its
/// epoll loop (`-F epoll`, non-blocking sockets). One process, one thread: `--threads-num`
/// spreads the addresses of a list over threads, so one port is one thread; taskset pins it.
pub fn sockperf_feed(port: u16) -> String {
    format!("T:127.0.0.1:{port}\n")
}

/// For workloads over the paper's file set: writes it once under `work/site` with
/// `corelocal files gen` (the bytes `corelocal serve http` serves built in) and returns the root.
fn site(a: &CompareArgs, work: &Path) -> Result<Option<PathBuf>, String> {
    if !a.workload.needs_fileset() {
        return Ok(None);
    }
    let root = work.join("site");
    if root.join("64.txt").is_file() {
        return Ok(Some(root));
    }
    let cl = corelocal_bin(a);
    let out = Proc::new(&cl)
        .args(["files", "gen", "--out"])
        .arg(&root)
        .output()
        .map_err(|e| format!("{} files gen: {e}", cl.display()))?;
    if !out.status.success() || !root.join("64.txt").is_file() {
        return Err(format!(
            "{} files gen --out {} failed: {}",
            cl.display(),
            root.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(Some(root))
}

fn preset(name: &str, a: &CompareArgs, work: &Path) -> Result<ServerDef, String> {
    let cl = corelocal_bin(a);
    let ka = a.workload != CmpWorkload::Crr;
    let def = |proto: &str, cmd: String| {
        Ok(ServerDef {
            name: name.into(),
            proto: proto.into(),
            cmd,
        })
    };
    match name {
        "floor" => {
            let b = floor_bin(a, work)?;
            def("http", format!("{} {{port}} 1 {{cpu}}{}", b.display(), if ka { " keepalive" } else { "" }))
        }
        "nginx" => {
            let nginx = which_or_install("nginx", "nginx-light")?;
            let dir = work.join("nginx");
            std::fs::create_dir_all(dir.join("tmp")).map_err(|e| e.to_string())?;
            let root = site(a, work)?;
            std::fs::write(dir.join("nginx.conf"), nginx_conf(&dir, a.port, root.as_deref()))
                .map_err(|e| e.to_string())?;
            def("http", format!("{} -p {} -c {}/nginx.conf", nginx.display(), dir.display(), dir.display()))
        }
        "lighttpd" => {
            let bin = which_or_install("lighttpd", "lighttpd")?;
            let dir = work.join("lighttpd");
            std::fs::create_dir_all(dir.join("www")).map_err(|e| e.to_string())?;
            std::fs::write(dir.join("www/hello"), "hello\n").map_err(|e| e.to_string())?;
            let root = site(a, work)?;
            std::fs::write(dir.join("lighttpd.conf"), lighttpd_conf(&dir, a.port, root.as_deref()))
                .map_err(|e| e.to_string())?;
            def("http", format!("{} -D -f {}/lighttpd.conf", bin.display(), dir.display()))
        }
        "corelocal-rpc" => def(
            "rpc",
            format!(
                "{} serve rpc --listen 127.0.0.1:{{port}} --cpus {{cpu}} --stats-interval 0{}",
                cl.display(),
                if ka { "" } else { " --one-shot" }
            ),
        ),
        "corelocal-http" if a.workload.needs_fileset() => def(
            "http",
            // No --root: the built-in copy of the paper's file set, the same bytes `files gen` writes.
            format!(
                "{} serve http --listen 127.0.0.1:{{port}} --cpus {{cpu}} --stats-interval 0",
                cl.display()
            ),
        ),
        "corelocal-http" => {
            // The same 6-byte `/hello` body nginx's preset returns, as a static file.
            let root = work.join("corelocal-www");
            std::fs::create_dir_all(&root).map_err(|e| e.to_string())?;
            std::fs::write(root.join("hello"), "hello\n").map_err(|e| e.to_string())?;
            def(
                "http",
                format!(
                    "{} serve http --listen 127.0.0.1:{{port}} --cpus {{cpu}} --stats-interval 0 --root {}",
                    cl.display(),
                    root.display()
                ),
            )
        }
        "corelocal-kv" => {
            def("kv", format!("{} serve kv --listen 127.0.0.1:{{port}} --cpus {{cpu}} --stats-interval 0", cl.display()))
        }
        "memcached" => {
            let m = which_or_install("memcached", "memcached")?;
            def("kv", format!("{} -l 127.0.0.1 -p {{port}} -t 1 -U 0 -c 20000 -u nobody", m.display()))
        }
        "sockperf" => {
            let b = which_or_install("sockperf", "sockperf")?;
            let dir = work.join("sockperf");
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            std::fs::write(dir.join("feed.txt"), sockperf_feed(a.port)).map_err(|e| e.to_string())?;
            def("sockperf", format!("{} server -f {}/feed.txt -F epoll --nonblocked", b.display(), dir.display()))
        }
        "corelocal-sockperf" => def(
            "sockperf",
            format!("{} serve sockperf --listen 127.0.0.1:{{port}} --cpus {{cpu}} --stats-interval 0", cl.display()),
        ),
        _ => Err(format!("unknown --peer {name:?}: floor, nginx, lighttpd, corelocal-rpc, corelocal-http, memcached, corelocal-kv, sockperf, corelocal-sockperf")),
    }
}

/// The bench arguments of one run against a server speaking `proto`.
pub fn bench_args(a: &CompareArgs, proto: &str, json: &Path) -> Result<Vec<String>, String> {
    let t = format!("127.0.0.1:{}", a.port);
    let mut v: Vec<String> = match (a.workload, proto) {
        (CmpWorkload::Crr, "http") => vec![
            "crr".into(),
            "--proto".into(),
            "http".into(),
            "--path".into(),
            "/hello".into(),
        ],
        (CmpWorkload::Crr, "rpc") => vec![
            "crr".into(),
            "--proto".into(),
            "rpc".into(),
            "--msg-size".into(),
            "64".into(),
        ],
        (CmpWorkload::Ka, "http") => {
            vec![
                "http".into(),
                "--bursts".into(),
                "1000".into(),
                "--think".into(),
                "0".into(),
                "--urls".into(),
                "-".into(),
            ]
        }
        (CmpWorkload::Ka, "rpc") => vec![
            "rpc".into(),
            "--msg-size".into(),
            "64".into(),
            "--txns-per-conn".into(),
            "1000".into(),
        ],
        (CmpWorkload::Crr, "sockperf") => vec![
            "crr".into(),
            "--proto".into(),
            "sockperf".into(),
            "--msg-size".into(),
            "64".into(),
        ],
        (CmpWorkload::Ka, "sockperf") => vec![
            "rpc".into(),
            "--proto".into(),
            "sockperf".into(),
            "--msg-size".into(),
            "64".into(),
            "--txns-per-conn".into(),
            "1000".into(),
        ],
        (CmpWorkload::Kv, "kv") => vec![
            "kv".into(),
            "--keys".into(),
            "1000".into(),
            "--get-ratio".into(),
            "1".into(),
        ],
        (CmpWorkload::File64, "http") => vec![
            "crr".into(),
            "--proto".into(),
            "http".into(),
            "--path".into(),
            corelocal_proto::http::fileset::SMALL_PATH.into(),
        ],
        (CmpWorkload::Sessions, "http") => vec![
            "http".into(),
            "--urls".into(),
            "paper".into(),
            "--bursts".into(),
            "1,2,3".into(),
            "--think".into(),
            "100ms".into(),
            "--target".into(),
            format!("http://{t}/"),
        ],
        (CmpWorkload::Kv1 | CmpWorkload::Kv100, "kv") => vec![
            "kv".into(),
            "--keys".into(),
            "1000".into(),
            "--get-ratio".into(),
            "1".into(),
            "--txns-per-conn".into(),
            if a.workload == CmpWorkload::Kv1 {
                "1"
            } else {
                "100"
            }
            .into(),
        ],
        (w, p) => return Err(format!("workload {w:?} does not apply to a {p} server")),
    };
    if v.last().map(String::as_str) == Some("-") {
        // http: the path comes from the target URL.
        v.truncate(v.len() - 2);
        v.extend(["--target".into(), format!("http://{t}/hello")]);
    } else if !v.iter().any(|x| x == "--target") {
        v.extend(["--target".into(), t]);
    }
    v.extend([
        "--cpus".into(),
        a.client_cpus.clone(),
        "--conns".into(),
        a.conns().to_string(),
        "--duration".into(),
        a.duration.to_string(),
        "--warmup".into(),
        a.warmup.to_string(),
        "--progress".into(),
        "never".into(),
        "--json".into(),
        json.display().to_string(),
    ]);
    v.extend(a.extra.iter().cloned());
    Ok(v)
}

/// Runs inside the namespace: start the server pinned, wait for its port, run the bench with
/// `--server-pid`, stop the server.
pub fn round(a: RoundArgs) -> Result<ExitCode, String> {
    let mut child = Proc::new("taskset")
        .args([
            "-c",
            &a.server_cpu.to_string(),
            "sh",
            "-c",
            &format!("exec {}", a.server_cmd),
        ])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting server {:?}: {e}", a.server_cmd))?;
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], a.port));
    let ready = loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            break true;
        }
        if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let result = if ready {
        // The readiness probe's connection is not part of the run: let it settle.
        std::thread::sleep(Duration::from_millis(200));
        let mut args = vec!["bench".to_string()];
        args.extend(a.bench.iter().cloned());
        args.extend(["--server-pid".into(), pid.to_string()]);
        match crate::cli::Standalone::try_parse_args(&args) {
            Ok(cmd) => crate::cli::execute(cmd),
            Err(e) => Err(e),
        }
    } else {
        Err(format!(
            "server {:?} did not listen on {addr} within 10s",
            a.server_cmd
        ))
    };
    crate::sys::signal(pid, false);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Ok(None) = child.try_wait() {
        crate::sys::signal(pid, true);
        let _ = child.wait();
    }
    result
}

/// One run's figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunFig {
    /// Round number.
    pub round: usize,
    /// Transactions per second.
    pub txns_per_s: f64,
    /// Connections per second.
    pub conns_per_s: f64,
    /// Server CPU µs per transaction (schedstat).
    pub server_us_per_txn: Option<f64>,
    /// Server CPU µs per transaction (utime+stime).
    pub server_us_per_txn_utime: Option<f64>,
    /// Server cores busy.
    pub server_cores: Option<f64>,
    /// Client CPU µs per transaction.
    pub client_us_per_txn: Option<f64>,
    /// p50 / p99 latency µs.
    pub p50_us: f64,
    /// p99.
    pub p99_us: f64,
    /// Errors in window.
    pub errors: u64,
    /// Host load average at the end.
    pub load: String,
    /// The run's JSON report.
    pub json: String,
}

/// Extracts a run's figures from its JSON report.
pub fn figures(v: &Value, round: usize, json: &str) -> RunFig {
    let g = |p: &str| v.pointer(p).and_then(Value::as_f64);
    let txns = g("/throughput/txns").unwrap_or(0.0);
    let per = |p: &str| g(p).filter(|_| txns > 0.0).map(|us| us / txns);
    let client_units = g("/client_cpu/us_per_unit").zip(g("/throughput/units"));
    RunFig {
        round,
        txns_per_s: g("/throughput/txns_per_s").unwrap_or(0.0),
        conns_per_s: g("/throughput/conns_per_s").unwrap_or(0.0),
        server_us_per_txn: per("/server_cpu/schedstat_us"),
        server_us_per_txn_utime: per("/server_cpu/utime_stime_us"),
        server_cores: g("/server_cpu/cores_busy"),
        client_us_per_txn: client_units
            .filter(|_| txns > 0.0)
            .map(|(u, n)| u * n / txns),
        p50_us: g("/latency/txn/p50_us").unwrap_or(0.0),
        p99_us: g("/latency/txn/p99_us").unwrap_or(0.0),
        errors: v
            .pointer("/errors/in_window")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        load: v
            .pointer("/host/loadavg")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        json: json.to_string(),
    }
}

/// Median, min, max and spread ((max − min) / median) of some values.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// (max − min) / median.
    pub spread: f64,
    /// Samples.
    pub n: usize,
}

/// Statistics of `v` (None when empty).
pub fn spread(v: &[f64]) -> Option<Spread> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    let (min, max) = (s[0], s[n - 1]);
    Some(Spread {
        median,
        min,
        max,
        spread: if median != 0.0 {
            (max - min) / median
        } else {
            0.0
        },
        n,
    })
}

/// One server's summary.
#[derive(Debug, Clone, Serialize)]
pub struct ServerSummary {
    /// The server.
    pub server: ServerDef,
    /// Each run.
    pub runs: Vec<RunFig>,
    /// Throughput.
    pub txns_per_s: Option<Spread>,
    /// Server CPU µs per transaction (schedstat).
    pub server_us_per_txn: Option<Spread>,
    /// Server CPU µs per transaction (utime+stime).
    pub server_us_per_txn_utime: Option<Spread>,
    /// Median server µs/txn ÷ the baseline's.
    pub cpu_ratio_vs_baseline: Option<f64>,
    /// Median throughput ÷ the baseline's.
    pub throughput_ratio_vs_baseline: Option<f64>,
    /// Failed runs.
    pub failures: Vec<String>,
}

/// Summarises runs per server; the first server is the baseline.
pub fn summarize(
    servers: &[ServerDef],
    runs: &[Vec<RunFig>],
    failures: &[Vec<String>],
) -> Vec<ServerSummary> {
    let mut out: Vec<ServerSummary> = servers
        .iter()
        .zip(runs)
        .zip(failures)
        .map(|((s, r), f)| {
            let col = |get: &dyn Fn(&RunFig) -> Option<f64>| {
                spread(&r.iter().filter_map(get).collect::<Vec<_>>())
            };
            ServerSummary {
                server: s.clone(),
                runs: r.clone(),
                txns_per_s: col(&|x| Some(x.txns_per_s)),
                server_us_per_txn: col(&|x| x.server_us_per_txn),
                server_us_per_txn_utime: col(&|x| x.server_us_per_txn_utime),
                cpu_ratio_vs_baseline: None,
                throughput_ratio_vs_baseline: None,
                failures: f.clone(),
            }
        })
        .collect();
    let base_cpu = out
        .first()
        .and_then(|b| b.server_us_per_txn.map(|s| s.median));
    let base_tp = out.first().and_then(|b| b.txns_per_s.map(|s| s.median));
    for s in &mut out {
        s.cpu_ratio_vs_baseline = match (s.server_us_per_txn, base_cpu) {
            (Some(x), Some(b)) if b > 0.0 => Some(x.median / b),
            _ => None,
        };
        s.throughput_ratio_vs_baseline = match (s.txns_per_s, base_tp) {
            (Some(x), Some(b)) if b > 0.0 => Some(x.median / b),
            _ => None,
        };
    }
    out
}

/// UTC `YYYY-MM-DD` of a unix time (civil-from-days).
pub fn utc_date(unix: u64) -> String {
    let z = (unix / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

fn fmt_spread(s: &Option<Spread>, digits: usize) -> String {
    match s {
        Some(s) => format!(
            "{:.digits$} ({:.digits$}–{:.digits$}, ±{:.0}%)",
            s.median,
            s.min,
            s.max,
            s.spread * 50.0
        ),
        None => "–".into(),
    }
}

/// The markdown table.
pub fn markdown(
    a: &CompareArgs,
    sums: &[ServerSummary],
    cmdline: &str,
    load_before: &str,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# corelocal bench compare: {:?}\n", a.workload);
    let _ = writeln!(s, "`{cmdline}`\n");
    let _ = writeln!(
        s,
        "{} rounds, servers run in order each round ({}), each run {} after {} warm-up in a fresh network \
         namespace{}; server pinned to CPU{}, client on CPU {} ({} connections). Load average before: {load_before}.\n",
        a.rounds,
        sums.iter().map(|x| x.server.name.as_str()).collect::<Vec<_>>().join(" → "),
        a.duration,
        a.warmup,
        if a.no_netns { " (disabled: --no-netns)" } else { "" },
        a.server_cpu,
        a.client_cpus,
        a.conns()
    );
    let busy = load_before
        .split_whitespace()
        .next()
        .and_then(|x| x.parse::<f64>().ok())
        .unwrap_or(0.0);
    if busy > 0.5 {
        let _ = writeln!(
            s,
            "**Taken under contention** (load average {busy:.2} before the runs; other work shared these CPUs): \
             absolute µs/op are inflated, compare the ratios of runs taken side by side.\n"
        );
    }
    let _ = writeln!(
        s,
        "| server | server CPU µs/op (schedstat) median (min–max, ±half-spread) | µs/op utime+stime | ratio vs {} | ops/s | ops/s ratio | failures |",
        sums.first().map_or("-", |x| x.server.name.as_str())
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for x in sums {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            x.server.name,
            fmt_spread(&x.server_us_per_txn, 2),
            fmt_spread(&x.server_us_per_txn_utime, 2),
            x.cpu_ratio_vs_baseline
                .map_or("–".into(), |r| format!("{r:.3}")),
            fmt_spread(&x.txns_per_s, 0),
            x.throughput_ratio_vs_baseline
                .map_or("–".into(), |r| format!("{r:.3}")),
            x.failures.len()
        );
    }
    let _ = writeln!(s, "\nPer run:\n\n| server | round | ops/s | server µs/op | client µs/op | p50 µs | p99 µs | errors | load |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    for x in sums {
        for r in &x.runs {
            let _ = writeln!(
                s,
                "| {} | {} | {:.0} | {} | {} | {:.1} | {:.1} | {} | {} |",
                x.server.name,
                r.round,
                r.txns_per_s,
                r.server_us_per_txn
                    .map_or("–".into(), |v| format!("{v:.2}")),
                r.client_us_per_txn
                    .map_or("–".into(), |v| format!("{v:.2}")),
                r.p50_us,
                r.p99_us,
                r.errors,
                r.load
            );
        }
        for f in &x.failures {
            let _ = writeln!(s, "\nfailure ({}): {f}", x.server.name);
        }
    }
    let _ = writeln!(s, "\nServers:\n");
    for x in sums {
        let _ = writeln!(
            s,
            "- {} ({}): `{}`",
            x.server.name, x.server.proto, x.server.cmd
        );
    }
    let _ = writeln!(
        s,
        "\nop = one request/response (crr and file64: one connection each; sessions: one HTTP request \
         of a session, not the session; kv1/kv100: one get, 1 or 100 per connection; sockperf: one 64-byte message and its pong). Server CPU is the server process's threads' \
         schedstat run time over the measured window ÷ ops; on loopback the client's CPU also runs much of \
         the server's receive path, so throughput is client-bound and server CPU per op is the figure that \
         compares servers."
    );
    s
}

/// Runs the comparison.
pub fn run(a: CompareArgs) -> Result<ExitCode, String> {
    if a.rounds == 0 || a.rounds > 50 {
        return Err("--rounds must be within 1..50".into());
    }
    let stamp_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let wl = a.workload.name();
    let base = format!("bench-compare-{}-{wl}", utc_date(stamp_unix));
    let rundir = a.out.join(&base);
    std::fs::create_dir_all(&rundir).map_err(|e| format!("{}: {e}", rundir.display()))?;
    let work = std::env::temp_dir().join(format!("corelocal-compare-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let mut servers = Vec::new();
    for p in &a.peer {
        servers.push(preset(p, &a, &work)?);
    }
    for s in &a.server {
        servers.push(parse_server(s)?);
    }
    if servers.is_empty() {
        return Err("nothing to compare: give --peer and/or --server".into());
    }
    let unshare = which("unshare");
    if !a.no_netns && unshare.is_none() {
        return Err("unshare not found (util-linux); or pass --no-netns".into());
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let via_corelocal = std::env::args().nth(1).as_deref() == Some("bench");
    let load_before = crate::report::host_info().loadavg;
    let mut runs: Vec<Vec<RunFig>> = vec![Vec::new(); servers.len()];
    let mut failures: Vec<Vec<String>> = vec![Vec::new(); servers.len()];
    for round in 1..=a.rounds {
        for (k, s) in servers.iter().enumerate() {
            let json = rundir.join(format!("r{round}-{}.json", s.name));
            let bench = bench_args(&a, &s.proto, &json)?;
            let server_cmd = s
                .cmd
                .replace("{port}", &a.port.to_string())
                .replace("{cpu}", &a.server_cpu.to_string());
            let mut round_args: Vec<String> = Vec::new();
            if via_corelocal {
                round_args.push("bench".into());
            }
            round_args.extend([
                "__round".into(),
                "--server-cmd".into(),
                server_cmd,
                "--port".into(),
                a.port.to_string(),
                "--server-cpu".into(),
                a.server_cpu.to_string(),
                "--".into(),
            ]);
            round_args.extend(bench);
            let mut cmd = if a.no_netns {
                let mut c = Proc::new(&exe);
                c.args(&round_args);
                c
            } else {
                let mut c = Proc::new(unshare.as_ref().expect("checked above"));
                c.args([
                    "-n",
                    "--",
                    "sh",
                    "-c",
                    "ip link set lo up && exec \"$@\"",
                    "sh",
                ])
                .arg(&exe)
                .args(&round_args);
                c
            };
            eprintln!("compare: round {round}/{} {} ...", a.rounds, s.name);
            let out = cmd
                .stdout(Stdio::null())
                .output()
                .map_err(|e| format!("running a round: {e}"))?;
            let text = std::fs::read_to_string(&json).ok();
            match (out.status.success(), text) {
                (true, Some(t)) | (false, Some(t)) => {
                    let v: Value =
                        serde_json::from_str(&t).map_err(|e| format!("{}: {e}", json.display()))?;
                    let fig = figures(&v, round, &json.display().to_string());
                    eprintln!(
                        "compare:   {:.0} ops/s, server {} µs/op, errors {}",
                        fig.txns_per_s,
                        fig.server_us_per_txn
                            .map_or("–".into(), |x| format!("{x:.2}")),
                        fig.errors
                    );
                    if !out.status.success() {
                        failures[k].push(format!(
                            "round {round}: exit {:?}: {}",
                            out.status.code(),
                            String::from_utf8_lossy(&out.stderr).trim()
                        ));
                    }
                    runs[k].push(fig);
                }
                (_, None) => {
                    let msg = format!(
                        "round {round}: no report ({})",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                    eprintln!("compare:   FAILED {msg}");
                    failures[k].push(msg);
                }
            }
        }
    }
    let sums = summarize(&servers, &runs, &failures);
    let cmdline = std::env::args().collect::<Vec<_>>().join(" ");
    let md = markdown(&a, &sums, &cmdline, &load_before);
    let report = serde_json::json!({
        "tool": format!("corelocal bench compare {}", env!("CARGO_PKG_VERSION")),
        "command_line": cmdline,
        "config": a,
        "started_unix": stamp_unix,
        "load_before": load_before,
        "load_after": crate::report::host_info().loadavg,
        "host": crate::report::host_info(),
        "servers": sums,
    });
    let jp = a.out.join(format!("{base}.json"));
    let mp = a.out.join(format!("{base}.md"));
    std::fs::write(
        &jp,
        serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    std::fs::write(&mp, &md).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&work);
    print!("{md}");
    eprintln!("compare: wrote {} and {}", jp.display(), mp.display());
    Ok(if sums.iter().all(|s| s.failures.is_empty()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_median() {
        let s = spread(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(s.spread, 1.0);
        assert_eq!(spread(&[1.0, 2.0, 3.0, 10.0]).unwrap().median, 2.5);
        assert!(spread(&[]).is_none());
    }

    #[test]
    fn ratios_against_the_first_server() {
        let fig = |us: f64, tp: f64| RunFig {
            round: 1,
            txns_per_s: tp,
            conns_per_s: tp,
            server_us_per_txn: Some(us),
            server_us_per_txn_utime: Some(us),
            server_cores: None,
            client_us_per_txn: None,
            p50_us: 0.0,
            p99_us: 0.0,
            errors: 0,
            load: String::new(),
            json: String::new(),
        };
        let sv = |n: &str| ServerDef {
            name: n.into(),
            proto: "http".into(),
            cmd: "x".into(),
        };
        let sums = summarize(
            &[sv("a"), sv("b")],
            &[
                vec![fig(10.0, 100.0), fig(12.0, 90.0), fig(11.0, 95.0)],
                vec![fig(16.5, 80.0), fig(16.5, 80.0)],
            ],
            &[vec![], vec!["x".into()]],
        );
        assert_eq!(sums[0].cpu_ratio_vs_baseline, Some(1.0));
        assert_eq!(sums[1].cpu_ratio_vs_baseline, Some(1.5));
        assert_eq!(sums[1].throughput_ratio_vs_baseline, Some(80.0 / 95.0));
        let md = markdown(
            &CompareArgs {
                peer: vec![],
                server: vec![],
                workload: CmpWorkload::Crr,
                rounds: 3,
                duration: Dur(5_000_000_000),
                warmup: Dur(1_000_000_000),
                conns: Some(64),
                server_cpu: 1,
                client_cpus: "0".into(),
                port: 8080,
                out: "results".into(),
                corelocal_bin: None,
                floor_bin: None,
                no_netns: false,
                extra: vec![],
            },
            &sums,
            "cmd",
            "0.1",
        );
        assert!(
            md.contains("| b | 16.50 (16.50–16.50, ±0%)") && md.contains("| 1.500 |"),
            "{md}"
        );
    }

    #[test]
    fn servers_args_dates() {
        assert_eq!(
            parse_server("mine=http:./srv {port} {cpu}").unwrap().cmd,
            "./srv {port} {cpu}"
        );
        assert!(parse_server("mine=ftp:x").is_err());
        assert!(parse_server("noequals").is_err());
        assert!(parse_server("a b=http:x").is_err());
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(1_700_000_000), "2023-11-14");
        assert_eq!(utc_date(951_782_400), "2000-02-29");
        let a = CompareArgs {
            peer: vec![],
            server: vec![],
            workload: CmpWorkload::Ka,
            rounds: 1,
            duration: Dur(1_000_000_000),
            warmup: Dur(0),
            conns: Some(8),
            server_cpu: 1,
            client_cpus: "0".into(),
            port: 9,
            out: "r".into(),
            corelocal_bin: None,
            floor_bin: None,
            no_netns: true,
            extra: vec!["--engine".into(), "epoll".into()],
        };
        let v = bench_args(&a, "http", Path::new("x.json")).unwrap();
        assert_eq!(&v[..5], ["http", "--bursts", "1000", "--think", "0"]);
        assert!(v
            .windows(2)
            .any(|w| w == ["--target", "http://127.0.0.1:9/hello"]));
        assert_eq!(&v[v.len() - 2..], ["--engine", "epoll"]);
        assert!(bench_args(&a, "kv", Path::new("x")).is_err());
        let v = bench_args(&a, "sockperf", Path::new("x.json")).unwrap();
        assert_eq!(
            &v[..7],
            [
                "rpc",
                "--proto",
                "sockperf",
                "--msg-size",
                "64",
                "--txns-per-conn",
                "1000"
            ]
        );
        assert_eq!(value_of(&v, "--target"), Some("127.0.0.1:9"));
        let mut c = a.clone();
        c.workload = CmpWorkload::Crr;
        let v = bench_args(&c, "sockperf", Path::new("x.json")).unwrap();
        assert_eq!(&v[..5], ["crr", "--proto", "sockperf", "--msg-size", "64"]);
        c.workload = CmpWorkload::Kv1;
        assert!(bench_args(&c, "sockperf", Path::new("x")).is_err());
        assert_eq!(
            parse_server("sp=sockperf:./s {port}").unwrap().proto,
            "sockperf"
        );
        assert!(nginx_conf(Path::new("/t"), 9, None).contains("listen 127.0.0.1:9 reuseport"));
        assert!(lighttpd_conf(Path::new("/t"), 9, None).contains("server.port = 9"));
    }

    fn args(w: CmpWorkload) -> CompareArgs {
        CompareArgs {
            peer: vec![],
            server: vec![],
            workload: w,
            rounds: 1,
            duration: Dur(1_000_000_000),
            warmup: Dur(0),
            conns: None,
            server_cpu: 1,
            client_cpus: "0".into(),
            port: 9,
            out: "r".into(),
            corelocal_bin: None,
            floor_bin: None,
            no_netns: true,
            extra: vec![],
        }
    }

    fn value_of<'a>(v: &'a [String], flag: &str) -> Option<&'a str> {
        v.windows(2).find(|w| w[0] == flag).map(|w| w[1].as_str())
    }

    #[test]
    fn new_workloads_build_their_bench_arguments() {
        let j = Path::new("x.json");
        let a = args(CmpWorkload::File64);
        let v = bench_args(&a, "http", j).unwrap();
        assert_eq!(&v[..5], ["crr", "--proto", "http", "--path", "/64.txt"]);
        assert_eq!(value_of(&v, "--target"), Some("127.0.0.1:9"));
        assert_eq!(value_of(&v, "--conns"), Some("64"));
        assert!(bench_args(&a, "kv", j).is_err());

        let a = args(CmpWorkload::Sessions);
        let v = bench_args(&a, "http", j).unwrap();
        assert_eq!(v[0], "http");
        assert_eq!(value_of(&v, "--urls"), Some("paper"));
        assert_eq!(value_of(&v, "--bursts"), Some("1,2,3"));
        assert_eq!(value_of(&v, "--think"), Some("100ms"));
        assert_eq!(value_of(&v, "--target"), Some("http://127.0.0.1:9/"));
        assert_eq!(v.iter().filter(|x| *x == "--target").count(), 1);
        assert_eq!(value_of(&v, "--conns"), Some("1000"));
        let mut b = args(CmpWorkload::Sessions);
        b.conns = Some(300);
        assert_eq!(
            value_of(&bench_args(&b, "http", j).unwrap(), "--conns"),
            Some("300")
        );

        for (w, n) in [(CmpWorkload::Kv1, "1"), (CmpWorkload::Kv100, "100")] {
            let v = bench_args(&args(w), "kv", j).unwrap();
            assert_eq!(v[0], "kv");
            assert_eq!(value_of(&v, "--txns-per-conn"), Some(n));
            assert_eq!(value_of(&v, "--get-ratio"), Some("1"));
            assert_eq!(value_of(&v, "--target"), Some("127.0.0.1:9"));
            assert!(bench_args(&args(w), "http", j).is_err());
        }
        // The existing kv workload stays keep-alive without a per-connection limit.
        let v = bench_args(&args(CmpWorkload::Kv), "kv", j).unwrap();
        assert_eq!(value_of(&v, "--txns-per-conn"), None);
        assert_eq!(CmpWorkload::Kv100.name(), "kv100");
        assert!(CmpWorkload::File64.needs_fileset() && !CmpWorkload::Crr.needs_fileset());
    }

    #[test]
    fn file_set_configs_serve_the_generated_root() {
        let root = Path::new("/tmp/site");
        let n = nginx_conf(Path::new("/t"), 9, Some(root));
        assert!(n.contains("root /tmp/site;"), "{n}");
        assert!(
            n.contains("location / { }") && n.contains("open_file_cache max=8000"),
            "{n}"
        );
        assert!(!n.contains("/hello"), "{n}");
        assert_eq!(n.matches('{').count(), n.matches('}').count(), "{n}");
        let h = nginx_conf(Path::new("/t"), 9, None);
        assert!(
            h.contains("location = /hello") && !h.contains("root "),
            "{h}"
        );
        assert_eq!(h.matches('{').count(), h.matches('}').count(), "{h}");
        let l = lighttpd_conf(Path::new("/t"), 9, Some(root));
        assert!(l.contains("server.document-root = \"/tmp/site\""), "{l}");
        assert!(
            lighttpd_conf(Path::new("/t"), 9, None).contains("server.document-root = \"/t/www\"")
        );
    }

    #[test]
    fn presets_pick_the_file_set_for_corelocal_http() {
        let work = std::env::temp_dir().join(format!("cl-cmp-test-{}", std::process::id()));
        let mut a = args(CmpWorkload::File64);
        a.corelocal_bin = Some("/bin/corelocal".into());
        let d = preset("corelocal-http", &a, &work).unwrap();
        assert!(!d.cmd.contains("--root"), "{}", d.cmd);
        a.workload = CmpWorkload::Crr;
        let d = preset("corelocal-http", &a, &work).unwrap();
        assert!(d.cmd.contains("--root"), "{}", d.cmd);
        a.workload = CmpWorkload::Kv1;
        assert!(preset("corelocal-kv", &a, &work)
            .unwrap()
            .cmd
            .contains("serve kv"));
        assert!(preset("nope", &a, &work).is_err());
        let d = preset("corelocal-sockperf", &a, &work).unwrap();
        assert_eq!(d.proto, "sockperf");
        assert!(
            d.cmd
                .contains("serve sockperf --listen 127.0.0.1:{port} --cpus {cpu}"),
            "{}",
            d.cmd
        );
        if which("sockperf").is_some() {
            let d = preset("sockperf", &a, &work).unwrap();
            assert!(
                d.cmd.contains(" server -f ") && d.cmd.ends_with("/feed.txt -F epoll --nonblocked"),
                "{}",
                d.cmd
            );
            let feed = work.join("sockperf/feed.txt");
            assert_eq!(std::fs::read_to_string(feed).unwrap(), "T:127.0.0.1:9\n");
        }
        // No file set for workloads that do not need it; a failing generator is a clear error.
        assert_eq!(site(&a, &work).unwrap(), None);
        a.workload = CmpWorkload::Sessions;
        a.corelocal_bin = Some("/nonexistent/corelocal".into());
        let e = site(&a, &work).unwrap_err();
        assert!(e.contains("files gen"), "{e}");
        let _ = std::fs::remove_dir_all(&work);
    }
}
