//! The memcached text protocol (sans-IO), answering errors exactly as memcached 1.6 does.
//!
//! A connection's input is a sequence of lines (`\n`-terminated, one trailing `\r` removed);
//! storage commands are followed by `<bytes>` of data and `\r\n`. This module frames lines,
//! parses them into [`Command`]s (or the exact reply memcached gives for a bad one, [`Reject`]),
//! parses numbers the way memcached's `safe_strto*` helpers do (so `+5`, `01` and truncated
//! 64-bit flags behave identically), and formats replies. The store and the connection state
//! machine (data reading, swallowing the data of refused values) live in the server.
//!
//! Compatibility notes (checked byte for byte against memcached 1.6.18, see the tests):
//! - Tokens are separated by spaces only; empty tokens are skipped.
//! - `noreply` is honoured when it is the last token of a command that takes it, and then
//!   suppresses that command's one reply, errors included — but not `ERROR` for an unknown or
//!   malformed command, which is decided before `noreply` is looked at.
//! - A storage command refused before its data is read (bad number, key too long) does not
//!   skip the data: the data line is then read as a command (usually `ERROR`), as memcached.
//! - Meta commands (`mg`, `ms`, `md`, `ma`, `me`) are returned unparsed as [`Command::Meta`]
//!   and parsed by [`meta::parse`]; `mn` is [`Command::MetaNoop`]; any other two-byte `m?`
//!   command is `ERROR`.
//! - An unknown command whose last token starts with `HTTP/` is hung up on without a reply
//!   ([`Command::CrossProtocol`]), so that a browser cannot be used to talk to the server.
//! - A line without `\n` longer than 2048 bytes is hung up on, unless it is a `get`/`gets`
//!   (a large multiget); a `get` line longer than [`Limits::get_line_bytes_max`] is answered
//!   with memcached's reply when it cannot buffer a request, [`READ_TOO_LARGE`], and closed.

pub mod meta;
mod numbers;
pub mod slabs;
#[cfg(test)]
mod tests;

pub use numbers::{safe_strtol, safe_strtoul, safe_strtoull};

/// Longest key (memcached's `KEY_MAX_LENGTH`).
pub const KEY_BYTES_MAX: usize = 250;

/// Relative expiry times up to this many seconds (30 days); larger values are unix times.
pub const REALTIME_MAXDELTA_SECS: i64 = 60 * 60 * 24 * 30;

/// The version reported by `version` and `stats`.
pub const VERSION: &str = "1.6.18-corelocal";

/// Framing limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A line without `\n` longer than this closes the connection, unless it is a `get`/`gets`
    /// (memcached: 2048).
    pub line_bytes_max: usize,
    /// Limit for `get`/`gets` lines (the key list of a multiget), which memcached bounds only
    /// by the memory it can allocate: beyond it the reply is [`READ_TOO_LARGE`] and the
    /// connection closes, as memcached does when its read buffer cannot grow. The default
    /// holds 8 times the 128 KiB key list of memcached's own test (t/getset.t).
    pub get_line_bytes_max: usize,
}

/// Default of [`Limits::get_line_bytes_max`].
pub const GET_LINE_BYTES_MAX_DEFAULT: usize = 1 << 20;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            line_bytes_max: 2048,
            get_line_bytes_max: GET_LINE_BYTES_MAX_DEFAULT,
        }
    }
}

/// The next line of `buf`: `Some((line, consumed))` with the `\n` and one `\r` before it
/// removed (memcached removes the `\r` only when the line has another byte before it).
pub fn next_line(buf: &[u8]) -> Option<(&[u8], usize)> {
    let nl = buf.iter().position(|&b| b == b'\n')?;
    let line = if nl > 1 && buf[nl - 1] == b'\r' {
        &buf[..nl - 1]
    } else {
        &buf[..nl]
    };
    Some((line, nl + 1))
}

/// What to do with an unfinished line that has grown past a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// Close without a reply (memcached: a line over 2048 bytes that is not a multiget is
    /// garbage).
    Hangup,
    /// Reply [`READ_TOO_LARGE`], then close (a multiget over [`Limits::get_line_bytes_max`]).
    TooLarge,
}

