//! The per-worker stats a corelocal server publishes (`corelocal serve … --stats-file FILE
//! --json`): one JSON object per line; `top` reads the last line.
//!
//! Fields per worker: `worker`, `cpu`, `accepted`, `accepted_local`, `stolen`, `open`, and —
//! once the balancer publishes them — `queue_len`, `queue_cap`, `busy`. Missing fields read as
//! absent, never as an error.

use serde::Serialize;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// How much of the file's end is read to find the last line.
pub const TAIL_BYTES: u64 = 256 << 10;
/// The most workers kept.
pub const WORKERS_MAX: usize = 4096;

/// One worker's counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Worker {
    /// Worker index.
    pub worker: u64,
    /// Its CPU.
    pub cpu: Option<u64>,
    /// Connections accepted (local + stolen).
    pub accepted: u64,
    /// Accepted from its own listener.
    pub accepted_local: u64,
    /// Stolen from another worker's listener.
    pub stolen: u64,
    /// Open connections.
    pub open: Option<u64>,
    /// Accept queue length (balancer).
    pub queue_len: Option<u64>,
    /// Accept queue capacity (balancer).
    pub queue_cap: Option<u64>,
    /// Busy bit (balancer).
    pub busy: Option<bool>,
}

/// The last line's content.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServerStats {
    /// Workers in file order.
    pub workers: Vec<Worker>,
}

fn num(v: &serde_json::Value, key: &str) -> Option<u64> {
    v.get(key)?.as_u64()
}

/// Parses one stats line.
pub fn parse_line(line: &str) -> Result<ServerStats, String> {
    let v: serde_json::Value =
        serde_json::from_str(line.trim()).map_err(|e| format!("not JSON: {e}"))?;
    let workers = v
        .get("workers")
        .and_then(|w| w.as_array())
        .ok_or("no \"workers\" array")?;
    Ok(ServerStats {
        workers: workers
            .iter()
            .take(WORKERS_MAX)
            .enumerate()
            .map(|(i, w)| Worker {
                worker: num(w, "worker").unwrap_or(i as u64),
                cpu: num(w, "cpu"),
                accepted: num(w, "accepted").unwrap_or(0),
                accepted_local: num(w, "accepted_local").unwrap_or(0),
                stolen: num(w, "stolen").unwrap_or(0),
                open: num(w, "open"),
                queue_len: num(w, "queue_len"),
                queue_cap: num(w, "queue_cap"),
                busy: w
                    .get("busy")
                    .and_then(|b| b.as_bool().or_else(|| b.as_u64().map(|n| n != 0))),
            })
            .collect(),
    })
}

/// The last non-empty line of `text`.
pub fn last_line(text: &str) -> Option<&str> {
    text.lines().rev().find(|l| !l.trim().is_empty())
}

/// Reads the last line of the stats file (only its last [`TAIL_BYTES`]).
pub fn read(path: &Path) -> Result<ServerStats, String> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))
        .map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    f.take(TAIL_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&bytes);
    let line = last_line(&text).ok_or_else(|| format!("{}: empty", path.display()))?;
    parse_line(line).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn today_and_with_balancer_fields() {
        let s = parse_line(r#"{"workers":[{"worker":0,"cpu":0,"accepted":10,"accepted_local":9,"stolen":1,"requests":5,"open":2,"errors":{}}],"total":{}}"#).unwrap();
        assert_eq!(
            s.workers[0],
            Worker {
                worker: 0,
                cpu: Some(0),
                accepted: 10,
                accepted_local: 9,
                stolen: 1,
                open: Some(2),
                ..Worker::default()
            }
        );
        let s = parse_line(
            r#"{"workers":[{"worker":1,"queue_len":3,"queue_cap":128,"busy":true},{"busy":0}]}"#,
        )
        .unwrap();
        assert_eq!(
            (
                s.workers[0].queue_len,
                s.workers[0].queue_cap,
                s.workers[0].busy
            ),
            (Some(3), Some(128), Some(true))
        );
        assert_eq!((s.workers[1].worker, s.workers[1].busy), (1, Some(false)));
        assert!(parse_line("{}").is_err());
        assert!(parse_line("{\"workers\":").is_err());
        assert_eq!(last_line("a\nb\n\n"), Some("b"));
    }
}
