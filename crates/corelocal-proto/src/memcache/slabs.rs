//! memcached's slab classes, for reporting only: the class an item of a given size would
//! live in (`me`'s `cls=`, `stats items`, `stats slabs`). Our store allocates per item and
//! has no slabs; memcached's tools and tests read these numbers, so they are computed the way
//! memcached's `slabs_init` and `slabs_clsid` compute them.

/// memcached's `sizeof(item)`: the item header its class sizes start from.
pub const ITEM_HEADER_BYTES: u32 = 48;

/// Most slab classes (memcached's `MAX_NUMBER_OF_SLAB_CLASSES`, class 0 unused).
pub const CLASSES_MAX: usize = 64;

/// The chunk sizes of memcached's slab classes.
#[derive(Debug, Clone, PartialEq)]
pub struct SlabClasses {
    /// Chunk size of class `i + 1`.
    sizes: Vec<u32>,
    /// Page size (memcached's `slab_page_size`, 1 MiB): chunks per page = page / size.
    page_bytes: u32,
    item_bytes_max: u64,
}

impl SlabClasses {
    /// The classes memcached builds with `-n chunk_min`, `-f factor`, `-o slab_chunk_max`
    /// (defaults 48, 1.25, 512 KiB) and `-I item_bytes_max`.
    pub fn new(chunk_min: u32, factor: f64, chunk_max: u32, item_bytes_max: u64) -> SlabClasses {
        let mut sizes = Vec::new();
        let mut size = ITEM_HEADER_BYTES + chunk_min;
        let factor = if factor > 1.0 { factor } else { 1.25 };
        while sizes.len() + 1 < CLASSES_MAX - 1 {
            if f64::from(size) >= f64::from(chunk_max) / factor {
                break;
            }
            if size % 8 != 0 {
                size += 8 - size % 8;
            }
            sizes.push(size);
            // C: `unsigned int size *= double factor` truncates.
            size = (f64::from(size) * factor) as u32;
        }
        sizes.push(chunk_max);
        SlabClasses {
            sizes,
            page_bytes: 1 << 20,
            item_bytes_max,
        }
    }

    /// Chunk sizes, class 1 first.
    pub fn sizes(&self) -> &[u32] {
        &self.sizes
    }

    /// Chunks of class `id` per 1 MiB page.
    pub fn per_page(&self, id: u32) -> u32 {
        let size = self.sizes[(id - 1) as usize];
        (self.page_bytes / size).max(1)
    }

    /// The class of an item of `size` bytes (memcached's `ITEM_ntotal`): the smallest whose
    /// chunk holds it, the largest for bigger ones (memcached chunks those), 0 for none.
    pub fn class_of(&self, size: u64) -> u32 {
        if size == 0 || size > self.item_bytes_max {
            return 0;
        }
        match self.sizes.iter().position(|&s| u64::from(s) >= size) {
            Some(i) => i as u32 + 1,
            None => self.sizes.len() as u32,
        }
    }
}

impl Default for SlabClasses {
    fn default() -> SlabClasses {
        SlabClasses::new(48, 1.25, 512 * 1024, 1 << 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `memcached -vv` prints these for the defaults.
    #[test]
    fn default_classes_are_memcacheds() {
        let c = SlabClasses::default();
        assert_eq!(
            &c.sizes()[..8],
            &[96, 120, 152, 192, 240, 304, 384, 480],
            "{:?}",
            c.sizes()
        );
        assert_eq!(c.sizes().len(), 39);
        assert_eq!(c.sizes()[37], 394_840);
        assert_eq!(*c.sizes().last().unwrap(), 524_288);
        assert_eq!(c.class_of(66), 1);
        assert_eq!(c.class_of(96), 1);
        assert_eq!(c.class_of(97), 2);
        assert_eq!(c.class_of(600_000), 39);
        assert_eq!(c.class_of(2 << 20), 0);
        assert_eq!(c.per_page(1), 10_922);
    }
}
