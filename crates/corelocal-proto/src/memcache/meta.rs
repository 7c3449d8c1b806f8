//! The meta protocol (`mg`, `ms`, `md`, `ma`, `me`; `mn` is a plain
//! [`Command`](super::Command)), parsed exactly as memcached 1.6.18's `proto_text.c` does: the
//! same checks in the same order, the same error strings, the same flag tokens echoed back.
//!
//! A meta command line is `<cm> <key> [<datalen>] <flag>*`. Each flag is one token whose
//! first byte names it; some carry an argument in the rest of the token (`T30`, `Oabc`).
//! [`parse`] checks the line and returns a [`MetaRequest`]: the key (base64-decoded with `b`),
//! the parsed flags, and the flag tokens in order, from which the server builds its reply
//! (flags come back in the order they were sent, as memcached writes them).
//!
//! What memcached does and this parser mirrors:
//! - at most 17 flags (20 tokens counting the command, key and memcached's terminal token; 16
//!   for `ms`, whose length is a token too): more is `CLIENT_ERROR options flags (are) too long`;
//! - a repeated flag or a first byte ≥ 127 is `CLIENT_ERROR duplicate flag`, an unknown one
//!   `CLIENT_ERROR invalid flag`; `md` and `ma` report every flag error as
//!   `CLIENT_ERROR invalid or duplicate flag`;
//! - an opaque (`O`) token longer than 32 bytes is `CLIENT_ERROR opaque token too long`;
//! - errors are always answered, `q` or not;
//! - an `ms` refused after its length was read discards its data ([`MetaReject::swallow`]);
//!   one refused before (bad length) does not, so its data line is then read as a command.
//!
//! Where we differ: memcached checks `mg`'s and `ma`'s opaque length while writing the reply,
//! after a `T`, `N` or the arithmetic has already changed the item; we refuse the command
//! before it changes anything. The reply is the same.

use super::{safe_strtol, safe_strtoul, safe_strtoull, split_token, StoreOp, KEY_BYTES_MAX};

/// A meta command with a key (`mn` has none and is [`super::Command::MetaNoop`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaOp {
    /// `mg`: meta get.
    Get,
    /// `ms`: meta set (data follows).
    Set,
    /// `md`: meta delete.
    Delete,
    /// `ma`: meta arithmetic.
    Arith,
    /// `me`: meta debug (a human-readable dump of an item's metadata).
    Debug,
}

/// Tokens on a meta line beyond which memcached refuses it (its `MFLAG_MAX_OPT_LENGTH`,
/// counted with its terminal token).
const TOKENS_MAX: usize = 20;

/// Most flags a meta command can carry (`mg`: command, key, 17 flags, terminal).
pub const FLAGS_MAX: usize = TOKENS_MAX - 3;

/// Longest opaque token, its `O` included (memcached's `MFLAG_MAX_OPAQUE_LENGTH`).
pub const OPAQUE_BYTES_MAX: usize = 32;

/// Generic malformed-line error.
pub const BAD_FORMAT: &str = super::BAD_FORMAT;
/// `mg` with too many flags.
pub const MG_TOO_MANY_FLAGS: &str = "CLIENT_ERROR options flags are too long";
/// `ms`/`md`/`ma` with too many flags.
pub const TOO_MANY_FLAGS: &str = "CLIENT_ERROR options flags too long";
/// A flag sent twice (or a first byte ≥ 127).
pub const DUPLICATE_FLAG: &str = "CLIENT_ERROR duplicate flag";
/// A flag memcached does not know.
pub const INVALID_FLAG: &str = "CLIENT_ERROR invalid flag";
/// `md`/`ma`: any flag error.
pub const INVALID_OR_DUPLICATE_FLAG: &str = "CLIENT_ERROR invalid or duplicate flag";
/// `b` with a key that is not base64.
pub const BAD_KEY_ENCODING: &str = "CLIENT_ERROR error decoding key";
/// A bad number in `N`, `T`, `R` or `C`.
pub const BAD_TOKEN: &str = "CLIENT_ERROR bad token in command line format";
/// `M` with other than one mode byte.
pub const BAD_MODE_LENGTH: &str = "CLIENT_ERROR incorrect length for M token";
/// A bad `J` (initial value).
pub const BAD_INITIAL: &str = "CLIENT_ERROR invalid numeric initial value";
/// A bad `D` (delta).
pub const BAD_DELTA: &str = "CLIENT_ERROR invalid numeric delta value";
/// An `O` token over [`OPAQUE_BYTES_MAX`].
pub const OPAQUE_TOO_LONG: &str = "CLIENT_ERROR opaque token too long";
/// `ms` with a mode other than E, A, P, R, S.
pub const MS_BAD_MODE: &str = "CLIENT_ERROR invalid mode for ms M token";
/// `ma` with a mode other than I, +, D, -.
pub const MA_BAD_MODE: &str = "CLIENT_ERROR invalid mode for ma M token";

