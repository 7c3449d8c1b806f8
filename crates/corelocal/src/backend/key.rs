//! Connection keys: a slot index plus the generation of the connection that holds it, and
//! `Slots`, the one table kind that hands them out and checks them.
//!
//! A slot ([`ConnId`]) is reused as soon as its connection is gone, but references to the old
//! connection outlive it:
//!
//! - in the worker's connection table: idle-timeout and lingering-close deadlines queued for
//!   it, its turn on the ready list after its handler yielded, and the [`Notifier`] its handler
//!   took (kept by any thread for as long as it likes);
//! - in the io_uring backend's direct-descriptor slots: its requests still with the kernel
//!   (a cancelled receive, a send whose buffer sits in the graveyard, a linked close), whose
//!   completions arrive after the kernel gave the slot to the next connection, and its place on
//!   the list of receives armed at the next submit. Each request's `user_data` packs the key
//!   (`ConnKey::pack`).
//!
//! Each of them holds a [`ConnKey`]. The invariant: a slot's generation changes every time the
//! slot gets a new connection (`Slots::renew`, `Slots::claim`, both one step in
//! `Entry::renew`) and at no other time, so a key matches its slot exactly while the
//! connection it was made for holds the slot. The
//! compare lives in one place, `Slots::index_of`, behind `Slots::get` and
//! `Slots::get_mut`: a stale key finds nothing, by construction rather than by a compare at
//! each use.
//!
//! Wrapping: the generation is a `u32` per slot that wraps, so a key matches again after its
//! slot got 2^32 new connections (at a million connections a second on one slot, 71 minutes).
//! Every queued deadline, ready-list entry, notify-queue entry and io_uring request is settled
//! long before (within a turn, an idle timeout or a linger time); only a [`Notifier`] kept that
//! long could reach a later connection, and that is a spurious `on_notify`, which handlers
//! accept anyway (an overflowing notify queue calls every connection). The worker's
//! generations were a 64-bit counter per worker before, and the ring kept 24 of its 32 bits in
//! `user_data` (a match again after 2^24 connections on a slot); the packing now keeps all 32.
//!
//! [`Notifier`]: crate::runtime::notify::Notifier

use super::ConnId;
use std::ops::{Index, IndexMut};

/// One connection: its slot and the generation of the slot it was given. See the module docs
/// for what it protects and the invariant; compared only by the slot table that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnKey {
    slot: ConnId,
    generation: u32,
}

/// Slots a packed key can name: 24 bits, well above the kernel's largest direct-descriptor
/// table (`IORING_MAX_FIXED_FILES`, 2^20).
pub(crate) const PACKED_SLOTS: u32 = 1 << 24;

impl ConnKey {
    /// The connection in `slot` under `generation` (tables make keys; this is for tests and
    /// handlers built outside a worker).
    pub const fn new(slot: ConnId, generation: u32) -> ConnKey {
        ConnKey { slot, generation }
    }

    /// The slot: the id the backend and the [`crate::runtime::Handler`] API know it by.
    #[inline]
    pub const fn slot(self) -> ConnId {
        self.slot
    }

    /// The key in the low 56 bits of a `u64` (an io_uring request's `user_data` keeps the top
    /// 8 for the request's kind): the generation whole above a 24-bit slot.
    #[inline]
    pub(crate) fn pack(self) -> u64 {
        debug_assert!(
            self.slot < PACKED_SLOTS,
            "slot {} too large to pack",
            self.slot
        );
        (u64::from(self.generation) << 24) | u64::from(self.slot & (PACKED_SLOTS - 1))
    }

    /// The key [`pack`](ConnKey::pack) put in the low 56 bits of `bits` (the rest ignored).
    #[inline]
    pub(crate) fn unpack(bits: u64) -> ConnKey {
        ConnKey {
            slot: bits as u32 & (PACKED_SLOTS - 1),
            generation: (bits >> 24) as u32,
        }
    }
}

/// A table of slots, each with the generation of its current (or last) connection: the one
/// place keys are made and checked. `T` is a slot's state: always present in the io_uring
/// backend (its slots are the ring's direct-descriptor table), an `Option` in the worker.
#[derive(Debug)]
pub(crate) struct Slots<T> {
    entries: Vec<Entry<T>>,
}

#[derive(Debug)]
struct Entry<T> {
    generation: u32,
    value: T,
}

impl<T> Entry<T> {
    /// The one generation step: the entry (slot `slot`) got a new connection.
    #[inline]
    fn renew(&mut self, slot: ConnId) -> ConnKey {
        self.generation = self.generation.wrapping_add(1);
        ConnKey::new(slot, self.generation)
    }
}

