//! [`IdSet`]: which samples a backend holds (or has checked), by sample id.
//!
//! A leaf module of its own because both backends (`files.rs`, `packed/`) keep one: while it
//! lived in `store.rs`, the backends imported the store that is built on them.
//!
//! Why two shapes (as `super::table`'s words): a bit per id of the *dataset* is N / 8 bytes
//! on every rank (625 MB at 5·10^9 samples, whatever the rank holds), while a rank only ever
//! holds its share and the next one's arrivals, about `(1 + Q) N / M`. A hash set costs about
//! 16-24 bytes an entry, so a job of more than [`super::table::DENSE_UP_TO`] ranks keeps
//! sharded sets that follow what the backend holds; a smaller one keeps the bits (no lock).

use std::collections::HashSet;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use super::table::{DENSE_UP_TO, SHARDS, shard_of};
use crate::plan::SampleId;
use crate::sys::sync::RwLocked;

/// A set of sample ids below a bound, safe to update from many threads.
pub(crate) enum IdSet {
    /// A bit per id (jobs of few ranks).
    Dense(Bitset),
    /// The ids in it, by shard.
    Sparse(Box<[RwLock<HashSet<SampleId>>]>),
}

impl IdSet {
    /// The set for ids below `samples` in a job of `world` ranks.
    pub(crate) fn new(samples: u64, world: u32) -> IdSet {
        match world <= DENSE_UP_TO {
            true => IdSet::Dense(Bitset::new(samples)),
            false => IdSet::Sparse((0..SHARDS).map(|_| RwLock::default()).collect()),
        }
    }

    pub(crate) fn get(&self, id: SampleId) -> bool {
        match self {
            IdSet::Dense(b) => b.get(id),
            IdSet::Sparse(s) => shard_of(s, id).read_locked().contains(&id),
        }
    }

    /// Adds `id`; returns whether it was already in.
    pub(crate) fn set(&self, id: SampleId) -> bool {
        match self {
            IdSet::Dense(b) => b.set(id),
            IdSet::Sparse(s) => !shard_of(s, id).write_locked().insert(id),
        }
    }

    /// Removes `id`; returns whether it was in.
    pub(crate) fn clear(&self, id: SampleId) -> bool {
        match self {
            IdSet::Dense(b) => b.clear(id),
            IdSet::Sparse(s) => shard_of(s, id).write_locked().remove(&id),
        }
    }

    /// Every id in the set, ascending.
    pub(crate) fn held(&self) -> Vec<SampleId> {
        match self {
            IdSet::Dense(b) => b.held(),
            IdSet::Sparse(s) => {
                let mut all: Vec<SampleId> = (s.iter())
                    .flat_map(|s| {
                        let s = s.read_locked();
                        s.iter().copied().collect::<Vec<_>>()
                    })
                    .collect();
                all.sort_unstable();
                all
            }
        }
    }

    /// Empties the set.
    pub(crate) fn clear_all(&self) {
        match self {
            IdSet::Dense(b) => b.clear_all(),
            IdSet::Sparse(s) => (s.iter()).for_each(|s| s.write_locked().clear()),
        }
    }
}

/// A fixed-size set of sample ids, one bit each.
pub(crate) struct Bitset(Vec<AtomicU64>);

impl Bitset {
    pub(crate) fn new(len: u64) -> Bitset {
        Bitset((0..len.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }
    /// Whether bit `i` is set (false past the end).
    pub(crate) fn get(&self, i: u64) -> bool {
        (self.0.get((i / 64) as usize))
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (i % 64)) != 0)
    }
    /// Sets bit `i`; returns whether it was already set.
    pub(crate) fn set(&self, i: u64) -> bool {
        self.0[(i / 64) as usize].fetch_or(1 << (i % 64), Ordering::AcqRel) & (1 << (i % 64)) != 0
    }
    /// Clears bit `i`; returns whether it was set (false past the end).
    pub(crate) fn clear(&self, i: u64) -> bool {
        (self.0.get((i / 64) as usize))
            .is_some_and(|w| w.fetch_and(!(1 << (i % 64)), Ordering::AcqRel) & (1 << (i % 64)) != 0)
    }
    pub(crate) fn clear_all(&self) {
        self.0.iter().for_each(|w| w.store(0, Ordering::Release));
    }
    /// The bits set, ascending (a pass over the words, 64 ids each).
    pub(crate) fn held(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for (i, w) in self.0.iter().enumerate() {
            let mut bits = w.load(Ordering::Acquire);
            while bits != 0 {
                out.push(i as u64 * 64 + u64::from(bits.trailing_zeros()));
                bits &= bits - 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_shapes_answer_alike() {
        for world in [1, 64] {
            let set = IdSet::new(200, world);
            assert!(!set.get(5) && !set.set(5) && set.set(5) && set.get(5));
            assert!(!set.set(199) && set.get(199) && !set.get(198));
            assert!(set.clear(5) && !set.clear(5) && !set.get(5));
            assert_eq!(set.held(), [199]);
            set.set(64);
            assert_eq!(set.held(), [64, 199]);
            set.clear_all();
            assert!(!set.get(199), "world {world}");
            assert!(set.held().is_empty());
        }
        assert!(
            !IdSet::new(10, 1).get(1 << 40),
            "past the end of the bits: not in"
        );
        let sparse = IdSet::new(10, 64);
        assert!(!sparse.set(5_000_000_000) && sparse.get(5_000_000_000));
    }
}
