//! Test helpers: pinned clients and a minimal HTTP/1.1 response reader.

#![allow(dead_code)]

use corelocal::cpu::{current_affinity, pin_current_thread, CpuSet};
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::Duration;

/// The CPUs this process may use (the tests' worker CPUs).
pub fn cpus() -> Vec<usize> {
    current_affinity().unwrap().iter().collect()
}

/// Runs `f` on a thread pinned to `cpu` and returns its result.
pub fn on_cpu<T: Send + 'static>(cpu: usize, f: impl FnOnce() -> T + Send + 'static) -> T {
    thread::spawn(move || {
        pin_current_thread(&CpuSet::single(cpu)).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// One HTTP/1.1 response: status code, headers (lower-cased names), body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Reads one response (Content-Length or chunked body) from `r`.
pub fn read_response(r: &mut impl BufRead) -> io::Result<Response> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no response"));
    }
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (n, v) = l
            .split_once(':')
            .ok_or_else(|| io::Error::other("bad header"))?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let mut resp = Response {
        status,
        headers,
        body: Vec::new(),
    };
    if let Some(len) = resp.header("content-length") {
        let len: usize = len.parse().map_err(|_| io::Error::other("bad length"))?;
        resp.body.resize(len, 0);
        r.read_exact(&mut resp.body)?;
    } else if resp.header("transfer-encoding") == Some("chunked") {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim(), 16)
                .map_err(|_| io::Error::other("bad chunk size"))?;
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk)?;
            if size == 0 {
                break;
            }
            resp.body.extend_from_slice(&chunk[..size]);
        }
    }
    Ok(resp)
}

/// A fresh connection with one request (`Connection: close`); the response.
pub fn get_once(addr: SocketAddr, path: &str) -> io::Result<Response> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )?;
    read_response(&mut BufReader::new(s))
}