impl<T> Slots<T> {
    /// `len` slots, made by `value`, none used yet (generation 0).
    pub(crate) fn with(len: u32, mut value: impl FnMut() -> T) -> Slots<T> {
        let entries = (0..len).map(|_| Entry {
            generation: 0,
            value: value(),
        });
        Slots {
            entries: entries.collect(),
        }
    }

    /// Slots in the table.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The key of the slot's current (or last) connection. Panics if out of the table.
    #[inline]
    pub(crate) fn key(&self, slot: ConnId) -> ConnKey {
        ConnKey::new(slot, self.entries[slot as usize].generation)
    }

    /// The key [`renew`](Slots::renew) will give the slot's next connection (the table grows
    /// to hold a slot past its end, from generation 0).
    #[inline]
    pub(crate) fn next_key(&self, slot: ConnId) -> ConnKey {
        let last = self.entries.get(slot as usize).map_or(0, |e| e.generation);
        ConnKey::new(slot, last.wrapping_add(1))
    }

    /// The slot got a new connection: a new generation, and every older key stale.
    #[inline]
    pub(crate) fn renew(&mut self, slot: ConnId) -> ConnKey {
        self.entries[slot as usize].renew(slot)
    }

    /// The state of the slot if `key`'s connection still holds it.
    #[inline]
    pub(crate) fn get(&self, key: ConnKey) -> Option<&T> {
        self.index_of(key).map(|i| &self.entries[i].value)
    }

    /// [`get`](Slots::get), mutable.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: ConnKey) -> Option<&mut T> {
        self.index_of(key).map(|i| &mut self.entries[i].value)
    }

    /// The one generation compare: where `key`'s slot is, if it is in the table and still
    /// holds `key`'s connection.
    #[inline]
    fn index_of(&self, key: ConnKey) -> Option<usize> {
        let i = key.slot as usize;
        let entry = self.entries.get(i)?;
        (entry.generation == key.generation).then_some(i)
    }
}

/// A slot's state by its index alone, whoever holds it: for what names a slot without a key
/// (an operation or completion of the connection that holds it now). Panics if out of the
/// table.
impl<T> Index<ConnId> for Slots<T> {
    type Output = T;

    #[inline]
    fn index(&self, slot: ConnId) -> &T {
        &self.entries[slot as usize].value
    }
}

impl<T> IndexMut<ConnId> for Slots<T> {
    #[inline]
    fn index_mut(&mut self, slot: ConnId) -> &mut T {
        &mut self.entries[slot as usize].value
    }
}

/// Slots that are empty between connections (the worker's table: grown on demand, since an
/// epoll backend's slots are descriptors).
impl<T> Slots<Option<T>> {
    /// An empty table.
    pub(crate) fn new() -> Slots<Option<T>> {
        Slots::with(0, || None)
    }

    /// Claims the empty `slot` (growing the table) for a new connection: its key, under a new
    /// generation, and the place the caller puts the connection in (`Some`). The caller writes
    /// it so that a large state is built in place: passed by value, it was copied once more
    /// (a `memcpy` of 55 instructions per connection, callgrind). Panics if the slot is held:
    /// a backend never reuses an id before its close completed.
    #[inline]
    pub(crate) fn claim(&mut self, slot: ConnId) -> (ConnKey, &mut Option<T>) {
        let i = slot as usize;
        if self.entries.len() <= i {
            self.entries.resize_with(i + 1, || Entry {
                generation: 0,
                value: None,
            });
        }
        let entry = &mut self.entries[i];
        assert!(entry.value.is_none(), "connection id reused while open");
        (entry.renew(slot), &mut entry.value)
    }

    /// Empties the slot; its generation stays until the next connection renews it.
    #[inline]
    pub(crate) fn remove(&mut self, slot: ConnId) -> Option<T> {
        self.entries.get_mut(slot as usize)?.value.take()
    }

    /// Empties the slot, dropping its connection where it lies (`remove` would copy it out
    /// first); whether one was there. Its generation stays, as with `remove`.
    #[inline]
    pub(crate) fn vacate(&mut self, slot: ConnId) -> bool {
        let Some(entry) = self.entries.get_mut(slot as usize) else {
            return false;
        };
        let held = entry.value.is_some();
        entry.value = None;
        held
    }

    /// The connection in `slot`, whichever it is.
    #[inline]
    pub(crate) fn occupant(&self, slot: ConnId) -> Option<&T> {
        self.entries.get(slot as usize)?.value.as_ref()
    }