/// A refused meta line: always answered (meta commands never hide errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaReject {
    /// The reply line (no CRLF).
    pub reply: &'static str,
    /// Bytes of data to discard after the line (`ms` refused after its length was read: the
    /// data and its CRLF); 0 otherwise.
    pub swallow: usize,
}

fn reject(reply: &'static str) -> MetaReject {
    MetaReject { reply, swallow: 0 }
}

/// A key as the command names it: decoded from base64 when the `b` flag was given.
#[derive(Clone, Copy)]
pub struct MetaKey {
    buf: [u8; KEY_BYTES_MAX],
    len: u8,
    binary: bool,
}

impl std::fmt::Debug for MetaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaKey")
            .field("key", &String::from_utf8_lossy(self.bytes()))
            .field("binary", &self.binary)
            .finish()
    }
}

impl PartialEq for MetaKey {
    fn eq(&self, o: &MetaKey) -> bool {
        self.bytes() == o.bytes() && self.binary == o.binary
    }
}

impl Eq for MetaKey {}

impl MetaKey {
    fn plain(key: &[u8]) -> MetaKey {
        let mut buf = [0; KEY_BYTES_MAX];
        buf[..key.len()].copy_from_slice(key);
        MetaKey {
            buf,
            len: key.len() as u8,
            binary: false,
        }
    }

    /// The key's bytes (decoded).
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }

    /// Whether the key was sent base64-encoded (`b`): it is then returned encoded.
    pub fn binary(&self) -> bool {
        self.binary
    }
}

/// The flags of a meta command, parsed (memcached's `_meta_flag_preparse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaFlags {
    /// `v`: return the value.
    pub value: bool,
    /// `q`: quiet — hide the nominal reply (`EN` for `mg`, `HD` for `ms`/`md`/`ma`).
    pub quiet: bool,
    /// `u`: do not bump the item in the LRU (nor mark it fetched).
    pub no_bump: bool,
    /// `I`: invalidate (`md`: mark stale; `ms` with `C`: a lower CAS stores as stale).
    pub invalidate: bool,
    /// `T<ttl>`: new expiry, as sent.
    pub ttl: Option<i32>,
    /// `N<ttl>`: create on a miss with this expiry.
    pub vivify: Option<i32>,
    /// `R<ttl>`: win the recache when the remaining TTL is below this.
    pub recache: Option<i32>,
    /// `F<flags>`: client flags for `ms` (0 when absent).
    pub client_flags: u32,
    /// `C<cas>`: compare CAS.
    pub cas: Option<u64>,
    /// `M<mode>`: the mode byte.
    pub mode: Option<u8>,
    /// `D<delta>`: `ma`'s delta (default 1).
    pub delta: u64,
    /// `J<initial>`: `ma`'s value when it creates the item (default 0).
    pub initial: u64,
}

impl Default for MetaFlags {
    fn default() -> MetaFlags {
        MetaFlags {
            value: false,
            quiet: false,
            no_bump: false,
            invalidate: false,
            ttl: None,
            vivify: None,
            recache: None,
            client_flags: 0,
            cas: None,
            mode: None,
            delta: 1,
            initial: 0,
        }
    }
}

