//! kv's cache as a byte stream, for a binary upgrade (`corelocal::runtime::handoff`): the
//! format, sans IO. [`Encoder`] appends to a `Vec<u8>`; [`Decoder`] is a state machine fed
//! the stream in pieces split anywhere.
//!
//! Layout (all integers little-endian):
//!
//! * Header, [`HEADER_LEN`] bytes: magic `CLKV`, format version (u32), the exporter's
//!   `memory_bytes_max` and `item_bytes_max` (u64 each), its wall clock at the export (ns since
//!   the unix epoch, u64), the items it expects to write (`u64::MAX`: not known), an
//!   options byte ([`OPTION_CAS`]), and an xxh64 of those 41 bytes.
//! * Records, oldest first per stripe: tag `R`, key length (u8), marks (u8), client flags
//!   (u32), value length (u32), CAS unique (u64), time to live in ns from the export's clock
//!   ([`TTL_NEVER`]: no expiry), an xxh64 of the record (u64), then the key and the value.
//! * Trailer: tag `E`, the record count (u64) and a fold of the header's and every record's
//!   hash (u64).
//!
//! Why a hash per record and not one over the stream: a record is checked before it is
//! handed on, so a bit flipped in a value never reaches the store; the trailer's fold then
//! catches records lost, repeated or reordered, and the missing trailer a cut stream.

use std::fmt;

/// The stream's first four bytes.
pub const MAGIC: [u8; 4] = *b"CLKV";
/// The format this build writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of the header of [`VERSION`].
pub const HEADER_LEN: usize = 49;
/// Bytes before the version-specific part of the header (magic, version).
const PREFIX_LEN: usize = 8;
/// Bytes of a record before its key.
pub const RECORD_HEAD_LEN: usize = 35;
/// Bytes of the trailer.
pub const TRAILER_LEN: usize = 17;
/// Longest key (memcached's limit).
pub const KEY_BYTES_MAX: usize = 250;
/// Largest value any stream may carry, whatever its header says (memcached's `-I` limit).
pub const VALUE_BYTES_MAX: u32 = 1 << 30;
/// [`Record::ttl_ns`]: the item never expires.
pub const TTL_NEVER: u64 = u64::MAX;
/// Header option: the exporter kept CAS uniques.
pub const OPTION_CAS: u8 = 1;
/// Record mark: fetched since stored.
pub const MARK_FETCHED: u8 = 1;
/// Record mark: marked stale (meta protocol).
pub const MARK_STALE: u8 = 2;
/// Record mark: a client was told it won the recache (meta protocol).
pub const MARK_TOKEN_SENT: u8 = 4;
/// Record mark: stored with a base64 key (`ms b`).
pub const MARK_KEY_BINARY: u8 = 8;
const MARKS_KNOWN: u8 = MARK_FETCHED | MARK_STALE | MARK_TOKEN_SENT | MARK_KEY_BINARY;

const TAG_RECORD: u8 = b'R';
const TAG_END: u8 = b'E';
const HEADER_SEED: u64 = 0x6b76_6865_6164; // "kvhead"
const RECORD_SEED: u64 = 0x006b_7672_6563; // "kvrec"

/// The stream's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The exporter's memory limit (`--memory-mb`, bytes).
    pub memory_bytes_max: u64,
    /// The exporter's item size limit (`--item-max`, bytes).
    pub item_bytes_max: u64,
    /// Whether the exporter kept CAS uniques.
    pub cas_enabled: bool,
    /// The exporter's wall clock when it took the export's time, ns since the unix epoch:
    /// every record's time to live counts from it.
    pub export_wall_ns: u64,
    /// Items the exporter expects to write (`u64::MAX`: not known); a hint (items may expire
    /// during the export), the trailer's count is the one checked.
    pub items: u64,
}

