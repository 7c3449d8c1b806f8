//! The item store: N stripes, each a mutex around a hash map, its own LRU list, byte budget
//! and counters. A key lives in stripe `hash(key) & (N-1)`; an operation locks one stripe.
//!
//! Why stripes and not one lock: every request of every worker touches the store, so a single
//! mutex's cache line would bounce between cores on every operation (the same sharing
//! Affinity-Accept removes from the listen socket). With N ≫ cores, two workers rarely want
//! the same stripe. Each stripe is a separate LRU with `memory / N` bytes, so eviction is
//! approximate LRU over the whole store (as memcached's per-slab-class LRUs are).

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use corelocal_proto::memcache::slabs::{SlabClasses, CLASSES_MAX};
use corelocal_proto::memcache::{self, StoreOp};

/// Bytes charged per item on top of memcached's item size (map entry, LRU links, key copy).
const SLOT_OVERHEAD_BYTES: u64 = 64;

const NIL: u32 = u32::MAX;

/// "Now" in the two forms the store needs.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// Unix seconds (expiry).
    pub unix: u64,
    /// Nanoseconds since the store's base instant (delayed flush ordering).
    pub ns: u64,
}

/// [`Slot::bits`]: fetched since stored (memcached's `ITEM_FETCHED`).
const FETCHED: u8 = 1;
/// Marked stale by `md I` or an `ms I` with an older CAS (`ITEM_STALE`).
const STALE: u8 = 2;
/// A client was told it won the recache (`W`); later ones see `Z` (`ITEM_TOKEN_SENT`).
const TOKEN_SENT: u8 = 4;
/// Stored by `ms` with a base64 key (`b`): `mg k` returns it encoded (`ITEM_KEY_BINARY`).
const KEY_BINARY: u8 = 8;

/// One stored item.
struct Slot {
    key: Box<[u8]>,
    value: Vec<u8>,
    flags: u32,
    /// Unix seconds; 0 = never.
    exp: u64,
    cas: u64,
    stored_ns: u64,
    /// Unix seconds of the last access (store or fetch): `mg l`, `me la=`.
    atime: u64,
    /// [`FETCHED`], [`STALE`], [`TOKEN_SENT`], [`KEY_BINARY`].
    bits: u8,
    /// memcached's slab class for this item's size (reporting only).
    class: u8,
    /// The stripe's flush generation when stored: an immediate flush_all bumps the stripe's,
    /// and items of an older one are dead (removed when next touched, or reclaimed).
    gen: u32,
    prev: u32,
    next: u32,
}

/// Counters of one stripe (summed for `stats`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    /// Keys looked up.
    pub cmd_get: u64,
    /// Storage commands.
    pub cmd_set: u64,
    /// touch and gat keys.
    pub cmd_touch: u64,
    /// Lookups that found a live item.
    pub get_hits: u64,
    /// Lookups that did not.
    pub get_misses: u64,
    /// Misses because the item had expired.
    pub get_expired: u64,
    /// Misses because of a (delayed) flush_all.
    pub get_flushed: u64,
    /// delete of a live item.
    pub delete_hits: u64,
    /// delete of a missing item.
    pub delete_misses: u64,
    /// incr hits.
    pub incr_hits: u64,
    /// incr misses.
    pub incr_misses: u64,
    /// decr hits.
    pub decr_hits: u64,
    /// decr misses.
    pub decr_misses: u64,
    /// cas stored.
    pub cas_hits: u64,
    /// cas on a missing item.
    pub cas_misses: u64,
    /// cas with a stale unique.
    pub cas_badval: u64,
    /// touch of a live item.
    pub touch_hits: u64,
    /// touch of a missing item.
    pub touch_misses: u64,
    /// Items ever stored.
    pub total_items: u64,
    /// Live items evicted to make room.
    pub evictions: u64,
    /// Dead (expired or flushed) items whose memory was taken back: at the LRU tail, by the
    /// crawler, or when touched.
    pub reclaimed: u64,
    /// Expired items reclaimed that were never fetched.
    pub expired_unfetched: u64,
    /// Live items evicted that were never fetched.
    pub evicted_unfetched: u64,
    /// Storage commands refused: the item is over the size limit.
    pub store_too_large: u64,
    /// Storage commands refused: no memory could be freed for the item.
    pub store_no_memory: u64,
}

impl Counters {
    fn add(&mut self, o: &Counters) {
        let pairs = [
            (&mut self.cmd_get, o.cmd_get),
            (&mut self.cmd_set, o.cmd_set),
            (&mut self.cmd_touch, o.cmd_touch),
            (&mut self.get_hits, o.get_hits),
            (&mut self.get_misses, o.get_misses),
            (&mut self.get_expired, o.get_expired),
            (&mut self.get_flushed, o.get_flushed),
            (&mut self.delete_hits, o.delete_hits),
            (&mut self.delete_misses, o.delete_misses),
            (&mut self.incr_hits, o.incr_hits),
            (&mut self.incr_misses, o.incr_misses),
            (&mut self.decr_hits, o.decr_hits),
            (&mut self.decr_misses, o.decr_misses),
            (&mut self.cas_hits, o.cas_hits),
            (&mut self.cas_misses, o.cas_misses),
            (&mut self.cas_badval, o.cas_badval),
            (&mut self.touch_hits, o.touch_hits),
            (&mut self.touch_misses, o.touch_misses),
            (&mut self.total_items, o.total_items),
            (&mut self.evictions, o.evictions),
            (&mut self.reclaimed, o.reclaimed),
            (&mut self.expired_unfetched, o.expired_unfetched),
            (&mut self.evicted_unfetched, o.evicted_unfetched),
            (&mut self.store_too_large, o.store_too_large),
            (&mut self.store_no_memory, o.store_no_memory),
        ];
        for (a, b) in pairs {
            *a += b;
        }
    }
}

