//! A corelocal server's own counters (`--server-stats FILE|URL`): locality and stealing over
//! the measurement window, from the delta of two JSON snapshots.

use serde::Serialize;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The counters of one worker (or the total).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Connections accepted.
    pub accepted: u64,
    /// … of which arrived on this worker's CPU.
    pub accepted_local: u64,
    /// … of which were stolen from another worker's queue.
    pub stolen: u64,
    /// Requests served.
    pub requests: u64,
    /// Errors of all kinds.
    pub errors: u64,
}

fn num(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn counters(v: &Value) -> Counters {
    let errors = v.get("errors").map(|e| match e {
        Value::Object(m) => m.values().filter_map(Value::as_u64).sum(),
        other => other.as_u64().unwrap_or(0),
    });
    Counters {
        accepted: num(v, "accepted"),
        accepted_local: num(v, "accepted_local"),
        stolen: num(v, "stolen"),
        requests: num(v, "requests"),
        errors: errors.unwrap_or(0),
    }
}

/// A parsed snapshot: per worker (worker id, cpu, counters) and the total.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerSnapshot {
    /// Workers.
    pub workers: Vec<(u64, Option<u64>, Counters)>,
    /// Total.
    pub total: Counters,
}

/// Parses the last JSON line of `text`.
pub fn parse_last(text: &str) -> Result<ServerSnapshot, String> {
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or("no JSON line in server stats")?;
    let v: Value = serde_json::from_str(line).map_err(|e| format!("server stats: {e}"))?;
    let workers: Vec<(u64, Option<u64>, Counters)> = v
        .get("workers")
        .and_then(Value::as_array)
        .map(|ws| {
            ws.iter()
                .enumerate()
                .map(|(i, w)| {
                    (
                        w.get("worker").and_then(Value::as_u64).unwrap_or(i as u64),
                        w.get("cpu").and_then(Value::as_u64),
                        counters(w),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let total = match v.get("total") {
        Some(t) => counters(t),
        None => {
            let mut t = Counters::default();
            for (_, _, c) in &workers {
                t.accepted += c.accepted;
                t.accepted_local += c.accepted_local;
                t.stolen += c.stolen;
                t.requests += c.requests;
                t.errors += c.errors;
            }
            t
        }
    };
    if workers.is_empty() && v.get("total").is_none() {
        return Err("server stats JSON has neither \"workers\" nor \"total\"".into());
    }
    Ok(ServerSnapshot { workers, total })
}

/// Locality over a window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Locality {
    /// Where the counters came from.
    pub source: String,
    /// Total deltas.
    pub total: Counters,
    /// accepted_local / accepted.
    pub locality: Option<f64>,
    /// stolen / accepted.
    pub stolen_share: Option<f64>,
    /// Per-worker deltas: (worker, cpu, counters, locality).
    pub workers: Vec<WorkerDelta>,
}

/// One worker's deltas.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WorkerDelta {
    /// Worker id.
    pub worker: u64,
    /// Its CPU.
    pub cpu: Option<u64>,
    /// Deltas.
    pub counters: Counters,
    /// Its locality.
    pub locality: Option<f64>,
}

fn sub(a: Counters, b: Counters) -> Counters {
    Counters {
        accepted: b.accepted.saturating_sub(a.accepted),
        accepted_local: b.accepted_local.saturating_sub(a.accepted_local),
        stolen: b.stolen.saturating_sub(a.stolen),
        requests: b.requests.saturating_sub(a.requests),
        errors: b.errors.saturating_sub(a.errors),
    }
}

fn ratio(n: u64, d: u64) -> Option<f64> {
    (d > 0).then(|| n as f64 / d as f64)
}

/// Locality between two snapshots.
pub fn delta(source: &str, a: &ServerSnapshot, b: &ServerSnapshot) -> Locality {
    let total = sub(a.total, b.total);
    let workers = b
        .workers
        .iter()
        .map(|(w, cpu, c1)| {
            let c0 = a
                .workers
                .iter()
                .find(|x| x.0 == *w)
                .map(|x| x.2)
                .unwrap_or_default();
            let d = sub(c0, *c1);
            WorkerDelta {
                worker: *w,
                cpu: *cpu,
                counters: d,
                locality: ratio(d.accepted_local, d.accepted),
            }
        })
        .collect();
    Locality {
        source: source.to_string(),
        locality: ratio(total.accepted_local, total.accepted),
        stolen_share: ratio(total.stolen, total.accepted),
        total,
        workers,
    }
}

/// Splits `http://host:port/path` into (host:port, path).
pub fn split_url(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("only http:// URLs are supported: {url}"))?;
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if hostport.is_empty() {
        return Err(format!("no host in {url}"));
    }
    let hostport = if hostport.contains(':') {
        hostport.to_string()
    } else {
        format!("{hostport}:80")
    };
    Ok((hostport, path.to_string()))
}

/// Reads a snapshot from a file (last JSON line) or an `http://` URL (bounded GET).
pub fn fetch(source: &str) -> Result<ServerSnapshot, String> {
    if source.starts_with("http://") {
        let (hostport, path) = split_url(source)?;
        let addr = hostport
            .to_socket_addrs()
            .map_err(|e| format!("{hostport}: {e}"))?
            .next()
            .ok_or_else(|| format!("{hostport}: no address"))?;
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .map_err(|e| format!("{source}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n"
        )
        .map_err(|e| e.to_string())?;
        let mut body = Vec::new();
        s.take(16 << 20)
            .read_to_end(&mut body)
            .map_err(|e| format!("{source}: {e}"))?;
        let text = String::from_utf8_lossy(&body);
        let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or(&text);
        parse_last(body)
    } else {
        let text = std::fs::read_to_string(source).map_err(|e| format!("{source}: {e}"))?;
        parse_last(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = r#"{"workers":[{"worker":0,"cpu":0,"accepted":10,"accepted_local":10,"stolen":0,"requests":10,"bytes_in":0,"bytes_out":0,"errors":{"bad_request":0,"too_large":0,"idle_timeout":0,"io":0}},{"worker":1,"cpu":1,"accepted":10,"accepted_local":5,"stolen":5,"requests":10,"errors":{"io":1}}],"total":{"accepted":20,"accepted_local":15,"stolen":5,"requests":20,"errors":{"io":1}}}"#;
    const B: &str = r#"{"workers":[{"worker":0,"cpu":0,"accepted":110,"accepted_local":109,"stolen":1,"requests":110,"errors":{"io":0}},{"worker":1,"cpu":1,"accepted":110,"accepted_local":105,"stolen":5,"requests":110,"errors":{"io":3}}],"total":{"accepted":220,"accepted_local":214,"stolen":6,"requests":220,"errors":{"io":3}}}"#;

    #[test]
    fn locality_from_last_lines() {
        let a = parse_last(&format!("starting\n{A}\n")).unwrap();
        let b = parse_last(&format!("{A}\n{B}\n\n")).unwrap();
        let d = delta("f", &a, &b);
        assert_eq!(d.total.accepted, 200);
        assert_eq!(d.locality, Some(199.0 / 200.0));
        assert_eq!(d.stolen_share, Some(1.0 / 200.0));
        assert_eq!(d.total.errors, 2);
        assert_eq!(d.workers[1].locality, Some(1.0));
        assert!(parse_last("nothing").is_err());
        assert!(parse_last("{\"x\":1}").is_err());
    }

    #[test]
    fn totals_summed_when_missing_and_urls() {
        let s = parse_last(
            r#"{"workers":[{"accepted":3,"accepted_local":2},{"accepted":1,"accepted_local":1}]}"#,
        )
        .unwrap();
        assert_eq!((s.total.accepted, s.total.accepted_local), (4, 3));
        assert_eq!(
            split_url("http://127.0.0.1:9/m").unwrap(),
            ("127.0.0.1:9".into(), "/m".into())
        );
        assert_eq!(split_url("http://h").unwrap(), ("h:80".into(), "/".into()));
        assert!(split_url("ftp://x").is_err());
    }
}