/// One item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Key (1 to [`KEY_BYTES_MAX`] bytes).
    pub key: &'a [u8],
    /// Value.
    pub value: &'a [u8],
    /// Client flags.
    pub flags: u32,
    /// CAS unique (0 when the exporter kept none).
    pub cas: u64,
    /// Time to live from [`Header::export_wall_ns`], ns; [`TTL_NEVER`]: no expiry.
    pub ttl_ns: u64,
    /// [`MARK_FETCHED`] and the other marks.
    pub marks: u8,
}

/// Bytes a record takes in the stream.
pub fn record_len(key_len: usize, value_len: usize) -> usize {
    RECORD_HEAD_LEN + key_len + value_len
}

/// Writes a stream: the header at [`Encoder::new`], then records, then the trailer.
#[derive(Debug)]
pub struct Encoder {
    value_bytes_max: u64,
    records: u64,
    fold: u64,
}

impl Encoder {
    /// Appends the header to `out`.
    pub fn new(header: &Header, out: &mut Vec<u8>) -> Encoder {
        assert!(header.item_bytes_max <= u64::from(VALUE_BYTES_MAX));
        let start = out.len();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&header.memory_bytes_max.to_le_bytes());
        out.extend_from_slice(&header.item_bytes_max.to_le_bytes());
        out.extend_from_slice(&header.export_wall_ns.to_le_bytes());
        out.extend_from_slice(&header.items.to_le_bytes());
        out.push(if header.cas_enabled { OPTION_CAS } else { 0 });
        let check = xxh64(&out[start..], HEADER_SEED);
        out.extend_from_slice(&check.to_le_bytes());
        debug_assert_eq!(out.len() - start, HEADER_LEN);
        Encoder {
            value_bytes_max: header.item_bytes_max,
            records: 0,
            fold: check,
        }
    }

    /// Appends a record. Panics on a key or value out of bounds (the store never holds one).
    pub fn record(&mut self, r: &Record<'_>, out: &mut Vec<u8>) {
        assert!((1..=KEY_BYTES_MAX).contains(&r.key.len()), "key length");
        assert!(r.value.len() as u64 <= self.value_bytes_max, "value length");
        assert_eq!(r.marks & !MARKS_KNOWN, 0, "unknown marks");
        let start = out.len();
        out.reserve(record_len(r.key.len(), r.value.len()));
        out.push(TAG_RECORD);
        out.push(r.key.len() as u8);
        out.push(r.marks);
        out.extend_from_slice(&r.flags.to_le_bytes());
        out.extend_from_slice(&(r.value.len() as u32).to_le_bytes());
        out.extend_from_slice(&r.cas.to_le_bytes());
        out.extend_from_slice(&r.ttl_ns.to_le_bytes());
        let head_check = xxh64(&out[start..], RECORD_SEED);
        let body_start = out.len() + 8;
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(r.key);
        out.extend_from_slice(r.value);
        let check = xxh64(&out[body_start..], head_check);
        out[body_start - 8..body_start].copy_from_slice(&check.to_le_bytes());
        self.records += 1;
        self.fold = fold(self.fold, check);
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Appends the trailer.
    pub fn finish(self, out: &mut Vec<u8>) {
        out.push(TAG_END);
        out.extend_from_slice(&self.records.to_le_bytes());
        out.extend_from_slice(&self.fold.to_le_bytes());
    }
}

