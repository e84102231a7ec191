//! What a rank has learned of the samples it holds or will hold: each one's size (when its
//! index has none) and source modification time, kept only for the samples of this rank's
//! share (issue 41).
//!
//! Why a table and not two arrays over every id: arrays cost 16 bytes per sample of the
//! *dataset* on every rank (160 MB per rank at 10^7 samples, whatever the share), while a
//! rank only ever learns about the samples it stages, receives, sends or reads. Entries go
//! when their sample leaves the share ([`SampleTable::forget`]: the exchange's eviction and
//! a resume's trim call it), so the table follows the share. Sharded so the FUSE threads,
//! the exchange and staging rarely meet on one lock; a lookup is a read lock and a hash.

use std::collections::HashMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::dataset::manifest::UNKNOWN_SIZE;
use crate::plan::SampleId;

/// Shards of the table (a power of two).
const SHARDS: usize = 64;

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// [`UNKNOWN_SIZE`] until learned.
    size: u64,
    /// Nanoseconds since 1970; 0 until learned.
    mtime: u64,
}

const EMPTY: Entry = Entry {
    size: UNKNOWN_SIZE,
    mtime: 0,
};

/// A word per sample id, kept only for the samples given one (sharded like the table):
/// the file backend's "checked at this change stamp" marks (`super::files`).
pub(crate) struct Stamps {
    shards: Box<[RwLock<HashMap<SampleId, u64>>]>,
}

impl Default for Stamps {
    fn default() -> Self {
        Stamps {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
        }
    }
}

impl Stamps {
    fn shard(&self, id: SampleId) -> &RwLock<HashMap<SampleId, u64>> {
        &self.shards[shard_of(id)]
    }

    /// `id`'s stamp, 0 if it has none.
    pub(crate) fn get(&self, id: SampleId) -> u64 {
        let shard = self.shard(id).read().unwrap_or_else(|e| e.into_inner());
        shard.get(&id).copied().unwrap_or(0)
    }

    pub(crate) fn set(&self, id: SampleId, stamp: u64) {
        let mut shard = self.shard(id).write().unwrap_or_else(|e| e.into_inner());
        shard.insert(id, stamp);
    }

    pub(crate) fn remove(&self, id: SampleId) {
        let mut shard = self.shard(id).write().unwrap_or_else(|e| e.into_inner());
        shard.remove(&id);
    }

    pub(crate) fn clear(&self) {
        for shard in self.shards.iter() {
            shard.write().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }
}

/// The shard of `id`: Fibonacci hashing, so neighbouring ids land in different shards.
fn shard_of(id: SampleId) -> usize {
    ((u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 58) as usize % SHARDS
}

/// Sizes and source times by sample id, for this rank's samples only.
pub(crate) struct SampleTable {
    shards: Box<[RwLock<HashMap<SampleId, Entry>>]>,
}

impl Default for SampleTable {
    fn default() -> Self {
        SampleTable {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
        }
    }
}

impl SampleTable {
    fn shard(&self, id: SampleId) -> usize {
        shard_of(id)
    }

    fn read(&self, id: SampleId) -> RwLockReadGuard<'_, HashMap<SampleId, Entry>> {
        self.shards[self.shard(id)]
            .read()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self, id: SampleId) -> RwLockWriteGuard<'_, HashMap<SampleId, Entry>> {
        self.shards[self.shard(id)]
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, id: SampleId) -> Entry {
        self.read(id).get(&id).copied().unwrap_or(EMPTY)
    }

    /// The learned size of `id`, if any.
    pub(crate) fn size(&self, id: SampleId) -> Option<u64> {
        Some(self.get(id).size).filter(|&s| s != UNKNOWN_SIZE)
    }

    /// Records a size only if none is known (a known size never changes behind a caller's
    /// back).
    pub(crate) fn learn_size(&self, id: SampleId, len: u64) {
        let mut shard = self.write(id);
        let entry = shard.entry(id).or_insert(EMPTY);
        if entry.size == UNKNOWN_SIZE {
            entry.size = len;
        }
    }

    /// Forgets `id`'s size (a copy it was learned from turned out torn).
    pub(crate) fn unlearn_size(&self, id: SampleId) {
        if let Some(entry) = self.write(id).get_mut(&id) {
            entry.size = UNKNOWN_SIZE;
        }
    }

    /// `id`'s source time in nanoseconds since 1970, 0 if not known.
    pub(crate) fn mtime(&self, id: SampleId) -> u64 {
        self.get(id).mtime
    }

    /// Records a source time (a later one wins); 0 is ignored.
    pub(crate) fn learn_mtime(&self, id: SampleId, nanos: u64) {
        if nanos != 0 {
            self.write(id).entry(id).or_insert(EMPTY).mtime = nanos;
        }
    }

    /// `id` left this rank's share: nothing of it is kept.
    pub(crate) fn forget(&self, id: SampleId) {
        self.write(id).remove(&id);
    }

    /// Samples with an entry (for tests and the memory bench).
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_learned_once_and_forgotten_with_the_sample() {
        let t = SampleTable::default();
        assert_eq!(t.size(7), None);
        t.learn_size(7, 100);
        t.learn_size(7, 200);
        assert_eq!(t.size(7), Some(100), "a known size never changes");
        t.learn_mtime(7, 5);
        t.learn_mtime(7, 0);
        assert_eq!(t.mtime(7), 5);
        t.unlearn_size(7);
        assert_eq!((t.size(7), t.mtime(7)), (None, 5));
        t.forget(7);
        assert_eq!((t.size(7), t.mtime(7), t.len()), (None, 0, 0));
    }

    #[test]
    fn only_samples_learned_about_take_room() {
        let t = SampleTable::default();
        for id in (0..1000).step_by(10) {
            t.learn_size(id, u64::from(id));
        }
        assert_eq!(t.len(), 100);
        assert_eq!(t.size(990), Some(990));
        assert_eq!(t.size(991), None);
    }
}