/// Whether `buf` (no `\n` in it) has grown past a line limit, and what to do then; `None`:
/// keep reading.
pub fn line_overflow(buf: &[u8], limits: &Limits) -> Option<Overflow> {
    if buf.len() <= limits.line_bytes_max.min(limits.get_line_bytes_max) {
        return None;
    }
    // memcached's test: at most 100 leading spaces, then "get " or "gets ".
    let spaces = buf.iter().take_while(|&&b| b == b' ').count();
    let rest = &buf[spaces..];
    let is_get = spaces <= 100 && (rest.starts_with(b"get ") || rest.starts_with(b"gets "));
    if !is_get && buf.len() > limits.line_bytes_max {
        Some(Overflow::Hangup)
    } else if buf.len() > limits.get_line_bytes_max {
        // Also a short line when the multiget limit is set below memcached's 2048: it is
        // the only request our server cannot take, so it gets the reply.
        Some(Overflow::TooLarge)
    } else {
        None
    }
}

/// A storage command's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    /// `set`.
    Set,
    /// `add`: only if absent.
    Add,
    /// `replace`: only if present.
    Replace,
    /// `append`: after the present value.
    Append,
    /// `prepend`: before the present value.
    Prepend,
    /// `cas`: only if the item's CAS unique is unchanged.
    Cas,
}

/// A storage command line; `bytes` of data and `\r\n` follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Store<'a> {
    /// Operation.
    pub op: StoreOp,
    /// Key (at most [`KEY_BYTES_MAX`]).
    pub key: &'a [u8],
    /// Client flags.
    pub flags: u32,
    /// Expiry as sent (see [`REALTIME_MAXDELTA_SECS`]; negative = already expired).
    pub exptime: i32,
    /// Data length.
    pub bytes: usize,
    /// CAS unique (`cas` only).
    pub cas: u64,
    /// Suppress the reply.
    pub noreply: bool,
}

/// `stats` sub-commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stats {
    /// `stats`.
    General,
    /// `stats reset`.
    Reset,
    /// `stats settings`.
    Settings,
    /// `stats items`: per slab class.
    Items,
    /// `stats slabs`: per slab class.
    Slabs,
    /// `stats sizes`: the item size histogram.
    Sizes,
    /// `stats sizes_enable`.
    SizesEnable,
    /// `stats sizes_disable`.
    SizesDisable,
    /// `stats conns`: one entry per connection and listener.
    Conns,
    /// `stats detail on|off|dump`; `None`: anything else (answered [`DETAIL_USAGE`]).
    Detail(Option<Detail>),
    /// `stats cachedump <class> <limit>`: the class and limit, or the error for bad ones
    /// (reported only when dumps are allowed, which memcached checks first).
    Cachedump(Result<(u32, u32), &'static str>),
}

/// `stats detail` sub-commands (per key-prefix statistics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// Start counting.
    On,
    /// Stop counting.
    Off,
    /// List the counts.
    Dump,
}

/// `lru_crawler` sub-commands (memcached's `process_lru_crawler_command`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crawler<'a> {
    /// `lru_crawler crawl <all|1,2,…>`: reclaim expired items of those classes.
    Crawl(&'a [u8]),
    /// `lru_crawler metadump <all|1,2,…|hash>`: list every item's metadata.
    Metadump(&'a [u8]),
    /// `lru_crawler tocrawl <n>` (`None`: not a number).
    Tocrawl(Option<u32>),
    /// `lru_crawler sleep <µs>` (`None`: not a number).
    Sleep(Option<u32>),
    /// `lru_crawler enable`.
    Enable,
    /// `lru_crawler disable`.
    Disable,
}

/// `slabs` sub-commands (memcached's `process_slabs_command`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slabs {
    /// `slabs reassign <src> <dst>`.
    Reassign,
    /// `slabs automove <0|1|2>`.
    Automove(u32),
    /// `slabs automove ratio <r>`.
    AutomoveRatio,
    /// Refused with this reply.
    Bad(&'static str),
}

/// `shutdown` with a mode other than `graceful`.
pub const BAD_SHUTDOWN_MODE: &str = "CLIENT_ERROR invalid shutdown mode";

/// `stats detail` without on, off or dump.
pub const DETAIL_USAGE: &str = "CLIENT_ERROR usage: stats detail on|off|dump";

/// The keys of a retrieval command, in order (no allocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys<'a>(&'a [u8]);

impl<'a> Iterator for Keys<'a> {
    type Item = &'a [u8];

    // Inlined into the get path (one call per key): thin LTO's heuristics otherwise move it
    // out of line or not from build to build (+41 instructions per one-get connection).
    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        let (tok, rest) = split_token(self.0)?;
        self.0 = rest;
        Some(tok)
    }
}

