//! Sets of sample ids that a partial cache's planner holds for many epochs
//! ([`SampleSet`]), and the one question the keep rule asks of any set ([`Ids`]).
//!
//! One rank's planner ([`super::keep_local::LocalKeep`]) holds its share for `horizon + 2`
//! epochs and its kept sets for five: as sorted `Vec<u64>` that was 8 B a sample each, about
//! 110 B per share sample with the default horizon, the largest thing a partial-cache
//! daemon held (720 MB of a one-rank mount of 10^7 objects). A share is a subset of the
//! dataset drawn at random, so its ids are dense in their range (a share of 1/M of the
//! samples: one id in M): a compressed bitmap holds it in about one bit per id of its range
//! for small M and two bytes per id when sparse. We use the `roaring` crate (Roaring
//! bitmaps, 64-bit ids as a tree of 32-bit ones) rather than a delta encoding of our own:
//! membership tests, sorted iteration and `len` are what the rule needs, and it has them,
//! fuzzed, with the format other systems use.

use roaring::RoaringTreemap;

use super::SampleId;

/// What the keep rule asks of a set of samples: whether it holds one, and its ids in order.
/// Sorted slices and [`SampleSet`] answer alike.
pub trait Ids {
    /// Whether `s` is in the set.
    fn has(&self, s: SampleId) -> bool;
    /// The set's ids, ascending.
    fn ids(&self) -> impl Iterator<Item = SampleId> + '_;
}

/// A sorted slice (as [`super::EpochShares`] holds shares).
impl Ids for [SampleId] {
    fn has(&self, s: SampleId) -> bool {
        self.binary_search(&s).is_ok()
    }

    fn ids(&self) -> impl Iterator<Item = SampleId> + '_ {
        self.iter().copied()
    }
}

/// A set of sample ids held compactly (a Roaring bitmap).
#[derive(Clone, Default, PartialEq)]
pub struct SampleSet(RoaringTreemap);

impl SampleSet {
    /// The set of `ids`, in any order (a share is sorted, which is the fast way in; a share
    /// an elastic restart hands over may not be).
    pub fn from_ids(ids: &[SampleId]) -> SampleSet {
        match RoaringTreemap::from_sorted_iter(ids.iter().copied()) {
            Ok(set) => SampleSet(set),
            Err(_) => SampleSet(ids.iter().copied().collect()),
        }
    }

    pub fn contains(&self, s: SampleId) -> bool {
        self.0.contains(s)
    }

    pub fn len(&self) -> u64 {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The ids, ascending.
    pub fn iter(&self) -> impl Iterator<Item = SampleId> + '_ {
        self.0.iter()
    }

    /// The ids, ascending, as a vector (what a caller keeping one epoch's set uses).
    pub fn to_vec(&self) -> Vec<SampleId> {
        let mut out = Vec::with_capacity(self.0.len() as usize);
        out.extend(self.0.iter());
        out
    }
}

impl Ids for SampleSet {
    fn has(&self, s: SampleId) -> bool {
        self.contains(s)
    }

    fn ids(&self) -> impl Iterator<Item = SampleId> + '_ {
        self.iter()
    }
}

impl std::fmt::Debug for SampleSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter().take(16)).finish()?;
        match self.len() > 16 {
            true => write!(f, " (of {})", self.len()),
            false => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_set_answers_as_its_sorted_ids_do(
            ids in proptest::collection::btree_set(0..u64::MAX, 0..300),
            probes in proptest::collection::vec(0..u64::MAX, 0..50),
        ) {
            let sorted: Vec<SampleId> = ids.into_iter().collect();
            let set = SampleSet::from_ids(&sorted);
            let mut shuffled = sorted.clone();
            shuffled.reverse();
            prop_assert!(SampleSet::from_ids(&shuffled) == set);
            prop_assert_eq!(set.to_vec(), sorted.clone());
            prop_assert_eq!(set.len(), sorted.len() as u64);
            prop_assert_eq!(set.ids().collect::<Vec<_>>(), sorted.ids().collect::<Vec<_>>());
            for p in probes.into_iter().chain(sorted.iter().copied()) {
                prop_assert_eq!(set.has(p), sorted.has(p));
            }
        }
    }
}