/// A parsed meta command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaRequest<'a> {
    /// Which command.
    pub op: MetaOp,
    /// The key.
    pub key: MetaKey,
    /// `ms`: the data length (its CRLF not included); 0 otherwise.
    pub datalen: usize,
    /// Parsed flags.
    pub flags: MetaFlags,
    /// `ms`: the storage operation (`M` mode; `C` turns set and replace into cas).
    pub store_op: StoreOp,
    /// `ma`: increment (else decrement, `MD`/`M-`).
    pub incr: bool,
    tokens: [&'a [u8]; FLAGS_MAX],
    ntokens: usize,
}

impl<'a> MetaRequest<'a> {
    /// The flag tokens in the order they were sent (each non-empty; its first byte is the
    /// flag), for building the reply.
    pub fn tokens(&self) -> &[&'a [u8]] {
        &self.tokens[..self.ntokens]
    }
}

/// Parses a meta command line whose command token is `op`'s (`mg`, `ms`, `md`, `ma`, `me`).
pub fn parse(op: MetaOp, line: &[u8]) -> Result<MetaRequest<'_>, MetaReject> {
    // Tokens after the command; memcached's count adds the command and a terminal token.
    let mut toks: [&[u8]; TOKENS_MAX] = [&[]; TOKENS_MAX];
    let mut n = 0;
    let mut rest = line;
    if let Some((_, r)) = split_token(rest) {
        rest = r;
    }
    while let Some((tok, r)) = split_token(rest) {
        if n < TOKENS_MAX {
            toks[n] = tok;
        }
        n += 1;
        rest = r;
    }
    let ntokens = n + 2;
    if op == MetaOp::Debug {
        return parse_debug(&toks, ntokens);
    }
    if ntokens < 3 {
        return Err(reject(super::ERROR));
    }
    if toks[0].len() > KEY_BYTES_MAX {
        return Err(reject(BAD_FORMAT));
    }
    let mut req = MetaRequest {
        op,
        key: MetaKey::plain(toks[0]),
        datalen: 0,
        flags: MetaFlags::default(),
        store_op: StoreOp::Set,
        incr: true,
        tokens: [&[]; FLAGS_MAX],
        ntokens: 0,
    };
    let first_flag = match op {
        MetaOp::Set => {
            if ntokens == 3 {
                return Err(reject(BAD_FORMAT));
            }
            if ntokens > TOKENS_MAX {
                return Err(reject(TOO_MANY_FLAGS));
            }
            match safe_strtol(toks[1]) {
                Some(len) if (0..=i32::MAX - 2).contains(&len) => req.datalen = len as usize,
                _ => return Err(reject(BAD_FORMAT)),
            }
            2
        }
        _ => {
            if ntokens > TOKENS_MAX {
                return Err(reject(if op == MetaOp::Get {
                    MG_TOO_MANY_FLAGS
                } else {
                    TOO_MANY_FLAGS
                }));
            }
            1
        }
    };
    let flag_toks = &toks[first_flag..n];
    req.tokens[..flag_toks.len()].copy_from_slice(flag_toks);
    req.ntokens = flag_toks.len();
    let swallow = if op == MetaOp::Set {
        req.datalen + 2
    } else {
        0
    };
    let fail = |reply: &'static str| {
        let reply = match op {
            MetaOp::Delete | MetaOp::Arith => INVALID_OR_DUPLICATE_FLAG,
            _ => reply,
        };
        Err(MetaReject { reply, swallow })
    };
    if let Err(e) = preparse(&mut req, toks[0]) {
        return fail(e);
    }
    let opaque_too_long = req
        .tokens()
        .iter()
        .any(|t| t[0] == b'O' && t.len() > OPAQUE_BYTES_MAX);
    match op {
        MetaOp::Set => {
            // memcached notes the long opaque, then checks the mode (whose error wins).
            req.store_op = match req.flags.mode {
                None | Some(b'S') => StoreOp::Set,
                Some(b'E') => StoreOp::Add,
                Some(b'A') => StoreOp::Append,
                Some(b'P') => StoreOp::Prepend,
                Some(b'R') => StoreOp::Replace,
                Some(_) => {
                    return Err(MetaReject {
                        reply: MS_BAD_MODE,
                        swallow,
                    })
                }
            };
            if req.flags.cas.is_some() && matches!(req.store_op, StoreOp::Set | StoreOp::Replace) {
                req.store_op = StoreOp::Cas;
            }
        }
        MetaOp::Arith => {
            req.incr = match req.flags.mode {
                None | Some(b'I' | b'+') => true,
                Some(b'D' | b'-') => false,
                Some(_) => return Err(reject(MA_BAD_MODE)),
            };
        }
        _ => {}
    }
    if opaque_too_long {
        return Err(MetaReject {
            reply: OPAQUE_TOO_LONG,
            swallow,
        });
    }
    Ok(req)
}