/// A parsed command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command<'a> {
    /// `get`/`gets`/`gat`/`gats`.
    Get {
        /// Keys to look up (each at most [`KEY_BYTES_MAX`]).
        keys: Keys<'a>,
        /// Include CAS uniques (`gets`, `gats`).
        cas: bool,
        /// New expiry for every hit (`gat`, `gats`).
        touch: Option<i32>,
    },
    /// A storage command; its data follows.
    Store(Store<'a>),
    /// `delete <key> [0] [noreply]`.
    Delete {
        /// Key.
        key: &'a [u8],
        /// Suppress the reply.
        noreply: bool,
    },
    /// `incr`/`decr <key> <delta> [noreply]`.
    Arith {
        /// `incr` (else `decr`).
        incr: bool,
        /// Key.
        key: &'a [u8],
        /// Amount.
        delta: u64,
        /// Suppress the reply.
        noreply: bool,
    },
    /// `touch <key> <exptime> [noreply]`.
    Touch {
        /// Key.
        key: &'a [u8],
        /// New expiry.
        exptime: i32,
        /// Suppress the reply.
        noreply: bool,
    },
    /// `flush_all [delay] [noreply]`.
    FlushAll {
        /// Delay (≤ 0: now), same units as an expiry; `None`: not a number, answered
        /// [`BAD_EXPTIME`] — unless flush_all is disabled, which memcached checks first.
        delay: Option<i32>,
        /// Suppress the reply.
        noreply: bool,
    },
    /// `version`.
    Version,
    /// `verbosity <level> [noreply]`.
    Verbosity {
        /// The level.
        level: u32,
        /// Suppress the reply.
        noreply: bool,
    },
    /// `stats [...]`.
    Stats(Stats),
    /// `quit`: close the connection.
    Quit,
    /// `mn` (meta no-op): answered `MN`.
    MetaNoop,
    /// A meta command with a key (`mg`, `ms`, `md`, `ma`, `me`), left for [`meta::parse`]
    /// (kept out of this enum so that it stays small for the `get` path).
    Meta {
        /// Which one.
        op: meta::MetaOp,
        /// The whole line.
        line: &'a [u8],
    },
    /// `shutdown [graceful]`: `Some(graceful)`, or `None` for another mode (answered
    /// [`BAD_SHUTDOWN_MODE`] when shutdown is enabled).
    Shutdown(Option<bool>),
    /// `refresh_certs`: memcached's TLS build reads its certificate files again (answered
    /// `ERROR` where connections speak no TLS).
    RefreshCerts,
    /// `cache_memlimit <megabytes> [noreply]`: `None` when not a number (answered `ERROR`).
    CacheMemlimit {
        /// The new limit in MiB.
        mb: Option<u32>,
        /// Suppress the reply.
        noreply: bool,
    },
    /// `lru_crawler <subcommand>`.
    LruCrawler(Crawler<'a>),
    /// `slabs reassign|automove …`, memcached's slab page mover.
    Slabs {
        /// What was asked.
        cmd: Slabs,
        /// Suppress the reply (`automove` only, as memcached).
        noreply: bool,
    },
    /// `debugtime <seconds>` (memcached's debug build): moves the clock forward; `None` when
    /// not a number (answered `ERROR`).
    DebugTime(Option<i64>),
    /// `watch [...]`: live logging of the events in `events` (bits of [`watch`]; no argument:
    /// fetchers, as memcached), or `None` when an argument names no event memcached logs
    /// (answered `ERROR`).
    Watch {
        /// Suppress the reply.
        noreply: bool,
        /// The events asked for.
        events: Option<u8>,
    },
    /// An unknown command that ends like an HTTP request line (`GET / HTTP/1.1`): close
    /// without a reply, as memcached does, so that a web page cannot make a browser speak to
    /// the server (cross-protocol requests).
    CrossProtocol,
}

/// A line that is answered with a fixed reply (no CRLF in `reply`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reject {
    /// The reply line.
    pub reply: &'static str,
    /// `noreply` was given: send nothing.
    pub silent: bool,
}

