//! The packed index: where each stored sample's record is ([`Entries`]).
//!
//! An array over every id of the dataset costs 16 bytes per sample of N on every rank
//! (1.6 GB at 10^8 page groups, whatever the rank holds), while the index only ever holds
//! what the segments hold: the rank's share and what it keeps or receives, about
//! `(1 + Q) N / M`. So, as `super::super::table` does for sizes and times, a job of more
//! than [`DENSE_UP_TO`] ranks keeps a map of the stored entries only (about 40 bytes an
//! entry), and a smaller one keeps the array. The index sits under the backend's state lock,
//! so the map needs no locks of its own; it is still cut in [`SHARDS`] maps, each growing on
//! its own: one map doubling its table holds the old and the new one at once (the heap's
//! peak of a daemon fell on such a rehash: 1.5x the index), one shard of 64 a 64th of that.

use std::collections::HashMap;

use super::Entry;
use crate::cache::table::{DENSE_UP_TO, SHARDS, shard_index};
use crate::plan::SampleId;

/// Where each stored sample's record is; [`Entry::default`] for a sample not stored.
pub(super) enum Entries {
    Dense(Vec<Entry>),
    Sparse(Box<[HashMap<SampleId, Entry>]>),
}

fn shards() -> Box<[HashMap<SampleId, Entry>]> {
    (0..SHARDS).map(|_| HashMap::new()).collect()
}

impl Entries {
    /// The index for a dataset of `samples` samples in a job of `world` ranks.
    pub(super) fn new(samples: u64, world: u32) -> Entries {
        match world <= DENSE_UP_TO {
            true => Entries::Dense(vec![Entry::default(); samples as usize]),
            false => Entries::Sparse(shards()),
        }
    }

    /// An empty index of the same shape.
    pub(super) fn emptied(&self) -> Entries {
        match self {
            Entries::Dense(v) => Entries::Dense(vec![Entry::default(); v.len()]),
            Entries::Sparse(_) => Entries::Sparse(shards()),
        }
    }

    /// `id`'s entry (the default when it is not stored).
    pub(super) fn get(&self, id: SampleId) -> Entry {
        match self {
            Entries::Dense(v) => v.get(id as usize).copied().unwrap_or_default(),
            Entries::Sparse(m) => (m[shard_index(id, m.len())].get(&id))
                .copied()
                .unwrap_or_default(),
        }
    }

    /// Sets `id`'s entry (the default removes it); returns the one it replaced.
    pub(super) fn set(&mut self, id: SampleId, e: Entry) -> Entry {
        match self {
            Entries::Dense(v) => std::mem::replace(&mut v[id as usize], e),
            Entries::Sparse(m) => {
                let shard = &mut m[shard_index(id, m.len())];
                match e == Entry::default() {
                    true => shard.remove(&id),
                    false => shard.insert(id, e),
                }
                .unwrap_or_default()
            }
        }
    }

    /// The stored samples and their entries, in no particular order.
    pub(super) fn stored(&self) -> Box<dyn Iterator<Item = (SampleId, Entry)> + '_> {
        match self {
            Entries::Dense(v) => Box::new(
                (v.iter().enumerate())
                    .filter(|(_, e)| e.seg != 0)
                    .map(|(id, &e)| (id as SampleId, e)),
            ),
            Entries::Sparse(m) => Box::new(m.iter().flatten().map(|(&id, &e)| (id, e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_shapes_answer_alike() {
        let at = |seg| Entry {
            seg,
            off: 48,
            len: 7,
        };
        for world in [1, 64] {
            let mut ix = Entries::new(10, world);
            assert_eq!(ix.set(3, at(1)), Entry::default());
            assert_eq!(ix.set(3, at(2)), at(1));
            ix.set(9, at(1));
            assert_eq!(ix.get(3), at(2));
            assert_eq!(ix.get(4), Entry::default());
            let mut stored: Vec<_> = ix.stored().collect();
            stored.sort_unstable_by_key(|s| s.0);
            assert_eq!(stored, [(3, at(2)), (9, at(1))]);
            assert_eq!(ix.set(3, Entry::default()), at(2));
            assert_eq!(ix.set(9, Entry::default()), at(1));
            assert_eq!(ix.stored().count(), 0, "world {world}");
            assert_eq!(ix.emptied().stored().count(), 0);
        }
    }
}
