//! Execution of the meta commands `mg`, `md`, `ma` and `me` (`ms` goes through the storage
//! path in `conn`, whose reply [`write_ms_reply`] builds), as memcached 1.6.18's
//! `proto_text.c` does: each under its key's stripe lock, reply flags in the order sent.
//!
//! Deliberate difference: memcached's `ma` with `T` updates the expiry of the item it read,
//! which is no longer the stored one when the new number is longer than the old value (the
//! value is then copied to a new item with the old expiry), so its `T` is lost; here `T`
//! always applies.

use std::io::Write;

use corelocal_proto::memcache::meta::{
    write_key_flag, write_num_flag, write_token, MetaOp, MetaRequest,
};
use corelocal_proto::memcache::{self, expiry_unix, item_size, write_line};

use super::store::{Now, Stored};
use super::Inner;

/// How memcached prints a remaining TTL (`t`): -1 for none, else the difference of its 32-bit
/// relative clocks, which wraps when the item has just been given a past expiry (`T-1 t`).
fn ttl_left(inner: &Inner, exp: u64, now: Now) -> i64 {
    if exp == 0 {
        return -1;
    }
    i64::from(inner.rel_time(exp).wrapping_sub(inner.rel_time(now.unix)))
}

/// A `ms` reply's flags, kept until the data has arrived: the `O`, `k` and `c` tokens in the
/// order sent (space-separated), and how to answer.
#[derive(Debug, Clone, Default)]
pub(super) struct MetaAnswer {
    pub(super) quiet: bool,
    pub(super) key_binary: bool,
    pub(super) tokens: Vec<u8>,
}

impl MetaAnswer {
    pub(super) fn new(req: &MetaRequest<'_>) -> MetaAnswer {
        let mut tokens = Vec::new();
        for t in req.tokens() {
            if matches!(t[0], b'O' | b'k' | b'c') {
                if !tokens.is_empty() {
                    tokens.push(b' ');
                }
                tokens.extend_from_slice(t);
            }
        }
        MetaAnswer {
            quiet: req.flags.quiet,
            key_binary: req.key.binary(),
            tokens,
        }
    }
}

/// The reply to a `ms` whose data has been stored (or refused): `HD`, `NS`, `EX` or `NF`
/// with the requested flags (`c` is the new CAS unique, 0 unless stored); `HD` is hidden by
/// `q`; errors are always sent.
pub(super) fn write_ms_reply(
    out: &mut Vec<u8>,
    result: Result<Stored, &'static str>,
    cas: u64,
    key: &[u8],
    a: &MetaAnswer,
) {
    let code = match result {
        Err(line) => return write_line(out, line),
        Ok(Stored::NoMemory) => return write_line(out, memcache::OUT_OF_MEMORY),
        Ok(Stored::Stored) => "HD",
        Ok(Stored::NotStored) => "NS",
        Ok(Stored::Exists) => "EX",
        Ok(Stored::NotFound) => "NF",
    };
    if code == "HD" && a.quiet {
        return;
    }
    out.extend_from_slice(code.as_bytes());
    for t in a.tokens.split(|&b| b == b' ').filter(|t| !t.is_empty()) {
        match t[0] {
            b'O' => write_token(out, t),
            b'k' => write_key_flag(out, key, a.key_binary),
            _ => write_num_flag(out, b'c', cas),
        }
    }
    out.extend_from_slice(b"\r\n");
}

impl Inner {
    /// Runs `mg`, `md`, `ma` or `me`, appending the reply.
    pub(super) fn meta(&self, req: &MetaRequest<'_>, out: &mut Vec<u8>, now: Now) {
        match req.op {
            MetaOp::Get => self.meta_get(req, out, now),
            MetaOp::Delete => self.meta_delete(req, out, now),
            MetaOp::Arith => self.meta_arith(req, out, now),
            MetaOp::Debug => self.meta_debug(req, out, now),
            MetaOp::Set => unreachable!("ms is a storage command"),
        }
    }

    fn exp(&self, ttl: i32, now: Now) -> u64 {
        expiry_unix(ttl, now.unix, self.started_unix)
    }