/// memcached's `_meta_flag_preparse`: every flag token once; the last error message wins,
/// except that a duplicate or unknown flag stops at once.
fn preparse(req: &mut MetaRequest<'_>, raw_key: &[u8]) -> Result<(), &'static str> {
    let mut seen = [false; 127];
    let mut err: Option<&'static str> = None;
    let mut failed = false;
    let f = &mut req.flags;
    for tok in &req.tokens[..req.ntokens] {
        let o = tok[0];
        if o >= 127 || seen[usize::from(o)] {
            return Err(DUPLICATE_FLAG);
        }
        seen[usize::from(o)] = true;
        let arg = &tok[1..];
        let mut bad = |msg: Option<&'static str>| {
            failed = true;
            if msg.is_some() {
                err = msg;
            }
        };
        match o {
            b'b' => match base64_decode(raw_key, &mut req.key.buf) {
                Some(len) => {
                    req.key.len = len as u8;
                    req.key.binary = true;
                }
                None => {
                    req.key.len = 0;
                    req.key.binary = true;
                    bad(Some(BAD_KEY_ENCODING));
                }
            },
            b'N' | b'T' | b'R' => match safe_strtol(arg) {
                Some(v) => match o {
                    b'N' => f.vivify = Some(v),
                    b'T' => f.ttl = Some(v),
                    _ => f.recache = Some(v),
                },
                None => bad(Some(BAD_TOKEN)),
            },
            b'l' | b'O' | b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' | b'h' => {}
            b'v' => f.value = true,
            b'u' => f.no_bump = true,
            b'q' => f.quiet = true,
            b'F' => match safe_strtoul(arg) {
                Some(v) => f.client_flags = v,
                None => bad(None),
            },
            b'C' => match safe_strtoull(arg) {
                Some(v) => f.cas = Some(v),
                None => bad(Some(BAD_TOKEN)),
            },
            b'M' => {
                if tok.len() == 2 {
                    f.mode = Some(tok[1]);
                } else {
                    bad(Some(BAD_MODE_LENGTH));
                }
            }
            b'J' => match safe_strtoull(arg) {
                Some(v) => f.initial = v,
                None => bad(Some(BAD_INITIAL)),
            },
            b'D' => match safe_strtoull(arg) {
                Some(v) => f.delta = v,
                None => bad(Some(BAD_DELTA)),
            },
            b'I' => f.invalidate = true,
            _ => return Err(INVALID_FLAG),
        }
    }
    if failed {
        Err(err.unwrap_or(BAD_FORMAT))
    } else {
        Ok(())
    }
}

/// `me <key> [b]`: memcached's `process_meta_command`.
fn parse_debug<'a>(
    toks: &[&'a [u8]; TOKENS_MAX],
    ntokens: usize,
) -> Result<MetaRequest<'a>, MetaReject> {
    if ntokens < 3 || toks[0].len() > KEY_BYTES_MAX {
        return Err(reject(BAD_FORMAT));
    }
    let mut key = MetaKey::plain(toks[0]);
    if ntokens >= 4 && toks[1] == b"b" {
        let len = base64_decode(toks[0], &mut key.buf).ok_or(reject(BAD_FORMAT))?;
        key.len = len as u8;
        key.binary = true;
    }
    Ok(MetaRequest {
        op: MetaOp::Debug,
        key,
        datalen: 0,
        flags: MetaFlags::default(),
        store_op: StoreOp::Set,
        incr: true,
        tokens: [&[]; FLAGS_MAX],
        ntokens: 0,
    })
}

