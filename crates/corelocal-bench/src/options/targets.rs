//! Targets and URL lists: resolving HOST:PORT or http:// URLs, reading and parsing URL lists.

use std::net::{SocketAddrV4, ToSocketAddrs};

/// Resolves HOST:PORT (or http://HOST:PORT/…) to an IPv4 address.
pub fn resolve(target: &str) -> Result<(SocketAddrV4, String, String), String> {
    let (hostport, path) = if target.starts_with("http://") {
        crate::serverstats::split_url(target)?
    } else if target.contains("://") {
        return Err(format!(
            "--target {target}: unsupported scheme; write HOST:PORT or http://HOST:PORT/PATH"
        ));
    } else {
        (target.to_string(), "/".to_string())
    };
    let addr = hostport
        .to_socket_addrs()
        .map_err(|e| target_error(target, &hostport, &e.to_string()))?
        .find_map(|a| match a {
            std::net::SocketAddr::V4(v4) => Some(v4),
            _ => None,
        })
        .ok_or_else(|| {
            format!("--target {target}: has no IPv4 address (the client is IPv4 only); give an IPv4 address or a host name with one")
        })?;
    Ok((addr, hostport, path))
}

/// Why `HOST:PORT` of `--target` did not resolve, and what to write instead.
fn target_error(target: &str, hostport: &str, error: &str) -> String {
    let example = "e.g. 127.0.0.1:7000 or http://127.0.0.1:8080/";
    let Some((host, port)) = hostport.rsplit_once(':') else {
        return format!("--target {target}: no port; write HOST:PORT ({example})");
    };
    if port.parse::<u16>().is_err() {
        return format!(
            "--target {target}: port {port:?} is not a number from 1 to 65535 ({example})"
        );
    }
    format!("--target {target}: cannot resolve host {host:?} ({error}); give an IP address or a known host name ({example})")
}

/// Reads a URL list: one path or http URL per line; `#` comments and blanks skipped.
pub fn load_urls(path: &std::path::Path) -> Result<Vec<String>, String> {
    let hint = "give a file with one path or http:// URL per line, or `paper`";
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--urls {}: cannot read it: {e}; {hint}", path.display()))?;
    let urls = parse_urls(&text).map_err(|e| format!("--urls {}: {e}", path.display()))?;
    if urls.is_empty() {
        return Err(format!("--urls {}: no URLs in it; {hint}", path.display()));
    }
    Ok(urls)
}

/// Parses a URL list (see [`load_urls`]).
pub fn parse_urls(text: &str) -> Result<Vec<String>, String> {
    let mut v = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let p = if l.starts_with("http://") {
            crate::serverstats::split_url(l)?.1
        } else {
            l.to_string()
        };
        if !p.starts_with('/') || p.contains(char::is_whitespace) {
            return Err(format!("URL list line {}: {l:?} is not a path", n + 1));
        }
        v.push(p);
    }
    Ok(v)
}