    fn meta_get(&self, req: &MetaRequest<'_>, out: &mut Vec<u8>, now: Now) {
        let f = &req.flags;
        let key = req.key.bytes();
        let mut l = self.store.lock(key, now);
        let mut created = false;
        if !l.hit() && f.vivify.is_some() {
            // memcached creates an empty item that never expires; `N` sets its TTL below.
            created = l.create(key, Vec::new(), 0);
        }
        if !l.hit() {
            let c = l.counters();
            c.cmd_get += 1;
            c.get_misses += 1;
            drop(l);
            if f.quiet {
                return;
            }
            out.extend_from_slice(b"EN");
            write_echo(out, req);
            out.extend_from_slice(b"\r\n");
            return;
        }
        if f.value {
            let _ = write!(out, "VA {}", l.value().len());
        } else {
            out.extend_from_slice(b"HD");
        }
        let mut won = false;
        for t in req.tokens() {
            match t[0] {
                b'T' => l.set_exp(self.exp(f.ttl.unwrap_or(0), now)),
                b'N' if created => {
                    l.set_exp(self.exp(f.vivify.unwrap_or(0), now));
                    won = true;
                }
                b'R' => {
                    let recache = self.exp(f.recache.unwrap_or(0), now);
                    if !l.token_sent() && !created && l.exp() != 0 && l.exp() < recache {
                        won = true;
                    }
                }
                b's' => write_num_flag(out, b's', l.value().len()),
                b't' => write_num_flag(out, b't', ttl_left(self, l.exp(), now)),
                b'c' => write_num_flag(out, b'c', l.cas()),
                b'f' => write_num_flag(out, b'f', l.flags()),
                b'l' => write_num_flag(out, b'l', now.unix.saturating_sub(l.atime())),
                b'h' => write_num_flag(out, b'h', u8::from(l.fetched())),
                b'O' => write_token(out, t),
                b'k' => write_key_flag(out, l.key(), l.key_binary()),
                _ => {}
            }
        }
        if l.token_sent() {
            out.extend_from_slice(b" Z");
        }
        if l.stale() {
            out.extend_from_slice(b" X");
            if !l.token_sent() {
                won = true;
            }
        }
        if won {
            out.extend_from_slice(b" W");
            l.set_token_sent();
        }
        out.extend_from_slice(b"\r\n");
        if f.value {
            out.extend_from_slice(l.value());
            out.extend_from_slice(b"\r\n");
        }
        if !f.no_bump {
            l.bump();
        }
        let c = l.counters();
        if f.ttl.is_some() {
            c.cmd_touch += 1;
            c.touch_hits += 1;
        } else {
            c.cmd_get += 1;
            c.get_hits += 1;
        }
    }

    fn meta_delete(&self, req: &MetaRequest<'_>, out: &mut Vec<u8>, now: Now) {
        let f = &req.flags;
        let mut l = self.store.lock(req.key.bytes(), now);
        let code = if !l.hit() {
            l.counters().delete_misses += 1;
            "NF"
        } else if f.cas.is_some_and(|c| c != l.cas()) {
            l.counters().delete_misses += 1;
            "EX"
        } else if f.invalidate {
            if let Some(ttl) = f.ttl {
                l.set_exp(self.exp(ttl, now));
            }
            l.invalidate();
            "HD"
        } else {
            l.counters().delete_hits += 1;
            l.remove();
            "HD"
        };
        drop(l);
        if code == "HD" && f.quiet {
            return;
        }
        out.extend_from_slice(code.as_bytes());
        write_echo(out, req);
        out.extend_from_slice(b"\r\n");
    }