/// Why a stream was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The first bytes are not [`MAGIC`].
    NotAStream,
    /// Another format version (nothing after it is read).
    Version(u32),
    /// The header's hash does not match.
    HeaderCorrupt,
    /// The header names limits this format cannot hold.
    HeaderLimits,
    /// A byte where a record or the trailer should begin is neither.
    BadTag {
        /// Stream offset.
        offset: u64,
    },
    /// A record's key or value length is out of bounds, or its marks unknown.
    BadRecord {
        /// Stream offset.
        offset: u64,
    },
    /// A record's hash does not match.
    RecordCorrupt {
        /// Stream offset.
        offset: u64,
    },
    /// The trailer's count or fold does not match the records read.
    TrailerMismatch,
    /// Bytes after the trailer.
    TrailingBytes,
    /// The stream ended before its trailer.
    Truncated {
        /// Bytes received.
        offset: u64,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::NotAStream => write!(f, "not a kv cache stream (bad magic)"),
            DecodeError::Version(v) => write!(f, "cache format {v}, this build reads {VERSION}"),
            DecodeError::HeaderCorrupt => write!(f, "cache stream header corrupt"),
            DecodeError::HeaderLimits => write!(f, "cache stream header out of bounds"),
            DecodeError::BadTag { offset } => write!(f, "cache stream corrupt at byte {offset}"),
            DecodeError::BadRecord { offset } => {
                write!(f, "cache stream record out of bounds at byte {offset}")
            }
            DecodeError::RecordCorrupt { offset } => {
                write!(f, "cache stream record corrupt at byte {offset}")
            }
            DecodeError::TrailerMismatch => {
                write!(f, "cache stream trailer does not match its records")
            }
            DecodeError::TrailingBytes => write!(f, "cache stream has bytes after its end"),
            DecodeError::Truncated { offset } => {
                write!(f, "cache stream cut short after {offset} bytes")
            }
        }
    }
}

/// What the decoder found, handed to the caller's sink.
#[derive(Debug)]
pub enum Event<'a> {
    /// The header (first, once).
    Header(Header),
    /// A record, checked.
    Record(Record<'a>),
}

/// A record's fixed part, parsed.
#[derive(Debug, Clone, Copy)]
struct Head {
    key_len: usize,
    value_len: usize,
    marks: u8,
    flags: u32,
    cas: u64,
    ttl_ns: u64,
    check: u64,
    head_check: u64,
}

#[derive(Debug, Clone, Copy)]
enum Stage {
    Prefix,
    Header,
    Unit,
    Body(Head),
    Done,
    /// The sink asked to stop, or the stream was refused: further input is ignored.
    Stopped,
}

/// Where a complete unit lies: in the input fed (no copy) or gathered in `partial`.
enum Span {
    Input(usize),
    Partial,
}

/// Reads a stream fed in pieces (see the module docs).
#[derive(Debug)]
pub struct Decoder {
    value_bytes_max: u64,
    stage: Stage,
    /// The current unit's bytes when it straddles pieces (at most one record).
    partial: Vec<u8>,
    records: u64,
    fold: u64,
    /// Bytes consumed before the current unit.
    offset: u64,
}

impl Decoder {
    /// A decoder that refuses values over `value_bytes_max` (the importer's item limit).
    pub fn new(value_bytes_max: u64) -> Decoder {
        Decoder {
            value_bytes_max: value_bytes_max.min(u64::from(VALUE_BYTES_MAX)),
            stage: Stage::Prefix,
            partial: Vec::new(),
            records: 0,
            fold: 0,
            offset: 0,
        }
    }