/// `ERROR`: unknown command or wrong token count.
pub const ERROR: &str = "ERROR";
/// Malformed arguments.
pub const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";
/// Bad `delete` arguments.
pub const BAD_DELETE: &str = "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]";
/// Bad expiry in `touch`/`gat`/`flush_all`.
pub const BAD_EXPTIME: &str = "CLIENT_ERROR invalid exptime argument";
/// Bad `incr`/`decr` amount.
pub const BAD_DELTA: &str = "CLIENT_ERROR invalid numeric delta argument";
/// Data not followed by `\r\n`.
pub const BAD_CHUNK: &str = "CLIENT_ERROR bad data chunk";
/// `incr`/`decr` on a value that is not a decimal number.
pub const NON_NUMERIC: &str = "CLIENT_ERROR cannot increment or decrement non-numeric value";
/// Value over the item size limit.
pub const TOO_LARGE: &str = "SERVER_ERROR object too large for cache";
/// Nothing could be evicted to make room.
pub const OUT_OF_MEMORY: &str = "SERVER_ERROR out of memory storing object";
/// A get response over the response size limit.
pub const GET_TOO_LARGE: &str = "SERVER_ERROR out of memory writing get response";
/// A request line over the limit (memcached: its read buffer could not grow); then close.
pub const READ_TOO_LARGE: &str = "SERVER_ERROR out of memory reading request";
/// `flush_all` when it is disabled (memcached `-F`).
pub const FLUSH_DISABLED: &str = "CLIENT_ERROR flush_all not allowed";

fn error() -> Reject {
    Reject {
        reply: ERROR,
        silent: false,
    }
}

fn reject(reply: &'static str, noreply: bool) -> Reject {
    Reject {
        reply,
        silent: noreply,
    }
}

/// The first space-separated token and the rest.
fn split_token(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let start = s.iter().position(|&b| b != b' ')?;
    let s = &s[start..];
    let end = s.iter().position(|&b| b == b' ').unwrap_or(s.len());
    Some((&s[..end], &s[end..]))
}

/// Up to `N` leading tokens and the count of all tokens.
fn tokens<const N: usize>(line: &[u8]) -> ([&[u8]; N], usize) {
    let mut toks: [&[u8]; N] = [&[]; N];
    let mut n = 0;
    let mut rest = line;
    while let Some((tok, r)) = split_token(rest) {
        if n < N {
            toks[n] = tok;
        }
        n += 1;
        rest = r;
    }
    (toks, n)
}

/// memcached's `set_noreply_maybe`: the last token is `noreply`.
fn noreply(toks: &[&[u8]], n: usize) -> bool {
    n > 0 && toks.get(n - 1) == Some(&&b"noreply"[..])
}