    fn meta_arith(&self, req: &MetaRequest<'_>, out: &mut Vec<u8>, now: Now) {
        let f = &req.flags;
        let key = req.key.bytes();
        let mut l = self.store.lock(key, now);
        let mut created = false;
        // The number the reply shows: the new value, or the seed of a created item.
        let number: u64;
        if !l.hit() {
            if f.vivify.is_none() {
                let c = l.counters();
                if req.incr {
                    c.incr_misses += 1;
                } else {
                    c.decr_misses += 1;
                }
                drop(l);
                out.extend_from_slice(b"NF");
                write_echo(out, req);
                out.extend_from_slice(b"\r\n");
                return;
            }
            if !l.create(key, f.initial.to_string().into_bytes(), 0) {
                drop(l);
                write_line(out, "SERVER_ERROR Out of memory allocating new item");
                return;
            }
            created = true;
            number = f.initial;
        } else {
            if l.value().is_empty() {
                drop(l);
                return write_line(out, memcache::NON_NUMERIC);
            }
            if f.cas.is_some_and(|c| c != 0 && c != l.cas()) {
                drop(l);
                out.extend_from_slice(b"EX");
                write_echo(out, req);
                out.extend_from_slice(b"\r\n");
                return;
            }
            let Some(n) = memcache::value_number(l.value()) else {
                drop(l);
                return write_line(out, memcache::NON_NUMERIC);
            };
            let c = l.counters();
            number = if req.incr {
                c.incr_hits += 1;
                n.wrapping_add(f.delta)
            } else {
                c.decr_hits += 1;
                n.saturating_sub(f.delta)
            };
            let old_len = l.value().len();
            l.set_value(memcache::arith_value(number, old_len));
            l.touch_lru();
        }
        // memcached hides only the reply to an existing item's update.
        if f.quiet && !created {
            if let Some(ttl) = f.ttl {
                l.set_exp(self.exp(ttl, now));
            }
            return;
        }
        let digits = number.to_string();
        if f.value {
            let _ = write!(out, "VA {}", digits.len());
        } else {
            out.extend_from_slice(b"HD");
        }
        for t in req.tokens() {
            match t[0] {
                b'c' => write_num_flag(out, b'c', l.cas()),
                b't' => write_num_flag(out, b't', ttl_left(self, l.exp(), now)),
                b'T' => l.set_exp(self.exp(f.ttl.unwrap_or(0), now)),
                b'N' if created => l.set_exp(self.exp(f.vivify.unwrap_or(0), now)),
                b'O' => write_token(out, t),
                b'k' => write_key_flag(out, key, req.key.binary()),
                _ => {}
            }
        }
        out.extend_from_slice(b"\r\n");
        if f.value {
            out.extend_from_slice(digits.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }

    fn meta_debug(&self, req: &MetaRequest<'_>, out: &mut Vec<u8>, now: Now) {
        self.stats.count_meta();
        let l = self.store.lock(req.key.bytes(), now);
        if !l.hit() {
            drop(l);
            return write_line(out, "EN");
        }
        out.extend_from_slice(b"ME ");
        if l.key_binary() {
            memcache::meta::base64_encode(l.key(), out);
        } else {
            out.extend_from_slice(l.key());
        }
        // memcached prints (now - expiry) as a signed 32-bit number: minus the TTL left.
        let exp = if l.exp() == 0 {
            -1
        } else {
            self.rel_time(now.unix).wrapping_sub(self.rel_time(l.exp())) as i32
        };
        let size = self.item_total(l.key().len(), l.flags(), l.value().len());
        let _ = write!(
            out,
            " exp={exp} la={} cas={} fetch={} cls={} size={size}\r\n",
            now.unix.saturating_sub(l.atime()),
            l.cas(),
            if l.fetched() { "yes" } else { "no" },
            self.store.slabs().class_of(size),
        );
    }

    /// memcached's `ITEM_ntotal`: [`item_size`] without the 8-byte CAS when CAS is off.
    pub(super) fn item_total(&self, key_len: usize, flags: u32, value_len: usize) -> u64 {
        let size = item_size(key_len, flags, value_len);
        if self.config.cas_enabled {
            size
        } else {
            size - 8
        }
    }
}

/// The `O` and `k` flags of a reply without an item (`EN`, `NF`, `EX`, `md`'s `HD`).
fn write_echo(out: &mut Vec<u8>, req: &MetaRequest<'_>) {
    for t in req.tokens() {
        match t[0] {
            b'O' => write_token(out, t),
            b'k' => write_key_flag(out, req.key.bytes(), req.key.binary()),
            _ => {}
        }
    }
}