/// What [`Store::with_eviction_sink`] calls with each evicted item.
pub type EvictionSink = std::sync::Arc<dyn Fn(&Evicted<'_>) + Send + Sync>;

/// An item evicted to make room, as the eviction sink sees it.
#[derive(Debug)]
pub struct Evicted<'a> {
    /// Its key.
    pub key: &'a [u8],
    /// Whether it was fetched since stored.
    pub fetched: bool,
    /// Its expiry (unix seconds; 0: none).
    pub exp: u64,
    /// When it was last accessed (unix seconds).
    pub atime: u64,
    /// When it was evicted (unix seconds, the store's clock).
    pub now: u64,
    /// Its slab class.
    pub class: u8,
    /// Its value's bytes.
    pub value_len: usize,
}

/// What memcached reports per slab class and we can count: evictions and reclaims by the
/// class an item's size falls in.
#[derive(Debug, Default, Clone, Copy)]
pub struct ClassCounters {
    /// Live items evicted.
    pub evicted: u64,
    /// Of those, items with an expiry.
    pub evicted_nonzero: u64,
    /// Seconds since the last evicted item was last accessed.
    pub evicted_time: u64,
    /// Storage refused for lack of memory.
    pub outofmemory: u64,
    /// Dead items reclaimed.
    pub reclaimed: u64,
    /// Expired items reclaimed that were never fetched.
    pub expired_unfetched: u64,
    /// Live items evicted that were never fetched.
    pub evicted_unfetched: u64,
    /// Dead items the crawler reclaimed.
    pub crawler_reclaimed: u64,
    /// Items the crawler looked at.
    pub crawler_checked: u64,
    /// Whether the class ever held an item (memcached keeps a class's pages once it has
    /// had one, and lists it in `stats slabs` from then on).
    pub used: bool,
}

impl ClassCounters {
    fn add(&mut self, o: &ClassCounters) {
        self.evicted += o.evicted;
        self.evicted_nonzero += o.evicted_nonzero;
        self.evicted_time = self.evicted_time.max(o.evicted_time);
        self.outofmemory += o.outofmemory;
        self.reclaimed += o.reclaimed;
        self.expired_unfetched += o.expired_unfetched;
        self.evicted_unfetched += o.evicted_unfetched;
        self.crawler_reclaimed += o.crawler_reclaimed;
        self.crawler_checked += o.crawler_checked;
        self.used |= o.used;
    }
}

/// One slab class's items, from a scan of the store (`stats items`, `stats slabs`).
#[derive(Debug, Default, Clone, Copy)]
pub struct ClassItems {
    /// Items (live or not yet reclaimed).
    pub number: u64,
    /// Seconds since the least recently accessed of them was accessed.
    pub age: u64,
    /// Their sizes summed (memcached's `mem_requested`).
    pub mem_requested: u64,
    /// Counters kept per class.
    pub counters: ClassCounters,
}

/// What [`Store::dump`] passes for each item.
#[derive(Debug, Clone, Copy)]
pub struct ItemInfo<'a> {
    /// Key.
    pub key: &'a [u8],
    /// Value length.
    pub value_len: usize,
    /// Client flags.
    pub flags: u32,
    /// Absolute expiry (0 = never).
    pub exp: u64,
    /// Unix seconds of the last access.
    pub atime: u64,
    /// CAS unique.
    pub cas: u64,
    /// Fetched since stored.
    pub fetched: bool,
    /// Stored with a base64 key.
    pub key_binary: bool,
    /// Slab class.
    pub class: u8,
}

/// An item as a cache export carries it (`super::snapshot`): [`Store::export_items`] passes
/// it, [`Store::import`] takes it.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotItem<'a> {
    /// Key.
    pub key: &'a [u8],
    /// Value.
    pub value: &'a [u8],
    /// Client flags.
    pub flags: u32,
    /// Absolute expiry, unix seconds (0 = never).
    pub exp: u64,
    /// CAS unique.
    pub cas: u64,
    /// Fetched since stored.
    pub fetched: bool,
    /// Marked stale (`md I`, `ms I`).
    pub stale: bool,
    /// A client was told it won the recache.
    pub token_sent: bool,
    /// Stored with a base64 key.
    pub key_binary: bool,
}

impl<'a> SnapshotItem<'a> {
    fn of(slot: &'a Slot) -> SnapshotItem<'a> {
        SnapshotItem {
            key: &slot.key,
            value: &slot.value,
            flags: slot.flags,
            exp: slot.exp,
            cas: slot.cas,
            fetched: slot.bits & FETCHED != 0,
            stale: slot.bits & STALE != 0,
            token_sent: slot.bits & TOKEN_SENT != 0,
            key_binary: slot.bits & KEY_BINARY != 0,
        }
    }

    fn bits(&self) -> u8 {
        let marks = [
            (self.fetched, FETCHED),
            (self.stale, STALE),
            (self.token_sent, TOKEN_SENT),
            (self.key_binary, KEY_BINARY),
        ];
        marks.iter().filter(|m| m.0).fold(0, |bits, m| bits | m.1)
    }
}

/// Totals over all stripes.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    /// Summed counters.
    pub counters: Counters,
    /// Live (or not yet reclaimed) items.
    pub curr_items: u64,
    /// Bytes charged.
    pub bytes: u64,
}

/// A storage command with its data.
#[derive(Debug, Clone, Copy)]
pub struct Put<'a> {
    /// Operation.
    pub op: StoreOp,
    /// Key.
    pub key: &'a [u8],
    /// Client flags.
    pub flags: u32,
    /// Absolute expiry, unix seconds (0 = never).
    pub exp: u64,
    /// The value.
    pub data: &'a [u8],
    /// CAS unique to compare (`cas`; `ms` append/prepend with `C`); 0: none.
    pub cas: u64,
    /// `ms I` with `C`: a CAS lower than the item's stores the value as stale (keeping the
    /// item's expiry) instead of failing.
    pub invalidate: bool,
    /// The key was sent base64-encoded (`ms b`).
    pub key_binary: bool,
}

