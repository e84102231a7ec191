//! What a rank has learned of the samples it holds or will hold: each one's size (when its
//! index has none) and source modification time ([`SampleTable`]), and the file backend's
//! "checked" marks ([`Stamps`]).
//!
//! Why two shapes: an array over every id costs a word per sample of the *dataset* on
//! every rank (16 + 8 bytes: 240 MB per rank at 10^7 samples, whatever its share), while a
//! rank only ever learns about the samples it stages, receives, sends or reads (its share
//! and the next one's arrivals, about `(1 + Q) N / M`). A hash map per sample costs about
//! three times an array slot (key, padding, empty buckets), so it pays from about four
//! ranks on: a job of [`DENSE_UP_TO`] ranks or fewer keeps arrays (as before the fix),
//! more keeps sharded maps whose entries go when their sample leaves the share
//! ([`SampleTable::forget`]: the exchange's eviction and a resume's trim call it), so they
//! follow the share. The maps are sharded so the FUSE threads, the exchange and staging
//! rarely meet on one lock; a lookup is a read lock and a hash.

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::dataset::manifest::UNKNOWN_SIZE;
use crate::plan::SampleId;
use crate::sys::sync::RwLocked;

/// Shards of a map (a power of two).
pub(super) const SHARDS: usize = 64;

/// `id`'s shard of `shards` (Fibonacci hashing: neighbouring ids land in different shards).
/// Shared with `super::bitset`'s sets.
pub(super) fn shard_of<T>(shards: &[T], id: SampleId) -> &T {
    &shards[shard_index(id, shards.len())]
}

/// The index of `id`'s shard among `len` (see [`shard_of`]).
pub(super) fn shard_index(id: SampleId, len: usize) -> usize {
    (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % len
}

/// Jobs of at most this many ranks keep arrays over every id (see the module docs).
pub(crate) const DENSE_UP_TO: u32 = 4;

/// A word per sample id, 0 where none was set: an array over every id, or sharded maps
/// holding only the ids set.
enum Words {
    Dense(Box<[AtomicU64]>),
    Sparse(Box<[RwLock<HashMap<SampleId, u64>>]>),
}

impl Words {
    fn new(samples: u64, dense: bool) -> Words {
        match dense {
            true => Words::Dense((0..samples).map(|_| AtomicU64::new(0)).collect()),
            false => Words::Sparse((0..SHARDS).map(|_| RwLock::default()).collect()),
        }
    }

    fn get(&self, id: SampleId) -> u64 {
        match self {
            Words::Dense(w) => w.get(id as usize).map_or(0, |w| w.load(Ordering::Acquire)),
            Words::Sparse(s) => {
                let shard = shard_of(s, id).read_locked();
                shard.get(&id).copied().unwrap_or(0)
            }
        }
    }

    /// Sets `id`'s word to `f(old)` (0 removes a sparse entry).
    fn update(&self, id: SampleId, f: impl Fn(u64) -> u64) {
        match self {
            Words::Dense(w) => {
                if let Some(w) = w.get(id as usize) {
                    let _ = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(f(v)));
                }
            }
            Words::Sparse(s) => {
                let mut shard = shard_of(s, id).write_locked();
                match f(shard.get(&id).copied().unwrap_or(0)) {
                    0 => shard.remove(&id),
                    v => shard.insert(id, v),
                };
            }
        }
    }

    fn clear(&self) {
        match self {
            Words::Dense(w) => w.iter().for_each(|w| w.store(0, Ordering::Release)),
            Words::Sparse(s) => (s.iter()).for_each(|s| s.write_locked().clear()),
        }
    }

    /// Ids with a word.
    fn len(&self) -> usize {
        match self {
            Words::Dense(w) => w.iter().filter(|w| w.load(Ordering::Acquire) != 0).count(),
            Words::Sparse(s) => s.iter().map(|s| s.read_locked().len()).sum(),
        }
    }
}