/// Parses one command line (without its line end).
pub fn parse_line(line: &[u8]) -> Result<Command<'_>, Reject> {
    // Up to 8 tokens matter for every command but the retrievals (which re-scan the line).
    let (t, n) = tokens::<8>(line);
    if n == 0 || t[0].len() < 2 {
        return Err(error());
    }
    // Token counts below are memcached's minus its terminal token.
    match t[0] {
        b"get" | b"gets" | b"gat" | b"gats" if n >= 2 => parse_get(t[0], line),
        b"set" | b"add" | b"replace" | b"append" | b"prepend" if n == 5 || n == 6 => {
            parse_store(&t, n, false)
        }
        b"cas" if n == 6 || n == 7 => parse_store(&t, n, true),
        b"incr" | b"decr" if n == 3 || n == 4 => parse_arith(&t, n),
        b"delete" if (2..=4).contains(&n) => parse_delete(&t, n),
        b"touch" if n == 3 || n == 4 => parse_touch(&t, n),
        b"flush_all" if (1..=3).contains(&n) => parse_flush(&t, n),
        b"version" => Ok(Command::Version),
        b"quit" => Ok(Command::Quit),
        b"mn" => Ok(Command::MetaNoop),
        b"mg" => Ok(Command::Meta {
            op: meta::MetaOp::Get,
            line,
        }),
        b"ms" => Ok(Command::Meta {
            op: meta::MetaOp::Set,
            line,
        }),
        b"md" => Ok(Command::Meta {
            op: meta::MetaOp::Delete,
            line,
        }),
        b"ma" => Ok(Command::Meta {
            op: meta::MetaOp::Arith,
            line,
        }),
        b"me" => Ok(Command::Meta {
            op: meta::MetaOp::Debug,
            line,
        }),
        b"verbosity" if n == 2 || n == 3 => {
            let nr = noreply(&t, n);
            match safe_strtoul(t[1]) {
                Some(level) => Ok(Command::Verbosity { level, noreply: nr }),
                None => Err(reject(BAD_FORMAT, nr)),
            }
        }
        b"stats" => parse_stats(&t, n),
        b"shutdown" => Ok(Command::Shutdown(match (n, t[1]) {
            (1, _) => Some(false),
            (2, b"graceful") => Some(true),
            _ => None,
        })),
        b"refresh_certs" if n == 1 => Ok(Command::RefreshCerts),
        b"cache_memlimit" if n == 2 || n == 3 => Ok(Command::CacheMemlimit {
            mb: safe_strtoul(t[1]),
            noreply: noreply(&t, n),
        }),
        b"lru_crawler" => parse_crawler(&t, n),
        b"slabs" if n == 4 && t[1] == b"reassign" => Ok(Command::Slabs {
            cmd: Slabs::Reassign,
            noreply: false,
        }),
        b"slabs" if n >= 3 && t[1] == b"automove" => {
            let cmd = if t[2] == b"ratio" {
                let ratio = std::str::from_utf8(t[3])
                    .ok()
                    .and_then(|r| r.parse::<f64>().ok());
                match ratio {
                    Some(_) if n >= 4 => Slabs::AutomoveRatio,
                    _ => Slabs::Bad(ERROR),
                }
            } else {
                match safe_strtoul(t[2]) {
                    None => Slabs::Bad(BAD_FORMAT),
                    Some(level @ 0..=2) => Slabs::Automove(level),
                    Some(_) => Slabs::Bad(ERROR),
                }
            };
            Ok(Command::Slabs {
                cmd,
                noreply: noreply(&t, n),
            })
        }
        b"debugtime" if n >= 2 => Ok(Command::DebugTime(
            std::str::from_utf8(t[1]).ok().and_then(|v| v.parse().ok()),
        )),
        b"watch" => Ok(Command::Watch {
            noreply: noreply(&t, n),
            events: watch::parse(&t[1..n]),
        }),
        name if !is_memcached_command(name) && looks_like_http(line) => Ok(Command::CrossProtocol),
        _ => Err(error()),
    }
}