/// Outcome of a storage command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// `STORED`.
    Stored,
    /// `NOT_STORED` (add of a present key, replace/append/prepend of a missing one).
    NotStored,
    /// `EXISTS` (cas with a stale unique).
    Exists,
    /// `NOT_FOUND` (cas of a missing key).
    NotFound,
    /// `SERVER_ERROR out of memory storing object`.
    NoMemory,
}

/// Outcome of [`Store::import`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Imported {
    /// Added.
    Stored,
    /// The key holds an item already: that one stays.
    Present,
    /// Over the item size limit.
    TooLarge,
    /// No room could be made (evictions off).
    NoMemory,
}

/// Outcome of incr/decr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arith {
    /// The new value.
    Value(u64),
    /// `NOT_FOUND`.
    NotFound,
    /// `CLIENT_ERROR cannot increment or decrement non-numeric value`.
    NonNumeric,
}

/// One stripe: a map from key to slot, slots on a doubly linked LRU list (head = newest).
struct Stripe {
    map: HashMap<Box<[u8]>, u32>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    head: u32,
    tail: u32,
    bytes: u64,
    bytes_max: u64,
    /// CAS uniques: (seq << stripe_bits) | stripe index, unique store-wide without a shared
    /// counter.
    cas_seq: u64,
    cas_low: u64,
    cas_shift: u32,
    /// memcached `-C`: every unique is 0.
    cas_enabled: bool,
    counters: Counters,
    /// Per slab class (index = class id).
    classes: Vec<ClassCounters>,
    /// Flush generation (see [`Slot::gen`]).
    gen: u32,
    /// Evict live items to make room (memcached without `-M`).
    evict: bool,
    /// Where evictions are told (memcached's `watch evictions`).
    evicted: Option<EvictionSink>,
    /// Slab class of each item size (shared by all stripes; reporting only).
    slabs: std::sync::Arc<SlabClasses>,
}

/// Stripes sit on their own cache lines so that locking one does not disturb a neighbour.
#[repr(align(128))]
struct Padded(Mutex<Stripe>);

/// The shared item store.
pub struct Store {
    stripes: Box<[Padded]>,
    mask: u64,
    hasher: BuildHasherDefault<DefaultHasher>,
    /// Delayed flush_all deadline (ns since base; 0 = none): items stored before it are dead
    /// once it has passed.
    flush_at_ns: AtomicU64,
    /// Items stored less than this long after a flush's deadline die with it too: 0 with CAS;
    /// one second without (memcached then compares whole seconds, see [`Store::with_cas`]).
    flush_slack_ns: u64,
    cas_enabled: bool,
    item_bytes_max: u64,
    memory_bytes_max: AtomicU64,
    slabs: std::sync::Arc<SlabClasses>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("stripes", &self.stripes.len())
            .field("memory_bytes_max", &self.memory_bytes_max)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// A store of `memory_bytes_max` bytes in `stripes` stripes (a power of two).
    pub fn new(memory_bytes_max: u64, item_bytes_max: u64, stripes: usize) -> Store {
        assert!(stripes.is_power_of_two(), "stripes must be a power of two");
        let bits = stripes.trailing_zeros();
        let per = memory_bytes_max / stripes as u64;
        let slabs = std::sync::Arc::new(SlabClasses::new(48, 1.25, 512 * 1024, item_bytes_max));
        let stripes = (0..stripes)
            .map(|i| {
                Padded(Mutex::new(Stripe {
                    map: HashMap::new(),
                    slots: Vec::new(),
                    free: Vec::new(),
                    head: NIL,
                    tail: NIL,
                    bytes: 0,
                    bytes_max: per,
                    cas_seq: 0,
                    cas_low: i as u64,
                    cas_shift: bits,
                    cas_enabled: true,
                    counters: Counters::default(),
                    classes: vec![ClassCounters::default(); CLASSES_MAX],
                    gen: 0,
                    evict: true,
                    evicted: None,
                    slabs: slabs.clone(),
                }))
            })
            .collect();
        Store {
            stripes,
            mask: (1u64 << bits) - 1,
            hasher: BuildHasherDefault::default(),
            flush_at_ns: AtomicU64::new(0),
            flush_slack_ns: 0,
            cas_enabled: true,
            item_bytes_max,
            memory_bytes_max: AtomicU64::new(memory_bytes_max),
            slabs,
        }
    }

    /// With `enabled` false, the store keeps no CAS uniques (memcached `-C`): every unique is
    /// 0, so `cas` of a present item stores whatever unique it names, and a flush kills every
    /// item stored up to the end of the second its deadline falls in (memcached without CAS
    /// has only an item's store second to compare; pass deadlines at a second's start).
    pub fn with_cas(mut self, enabled: bool) -> Store {
        self.cas_enabled = enabled;
        self.flush_slack_ns = if enabled { 0 } else { 1_000_000_000 };
        for p in self.stripes.iter_mut() {
            p.0.get_mut().unwrap_or_else(|e| e.into_inner()).cas_enabled = enabled;
        }
        self
    }

    /// Calls `sink` with each item evicted (under its stripe's lock: it must not use the
    /// store).
    pub fn with_eviction_sink(mut self, sink: EvictionSink) -> Store {
        for p in self.stripes.iter_mut() {
            p.0.get_mut().unwrap_or_else(|e| e.into_inner()).evicted = Some(sink.clone());
        }
        self
    }

    /// With `enabled` false, a full store refuses new items instead of evicting live ones
    /// (memcached `-M`; dead ones are still reclaimed).
    pub fn with_evictions(mut self, enabled: bool) -> Store {
        for p in self.stripes.iter_mut() {
            p.0.get_mut().unwrap_or_else(|e| e.into_inner()).evict = enabled;
        }
        self
    }

