//! Up-front checks of flag values, made before anything starts: each error names the flag and
//! its value, says what is wrong with it and what would be right.

use corelocal::cpu::{self, CpuSet};
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `requested` CPUs can all have a thread pinned to them: each is online and allowed for this
/// process.
pub fn cpus(flag: &str, requested: &CpuSet) -> Result<(), String> {
    match cpu::unavailable(requested) {
        None => Ok(()),
        Some(u) => Err(format!(
            "{flag} {requested}: {u} (leave {flag} out to use all of them)"
        )),
    }
}

/// Where a missing path stops existing: `"/srv exists, /srv/www does not"`, or `None` when
/// even its first component is missing (a relative path in a missing directory).
fn missing_part(path: &Path) -> String {
    let mut existing = path.parent();
    let mut first_missing = path;
    while let Some(dir) = existing {
        let dir_or_dot = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if dir_or_dot.exists() {
            return format!(
                "{} exists, {} does not",
                dir_or_dot.display(),
                first_missing.display()
            );
        }
        first_missing = dir;
        existing = dir.parent();
    }
    format!("{} does not exist", first_missing.display())
}

/// What kind of file `meta` is, for "is a …, not a …" messages.
fn kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// `path` is a directory this process can list. `hint` says what would be right.
pub fn existing_dir(flag: &str, path: &Path, hint: &str) -> Result<(), String> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(format!(
            "{flag} {shown}: no such directory ({}); {hint}",
            missing_part(path)
        )),
        Err(e) => Err(format!("{flag} {shown}: cannot read it: {e}; {hint}")),
        Ok(meta) if !meta.is_dir() => Err(format!(
            "{flag} {shown}: is {}, not a directory; {hint}",
            kind(&meta)
        )),
        Ok(_) => match std::fs::read_dir(path) {
            Ok(_) => Ok(()),
            Err(e) => Err(format!("{flag} {shown}: cannot list it: {e}; {hint}")),
        },
    }
}

/// `path` is a file that can be created or appended to: not a directory, and its directory
/// exists. `example` is a file name to suggest when `path` is a directory.
pub fn output_file(flag: &str, path: &Path, example: &str) -> Result<(), String> {
    let shown = path.display();
    if path.as_os_str().is_empty() {
        return Err(format!(
            "{flag}: empty path; give a file path such as {example}"
        ));
    }
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            return Err(format!(
                "{flag} {shown}: is a directory; give a file path such as {}",
                path.join(example).display()
            ))
        }
        Ok(_) => return Ok(()),
        Err(e)
            if e.kind() != io::ErrorKind::NotFound && e.raw_os_error() != Some(libc::ENOTDIR) =>
        {
            return Err(format!("{flag} {shown}: cannot use it: {e}"))
        }
        Err(_) => {}
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(meta) => Err(format!(
            "{flag} {shown}: {} is {}, not a directory; give a path in an existing directory",
            dir.display(),
            kind(&meta)
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(format!(
            "{flag} {shown}: its directory is missing ({}); create it first or give a path in \
             an existing directory",
            missing_part(dir)
        )),
        Err(e) => Err(format!("{flag} {shown}: cannot use {}: {e}", dir.display())),
    }
}

/// A duration that must not be zero (`what_zero_would_mean` explains why not).
pub fn positive(flag: &str, value: Duration, example: &str) -> Result<(), String> {
    if value.is_zero() {
        return Err(format!("{flag} 0: must be positive, e.g. {flag} {example}"));
    }
    Ok(())
}

/// `pid` is a running process.
pub fn process(flag: &str, pid: i32, hint: &str) -> Result<(), String> {
    if Path::new(&format!("/proc/{pid}")).exists() {
        Ok(())
    } else {
        Err(format!("{flag} {pid}: no process {pid} is running; {hint}"))
    }
}

/// The network interfaces of this namespace (`/sys/class/net`), sorted.
fn interfaces() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// `name` is a network interface of this namespace.
pub fn interface(flag: &str, name: &str) -> Result<(), String> {
    if !name.is_empty() && !name.contains('/') && Path::new("/sys/class/net").join(name).exists() {
        return Ok(());
    }
    Err(format!(
        "{flag} {name}: no such network interface; interfaces here: {}",
        interfaces().join(", ")
    ))
}