/// Whether memcached 1.6.18 dispatches on this command name (whether or not we implement it,
/// and whatever its token count): its HTTP check is reached only by names it does not know.
/// It dispatches on the first byte for `g`, `s`, `a`, `c`, `i`, `d`, `t` (any other word with
/// those initials is `ERROR`), and on two-byte `m?` meta commands.
fn is_memcached_command(name: &[u8]) -> bool {
    match name {
        [b'm', _] => true,
        [b'g' | b's' | b'a' | b'c' | b'i' | b'd' | b't', ..] => true,
        _ => matches!(
            name,
            b"replace"
                | b"prepend"
                | b"bget"
                | b"flush_all"
                | b"version"
                | b"quit"
                | b"lru_crawler"
                | b"watch"
                | b"verbosity"
                | b"lru"
                | b"misbehave"
                | b"extstore"
                | b"refresh_certs"
        ),
    }
}

/// memcached's test for an HTTP request line: the last token starts with `HTTP/`. Its
/// tokenizer keeps at most 23 tokens (the rest of a longer line is one unparsed remainder),
/// so for a longer line the 23rd token is the one looked at.
fn looks_like_http(line: &[u8]) -> bool {
    const TOKENS_MAX: usize = 23;
    let mut last: &[u8] = &[];
    let mut rest = line;
    for _ in 0..TOKENS_MAX {
        let Some((tok, r)) = split_token(rest) else {
            break;
        };
        last = tok;
        rest = r;
    }
    last.starts_with(b"HTTP/")
}

fn parse_get<'a>(cmd: &[u8], line: &'a [u8]) -> Result<Command<'a>, Reject> {
    let (_, mut rest) = split_token(line).ok_or_else(error)?;
    let touch = if cmd.starts_with(b"gat") {
        let (exp, r) = split_token(rest).ok_or_else(error)?;
        rest = r;
        Some(safe_strtol(exp).ok_or(reject(BAD_EXPTIME, false))?)
    } else {
        None
    };
    let keys = Keys(rest);
    if keys.clone().any(|k| k.len() > KEY_BYTES_MAX) {
        return Err(reject(BAD_FORMAT, false));
    }
    Ok(Command::Get {
        keys,
        cas: cmd.ends_with(b"s"),
        touch,
    })
}

fn parse_store<'a>(t: &[&'a [u8]; 8], n: usize, is_cas: bool) -> Result<Command<'a>, Reject> {
    let nr = noreply(t, n);
    let bad = reject(BAD_FORMAT, nr);
    if t[1].len() > KEY_BYTES_MAX {
        return Err(bad);
    }
    let (Some(flags), Some(exptime), Some(bytes)) =
        (safe_strtoul(t[2]), safe_strtol(t[3]), safe_strtol(t[4]))
    else {
        return Err(bad);
    };
    let cas = if is_cas {
        safe_strtoull(t[5]).ok_or(bad)?
    } else {
        0
    };
    if !(0..=i32::MAX - 2).contains(&bytes) {
        return Err(bad);
    }
    let op = match t[0] {
        b"set" => StoreOp::Set,
        b"add" => StoreOp::Add,
        b"replace" => StoreOp::Replace,
        b"append" => StoreOp::Append,
        b"prepend" => StoreOp::Prepend,
        _ => StoreOp::Cas,
    };
    Ok(Command::Store(Store {
        op,
        key: t[1],
        flags,
        exptime,
        bytes: bytes as usize,
        cas,
        noreply: nr,
    }))
}

fn parse_arith<'a>(t: &[&'a [u8]; 8], n: usize) -> Result<Command<'a>, Reject> {
    let nr = noreply(t, n);
    if t[1].len() > KEY_BYTES_MAX {
        return Err(reject(BAD_FORMAT, nr));
    }
    let delta = safe_strtoull(t[2]).ok_or(reject(BAD_DELTA, nr))?;
    Ok(Command::Arith {
        incr: t[0] == b"incr",
        key: t[1],
        delta,
        noreply: nr,
    })
}

fn parse_delete<'a>(t: &[&'a [u8]; 8], n: usize) -> Result<Command<'a>, Reject> {
    let mut nr = false;
    if n > 2 {
        // `delete <key> 0` is a legacy form; any other extra token is an error.
        let hold_is_zero = t[2] == b"0";
        nr = noreply(t, n);
        let valid = (n == 3 && (hold_is_zero || nr)) || (n == 4 && hold_is_zero && nr);
        if !valid {
            return Err(reject(BAD_DELETE, nr));
        }
    }
    if t[1].len() > KEY_BYTES_MAX {
        return Err(reject(BAD_FORMAT, nr));
    }
    Ok(Command::Delete {
        key: t[1],
        noreply: nr,
    })
}

