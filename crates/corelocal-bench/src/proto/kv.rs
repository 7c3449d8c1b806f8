//! The memcached client: text-protocol get/set and meta-protocol mg/ms request builders and
//! the response parser.

use super::{err, Progress, ProtoError, RespInfo, MAX_HEADER};

/// Builds `get key\r\n`.
pub fn kv_get(key: &str) -> Vec<u8> {
    format!("get {key}\r\n").into_bytes()
}

/// Builds `set key 0 0 len\r\nvalue\r\n` with a deterministic value of `size` bytes.
pub fn kv_set(key: &str, size: usize) -> Vec<u8> {
    let mut v = format!("set {key} 0 0 {size}\r\n").into_bytes();
    v.extend((0..size).map(|i| b'a' + (i % 26) as u8));
    v.extend_from_slice(b"\r\n");
    v
}

/// Builds the meta get `mg key v\r\n` (the value, no flags: `VA <len>` or `EN`).
pub fn kv_mg(key: &str) -> Vec<u8> {
    format!("mg {key} v\r\n").into_bytes()
}

/// Builds the meta set `ms key len\r\nvalue\r\n` (answered `HD`) with the value of [`kv_set`].
pub fn kv_ms(key: &str, size: usize) -> Vec<u8> {
    let mut v = format!("ms {key} {size}\r\n").into_bytes();
    v.extend((0..size).map(|i| b'a' + (i % 26) as u8));
    v.extend_from_slice(b"\r\n");
    v
}

/// Builds `GET key\n` in the line protocol of corelocal's `kv` example.
pub fn kv_line_get(key: &str) -> Vec<u8> {
    format!("GET {key}\n").into_bytes()
}

/// Builds `SET key value\n` in the `kv` example's line protocol, with the value of
/// [`kv_set`] (letters only: a value there is one word).
pub fn kv_line_set(key: &str, size: usize) -> Vec<u8> {
    let mut v = format!("SET {key} ").into_bytes();
    v.extend((0..size).map(|i| b'a' + (i % 26) as u8));
    v.push(b'\n');
    v
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KvState {
    Line,
    Data(usize),
}

/// What a memcached request expects back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvExpect {
    /// `VALUE …` blocks then `END`.
    Get,
    /// One status line (`STORED`, `NOT_STORED`, …).
    Store,
    /// A meta get with `v`: `VA <len> …` and the data, or `EN`.
    MetaGet,
    /// A meta set: one status line (`HD`, `NS`, `EX`, `NF`).
    MetaStore,
    /// The `kv` example's `GET`: `VALUE <value>` or `NOT_FOUND`.
    LineGet,
    /// The `kv` example's `SET`: `STORED`.
    LineStore,
}

/// Incremental memcached text-protocol response parser.
#[derive(Debug, Clone)]
pub struct KvParser {
    expect: KvExpect,
    line: Vec<u8>,
    state: KvState,
    info: RespInfo,
}

impl KvParser {
    /// A parser for the response to a get or a store command.
    pub fn new(expect: KvExpect) -> Self {
        KvParser {
            expect,
            line: Vec::new(),
            state: KvState::Line,
            info: RespInfo::default(),
        }
    }

    fn on_line(&mut self) -> Result<bool, ProtoError> {
        let line =
            std::str::from_utf8(&self.line).map_err(|_| ProtoError("non-UTF-8 reply".into()))?;
        let line = line.trim_end_matches('\r');
        if line.starts_with("SERVER_ERROR")
            || line.starts_with("CLIENT_ERROR")
            || line.starts_with("ERROR")
        {
            return err(format!("memcached: {line}"));
        }
        match self.expect {
            KvExpect::Store => {
                match line {
                    "STORED" | "NOT_STORED" | "EXISTS" | "NOT_FOUND" => {}
                    _ => return err(format!("unexpected store reply {line:?}")),
                }
                Ok(true)
            }
            KvExpect::LineStore => match line {
                "STORED" => Ok(true),
                _ => err(format!("unexpected SET reply {line:?}")),
            },
            KvExpect::LineGet => {
                if line == "NOT_FOUND" {
                    self.info.hit = Some(false);
                } else if let Some(value) = line.strip_prefix("VALUE ") {
                    self.info.hit = Some(true);
                    self.info.body += value.len();
                } else {
                    return err(format!("unexpected GET reply {line:?}"));
                }
                Ok(true)
            }
            KvExpect::MetaStore => {
                match line.split(' ').next() {
                    Some("HD" | "NS" | "EX" | "NF") => {}
                    _ => return err(format!("unexpected ms reply {line:?}")),
                }
                Ok(true)
            }
            KvExpect::MetaGet => {
                let mut f = line.split(' ');
                match f.next() {
                    Some("EN") => {
                        self.info.hit = Some(false);
                        Ok(true)
                    }
                    Some("VA") => {
                        let bytes: usize = f
                            .next()
                            .and_then(|b| b.parse().ok())
                            .ok_or_else(|| ProtoError(format!("bad VA line {line:?}")))?;
                        if bytes > 1 << 30 {
                            return err("value too large");
                        }
                        self.info.hit = Some(true);
                        self.info.body += bytes;
                        self.state = KvState::Data(bytes + 2);
                        Ok(false)
                    }
                    _ => err(format!("unexpected mg reply {line:?}")),
                }
            }
            KvExpect::Get => {
                if line == "END" {
                    if self.info.hit.is_none() {
                        self.info.hit = Some(false);
                    }
                    return Ok(true);
                }
                let mut f = line.split(' ');
                if f.next() != Some("VALUE") {
                    return err(format!("unexpected get reply {line:?}"));
                }
                let bytes: usize = f
                    .nth(2)
                    .and_then(|b| b.parse().ok())
                    .ok_or_else(|| ProtoError(format!("bad VALUE line {line:?}")))?;
                if bytes > 1 << 30 {
                    return err("value too large");
                }
                self.info.hit = Some(true);
                self.info.body += bytes;
                self.state = KvState::Data(bytes + 2);
                Ok(false)
            }
        }
    }

    /// Feeds bytes.
    pub fn feed(&mut self, data: &[u8]) -> Result<Progress, ProtoError> {
        let mut i = 0;
        while i < data.len() {
            match self.state {
                KvState::Data(n) => {
                    let take = n.min(data.len() - i);
                    i += take;
                    self.state = if take == n {
                        KvState::Line
                    } else {
                        KvState::Data(n - take)
                    };
                    // A meta get's value is the whole answer (text gets end with END).
                    if take == n && self.expect == KvExpect::MetaGet {
                        return Ok(Progress::Done {
                            consumed: i,
                            info: self.info,
                        });
                    }
                }
                KvState::Line => match data[i..].iter().position(|&b| b == b'\n') {
                    Some(pos) => {
                        self.line.extend_from_slice(&data[i..i + pos]);
                        i += pos + 1;
                        let done = self.on_line()?;
                        self.line.clear();
                        if done {
                            return Ok(Progress::Done {
                                consumed: i,
                                info: self.info,
                            });
                        }
                    }
                    None => {
                        self.line.extend_from_slice(&data[i..]);
                        if self.line.len() > MAX_HEADER {
                            return err("reply line too long");
                        }
                        return Ok(Progress::NeedMore);
                    }
                },
            }
        }
        Ok(Progress::NeedMore)
    }
}