    /// Whether CAS uniques are kept.
    pub fn cas_enabled(&self) -> bool {
        self.cas_enabled
    }

    /// The configured memory limit.
    pub fn memory_bytes_max(&self) -> u64 {
        self.memory_bytes_max.load(Ordering::Relaxed)
    }

    /// The configured item size limit.
    pub fn item_bytes_max(&self) -> u64 {
        self.item_bytes_max
    }

    /// Whether a value of this shape is over the item size limit (memcached's accounting).
    pub fn too_large(&self, key: &[u8], flags: u32, value_len: usize) -> bool {
        memcache::item_size(key.len(), flags, value_len) > self.item_bytes_max
    }

    fn stripe(&self, key: &[u8]) -> MutexGuard<'_, Stripe> {
        let i = (self.hasher.hash_one(key) & self.mask) as usize;
        // A panic under the lock cannot leave the LRU list half-linked in a way that breaks
        // memory safety; keep serving rather than poisoning every later request.
        self.stripes[i].0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn flush_at(&self) -> u64 {
        self.flush_at_ns.load(Ordering::Relaxed)
    }

    /// Looks `key` up; on a hit calls `f(flags, value, cas)` under the stripe lock (so the
    /// value is copied straight into the response) and, for gat, sets a new expiry.
    /// Inlined into the get path: left to thin LTO it moves out of line from build to build.
    #[inline]
    pub fn get(
        &self,
        key: &[u8],
        now: Now,
        touch_exp: Option<u64>,
        f: impl FnOnce(u32, &[u8], u64),
    ) -> bool {
        let flush = self.flush_at();
        let mut s = self.stripe(key);
        s.counters.cmd_get += 1;
        if touch_exp.is_some() {
            s.counters.cmd_touch += 1;
        }
        let Some(i) = s.live(key, now, flush, self.flush_slack_ns, true) else {
            s.counters.get_misses += 1;
            if touch_exp.is_some() {
                s.counters.touch_misses += 1;
            }
            return false;
        };
        s.counters.get_hits += 1;
        s.bump(i);
        let slot = &mut s.slots[i as usize];
        slot.bits |= FETCHED;
        slot.atime = now.unix;
        if let Some(exp) = touch_exp {
            slot.exp = exp;
        }
        f(slot.flags, &slot.value, slot.cas);
        if touch_exp.is_some() {
            s.counters.touch_hits += 1;
        }
        true
    }

    /// What `key` holds, without counting or touching it: (value bytes, slab class), for the
    /// lookup memcached's `watch fetchers` logs before a store.
    pub fn peek(&self, key: &[u8], now: Now) -> Option<(usize, u8)> {
        let flush = self.flush_at();
        let mut s = self.stripe(key);
        let i = s.live(key, now, flush, self.flush_slack_ns, false)?;
        let slot = &s.slots[i as usize];
        Some((slot.value.len(), slot.class))
    }

    /// The slab class an item of `key`, `flags` and `value` is reported in.
    pub fn class_of(&self, key: &[u8], flags: u32, value: &[u8]) -> u8 {
        let size = memcache::item_size(key.len(), flags, value.len());
        self.slabs.class_of(size) as u8
    }

    /// A storage command with its data.
    pub fn store(&self, put: &Put<'_>, now: Now) -> Stored {
        self.store_cas(put, now).0
    }

    /// A storage command with its data; also the stored item's CAS unique (0 unless stored).
    pub fn store_cas(&self, put: &Put<'_>, now: Now) -> (Stored, u64) {
        let Put {
            op,
            key,
            flags,
            exp,
            data,
            cas,
            invalidate,
            key_binary,
        } = *put;
        let flush = self.flush_at();
        let item_max = self.item_bytes_max;
        let mut s = self.stripe(key);
        s.counters.cmd_set += 1;
        let present = s.live(key, now, flush, self.flush_slack_ns, false);
        let mut bits = if key_binary { KEY_BINARY } else { 0 };
        let mut exp = exp;
        let value = match (op, present) {
            (StoreOp::Set, _) => data.to_vec(),
            (StoreOp::Add, Some(i)) => {
                s.bump(i);
                return (Stored::NotStored, 0);
            }
            (StoreOp::Add, None) => data.to_vec(),
            (StoreOp::Replace | StoreOp::Append | StoreOp::Prepend, None) => {
                return (Stored::NotStored, 0)
            }
            (StoreOp::Replace, Some(_)) => data.to_vec(),
            // memcached compares a CAS given with append/prepend (`ms MA C…`): equal or none.
            (StoreOp::Append | StoreOp::Prepend, Some(i))
                if cas != 0 && s.slots[i as usize].cas != cas =>
            {
                return (Stored::Exists, 0);
            }
            (StoreOp::Append | StoreOp::Prepend, Some(i)) => {
                let old = &s.slots[i as usize];
                let mut v = Vec::with_capacity(old.value.len() + data.len());
                if op == StoreOp::Append {
                    v.extend_from_slice(&old.value);
                    v.extend_from_slice(data);
                } else {
                    v.extend_from_slice(data);
                    v.extend_from_slice(&old.value);
                }
                // memcached keeps the old flags and expiry, and answers NOT_STORED when the
                // combined value does not fit.
                if memcache::item_size(key.len(), old.flags, v.len()) > item_max {
                    return (Stored::NotStored, 0);
                }
                let (flags, exp) = (old.flags, old.exp);
                return s.put_bits(key, v, flags, exp, bits, now);
            }
            (StoreOp::Cas, None) => {
                s.counters.cas_misses += 1;
                return (Stored::NotFound, 0);
            }
            (StoreOp::Cas, Some(i)) => {
                let (old_cas, old_exp, old_bits) = {
                    let old = &s.slots[i as usize];
                    (old.cas, old.exp, old.bits)
                };
                // memcached: a unique of 0 (none given, or CAS disabled with -C, where every
                // unique is 0) never matches; `ms I` stores an older unique as stale.
                if cas != 0 && cas == old_cas {
                    s.counters.cas_hits += 1;
                } else if invalidate && cas != 0 && cas < old_cas {
                    s.counters.cas_hits += 1;
                    exp = old_exp;
                    bits |= STALE | (old_bits & TOKEN_SENT);
                } else {
                    s.counters.cas_badval += 1;
                    return (Stored::Exists, 0);
                }
                data.to_vec()
            }
        };
        s.put_bits(key, value, flags, exp, bits, now)
    }

