//! The servers to compare: presets (Debian peers, the floor server, corelocal's own) and their
//! configurations, and custom `--server NAME=PROTO:COMMAND` definitions.

use super::{CmpWorkload, CompareArgs};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command as Proc;

/// A server to compare.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ServerDef {
    /// Name in the tables.
    pub name: String,
    /// Protocol it speaks: http, rpc, kv, kv-line (the `kv` example's), sockperf.
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
    if !matches!(proto, "http" | "rpc" | "kv" | "kv-line" | "sockperf") {
        return Err(format!(
            "--server {s:?}: PROTO must be http, rpc, kv, kv-line or sockperf"
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

pub(super) fn which(name: &str) -> Option<PathBuf> {
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
    compile_c(
        &src.join("tools/floor_server.c"),
        &work.join("floor_server"),
    )
}

/// The kv counterpart of the floor server, built from the copy this crate carries.
fn kv_floor_bin(work: &Path) -> Result<PathBuf, String> {
    let src = work.join("kv_floor_server.c");
    std::fs::write(&src, include_str!("kv_floor_server.c")).map_err(|e| e.to_string())?;
    compile_c(&src, &work.join("kv_floor_server"))
}

/// The io_uring kv floor (raw syscalls, no liburing), built from the copy this crate carries.
fn kv_uring_floor_bin(work: &Path) -> Result<PathBuf, String> {
    uring_floor_bin(
        work,
        "kv_uring_floor_server",
        include_str!("kv_uring_floor_server.c"),
    )
}

/// The io_uring HTTP floor (raw syscalls, no liburing), built from the copy this crate carries.
fn http_uring_floor_bin(work: &Path) -> Result<PathBuf, String> {
    uring_floor_bin(
        work,
        "http_uring_floor_server",
        include_str!("http_uring_floor_server.c"),
    )
}

/// Writes an io_uring floor's source and the header the floors share into `work`, builds it.
fn uring_floor_bin(work: &Path, name: &str, source: &str) -> Result<PathBuf, String> {
    let write =
        |file: &str, text: &str| std::fs::write(work.join(file), text).map_err(|e| e.to_string());
    write("uring_floor.h", include_str!("uring_floor.h"))?;
    let src = format!("{name}.c");
    write(&src, source)?;
    compile_c(&work.join(src), &work.join(name))
}

/// Builds a one-file C server with gcc (-O2, pthreads) into `bin`.
fn compile_c(src: &Path, bin: &Path) -> Result<PathBuf, String> {
    let st = Proc::new("gcc")
        .args(["-O2", "-pthread"])
        .arg(src)
        .arg("-o")
        .arg(bin)
        .status()
        .map_err(|e| format!("gcc: {e}"))?;
    if !st.success() {
        return Err(format!("building {} failed", src.display()));
    }
    Ok(bin.to_path_buf())
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

/// h2o (Debian's 2.2) with one thread, serving `root` as static files (`/hello`: the same 6
/// bytes nginx's preset returns), keep-alive on, no access log. `user: root`: the benchmark's
/// work directory is private, and h2o started by root would otherwise become `nobody`.
pub fn h2o_conf(dir: &Path, port: u16, root: &Path) -> String {
    format!(
        "num-threads: 1\nuser: root\nerror-log: {d}/error.log\nmax-connections: 20000\n\
         listen:\n  host: 127.0.0.1\n  port: {port}\n\
         hosts:\n  \"default\":\n    paths:\n      /:\n        file.dir: {r}\n",
        d = dir.display(),
        r = root.display()
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
pub(super) fn site(a: &CompareArgs, work: &Path) -> Result<Option<PathBuf>, String> {
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

pub(super) fn preset(name: &str, a: &CompareArgs, work: &Path) -> Result<ServerDef, String> {
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
        "floor" | "http-uring-floor" => {
            let b = if name == "floor" { floor_bin(a, work)? } else { http_uring_floor_bin(work)? };
            def("http", format!("{} {{port}} 1 {{cpu}}{}", b.display(), if ka { " keepalive" } else { "" }))
        }
        "kv-floor" => {
            let b = kv_floor_bin(work)?;
            def("kv", format!("{} {{port}} 1 {{cpu}}", b.display()))
        }
        "kv-uring-floor" => {
            let b = kv_uring_floor_bin(work)?;
            def("kv", format!("{} {{port}} 1 {{cpu}}", b.display()))
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
        "h2o" => {
            let bin = which_or_install("h2o", "h2o")?;
            let dir = work.join("h2o");
            std::fs::create_dir_all(dir.join("www")).map_err(|e| e.to_string())?;
            std::fs::write(dir.join("www/hello"), "hello\n").map_err(|e| e.to_string())?;
            let root = site(a, work)?.unwrap_or_else(|| dir.join("www"));
            std::fs::write(dir.join("h2o.conf"), h2o_conf(&dir, a.port, &root))
                .map_err(|e| e.to_string())?;
            def("http", format!("{} -c {}/h2o.conf", bin.display(), dir.display()))
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
        "corelocal-kv-example" => {
            // The library's own example (crates/corelocal/examples/kv.rs), beside the binary:
            // pinned by taskset, it starts one worker on that CPU.
            let b = corelocal_bin(a).with_file_name("examples").join("kv");
            if !b.is_file() {
                return Err(format!(
                    "{} not found: cargo build --release -p corelocal --example kv",
                    b.display()
                ));
            }
            def("kv-line", format!("{} 127.0.0.1:{{port}}", b.display()))
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
        _ => Err(format!("unknown --peer {name:?}: floor, http-uring-floor, kv-floor, kv-uring-floor, nginx, h2o, lighttpd, corelocal-rpc, corelocal-http, memcached, corelocal-kv, corelocal-kv-example, sockperf, corelocal-sockperf")),
    }
}