/// `addr` can be bound now: its IP is an address of this host and its port is free. The
/// probe socket is closed at once (someone may take the port before the real bind; that
/// error then names the flag too).
pub fn bindable(flag: &str, addr: SocketAddr) -> Result<(), String> {
    std::net::TcpListener::bind(addr)
        .map(drop)
        .map_err(|e| bind_error(flag, addr, &e))
}

/// Explains a failed bind of `addr`, given with `flag`.
pub fn bind_error(flag: &str, addr: SocketAddr, e: &io::Error) -> String {
    let port = addr.port();
    match e.kind() {
        io::ErrorKind::AddrInUse => format!(
            "{flag} {addr}: port {port} is in use by another socket (`ss -ltnp 'sport = :{port}'` \
             shows who has it); choose another port, or stop that process"
        ),
        io::ErrorKind::AddrNotAvailable => format!(
            "{flag} {addr}: {} is not an address of this host; use one that `ip addr` lists, \
             {} for this host only, or {} for all addresses",
            addr.ip(),
            if addr.is_ipv4() { "127.0.0.1" } else { "[::1]" },
            if addr.is_ipv4() { "0.0.0.0" } else { "[::]" },
        ),
        io::ErrorKind::PermissionDenied if port < 1024 => format!(
            "{flag} {addr}: ports below 1024 need root or CAP_NET_BIND_SERVICE ({e}); use a \
             port from 1024 up"
        ),
        _ => format!("{flag} {addr}: cannot listen there: {e}"),
    }
}

/// Parses `IP:PORT` (`127.0.0.1:8080`, `[::1]:8080`), saying what is missing when it fails.
pub fn parse_socket_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.trim().parse() {
        return Ok(addr);
    }
    let example = "e.g. 127.0.0.1:8080, 0.0.0.0:8080 or [::1]:8080";
    match text.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => {
            return Err(format!("no port: write {text}:PORT ({example})"))
        }
        Ok(std::net::IpAddr::V6(_)) => {
            return Err(format!(
                "no port: write [{text}]:PORT (an IPv6 address goes in brackets; {example})"
            ))
        }
        Err(_) => {}
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("expected IP:PORT ({example})"));
    };
    if port.parse::<u16>().is_err() {
        return Err(match port.parse::<u64>() {
            Ok(_) => format!("port {port} is out of range (0 to 65535)"),
            Err(_) => format!("port {port:?} is not a number ({example})"),
        });
    }
    if host.parse::<std::net::IpAddr>().is_err()
        && !host.starts_with('[')
        && host.chars().any(|c| c.is_ascii_alphabetic())
    {
        return Err(format!(
            "{host:?} is a host name; names are not resolved here: write an IP address, \
             e.g. 127.0.0.1:{port} or [::1]:{port}"
        ));
    }
    Err(format!("{host:?} is not an IP address ({example})"))
}