/// Sizes and source times by sample id.
pub(crate) struct SampleTable {
    /// Size + 1; 0: not known.
    sizes: Words,
    /// Nanoseconds since 1970; 0: not known.
    mtimes: Words,
}

impl SampleTable {
    /// The table of a dataset of `samples` samples in a job of `world` ranks.
    pub(crate) fn new(samples: u64, world: u32) -> SampleTable {
        let dense = world <= DENSE_UP_TO;
        SampleTable {
            sizes: Words::new(samples, dense),
            mtimes: Words::new(samples, dense),
        }
    }

    /// The learned size of `id`, if any.
    pub(crate) fn size(&self, id: SampleId) -> Option<u64> {
        self.sizes.get(id).checked_sub(1)
    }

    /// Records a size only if none is known (a known size never changes behind a caller's
    /// back).
    pub(crate) fn learn_size(&self, id: SampleId, len: u64) {
        if len != UNKNOWN_SIZE {
            self.sizes
                .update(id, |old| if old == 0 { len + 1 } else { old });
        }
    }

    /// Forgets `id`'s size (a copy it was learned from turned out torn).
    pub(crate) fn unlearn_size(&self, id: SampleId) {
        self.sizes.update(id, |_| 0);
    }

    /// `id`'s source time in nanoseconds since 1970, 0 if not known.
    pub(crate) fn mtime(&self, id: SampleId) -> u64 {
        self.mtimes.get(id)
    }

    /// Records a source time (a later one wins); 0 is ignored.
    pub(crate) fn learn_mtime(&self, id: SampleId, nanos: u64) {
        if nanos != 0 {
            self.mtimes.update(id, |_| nanos);
        }
    }

    /// `id` left this rank's share: nothing of it is kept.
    pub(crate) fn forget(&self, id: SampleId) {
        self.sizes.update(id, |_| 0);
        self.mtimes.update(id, |_| 0);
    }

    /// Samples with a learned size or time (tests, benches; O(N) for arrays).
    pub(crate) fn len(&self) -> usize {
        self.sizes.len().max(self.mtimes.len())
    }
}

/// The file backend's "checked at this change stamp" marks (`super::files`); 0: none.
pub(crate) struct Stamps(Words);

impl Stamps {
    /// The marks of a dataset of `samples` samples in a job of `world` ranks.
    pub(crate) fn new(samples: u64, world: u32) -> Stamps {
        Stamps(Words::new(samples, world <= DENSE_UP_TO))
    }

    pub(crate) fn get(&self, id: SampleId) -> u64 {
        self.0.get(id)
    }

    pub(crate) fn set(&self, id: SampleId, stamp: u64) {
        self.0.update(id, |_| stamp);
    }

    pub(crate) fn remove(&self, id: SampleId) {
        self.0.update(id, |_| 0);
    }

    pub(crate) fn clear(&self) {
        self.0.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_learned_once_and_forgotten_with_the_sample_in_both_shapes() {
        for world in [1, DENSE_UP_TO + 1] {
            let t = SampleTable::new(10, world);
            assert_eq!(t.size(7), None);
            t.learn_size(7, 0);
            t.learn_size(7, 200);
            assert_eq!(t.size(7), Some(0), "a known size never changes");
            t.learn_mtime(7, 5);
            t.learn_mtime(7, 0);
            assert_eq!(t.mtime(7), 5);
            t.unlearn_size(7);
            assert_eq!((t.size(7), t.mtime(7)), (None, 5));
            t.forget(7);
            assert_eq!((t.size(7), t.mtime(7), t.len()), (None, 0, 0));
        }
    }

    #[test]
    fn stamps_are_set_and_removed_in_both_shapes() {
        for world in [1, DENSE_UP_TO + 1] {
            let s = Stamps::new(10, world);
            s.set(3, 9);
            assert_eq!((s.get(3), s.get(4)), (9, 0));
            s.remove(3);
            assert_eq!(s.get(3), 0);
            s.set(4, 1);
            s.clear();
            assert_eq!(s.get(4), 0);
        }
    }
}