    /// Locks `key`'s stripe and looks the key up (an expired or flushed item is removed), for
    /// a meta command that reads and changes the item under one lock.
    pub fn lock<'s>(&'s self, key: &[u8], now: Now) -> Locked<'s> {
        let flush = self.flush_at();
        let mut s = self.stripe(key);
        let slot = s.live(key, now, flush, self.flush_slack_ns, true);
        Locked { s, slot, now }
    }

    /// Removes `key`; whether it was there.
    pub fn delete(&self, key: &[u8], now: Now) -> bool {
        let flush = self.flush_at();
        let mut s = self.stripe(key);
        match s.live(key, now, flush, self.flush_slack_ns, false) {
            Some(i) => {
                s.counters.delete_hits += 1;
                s.remove(i);
                true
            }
            None => {
                s.counters.delete_misses += 1;
                false
            }
        }
    }

    /// incr/decr: wraps at 2^64 going up, stops at 0 going down; the new text is space-padded
    /// to the old length when shorter (memcached's in-place rewrite).
    pub fn arith(&self, key: &[u8], incr: bool, delta: u64, now: Now) -> Arith {
        let flush = self.flush_at();
        let mut s = self.stripe(key);
        let Some(i) = s.live(key, now, flush, self.flush_slack_ns, false) else {
            if incr {
                s.counters.incr_misses += 1;
            } else {
                s.counters.decr_misses += 1;
            }
            return Arith::NotFound;
        };
        let Some(n) = memcache::value_number(&s.slots[i as usize].value) else {
            return Arith::NonNumeric;
        };
        let n = if incr {
            s.counters.incr_hits += 1;
            n.wrapping_add(delta)
        } else {
            s.counters.decr_hits += 1;
            n.saturating_sub(delta)
        };
        let old_len = s.slots[i as usize].value.len();
        let value = memcache::arith_value(n, old_len);
        s.set_value(i, value);
        s.bump(i);
        Arith::Value(n)
    }

    /// Sets a new expiry; whether the key was there.
    pub fn touch(&self, key: &[u8], exp: u64, now: Now) -> bool {
        let flush = self.flush_at();
        let mut s = self.stripe(key);
        s.counters.cmd_touch += 1;
        match s.live(key, now, flush, self.flush_slack_ns, false) {
            Some(i) => {
                s.counters.touch_hits += 1;
                s.slots[i as usize].exp = exp;
                s.bump(i);
                true
            }
            None => {
                s.counters.touch_misses += 1;
                false
            }
        }
    }

    /// flush_all: now (every item stored so far is dead: removed when next looked up, as
    /// memcached, which counts that as `get_flushed`, or reclaimed by the LRU or the crawler)
    /// or at `at_ns` (items stored before then die). A flush now cancels a pending one.
    pub fn flush(&self, at_ns: Option<u64>) {
        match at_ns {
            Some(at) => self.flush_at_ns.store(at.max(1), Ordering::Relaxed),
            None => {
                self.flush_at_ns.store(0, Ordering::Relaxed);
                for p in self.stripes.iter() {
                    let mut s = p.0.lock().unwrap_or_else(|e| e.into_inner());
                    s.gen = s.gen.wrapping_add(1);
                }
            }
        }
    }

    /// Changes the memory limit (`cache_memlimit`): each stripe's share; a lower one is
    /// reached by evicting as new items need room.
    pub fn set_memory_limit(&self, bytes: u64) {
        let per = bytes / self.stripes.len() as u64;
        for p in self.stripes.iter() {
            p.0.lock().unwrap_or_else(|e| e.into_inner()).bytes_max = per;
        }
        self.memory_bytes_max.store(bytes, Ordering::Relaxed);
    }

    /// The memcached slab classes items are reported in.
    pub fn slabs(&self) -> &SlabClasses {
        &self.slabs
    }

    /// Counts a storage command refused before its data (too large for the item limit).
    pub fn count_too_large(&self, key: &[u8]) {
        self.stripe(key).counters.store_too_large += 1;
    }

    /// Per slab class: items, their age and size, and the class counters (one pass over
    /// every stripe, each locked in turn).
    pub fn classes(&self, now: Now) -> Vec<ClassItems> {
        let mut out = vec![ClassItems::default(); CLASSES_MAX];
        for p in self.stripes.iter() {
            let s = p.0.lock().unwrap_or_else(|e| e.into_inner());
            for (c, sc) in out.iter_mut().zip(&s.classes) {
                c.counters.add(sc);
            }
            let mut i = s.head;
            while i != NIL {
                let slot = &s.slots[i as usize];
                let c = &mut out[usize::from(slot.class)];
                c.number += 1;
                c.age = c.age.max(now.unix.saturating_sub(slot.atime));
                c.mem_requested +=
                    memcache::item_size(slot.key.len(), slot.flags, slot.value.len());
                i = slot.next;
            }
        }
        out
    }

    /// Calls `f` for every live item (a stripe at a time, under its lock, most recently used
    /// first), until it returns false: `lru_crawler metadump`, `stats cachedump`.
    pub fn dump(&self, now: Now, mut f: impl FnMut(&ItemInfo<'_>) -> bool) {
        let flush = self.flush_at();
        for p in self.stripes.iter() {
            let s = p.0.lock().unwrap_or_else(|e| e.into_inner());
            let mut i = s.head;
            while i != NIL {
                let slot = &s.slots[i as usize];
                i = slot.next;
                if s.dead(slot, now, flush, self.flush_slack_ns) {
                    continue;
                }
                let info = ItemInfo {
                    key: &slot.key,
                    value_len: slot.value.len(),
                    flags: slot.flags,
                    exp: slot.exp,
                    atime: slot.atime,
                    cas: slot.cas,
                    fetched: slot.bits & FETCHED != 0,
                    key_binary: slot.bits & KEY_BINARY != 0,
                    class: slot.class,
                };
                if !f(&info) {
                    return;
                }
            }
        }
    }

    /// Stripes (for an export, which walks them one at a time).
    pub fn stripe_count(&self) -> usize {
        self.stripes.len()
    }

    /// Where stripe `stripe`'s live items are, oldest first: an export's plan, read in
    /// batches by [`Store::export_items`] so that no lock is held for a whole large stripe's
    /// copy (only for this walk over its links).
    pub fn export_order(&self, stripe: usize, now: Now) -> Vec<u32> {
        let flush = self.flush_at();
        let s = self.stripes[stripe]
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut order = Vec::with_capacity(s.map.len());
        let mut i = s.tail;
        while i != NIL {
            let slot = &s.slots[i as usize];
            if !s.dead(slot, now, flush, self.flush_slack_ns) {
                order.push(i);
            }
            i = slot.prev;
        }
        debug_assert!(order.len() <= s.map.len());
        order
    }

    /// Calls `f` under stripe `stripe`'s lock for each item of `order` (from
    /// [`Store::export_order`]) still live, until `f` returns false; returns how many entries
    /// of `order` were gone through (the one `f` refused included). An item removed since
    /// the plan was made (the crawler may reclaim) is skipped.
    pub fn export_items(
        &self,
        stripe: usize,
        order: &[u32],
        now: Now,
        mut f: impl FnMut(&SnapshotItem<'_>) -> bool,
    ) -> usize {
        let flush = self.flush_at();
        let s = self.stripes[stripe]
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (done, &i) in order.iter().enumerate() {
            let slot = &s.slots[i as usize];
            // A removed slot keeps no key (`Stripe::remove` takes it).
            if slot.key.is_empty() || s.dead(slot, now, flush, self.flush_slack_ns) {
                continue;
            }
            if !f(&SnapshotItem::of(slot)) {
                return done + 1;
            }
        }
        order.len()
    }

    /// Adds an item from a predecessor's export, unless its key is present (the store's own
    /// item wins) or it is too large: its CAS unique is kept (0: a new one), and stripes'
    /// CAS counters must then move past it ([`Store::cas_floor`]). Evicts to make room as a
    /// store does.
    pub fn import(&self, item: &SnapshotItem<'_>, now: Now) -> Imported {
        if self.too_large(item.key, item.flags, item.value.len()) {
            return Imported::TooLarge;
        }
        let flush = self.flush_at();
        let mut s = self.stripe(item.key);
        if s.live(item.key, now, flush, self.flush_slack_ns, false)
            .is_some()
        {
            return Imported::Present;
        }
        let (stored, _) = s.put_bits(
            item.key,
            item.value.to_vec(),
            item.flags,
            item.exp,
            item.bits(),
            now,
        );
        if stored != Stored::Stored {
            return Imported::NoMemory;
        }
        if self.cas_enabled && item.cas != 0 {
            // `put_bits` links the new item at the head.
            let i = s.head as usize;
            debug_assert_eq!(&*s.slots[i].key, item.key);
            s.slots[i].cas = item.cas;
        }
        Imported::Stored
    }

    /// Moves every stripe's CAS counter past `cas`, so that no unique handed out before (by
    /// a predecessor) is handed out again.
    pub fn cas_floor(&self, cas: u64) {
        for p in self.stripes.iter() {
            let mut s = p.0.lock().unwrap_or_else(|e| e.into_inner());
            s.cas_seq = s.cas_seq.max(cas >> s.cas_shift);
        }
    }

    /// Nanoseconds (on [`Now::ns`]'s clock) until a delayed flush_all kills every item now
    /// stored; `None` without one pending.
    pub fn flush_pending_ns(&self, now: Now) -> Option<u64> {
        let at = self.flush_at();
        (at > now.ns).then(|| at - now.ns)
    }

    /// Reclaims up to `limit` dead (expired or flushed) items per stripe, walking from the
    /// LRU tail (memcached's LRU crawler); returns (items checked, items reclaimed).
    pub fn crawl(&self, now: Now, limit: usize, classes: Option<&[u8]>) -> (u64, u64) {
        let flush = self.flush_at();
        let (mut checked, mut reclaimed) = (0, 0);
        for p in self.stripes.iter() {
            let mut s = p.0.lock().unwrap_or_else(|e| e.into_inner());
            let mut i = s.tail;
            let mut n = 0;
            while i != NIL && n < limit {
                let slot = &s.slots[i as usize];
                let prev = slot.prev;
                let class = usize::from(slot.class);
                if classes.is_some_and(|c| !c.contains(&slot.class)) {
                    i = prev;
                    continue;
                }
                checked += 1;
                n += 1;
                let dead = s.dead(slot, now, flush, self.flush_slack_ns);
                s.classes[class].crawler_checked += 1;
                if dead {
                    s.reclaim(i, now);
                    s.classes[class].crawler_reclaimed += 1;
                    reclaimed += 1;
                }
                i = prev;
            }
        }
        (checked, reclaimed)
    }

    /// Sums every stripe.
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for p in self.stripes.iter() {
            let s = p.0.lock().unwrap_or_else(|e| e.into_inner());
            t.counters.add(&s.counters);
            t.curr_items += s.map.len() as u64;
            t.bytes += s.bytes;
        }
        t
    }

    /// `stats reset`: zeroes the counters (not items or bytes).
    pub fn reset_counters(&self) {
        for p in self.stripes.iter() {
            let mut s = p.0.lock().unwrap_or_else(|e| e.into_inner());
            s.counters = Counters::default();
            // Counters go; which classes hold pages stays (memcached's pages stay).
            s.classes.iter_mut().for_each(|c| {
                *c = ClassCounters {
                    used: c.used,
                    ..ClassCounters::default()
                }
            });
        }
    }
}