fn parse_touch<'a>(t: &[&'a [u8]; 8], n: usize) -> Result<Command<'a>, Reject> {
    let nr = noreply(t, n);
    if t[1].len() > KEY_BYTES_MAX {
        return Err(reject(BAD_FORMAT, nr));
    }
    let exptime = safe_strtol(t[2]).ok_or(reject(BAD_EXPTIME, nr))?;
    Ok(Command::Touch {
        key: t[1],
        exptime,
        noreply: nr,
    })
}

fn parse_flush<'a>(t: &[&'a [u8]; 8], n: usize) -> Result<Command<'a>, Reject> {
    let nr = noreply(t, n);
    let delay = if n != if nr { 2 } else { 1 } {
        safe_strtol(t[1])
    } else {
        Some(0)
    };
    Ok(Command::FlushAll { delay, noreply: nr })
}

fn parse_crawler<'a>(t: &[&'a [u8]; 8], n: usize) -> Result<Command<'a>, Reject> {
    let c = match (n, t[1]) {
        (3, b"crawl") => Crawler::Crawl(t[2]),
        (3, b"metadump") => Crawler::Metadump(t[2]),
        (3, b"tocrawl") => Crawler::Tocrawl(safe_strtoul(t[2])),
        (3, b"sleep") => Crawler::Sleep(safe_strtoul(t[2])),
        (2, b"enable") => Crawler::Enable,
        (2, b"disable") => Crawler::Disable,
        _ => return Err(error()),
    };
    Ok(Command::LruCrawler(c))
}

fn parse_stats<'a>(t: &[&'a [u8]; 8], n: usize) -> Result<Command<'a>, Reject> {
    if n == 1 {
        return Ok(Command::Stats(Stats::General));
    }
    let which = match t[1] {
        b"reset" => Stats::Reset,
        b"settings" => Stats::Settings,
        b"items" => Stats::Items,
        b"slabs" => Stats::Slabs,
        b"sizes" => Stats::Sizes,
        b"sizes_enable" => Stats::SizesEnable,
        b"sizes_disable" => Stats::SizesDisable,
        b"conns" => Stats::Conns,
        b"detail" => Stats::Detail(match (n, t[2]) {
            (3.., b"on") => Some(Detail::On),
            (3.., b"off") => Some(Detail::Off),
            (3.., b"dump") => Some(Detail::Dump),
            _ => None,
        }),
        b"cachedump" => Stats::Cachedump(if n < 4 {
            Err("CLIENT_ERROR bad command line")
        } else {
            match (safe_strtoul(t[2]), safe_strtoul(t[3])) {
                (Some(id), Some(_)) if id as usize >= slabs::CLASSES_MAX => {
                    Err("CLIENT_ERROR Illegal slab id")
                }
                (Some(id), Some(limit)) => Ok((id, limit)),
                _ => Err(BAD_FORMAT),
            }
        }),
        _ => return Err(error()),
    };
    Ok(Command::Stats(which))
}

/// memcached's item size for the size limit: header (48) + CAS (8) + key + NUL + data + CRLF,
/// plus 4 bytes when the flags are non-zero. Matches memcached 1.6's `-I` boundary exactly.
pub fn item_size(key_len: usize, flags: u32, value_len: usize) -> u64 {
    let flags_len = if flags != 0 { 4 } else { 0 };
    (48 + 8 + key_len + 1 + value_len + 2 + flags_len) as u64
}

/// Whether a data block (value plus its two terminator bytes) ends in `\r\n`.
pub fn data_chunk_ok(chunk: &[u8]) -> bool {
    chunk.ends_with(b"\r\n")
}

