//! kv at a binary upgrade (`corelocal::runtime::handoff`): the cache exported by the old
//! process and imported by the new one, in [`super::snapshot`]'s format, and what a
//! connection keeps between requests.

use std::sync::Arc;
use std::time::Instant;

use corelocal::runtime::handoff::{StateError, StateExport, StateImport};

use super::admin::Auth;
use super::snapshot::{
    self, DecodeError, Decoder, Encoder, Event, Header, Record, MARK_FETCHED, MARK_KEY_BINARY,
    MARK_STALE, MARK_TOKEN_SENT, TTL_NEVER,
};
use super::store::{Imported, Now, SnapshotItem};
use super::Inner;

const NS_PER_SEC: u64 = 1_000_000_000;

impl Inner {
    /// The wall clock at `now` (ns since the unix epoch) on the service's clock, the one
    /// expiry times are on (`debugtime` included).
    fn wall_ns(&self, now: Instant) -> u64 {
        let wall = self.wall_base + self.since_base(now);
        u64::try_from(wall.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The export's clock, taken once: items dead by it are left out, time to live counts from
/// it.
#[derive(Debug, Clone, Copy)]
struct ExportClock {
    now: Now,
    wall_ns: u64,
    /// A delayed flush_all pending: every item exported dies with it.
    flush_left_ns: Option<u64>,
}

/// The old process's side: the store, stripe by stripe, oldest items first.
pub(super) struct KvExport {
    inner: Arc<Inner>,
    clock: ExportClock,
    /// `None` once the trailer is written.
    encoder: Option<Encoder>,
    records: u64,
    /// Per stripe, its live items' positions at the export's start (emptied once done).
    order: Vec<Vec<u32>>,
    stripe: usize,
    /// Entries of `order[stripe]` done.
    done: usize,
    /// Encoded bytes that did not fit in the last chunk (the header, a record, the trailer).
    spill: Vec<u8>,
    spill_at: usize,
    bytes: u64,
}

impl KvExport {
    pub(super) fn new(inner: &Arc<Inner>, instant: Instant) -> KvExport {
        let store = &inner.store;
        let now = inner.now(instant);
        let wall_ns = inner.wall_ns(instant);
        let clock = ExportClock {
            now,
            wall_ns,
            flush_left_ns: store
                .flush_pending_ns(now)
                .map(|left| to_second_start(wall_ns, left)),
        };
        let order: Vec<Vec<u32>> = (0..store.stripe_count())
            .map(|i| store.export_order(i, now))
            .collect();
        let header = Header {
            memory_bytes_max: inner.config.memory_bytes_max,
            item_bytes_max: inner.config.item_bytes_max,
            cas_enabled: inner.config.cas_enabled,
            export_wall_ns: clock.wall_ns,
            items: order.iter().map(|o| o.len() as u64).sum(),
        };
        let mut spill = Vec::with_capacity(snapshot::HEADER_LEN);
        let encoder = Encoder::new(&header, &mut spill);
        KvExport {
            inner: inner.clone(),
            clock,
            encoder: Some(encoder),
            records: 0,
            order,
            stripe: 0,
            done: 0,
            spill,
            spill_at: 0,
            bytes: 0,
        }
    }

    /// Moves spilled bytes to `out`, up to `limit`.
    fn drain_spill(&mut self, out: &mut Vec<u8>, limit: usize) {
        let n = (self.spill.len() - self.spill_at).min(limit.saturating_sub(out.len()));
        out.extend_from_slice(&self.spill[self.spill_at..self.spill_at + n]);
        self.spill_at += n;
        if self.spill_at == self.spill.len() {
            self.spill.clear();
            self.spill_at = 0;
        }
    }

    /// The stripe with items left to export, if any.
    fn next_stripe(&mut self) -> Option<usize> {
        while self.stripe < self.order.len() && self.done == self.order[self.stripe].len() {
            self.order[self.stripe] = Vec::new();
            self.stripe += 1;
            self.done = 0;
        }
        (self.stripe < self.order.len()).then_some(self.stripe)
    }

    /// Encodes records of one stripe into `out` up to `limit` (the one that does not fit goes
    /// to the spill), under one short hold of its lock; false once no records are left.
    fn encode_batch(&mut self, out: &mut Vec<u8>, limit: usize) -> bool {
        let Some(stripe) = self.next_stripe() else {
            return false;
        };
        let encoder = self
            .encoder
            .as_mut()
            .expect("records come before the trailer");
        let (clock, spill) = (self.clock, &mut self.spill);
        let order = &self.order[stripe][self.done..];
        let gone_through = self
            .inner
            .store
            .export_items(stripe, order, clock.now, |item| {
                let record = record_of(item, &clock);
                let len = snapshot::record_len(record.key.len(), record.value.len());
                if out.len() + len <= limit {
                    encoder.record(&record, out);
                    return true;
                }
                encoder.record(&record, spill);
                false
            });
        self.done += gone_through;
        true
    }
}

impl StateExport for KvExport {
    fn next_chunk(&mut self, out: &mut Vec<u8>, bytes_max: usize) -> Result<bool, StateError> {
        if bytes_max == 0 {
            return Err(StateError::Export("kv export: chunks of 0 bytes".into()));
        }
        let start = out.len();
        let limit = start.saturating_add(bytes_max);
        let more = loop {
            self.drain_spill(out, limit);
            if out.len() >= limit {
                break true;
            }
            debug_assert!(self.spill.is_empty());
            if self.encode_batch(out, limit) {
                continue;
            }
            match self.encoder.take() {
                Some(encoder) => {
                    self.records = encoder.records();
                    encoder.finish(&mut self.spill);
                }
                None => break false,
            }
        };
        self.bytes += (out.len() - start) as u64;
        Ok(more)
    }

    fn summary(&self) -> String {
        let records = self.encoder.as_ref().map_or(self.records, |e| e.records());
        format!("{records} items, {}", fmt_bytes(self.bytes))
    }
}

/// `left` shortened to end at the start of a wall-clock second: expiry is kept in whole
/// seconds, and an item must not outlive a pending flush (it may die up to a second early).
fn to_second_start(wall_ns: u64, left: u64) -> u64 {
    let deadline = wall_ns.saturating_add(left);
    (deadline - deadline % NS_PER_SEC).saturating_sub(wall_ns)
}

/// An item's record: expiry as time to live from the export's clock.
fn record_of<'a>(item: &SnapshotItem<'a>, clock: &ExportClock) -> Record<'a> {
    let ttl_ns = if item.exp == 0 {
        TTL_NEVER
    } else {
        // Dead items are left out, so this is positive; at least 1 so it never reads as 0.
        item.exp
            .saturating_mul(NS_PER_SEC)
            .saturating_sub(clock.wall_ns)
            .max(1)
    };
    let marks = [
        (item.fetched, MARK_FETCHED),
        (item.stale, MARK_STALE),
        (item.token_sent, MARK_TOKEN_SENT),
        (item.key_binary, MARK_KEY_BINARY),
    ];
    Record {
        key: item.key,
        value: item.value,
        flags: item.flags,
        cas: item.cas,
        ttl_ns: clock.flush_left_ns.map_or(ttl_ns, |f| ttl_ns.min(f.max(1))),
        marks: marks.iter().filter(|m| m.0).fold(0, |acc, m| acc | m.1),
    }
}

/// The import's clock, read at each chunk (an import of a large cache takes seconds).
#[derive(Debug, Clone, Copy)]
struct ImportClock {
    now: Now,
    wall_ns: u64,
}

enum ImportState {
    Reading,
    /// Another format or other limits: nothing imported, the rest of the stream skipped.
    Mismatch(String),
    /// A corrupt or cut stream: what came before stays.
    Failed(String),
}

/// What an import did, for the takeover report.
#[derive(Debug, Default)]
struct Tally {
    stored: u64,
    /// Kept the store's own item.
    present: u64,
    /// Their time ran out during the move.
    expired: u64,
    too_large: u64,
    no_memory: u64,
    value_bytes: u64,
    /// Largest CAS unique seen, and the one the store's counters were last moved past.
    cas_max: u64,
    cas_floor: u64,
}

/// The new process's side: records into the store, before any worker runs.
pub(super) struct KvImport {
    inner: Arc<Inner>,
    decoder: Decoder,
    state: ImportState,
    /// From the header, once read.
    export_wall_ns: Option<u64>,
    tally: Tally,
    started: Instant,
    /// Who wrote the stream, as the refusals name it ([`FROM_PREDECESSOR`]).
    from: &'static str,
}

/// [`KvImport::new`]'s `from` at a binary upgrade.
pub(super) const FROM_PREDECESSOR: &str = "the running server";

impl KvImport {
    pub(super) fn new(inner: &Arc<Inner>, from: &'static str) -> KvImport {
        KvImport {
            from,
            inner: inner.clone(),
            decoder: Decoder::new(inner.config.item_bytes_max),
            state: ImportState::Reading,
            export_wall_ns: None,
            tally: Tally::default(),
            started: Instant::now(),
        }
    }