    /// [`occupant`](Slots::occupant), mutable.
    #[inline]
    pub(crate) fn occupant_mut(&mut self, slot: ConnId) -> Option<&mut T> {
        self.entries.get_mut(slot as usize)?.value.as_mut()
    }

    /// `key`'s connection, if it still holds its slot.
    #[inline]
    pub(crate) fn live(&self, key: ConnKey) -> Option<&T> {
        self.get(key)?.as_ref()
    }

    /// [`live`](Slots::live), mutable.
    #[inline]
    pub(crate) fn live_mut(&mut self, key: ConnKey) -> Option<&mut T> {
        self.get_mut(key)?.as_mut()
    }

    /// Every held slot with its connection, in slot order.
    pub(crate) fn occupants(&self) -> impl Iterator<Item = (ConnKey, &T)> + '_ {
        self.entries.iter().enumerate().filter_map(|(i, e)| {
            let key = ConnKey::new(i as ConnId, e.generation);
            e.value.as_ref().map(|v| (key, v))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl<T> Slots<Option<T>> {
        fn insert(&mut self, slot: ConnId, value: T) -> ConnKey {
            let (key, place) = self.claim(slot);
            *place = Some(value);
            key
        }
    }

    #[test]
    fn a_stale_key_is_refused_after_remove_and_reinsert() {
        let mut slots = Slots::new();
        let first = slots.insert(3, "first");
        assert_eq!(first.slot(), 3);
        assert_eq!(slots.live(first), Some(&"first"));
        assert_eq!(slots.remove(3), Some("first"));
        assert_eq!(slots.live(first), None, "removed");
        assert_eq!(slots.next_key(3), ConnKey::new(3, 2));
        let second = slots.insert(3, "second");
        assert_eq!(second, ConnKey::new(3, 2), "next_key foretold it");
        assert_eq!(slots.live(first), None, "stale after reuse");
        assert_eq!(slots.get_mut(first), None);
        assert_eq!(slots.live_mut(second), Some(&mut "second"));
        assert_eq!(
            slots.occupant(3),
            Some(&"second"),
            "by index: whoever holds it"
        );
        assert_eq!(slots.live(ConnKey::new(9, 1)), None, "out of the table");
        assert_eq!(slots.next_key(9), ConnKey::new(9, 1));
    }

    #[test]
    #[should_panic(expected = "reused while open")]
    fn a_held_slot_is_not_given_twice() {
        let mut slots = Slots::new();
        slots.insert(0, 1);
        slots.insert(0, 2);
    }

    #[test]
    fn always_present_slots_renew_their_generation() {
        let mut slots = Slots::with(2, || 0u8);
        let a = slots.renew(1);
        slots[1] = 7;
        assert_eq!(slots.get(a), Some(&7));
        let b = slots.renew(1);
        assert_eq!((slots.get(a), slots.get(b)), (None, Some(&7)));
        assert_eq!(slots.key(1), b);
        assert_eq!(
            slots.get(ConnKey::new(0, 0)),
            Some(&0),
            "never used: generation 0"
        );
    }

    #[test]
    fn the_generation_wraps_after_2_pow_32_connections_on_a_slot() {
        let mut slots = Slots::with(1, || ());
        slots.entries[0].generation = u32::MAX - 1;
        let old = slots.renew(0);
        assert_eq!(old, ConnKey::new(0, u32::MAX));
        let wrapped = slots.renew(0);
        assert_eq!(wrapped, ConnKey::new(0, 0), "wraps to 0");
        assert_eq!(slots.get(old), None);
        assert_eq!(slots.next_key(0), ConnKey::new(0, 1));
        // 2^32 connections later the old key matches again (see the module docs).
        slots.entries[0].generation = u32::MAX;
        assert_eq!(slots.get(old), Some(&()));
    }

    #[test]
    fn occupants_are_listed_with_their_keys() {
        let mut slots = Slots::new();
        let a = slots.insert(0, 'a');
        let c = slots.insert(2, 'c');
        slots.insert(1, 'b');
        slots.remove(1);
        let held: Vec<_> = slots.occupants().collect();
        assert_eq!(held, [(a, &'a'), (c, &'c')]);
    }

    #[test]
    fn a_packed_key_keeps_its_whole_generation() {
        for key in [
            ConnKey::new(0, 0),
            ConnKey::new(PACKED_SLOTS - 1, u32::MAX),
            ConnKey::new(12345, 1 << 24),
        ] {
            let packed = key.pack();
            assert!(packed < 1 << 56, "the top 8 bits are the request kind's");
            assert_eq!(ConnKey::unpack(packed | (0xab << 56)), key);
        }
    }
}