/// Absolute expiry (unix seconds; 0 = never) for an expiry as sent, memcached's `realtime`:
/// 0 never expires, negative is already expired, up to 30 days is relative to `now_unix`,
/// larger is a unix time (at or before `started_unix`: already expired).
pub fn expiry_unix(exptime: i32, now_unix: u64, started_unix: u64) -> u64 {
    let exptime = i64::from(exptime);
    match exptime {
        0 => 0,
        e if e < 0 => 1,
        e if e > REALTIME_MAXDELTA_SECS => {
            if e as u64 <= started_unix {
                1
            } else {
                e as u64
            }
        }
        e => now_unix + e as u64,
    }
}

/// The number stored in a value, as `incr`/`decr` read it (memcached's `safe_strtoull` on the
/// data followed by its `\r\n`); `None` if non-numeric.
pub fn value_number(data: &[u8]) -> Option<u64> {
    if data.is_empty() {
        return None;
    }
    numbers::strtoull_prefix(data)
}

/// The new value after `incr`/`decr`: the decimal number, space-padded to `old_len` when it
/// fits (memcached rewrites in place and pads: "decrementing 100 gives `99 `").
pub fn arith_value(n: u64, old_len: usize) -> Vec<u8> {
    let mut v = n.to_string().into_bytes();
    if v.len() <= old_len {
        v.resize(old_len, b' ');
    }
    v
}

/// Appends `VALUE <key> <flags> <bytes>[ <cas>]\r\n<data>\r\n`.
pub fn write_value(out: &mut Vec<u8>, key: &[u8], flags: u32, data: &[u8], cas: Option<u64>) {
    use std::io::Write;
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    let _ = match cas {
        Some(c) => write!(out, " {} {} {}\r\n", flags, data.len(), c),
        None => write!(out, " {} {}\r\n", flags, data.len()),
    };
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Appends a reply line and its CRLF.
pub fn write_line(out: &mut Vec<u8>, line: &str) {
    out.extend_from_slice(line.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// The events of memcached's `watch` command, as bits.
pub mod watch {
    /// Item fetches (`type=item_get`), including the lookup a storage command makes.
    pub const FETCHERS: u8 = 1;
    /// Item stores (`type=item_store`).
    pub const MUTATIONS: u8 = 2;
    /// Evictions (`type=eviction`).
    pub const EVICTIONS: u8 = 4;
    /// Connections opened and closed (`type=conn_new`, `type=conn_close`).
    pub const CONNEVENTS: u8 = 8;
    /// Events memcached logs that nothing here produces (`rawcmds`, `sysevents`, the proxy's):
    /// accepted, never logged.
    pub const OTHER: u8 = 16;

    /// The events `words` name (none: fetchers); `None` if one is not an event. memcached
    /// reads `noreply` as an argument too, so it makes the command an error.
    pub fn parse(words: &[&[u8]]) -> Option<u8> {
        if words.is_empty() {
            return Some(FETCHERS);
        }
        words.iter().try_fold(0, |bits, w| {
            let bit = match *w {
                b"fetchers" => FETCHERS,
                b"mutations" => MUTATIONS,
                b"evictions" => EVICTIONS,
                b"connevents" => CONNEVENTS,
                b"rawcmds" | b"sysevents" | b"proxyreqs" | b"proxyevents" | b"proxyuser" => OTHER,
                _ => return None,
            };
            Some(bits | bit)
        })
    }

    #[cfg(test)]
    mod tests {
        use super::super::{parse_line, Command};
        use super::*;

        #[test]
        fn watch_arguments_are_memcacheds() {
            let events = |line: &[u8]| match parse_line(line) {
                Ok(Command::Watch { events, .. }) => events,
                other => panic!("{other:?}"),
            };
            assert_eq!(events(b"watch"), Some(FETCHERS));
            assert_eq!(
                events(b"watch mutations evictions"),
                Some(MUTATIONS | EVICTIONS)
            );
            assert_eq!(
                events(b"watch connevents rawcmds"),
                Some(CONNEVENTS | OTHER)
            );
            assert_eq!(events(b"watch bogus"), None);
            assert_eq!(events(b"watch fetchers noreply"), None);
        }
    }
}