    /// Feeds a chunk to the decoder; a mismatch found in the header goes to `self.state`.
    fn decode(&mut self, data: &[u8]) -> Result<(), DecodeError> {
        let instant = Instant::now();
        let clock = ImportClock {
            now: self.inner.now(instant),
            wall_ns: self.inner.wall_ns(instant),
        };
        let (inner, tally, state) = (&self.inner, &mut self.tally, &mut self.state);
        let (export_wall_ns, from) = (&mut self.export_wall_ns, self.from);
        self.decoder.feed(data, &mut |event| match event {
            Event::Header(h) => match mismatch(&h, inner, from) {
                Some(why) => {
                    *state = ImportState::Mismatch(why);
                    false
                }
                None => {
                    *export_wall_ns = Some(h.export_wall_ns);
                    true
                }
            },
            Event::Record(r) => {
                let exported_at = export_wall_ns.expect("the header comes first");
                import_record(inner, tally, &r, exported_at, clock);
                true
            }
        })
    }

    fn kept(&self) -> String {
        format!(
            "kept the {} whole items imported before it",
            self.tally.stored
        )
    }
}

impl StateImport for KvImport {
    fn chunk(&mut self, data: &[u8]) -> Result<(), StateError> {
        match &self.state {
            ImportState::Reading => {}
            ImportState::Mismatch(_) => return Ok(()),
            ImportState::Failed(why) => return Err(StateError::Broken(why.clone())),
        }
        let result = self.decode(data);
        // Before anything else: tokens handed out by the predecessor are never reused.
        if self.tally.cas_max > self.tally.cas_floor {
            self.inner.store.cas_floor(self.tally.cas_max);
            self.tally.cas_floor = self.tally.cas_max;
        }
        match result {
            Ok(()) => Ok(()),
            Err(DecodeError::Version(v)) => {
                self.state = ImportState::Mismatch(format!(
                    "starting with an empty cache: {} writes cache format {v}, this one reads {}",
                    self.from,
                    snapshot::VERSION
                ));
                Ok(())
            }
            Err(e) => {
                let why = format!("{e}: {}", self.kept());
                self.state = ImportState::Failed(why.clone());
                Err(StateError::Broken(why))
            }
        }
    }