impl Stripe {
    /// The slot of a live `key`; a dead one (expired, flushed) is removed on the way.
    fn live(
        &mut self,
        key: &[u8],
        now: Now,
        flush_at: u64,
        flush_slack_ns: u64,
        count: bool,
    ) -> Option<u32> {
        let i = *self.map.get(key)?;
        let slot = &self.slots[i as usize];
        let expired = slot.exp != 0 && slot.exp <= now.unix;
        let flushed = slot.gen != self.gen
            || (flush_at != 0
                && flush_at <= now.ns
                && slot.stored_ns < flush_at.saturating_add(flush_slack_ns));
        if !expired && !flushed {
            return Some(i);
        }
        if count {
            if flushed {
                self.counters.get_flushed += 1;
            } else {
                self.counters.get_expired += 1;
            }
        }
        self.reclaim(i, now);
        None
    }

    /// Whether an item is dead: expired, or flushed (immediately or by a passed deadline).
    fn dead(&self, slot: &Slot, now: Now, flush_at: u64, flush_slack_ns: u64) -> bool {
        (slot.exp != 0 && slot.exp <= now.unix)
            || slot.gen != self.gen
            || (flush_at != 0
                && flush_at <= now.ns
                && slot.stored_ns < flush_at.saturating_add(flush_slack_ns))
    }