/// memcached's base64 alphabet.
const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// A byte's 6-bit value; `=` is 0; `None` for bytes the decoder skips.
fn b64_value(b: u8) -> Option<u8> {
    match b {
        b'A'..=b'Z' => Some(b - b'A'),
        b'a'..=b'z' => Some(b - b'a' + 26),
        b'0'..=b'9' => Some(b - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        b'=' => Some(0),
        _ => None,
    }
}

/// Decodes base64 exactly as memcached's `base64_decode`: bytes outside the alphabet are
/// skipped, the count of the others must be a non-zero multiple of 4, decoding stops after
/// the first block with padding. Returns the decoded length written to `out`, or `None`
/// (memcached's 0: the key is refused).
pub fn base64_decode(src: &[u8], out: &mut [u8]) -> Option<usize> {
    let count = src.iter().filter(|&&b| b64_value(b).is_some()).count();
    if count == 0 || count % 4 != 0 || count / 4 * 3 > out.len() {
        return None;
    }
    let mut pos = 0;
    let mut block = [0u8; 4];
    let mut n = 0;
    let mut pad = 0;
    for &b in src {
        let Some(v) = b64_value(b) else { continue };
        if b == b'=' {
            pad += 1;
        }
        block[n] = v;
        n += 1;
        if n == 4 {
            out[pos] = (block[0] << 2) | (block[1] >> 4);
            out[pos + 1] = (block[1] << 4) | (block[2] >> 2);
            out[pos + 2] = (block[2] << 6) | block[3];
            pos += 3;
            n = 0;
            if pad > 0 {
                match pad {
                    1 => pos -= 1,
                    2 => pos -= 2,
                    _ => return None,
                }
                break;
            }
        }
    }
    if pos == 0 {
        // memcached's 0 means failure: "====" decodes to nothing and is refused.
        return None;
    }
    Some(pos)
}

/// Appends the base64 encoding of `src` (padded), as memcached's `base64_encode`.
pub fn base64_encode(src: &[u8], out: &mut Vec<u8>) {
    let mut chunks = src.chunks_exact(3);
    for c in &mut chunks {
        out.extend_from_slice(&[
            B64[usize::from(c[0] >> 2)],
            B64[usize::from(((c[0] & 3) << 4) | (c[1] >> 4))],
            B64[usize::from(((c[1] & 0xf) << 2) | (c[2] >> 6))],
            B64[usize::from(c[2] & 0x3f)],
        ]);
    }
    match *chunks.remainder() {
        [a] => out.extend_from_slice(&[
            B64[usize::from(a >> 2)],
            B64[usize::from((a & 3) << 4)],
            b'=',
            b'=',
        ]),
        [a, b] => out.extend_from_slice(&[
            B64[usize::from(a >> 2)],
            B64[usize::from(((a & 3) << 4) | (b >> 4))],
            B64[usize::from((b & 0xf) << 2)],
            b'=',
        ]),
        _ => {}
    }
}

/// Appends ` k<key>` — base64-encoded followed by ` b` when `binary` (memcached's `META_KEY`).
pub fn write_key_flag(out: &mut Vec<u8>, key: &[u8], binary: bool) {
    out.extend_from_slice(b" k");
    if binary {
        base64_encode(key, out);
        out.extend_from_slice(b" b");
    } else {
        out.extend_from_slice(key);
    }
}

/// Appends ` <flag><n>` (a numeric return flag such as `t30` or `c12`).
pub fn write_num_flag(out: &mut Vec<u8>, flag: u8, n: impl std::fmt::Display) {
    use std::io::Write;
    let _ = write!(out, " {}{n}", char::from(flag));
}

/// Appends ` <token>` (an opaque token echoed back whole, its `O` included).
pub fn write_token(out: &mut Vec<u8>, token: &[u8]) {
    out.push(b' ');
    out.extend_from_slice(token);
}

#[cfg(test)]
#[path = "meta_tests.rs"]
mod tests;