    /// Feeds the next piece; `sink` gets each complete unit and returns false to stop (later
    /// input is then ignored). An error is final: later input is ignored too.
    pub fn feed(
        &mut self,
        input: &[u8],
        sink: &mut impl FnMut(Event<'_>) -> bool,
    ) -> Result<(), DecodeError> {
        let mut at = 0;
        let r = self.feed_units(input, &mut at, sink);
        if r.is_err() {
            self.stage = Stage::Stopped;
            self.partial = Vec::new();
        }
        r
    }

    fn feed_units(
        &mut self,
        input: &[u8],
        at: &mut usize,
        sink: &mut impl FnMut(Event<'_>) -> bool,
    ) -> Result<(), DecodeError> {
        loop {
            let more = match self.stage {
                Stage::Stopped => return Ok(()),
                Stage::Done if *at < input.len() => return Err(DecodeError::TrailingBytes),
                Stage::Done => return Ok(()),
                Stage::Prefix => self.prefix(input, at)?,
                Stage::Header => self.header(input, at, sink)?,
                Stage::Unit => self.unit(input, at)?,
                Stage::Body(head) => self.body(head, input, at, sink)?,
            };
            if !more {
                return Ok(());
            }
        }
    }

    /// The stream ended: whether it was whole.
    pub fn finish(&self) -> Result<u64, DecodeError> {
        match self.stage {
            Stage::Done => Ok(self.records),
            _ => Err(DecodeError::Truncated {
                offset: self.offset + self.partial.len() as u64,
            }),
        }
    }

    /// Gathers the `n` bytes of the current unit; `None` when the input ran out first.
    fn gather(&mut self, input: &[u8], at: &mut usize, n: usize) -> Option<Span> {
        debug_assert!(self.partial.len() < n || n == 0);
        let avail = &input[*at..];
        if self.partial.is_empty() && avail.len() >= n {
            let span = Span::Input(*at);
            *at += n;
            return Some(span);
        }
        if self.partial.is_empty() {
            self.partial.reserve_exact(n);
        }
        let take = (n - self.partial.len()).min(avail.len());
        self.partial.extend_from_slice(&avail[..take]);
        *at += take;
        (self.partial.len() == n).then_some(Span::Partial)
    }

    /// The unit gathered: its bytes.
    fn span<'a>(&'a self, input: &'a [u8], span: &Span, n: usize) -> &'a [u8] {
        match *span {
            Span::Input(start) => &input[start..start + n],
            Span::Partial => &self.partial[..n],
        }
    }

    /// A unit was handled: the next begins after it.
    fn advance(&mut self, n: usize, stage: Stage) {
        self.offset += n as u64;
        self.partial.clear();
        self.stage = stage;
    }

    fn prefix(&mut self, input: &[u8], at: &mut usize) -> Result<bool, DecodeError> {
        let Some(span) = self.gather(input, at, PREFIX_LEN) else {
            return Ok(false);
        };
        let b = self.span(input, &span, PREFIX_LEN);
        if b[..4] != MAGIC {
            return Err(DecodeError::NotAStream);
        }
        let version = u32_at(b, 4);
        if version != VERSION {
            return Err(DecodeError::Version(version));
        }
        // The prefix stays in `partial`: the header's hash covers it.
        if let Span::Input(start) = span {
            self.partial
                .extend_from_slice(&input[start..start + PREFIX_LEN]);
        }
        self.stage = Stage::Header;
        Ok(true)
    }

    fn header(
        &mut self,
        input: &[u8],
        at: &mut usize,
        sink: &mut impl FnMut(Event<'_>) -> bool,
    ) -> Result<bool, DecodeError> {
        let Some(span) = self.gather(input, at, HEADER_LEN) else {
            return Ok(false);
        };
        debug_assert!(
            matches!(span, Span::Partial),
            "the prefix is always gathered"
        );
        let b = self.span(input, &span, HEADER_LEN);
        let check = u64_at(b, 41);
        if xxh64(&b[..41], HEADER_SEED) != check {
            return Err(DecodeError::HeaderCorrupt);
        }
        let header = Header {
            memory_bytes_max: u64_at(b, 8),
            item_bytes_max: u64_at(b, 16),
            export_wall_ns: u64_at(b, 24),
            items: u64_at(b, 32),
            cas_enabled: b[40] & OPTION_CAS != 0,
        };
        if header.item_bytes_max > u64::from(VALUE_BYTES_MAX) || b[40] & !OPTION_CAS != 0 {
            return Err(DecodeError::HeaderLimits);
        }
        self.fold = check;
        self.advance(HEADER_LEN, Stage::Unit);
        if !sink(Event::Header(header)) {
            self.stage = Stage::Stopped;
            return Ok(false);
        }
        Ok(true)
    }

    /// A record's head or the trailer, told apart by the first byte.
    fn unit(&mut self, input: &[u8], at: &mut usize) -> Result<bool, DecodeError> {
        let tag = match self.partial.first() {
            Some(&t) => t,
            None if *at < input.len() => input[*at],
            None => return Ok(false),
        };
        match tag {
            TAG_RECORD => self.record_head(input, at),
            TAG_END => self.trailer(input, at),
            _ => Err(DecodeError::BadTag {
                offset: self.offset,
            }),
        }
    }

    fn record_head(&mut self, input: &[u8], at: &mut usize) -> Result<bool, DecodeError> {
        let Some(span) = self.gather(input, at, RECORD_HEAD_LEN) else {
            return Ok(false);
        };
        let b = self.span(input, &span, RECORD_HEAD_LEN);
        let head = Head {
            key_len: usize::from(b[1]),
            marks: b[2],
            flags: u32_at(b, 3),
            value_len: u32_at(b, 7) as usize,
            cas: u64_at(b, 11),
            ttl_ns: u64_at(b, 19),
            check: u64_at(b, 27),
            head_check: xxh64(&b[..27], RECORD_SEED),
        };
        let key_ok = (1..=KEY_BYTES_MAX).contains(&head.key_len);
        let value_ok = head.value_len as u64 <= self.value_bytes_max;
        if !key_ok || !value_ok || head.marks & !MARKS_KNOWN != 0 {
            return Err(DecodeError::BadRecord {
                offset: self.offset,
            });
        }
        self.advance(RECORD_HEAD_LEN, Stage::Body(head));
        Ok(true)
    }

    fn body(
        &mut self,
        head: Head,
        input: &[u8],
        at: &mut usize,
        sink: &mut impl FnMut(Event<'_>) -> bool,
    ) -> Result<bool, DecodeError> {
        let n = head.key_len + head.value_len;
        let Some(span) = self.gather(input, at, n) else {
            return Ok(false);
        };
        let b = self.span(input, &span, n);
        if xxh64(b, head.head_check) != head.check {
            return Err(DecodeError::RecordCorrupt {
                offset: self.offset - RECORD_HEAD_LEN as u64,
            });
        }
        let record = Record {
            key: &b[..head.key_len],
            value: &b[head.key_len..],
            flags: head.flags,
            cas: head.cas,
            ttl_ns: head.ttl_ns,
            marks: head.marks,
        };
        let go_on = sink(Event::Record(record));
        self.records += 1;
        self.fold = fold(self.fold, head.check);
        self.advance(n, Stage::Unit);
        if !go_on {
            self.stage = Stage::Stopped;
        }
        Ok(go_on)
    }

    fn trailer(&mut self, input: &[u8], at: &mut usize) -> Result<bool, DecodeError> {
        let Some(span) = self.gather(input, at, TRAILER_LEN) else {
            return Ok(false);
        };
        let b = self.span(input, &span, TRAILER_LEN);
        if u64_at(b, 1) != self.records || u64_at(b, 9) != self.fold {
            return Err(DecodeError::TrailerMismatch);
        }
        self.advance(TRAILER_LEN, Stage::Done);
        Ok(true)
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Folds a record's hash into the stream's: order-dependent, so lost, repeated or swapped
/// records change it.
fn fold(acc: u64, check: u64) -> u64 {
    (acc ^ check)
        .wrapping_mul(P1)
        .rotate_left(31)
        .wrapping_add(P4)
}

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

/// XXH64 (Yann Collet's xxHash, 64-bit), one shot: fast enough to check a cache at memory
/// speed, small enough to keep here rather than add a dependency.
pub fn xxh64(data: &[u8], seed: u64) -> u64 {
    let mut rest = data;
    let mut h = if data.len() >= 32 {
        let mut v = [
            seed.wrapping_add(P1).wrapping_add(P2),
            seed.wrapping_add(P2),
            seed,
            seed.wrapping_sub(P1),
        ];
        while rest.len() >= 32 {
            for (i, lane) in v.iter_mut().enumerate() {
                *lane = xxh_round(*lane, u64_at(rest, i * 8));
            }
            rest = &rest[32..];
        }
        let mut h = v[0]
            .rotate_left(1)
            .wrapping_add(v[1].rotate_left(7))
            .wrapping_add(v[2].rotate_left(12))
            .wrapping_add(v[3].rotate_left(18));
        for lane in v {
            h = (h ^ xxh_round(0, lane)).wrapping_mul(P1).wrapping_add(P4);
        }
        h
    } else {
        seed.wrapping_add(P5)
    };
    h = h.wrapping_add(data.len() as u64);
    while rest.len() >= 8 {
        h ^= xxh_round(0, u64_at(rest, 0));
        h = h.rotate_left(27).wrapping_mul(P1).wrapping_add(P4);
        rest = &rest[8..];
    }
    if rest.len() >= 4 {
        h ^= u64::from(u32_at(rest, 0)).wrapping_mul(P1);
        h = h.rotate_left(23).wrapping_mul(P2).wrapping_add(P3);
        rest = &rest[4..];
    }
    for &b in rest {
        h ^= u64::from(b).wrapping_mul(P5);
        h = h.rotate_left(11).wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
}

fn xxh_round(acc: u64, input: u64) -> u64 {
    acc.wrapping_add(input.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An owned [`Record`], for comparing what went in with what came out.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Item {
        key: Vec<u8>,
        value: Vec<u8>,
        flags: u32,
        cas: u64,
        ttl_ns: u64,
        marks: u8,
    }

    impl Item {
        fn of(r: &Record<'_>) -> Item {
            Item {
                key: r.key.to_vec(),
                value: r.value.to_vec(),
                flags: r.flags,
                cas: r.cas,
                ttl_ns: r.ttl_ns,
                marks: r.marks,
            }
        }

        fn record(&self) -> Record<'_> {
            Record {
                key: &self.key,
                value: &self.value,
                flags: self.flags,
                cas: self.cas,
                ttl_ns: self.ttl_ns,
                marks: self.marks,
            }
        }
    }

    const ITEM_MAX: u64 = 4096;

    fn header() -> Header {
        Header {
            memory_bytes_max: 64 << 20,
            item_bytes_max: ITEM_MAX,
            cas_enabled: true,
            export_wall_ns: 1_700_000_000_123_456_789,
            items: 3,
        }
    }

    fn encode(items: &[Item]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = Encoder::new(&header(), &mut out);
        for it in items {
            enc.record(&it.record(), &mut out);
        }
        enc.finish(&mut out);
        out
    }

    fn three() -> Vec<Item> {
        (0..3u8)
            .map(|i| Item {
                key: vec![b'k', b'0' + i],
                value: vec![i; 40 * usize::from(i)],
                flags: u32::from(i) * 7,
                cas: u64::from(i) << 40,
                ttl_ns: if i == 1 { TTL_NEVER } else { u64::from(i) + 5 },
                marks: i & MARKS_KNOWN,
            })
            .collect()
    }

    /// Decodes `stream` fed in pieces cut at `cuts`; the header, the records that came out,
    /// and the outcome.
    fn decode(
        stream: &[u8],
        cuts: &[usize],
    ) -> (Option<Header>, Vec<Item>, Result<u64, DecodeError>) {
        let mut dec = Decoder::new(ITEM_MAX);
        let (mut header, mut items) = (None, Vec::new());
        let mut sink = |e: Event<'_>| {
            match e {
                Event::Header(h) => header = Some(h),
                Event::Record(r) => items.push(Item::of(&r)),
            }
            true
        };
        let mut from = 0;
        for &to in cuts.iter().chain(std::iter::once(&stream.len())) {
            let to = to.clamp(from, stream.len());
            if let Err(e) = dec.feed(&stream[from..to], &mut sink) {
                return (header, items, Err(e));
            }
            from = to;
        }
        (header, items, dec.finish())
    }

    #[test]
    fn xxh64_matches_reference_vectors() {
        assert_eq!(xxh64(b"", 0), 0xEF46_DB37_51D8_E999);
        assert_eq!(xxh64(b"a", 0), 0xD24E_C4F1_A98C_6E5B);
        assert_eq!(xxh64(b"abc", 0), 0x44BC_2CF5_AD77_0999);
        let long = b"Nobody inspects the spammish repetition";
        assert_eq!(xxh64(long, 0), 0xFBCE_A83C_8A37_8BF1);
    }

    fn item_strategy() -> impl Strategy<Value = Item> {
        (
            proptest::collection::vec(any::<u8>(), 1..=KEY_BYTES_MAX),
            proptest::collection::vec(any::<u8>(), 0..=ITEM_MAX as usize),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            0..=MARKS_KNOWN,
        )
            .prop_map(|(key, value, flags, cas, ttl_ns, marks)| Item {
                key,
                value,
                flags,
                cas,
                ttl_ns,
                marks,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn round_trip_any_split(
            items in proptest::collection::vec(item_strategy(), 0..40),
            mut cuts in proptest::collection::vec(any::<usize>(), 0..60),
        ) {
            let stream = encode(&items);
            cuts.iter_mut().for_each(|c| *c %= stream.len() + 1);
            cuts.sort_unstable();
            let (h, got, outcome) = decode(&stream, &cuts);
            prop_assert_eq!(h, Some(header()));
            prop_assert_eq!(outcome, Ok(items.len() as u64));
            prop_assert_eq!(got, items);
        }
    }

    #[test]
    fn cut_stream_is_refused_and_yields_whole_records_only() {
        let items = three();
        let stream = encode(&items);
        for len in 0..stream.len() {
            let (_, got, outcome) = decode(&stream[..len], &[len / 2]);
            assert_eq!(outcome, Err(DecodeError::Truncated { offset: len as u64 }));
            assert_eq!(got[..], items[..got.len()], "cut at {len}");
        }
    }

    #[test]
    fn every_bit_flip_is_refused_before_a_bad_record_gets_out() {
        let items = three();
        let stream = encode(&items);
        for bit in 0..stream.len() * 8 {
            let mut bad = stream.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            let (_, got, outcome) = decode(&bad, &[bit / 8, bit / 8 + 1]);
            assert!(outcome.is_err(), "bit {bit} went unnoticed");
            assert_eq!(
                got[..],
                items[..got.len()],
                "bit {bit} let a bad record out"
            );
        }
    }

    #[test]
    fn lengths_out_of_bounds_are_refused() {
        let stream = encode(&three());
        let key_len_at = HEADER_LEN + 1;
        for bad_key_len in [0u8, 251] {
            let mut bad = stream.clone();
            bad[key_len_at] = bad_key_len;
            let (_, got, outcome) = decode(&bad, &[]);
            let offset = HEADER_LEN as u64;
            assert_eq!(outcome, Err(DecodeError::BadRecord { offset }));
            assert!(got.is_empty());
        }
        let mut bad = stream.clone();
        let value_len_at = HEADER_LEN + 7;
        bad[value_len_at..value_len_at + 4].copy_from_slice(&(ITEM_MAX as u32 + 1).to_le_bytes());
        let (_, _, outcome) = decode(&bad, &[]);
        assert!(matches!(outcome, Err(DecodeError::BadRecord { .. })));
    }

    #[test]
    #[should_panic(expected = "value length")]
    fn encoder_refuses_a_value_over_the_limit() {
        let mut out = Vec::new();
        let mut enc = Encoder::new(&header(), &mut out);
        let value = vec![0; ITEM_MAX as usize + 1];
        let mut item = three()[0].clone();
        item.value = value;
        enc.record(&item.record(), &mut out);
    }

    #[test]
    fn other_version_is_refused_unread() {
        let mut stream = encode(&three());
        stream[4..8].copy_from_slice(&(VERSION + 1).to_le_bytes());
        let (h, got, outcome) = decode(&stream, &[3]);
        assert_eq!(outcome, Err(DecodeError::Version(VERSION + 1)));
        assert!(h.is_none() && got.is_empty());
    }

    #[test]
    fn bytes_after_the_trailer_are_refused() {
        let mut stream = encode(&three());
        stream.push(TAG_RECORD);
        let (_, got, outcome) = decode(&stream, &[]);
        assert_eq!(outcome, Err(DecodeError::TrailingBytes));
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn a_sink_that_stops_gets_nothing_more() {
        let stream = encode(&three());
        let mut dec = Decoder::new(ITEM_MAX);
        let mut events = 0;
        dec.feed(&stream, &mut |_| {
            events += 1;
            false
        })
        .unwrap();
        assert_eq!(events, 1, "only the header");
    }
}