    /// Removes a dead item, counted as reclaimed.
    fn reclaim(&mut self, i: u32, now: Now) {
        let slot = &self.slots[i as usize];
        let class = usize::from(slot.class);
        let unfetched_expiry = slot.bits & FETCHED == 0 && slot.exp != 0 && slot.exp <= now.unix;
        self.counters.reclaimed += 1;
        self.classes[class].reclaimed += 1;
        if unfetched_expiry {
            self.counters.expired_unfetched += 1;
            self.classes[class].expired_unfetched += 1;
        }
        self.remove(i);
    }

    fn next_cas(&mut self) -> u64 {
        if !self.cas_enabled {
            return 0;
        }
        self.cas_seq += 1;
        (self.cas_seq << self.cas_shift) | self.cas_low
    }

    fn cost(key_len: usize, flags: u32, value_len: usize) -> u64 {
        memcache::item_size(key_len, flags, value_len) + SLOT_OVERHEAD_BYTES + key_len as u64
    }

    /// Replaces item `i`'s value (incr/decr) with a new CAS unique: in place when it fits,
    /// as memcached, else as a new item (so the stale and fetched marks go).
    fn set_value(&mut self, i: u32, value: Vec<u8>) {
        let cas = self.next_cas();
        let slot = &mut self.slots[i as usize];
        let old_len = slot.value.len();
        if value.len() > old_len {
            slot.bits &= KEY_BINARY;
        }
        let old = Stripe::cost(slot.key.len(), slot.flags, old_len);
        let new = Stripe::cost(slot.key.len(), slot.flags, value.len());
        slot.value = value;
        slot.cas = cas;
        self.bytes = self.bytes - old + new;
    }

    /// Inserts or replaces `key`, evicting from the LRU tail to stay within the byte budget.
    fn put(&mut self, key: &[u8], value: Vec<u8>, flags: u32, exp: u64, now: Now) -> Stored {
        self.put_bits(key, value, flags, exp, 0, now).0
    }

