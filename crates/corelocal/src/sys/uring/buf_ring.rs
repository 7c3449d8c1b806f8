//! The provided-buffer ring that multishot receives pick their buffers from: the
//! page-aligned ring shared with the kernel and the buffers themselves.

use io_uring::types;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io;
use std::sync::atomic::{AtomicU16, Ordering};

/// The page-aligned buffer ring shared with the kernel, plus the buffers themselves.
pub(super) struct BufRing {
    pub(super) ring: *mut types::BufRingEntry,
    layout: Layout,
    pub(super) entries: u16,
    tail: u16,
    published: u16,
    bufs: Vec<u8>,
    buf_bytes: usize,
}

impl BufRing {
    pub(super) fn new(entries: u16, buf_bytes: usize) -> io::Result<BufRing> {
        assert!(entries.is_power_of_two(), "buffer ring size: power of two");
        let layout = Layout::from_size_align(entries as usize * 16, 4096)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        // SAFETY: the layout has a non-zero size (entries ≥ 1).
        let ring = unsafe { alloc_zeroed(layout) } as *mut types::BufRingEntry;
        if ring.is_null() {
            return Err(io::Error::new(io::ErrorKind::OutOfMemory, "buffer ring"));
        }
        let mut r = BufRing {
            ring,
            layout,
            entries,
            tail: 0,
            published: 0,
            bufs: vec![0; entries as usize * buf_bytes],
            buf_bytes,
        };
        for bid in 0..entries {
            r.push(bid);
        }
        r.publish();
        Ok(r)
    }

    pub(super) fn push(&mut self, bid: u16) {
        let index = (self.tail & (self.entries - 1)) as usize;
        let addr = self.bufs.as_ptr() as u64 + bid as u64 * self.buf_bytes as u64;
        // Index < entries, so the entry lies inside the ring allocation; the kernel
        // only reads entries between its head and the published tail, and this one is past it.
        // SAFETY: the conditions above hold.
        let entry = unsafe { &mut *self.ring.add(index) };
        entry.set_addr(addr);
        entry.set_len(self.buf_bytes as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes pushed buffers visible to the kernel; returns whether any were new.
    pub(super) fn publish(&mut self) -> bool {
        if self.published == self.tail {
            return false;
        }
        // The tail field lives in the first ring entry, inside our allocation; the
        // kernel reads it concurrently, hence the atomic release store.
        // SAFETY: the conditions above hold.
        let tail = unsafe { &*(types::BufRingEntry::tail(self.ring) as *const AtomicU16) };
        tail.store(self.tail, Ordering::Release);
        self.published = self.tail;
        true
    }

    pub(super) fn data(&self, bid: u16, len: usize) -> &[u8] {
        let start = bid as usize * self.buf_bytes;
        &self.bufs[start..start + len]
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // Allocated in `new` with this layout; the ring is unregistered (or the io_uring
        // instance dropped) before this, as UringBackend's field order guarantees.
        // SAFETY: the conditions above hold.
        unsafe { dealloc(self.ring as *mut u8, self.layout) };
    }
}