    fn finish(self: Box<Self>) -> Result<String, StateError> {
        match self.state {
            ImportState::Mismatch(why) => return Err(StateError::Incompatible(why)),
            ImportState::Failed(why) => return Err(StateError::Broken(why)),
            ImportState::Reading => {}
        }
        if let Err(e) = self.decoder.finish() {
            return Err(StateError::Broken(format!("{e}: {}", self.kept())));
        }
        let t = &self.tally;
        Ok(format!(
            "imported {} items ({}) in {:.1} s; {} expired during the move, {} kept the item \
             already present, {} too large, {} found no memory",
            t.stored,
            fmt_bytes(t.value_bytes),
            self.started.elapsed().as_secs_f64(),
            t.expired,
            t.present,
            t.too_large,
            t.no_memory,
        ))
    }
}

/// Why a stream from a server with other limits is not imported (`None`: it is).
fn mismatch(h: &Header, inner: &Inner, from: &str) -> Option<String> {
    let c = &inner.config;
    let (flag, theirs, ours) = if h.memory_bytes_max != c.memory_bytes_max {
        (
            "--memory-mb",
            mb(h.memory_bytes_max),
            mb(c.memory_bytes_max),
        )
    } else if h.item_bytes_max != c.item_bytes_max {
        (
            "--item-max",
            h.item_bytes_max.to_string(),
            c.item_bytes_max.to_string(),
        )
    } else {
        return None;
    };
    Some(format!(
        "starting with an empty cache: {from} has {flag} {theirs}, this one {ours}"
    ))
}

/// Bytes as `--memory-mb` takes them.
fn mb(bytes: u64) -> String {
    if bytes % (1 << 20) == 0 {
        (bytes >> 20).to_string()
    } else {
        format!("{:.3}", bytes as f64 / f64::from(1 << 20))
    }
}

/// Adds one record to the store, counting the outcome.
fn import_record(
    inner: &Inner,
    tally: &mut Tally,
    r: &Record<'_>,
    exported_at: u64,
    clock: ImportClock,
) {
    tally.cas_max = tally.cas_max.max(r.cas);
    let Some(exp) = expiry(r.ttl_ns, exported_at, clock) else {
        tally.expired += 1;
        return;
    };
    let item = SnapshotItem {
        key: r.key,
        value: r.value,
        flags: r.flags,
        exp,
        cas: r.cas,
        fetched: r.marks & MARK_FETCHED != 0,
        stale: r.marks & MARK_STALE != 0,
        token_sent: r.marks & MARK_TOKEN_SENT != 0,
        key_binary: r.marks & MARK_KEY_BINARY != 0,
    };
    match inner.store.import(&item, clock.now) {
        Imported::Stored => {
            tally.stored += 1;
            tally.value_bytes += r.value.len() as u64;
        }
        Imported::Present => tally.present += 1,
        Imported::TooLarge => tally.too_large += 1,
        Imported::NoMemory => tally.no_memory += 1,
    }
}

/// The absolute expiry (unix seconds, 0 = never) on the importer's clock of a record whose
/// time to live counted from `exported_at`; `None` when it ran out during the move. Rounded
/// up to the second, as the store keeps expiry (the same second when both clocks agree).
fn expiry(ttl_ns: u64, exported_at: u64, clock: ImportClock) -> Option<u64> {
    if ttl_ns == TTL_NEVER {
        return Some(0);
    }
    // A wall clock stepped back between the two reads counts as no time passed.
    let elapsed = clock.wall_ns.saturating_sub(exported_at);
    let left = ttl_ns.checked_sub(elapsed).filter(|&left| left > 0)?;
    let exp = clock.wall_ns.saturating_add(left).div_ceil(NS_PER_SEC);
    (exp > clock.now.unix).then_some(exp)
}

/// [`super::KvConn`]'s state between requests: format version, then what follows.
const CONN_STATE_VERSION: u8 = 1;
/// No authentication configured.
const AUTH_OFF: u8 = 0;
/// Authenticated.
const AUTH_DONE: u8 = 1;
/// Waiting for the authentication `set` line.
const AUTH_LINE: u8 = 2;
/// Waiting for the token of that `set` (its length follows, u32 little-endian).
const AUTH_TOKEN: u8 = 3;

/// A connection's state between requests, for its successor (see [`resumed_auth`]).
pub(super) fn conn_state(auth: Auth, auth_configured: bool) -> Vec<u8> {
    let mut state = vec![CONN_STATE_VERSION];
    match auth {
        Auth::Done if !auth_configured => state.push(AUTH_OFF),
        Auth::Done => state.push(AUTH_DONE),
        Auth::Line => state.push(AUTH_LINE),
        Auth::Token(len) => {
            state.push(AUTH_TOKEN);
            let len = u32::try_from(len).expect("token lengths are bounded by the line limit");
            state.extend_from_slice(&len.to_le_bytes());
        }
    }
    state
}

/// Where a moved connection is in authentication, from [`conn_state`]; `None`: as a new
/// connection (an unknown version included). A connection of a server without
/// authentication must authenticate when this one has it.
pub(super) fn resumed_auth(state: &[u8], inner: &Inner) -> Option<Auth> {
    if inner.config.auth.is_empty() {
        return None;
    }
    match *state {
        [CONN_STATE_VERSION, AUTH_DONE] => Some(Auth::Done),
        [CONN_STATE_VERSION, AUTH_TOKEN, a, b, c, d] => {
            let len = u32::from_le_bytes([a, b, c, d]) as usize;
            let len_max = inner.config.limits.get_line_bytes_max + 1;
            (2..=len_max).contains(&len).then_some(Auth::Token(len))
        }
        _ => None,
    }
}

/// `1.0 GiB`, `512.0 KiB`, `12 B`.
fn fmt_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}