    /// [`Stripe::put`] with the item's marks; also the new CAS unique.
    fn put_bits(
        &mut self,
        key: &[u8],
        value: Vec<u8>,
        flags: u32,
        exp: u64,
        bits: u8,
        now: Now,
    ) -> (Stored, u64) {
        let cost = Stripe::cost(key.len(), flags, value.len());
        if let Some(&i) = self.map.get(key) {
            self.remove(i);
        }
        let class = self
            .slabs
            .class_of(memcache::item_size(key.len(), flags, value.len())) as u8;
        if cost > self.bytes_max {
            self.counters.store_no_memory += 1;
            self.classes[usize::from(class)].outofmemory += 1;
            return (Stored::NoMemory, 0);
        }
        while self.bytes + cost > self.bytes_max && self.tail != NIL {
            let victim = self.tail;
            let v = &self.slots[victim as usize];
            // A dead item at the tail is reclaimed, not evicted (memcached's tail check).
            if v.gen != self.gen || (v.exp != 0 && v.exp <= now.unix) {
                self.reclaim(victim, now);
                continue;
            }
            if !self.evict {
                self.counters.store_no_memory += 1;
                self.classes[usize::from(class)].outofmemory += 1;
                return (Stored::NoMemory, 0);
            }
            let (vc, unfetched, nonzero) =
                (usize::from(v.class), v.bits & FETCHED == 0, v.exp != 0);
            let idle = now.unix.saturating_sub(v.atime);
            if let Some(sink) = &self.evicted {
                sink(&Evicted {
                    key: &v.key,
                    fetched: !unfetched,
                    exp: v.exp,
                    atime: v.atime,
                    now: now.unix,
                    class: v.class,
                    value_len: v.value.len(),
                });
            }
            self.counters.evictions += 1;
            let c = &mut self.classes[vc];
            c.evicted += 1;
            c.evicted_time = idle;
            if nonzero {
                c.evicted_nonzero += 1;
            }
            if unfetched {
                c.evicted_unfetched += 1;
                self.counters.evicted_unfetched += 1;
            }
            self.remove(victim);
        }
        let cas = self.next_cas();
        let slot = Slot {
            key: key.into(),
            value,
            flags,
            exp,
            cas,
            stored_ns: now.ns,
            atime: now.unix,
            bits,
            class,
            gen: self.gen,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.map.insert(key.into(), i);
        self.link_front(i);
        self.classes[usize::from(class)].used = true;
        self.bytes += cost;
        self.counters.total_items += 1;
        (Stored::Stored, cas)
    }

    fn remove(&mut self, i: u32) {
        self.unlink(i);
        let slot = &mut self.slots[i as usize];
        let key = std::mem::take(&mut slot.key);
        let value = std::mem::take(&mut slot.value);
        self.bytes -= Stripe::cost(key.len(), slot.flags, value.len());
        self.map.remove(&key);
        self.free.push(i);
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = {
            let s = &self.slots[i as usize];
            (s.prev, s.next)
        };
        match prev {
            NIL => self.head = next,
            p => self.slots[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.slots[n as usize].prev = prev,
        }
        let s = &mut self.slots[i as usize];
        s.prev = NIL;
        s.next = NIL;
    }

    fn link_front(&mut self, i: u32) {
        let old = self.head;
        {
            let s = &mut self.slots[i as usize];
            s.prev = NIL;
            s.next = old;
        }
        match old {
            NIL => self.tail = i,
            h => self.slots[h as usize].prev = i,
        }
        self.head = i;
    }

    /// Marks `i` most recently used.
    fn bump(&mut self, i: u32) {
        if self.head != i {
            self.unlink(i);
            self.link_front(i);
        }
    }
}

/// A stripe locked for one key (see [`Store::lock`]): the item, if live, can be read and
/// changed, created on a miss, or removed, all under the one lock.
pub struct Locked<'s> {
    s: MutexGuard<'s, Stripe>,
    slot: Option<u32>,
    now: Now,
}

impl std::fmt::Debug for Locked<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locked")
            .field("hit", &self.slot.is_some())
            .finish()
    }
}

impl Locked<'_> {
    /// Whether the key holds a live item.
    pub fn hit(&self) -> bool {
        self.slot.is_some()
    }

    fn slot(&self) -> &Slot {
        &self.s.slots[self.slot.expect("Locked: no item") as usize]
    }

    fn slot_mut(&mut self) -> &mut Slot {
        let i = self.slot.expect("Locked: no item");
        &mut self.s.slots[i as usize]
    }

    /// The stripe's counters (for the command's statistics).
    pub fn counters(&mut self) -> &mut Counters {
        &mut self.s.counters
    }

    /// Creates the item on a miss (`mg N`, `ma N`); false when it does not fit in memory.
    pub fn create(&mut self, key: &[u8], value: Vec<u8>, exp: u64) -> bool {
        debug_assert!(self.slot.is_none());
        if self.s.put(key, value, 0, exp, self.now) != Stored::Stored {
            return false;
        }
        self.slot = self.s.map.get(key).copied();
        self.slot.is_some()
    }

    /// Removes the item (`md`).
    pub fn remove(&mut self) {
        if let Some(i) = self.slot.take() {
            self.s.remove(i);
        }
    }

    /// The item's key. Panics without an item (as every accessor below).
    pub fn key(&self) -> &[u8] {
        &self.slot().key
    }

    /// The item's value.
    pub fn value(&self) -> &[u8] {
        &self.slot().value
    }

    /// Client flags.
    pub fn flags(&self) -> u32 {
        self.slot().flags
    }

    /// CAS unique.
    pub fn cas(&self) -> u64 {
        self.slot().cas
    }

    /// Absolute expiry (unix seconds; 0 = never).
    pub fn exp(&self) -> u64 {
        self.slot().exp
    }

    /// Sets the expiry.
    pub fn set_exp(&mut self, exp: u64) {
        self.slot_mut().exp = exp;
    }

    /// Unix seconds of the last access.
    pub fn atime(&self) -> u64 {
        self.slot().atime
    }

    /// Fetched since it was stored.
    pub fn fetched(&self) -> bool {
        self.slot().bits & FETCHED != 0
    }

    /// Marked stale.
    pub fn stale(&self) -> bool {
        self.slot().bits & STALE != 0
    }

    /// A client has been told it won the recache.
    pub fn token_sent(&self) -> bool {
        self.slot().bits & TOKEN_SENT != 0
    }

    /// Records that a client won the recache.
    pub fn set_token_sent(&mut self) {
        self.slot_mut().bits |= TOKEN_SENT;
    }

    /// Stored with a base64 key.
    pub fn key_binary(&self) -> bool {
        self.slot().bits & KEY_BINARY != 0
    }

    /// Marks the item stale with a new CAS unique and lets the next client win the recache
    /// (`md I`).
    pub fn invalidate(&mut self) {
        let cas = self.s.next_cas();
        let slot = self.slot_mut();
        slot.bits = (slot.bits | STALE) & !TOKEN_SENT;
        slot.cas = cas;
    }

    /// Replaces the value with a new CAS unique (`ma`).
    pub fn set_value(&mut self, value: Vec<u8>) {
        let i = self.slot.expect("Locked: no item");
        self.s.set_value(i, value);
    }

    /// A fetch's LRU bump: most recently used, marked fetched, accessed now.
    pub fn bump(&mut self) {
        let i = self.slot.expect("Locked: no item");
        self.s.bump(i);
        let unix = self.now.unix;
        let slot = self.slot_mut();
        slot.bits |= FETCHED;
        slot.atime = unix;
    }

    /// Moves the item to the head of the LRU without marking it fetched.
    pub fn touch_lru(&mut self) {
        let i = self.slot.expect("Locked: no item");
        self.s.bump(i);
    }
}