/// A path that must exist and be a unix socket, when it exists at all.
pub fn not_a_socket(flag: &str, path: &PathBuf, hint: &str) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => Err(format!(
            "{flag} {}: is {}, not a unix socket; {hint}",
            path.display(),
            kind(&meta)
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corelocal::testing::ScratchDir;

    #[test]
    fn cpus_names_the_missing_ones_and_the_usable_ones() {
        let allowed = cpu::current_affinity().unwrap();
        assert_eq!(cpus("--cpus", &allowed), Ok(()));
        let max = allowed.max().unwrap();
        let beyond: CpuSet = [max + 1000, max + 1001].into_iter().collect();
        let e = cpus("--cpus", &beyond.union(&allowed)).unwrap_err();
        let missing = beyond.to_list();
        assert!(e.contains(&format!("CPUs {missing} are not online")), "{e}");
        let usable = cpu::unavailable(&beyond).unwrap().usable;
        assert!(e.contains(&format!("can use: {usable}")), "{e}");
        assert!(e.starts_with("--cpus "), "{e}");
    }

    #[test]
    fn existing_dir_says_which_part_is_missing_and_what_it_is() {
        let scratch = ScratchDir::new("check-dir");
        let dir: &Path = &scratch;
        assert_eq!(existing_dir("--root", dir, "hint"), Ok(()));
        let missing = dir.join("a/b");
        let e = existing_dir("--root", &missing, "give a directory").unwrap_err();
        assert_eq!(
            e,
            format!(
                "--root {}: no such directory ({} exists, {} does not); give a directory",
                missing.display(),
                dir.display(),
                dir.join("a").display()
            )
        );
        let file = dir.join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = existing_dir("--root", &file, "hint").unwrap_err();
        assert!(
            e.ends_with("is a regular file, not a directory; hint"),
            "{e}"
        );
    }

    #[test]
    fn output_file_wants_a_file_in_an_existing_directory() {
        let scratch = ScratchDir::new("check-out");
        let dir: &Path = &scratch;
        assert_eq!(
            output_file("--stats-file", &dir.join("s.jsonl"), "s"),
            Ok(())
        );
        let e = output_file("--stats-file", dir, "stats.jsonl").unwrap_err();
        assert!(
            e.contains("is a directory; give a file path such as"),
            "{e}"
        );
        assert!(e.contains("stats.jsonl"), "{e}");
        let nested = dir.join("no/such.jsonl");
        let e = output_file("--stats-file", &nested, "s").unwrap_err();
        assert!(e.contains(&nested.display().to_string()), "{e}");
        assert!(e.contains("its directory is missing"), "{e}");
        assert!(
            e.contains(&format!("{} does not", dir.join("no").display())),
            "{e}"
        );
        let file = dir.join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = output_file("--json", &file.join("x.json"), "x").unwrap_err();
        assert!(e.contains("is a regular file, not a directory"), "{e}");
    }

    #[test]
    fn socket_addresses_say_what_is_missing() {
        assert_eq!(
            parse_socket_addr("127.0.0.1:80"),
            Ok("127.0.0.1:80".parse().unwrap())
        );
        for (bad, why) in [
            ("127.0.0.1", "no port: write 127.0.0.1:PORT"),
            ("localhost:80", "host name; names are not resolved"),
            ("127.0.0.1:99999", "port 99999 is out of range (0 to 65535)"),
            ("127.0.0.1:http", "port \"http\" is not a number"),
            ("::1:80", "no port: write [::1:80]:PORT"),
            ("1.2.3:80", "\"1.2.3\" is not an IP address"),
            ("nothing", "expected IP:PORT"),
        ] {
            let e = parse_socket_addr(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn bind_errors_name_the_address_and_the_way_out() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let e = bindable("--listen", addr).unwrap_err();
        assert!(
            e.starts_with(&format!("--listen {addr}: port {} is in use", addr.port())),
            "{e}"
        );
        let foreign: SocketAddr = "192.0.2.1:8080".parse().unwrap();
        let e = bindable("--metrics", foreign).unwrap_err();
        assert!(
            e.contains("192.0.2.1 is not an address of this host"),
            "{e}"
        );
        assert_eq!(bindable("--listen", "127.0.0.1:0".parse().unwrap()), Ok(()));
    }

    #[test]
    fn interfaces_and_processes_must_exist() {
        assert_eq!(interface("--xdp-iface", "lo"), Ok(()));
        let e = interface("--xdp-iface", "nosuch0").unwrap_err();
        assert!(
            e.starts_with("--xdp-iface nosuch0: no such network interface; interfaces here: "),
            "{e}"
        );
        assert!(e.contains("lo"), "{e}");
        assert_eq!(
            process("--takeover", std::process::id() as i32, "h"),
            Ok(())
        );
        let e = process("--takeover", i32::MAX, "give a PID").unwrap_err();
        assert!(
            e.contains("no process 2147483647 is running; give a PID"),
            "{e}"
        );
    }

    #[test]
    fn zero_durations_are_refused_with_an_example() {
        assert_eq!(
            positive("--idle-timeout", Duration::from_secs(1), "60s"),
            Ok(())
        );
        assert_eq!(
            positive("--idle-timeout", Duration::ZERO, "60s"),
            Err("--idle-timeout 0: must be positive, e.g. --idle-timeout 60s".into())
        );
    }
}
