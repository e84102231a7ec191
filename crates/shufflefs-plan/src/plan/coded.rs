//! The plan under `--exchange coded`: every epoch a fresh, uniformly random,
//! balanced share for every compute rank (a global full reshuffle), and per rank a cache of
//! the share plus retained samples up to `alpha` of the dataset.
//!
//! Both are [`RandomPlacement`]'s, so the shares and caches the exchange re-derives, the
//! ones the calculator (`shufflefs plan`) averages over and the ones a restart recomputes are
//! one definition (its docs state the cache update rule). Everything is a function of
//! `(samples, ranks, alpha, seed, epoch)` alone: a rank that crashed re-derives its cache
//! contents at the epoch it resumes, and whatever its disk lost is sent again plainly by the
//! server (see `exchange::coded`).
//!
//! A coded [`Step`] has no [`Transfer`](super::Transfer)s: no rank sends another anything;
//! the server multicasts what each rank lacks. So the partial-local machinery that walks
//! transfers (the exchange executor, `resume`'s redo) has nothing to do under this plan.

use std::collections::BTreeSet;

use super::coded_keep::CodedPlacement;
use super::placement::{PlacementError, RandomPlacement};
use super::{EpochShares, Rank, SampleId, Step};

/// The shares and caches of a coded run.
#[derive(Clone, Debug)]
pub struct CodedShares {
    samples: u64,
    ranks: u32,
    alpha: f64,
    seed: u64,
    /// The kept sets' room in samples when the cache does not fit the disk
    /// (`plan::coded_keep`); `None`: every rank holds its whole coded cache.
    slots: Option<usize>,
}

impl CodedShares {
    /// Checks that a cache of `alpha` of the dataset can hold a share (`alpha >= 1/ranks`).
    pub fn new(samples: u64, ranks: u32, alpha: f64, seed: u64) -> Result<Self, PlacementError> {
        RandomPlacement::new(samples, ranks as usize, alpha, seed)?;
        Ok(CodedShares {
            samples,
            ranks,
            alpha,
            seed,
            slots: None,
        })
    }

    /// The same run with kept sets of `slots` samples (`plan::coded_keep`), or whole caches.
    pub fn with_slots(self, slots: Option<usize>) -> Self {
        CodedShares { slots, ..self }
    }

    /// The kept sets' room in samples, if the cache does not fit.
    pub fn slots(&self) -> Option<usize> {
        self.slots
    }

    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// The caches (or kept sets) of every rank at `epoch` (replays the rules from epoch 0).
    pub fn placement_at(&self, epoch: u64) -> CodedPlacement {
        let mut p = CodedPlacement::new(self.random(), self.slots);
        p.advance_to(epoch);
        p
    }

    /// [`CodedShares::placement_at`] whose kept sets are rank `rank`'s alone (what a
    /// store's gate needs; the shares and caches are every rank's).
    pub fn placement_of(&self, epoch: u64, rank: usize) -> CodedPlacement {
        let mut p = CodedPlacement::tracking(self.random(), self.slots, Some(rank));
        p.advance_to(epoch);
        p
    }

    /// The placement at epoch 0.
    fn random(&self) -> RandomPlacement {
        RandomPlacement::new(self.samples, self.ranks as usize, self.alpha, self.seed)
            .expect("checked in new")
    }

    /// Epoch `epoch`'s shares, each sorted (so views list by class, as under every plan).
    pub(crate) fn shares(&self, epoch: u64) -> EpochShares {
        let p = self.random();
        EpochShares {
            epoch,
            shares: p
                .shares(epoch)
                .into_iter()
                .map(|s| s.into_iter().collect())
                .collect(),
            slots: Vec::new(),
        }
    }

    /// The next epoch's shares; no transfers (see the module docs).
    pub(crate) fn step(&self, cur: &EpochShares) -> Step {
        Step {
            next: self.shares(cur.epoch + 1),
            transfers: Vec::new(),
        }
    }

    /// What `rank`'s coded cache holds at `epoch`: its share and the retained samples,
    /// ascending (of a cache that does not fit, what the kept set is chosen from).
    pub(crate) fn cache(&self, rank: Rank, epoch: u64) -> Vec<SampleId> {
        let mut p = self.random();
        p.advance_to(epoch);
        let cache: &BTreeSet<SampleId> = &p.caches()[rank as usize];
        cache.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_partition_and_caches_hold_the_share() {
        let c = CodedShares::new(101, 4, 0.4, 3).unwrap();
        for epoch in 0..4 {
            let shares = c.shares(epoch);
            let mut all: Vec<SampleId> = shares.shares.concat();
            all.sort_unstable();
            assert_eq!(all, (0..101).collect::<Vec<_>>());
            for r in 0..4 {
                let cache = c.cache(r, epoch);
                assert_eq!(cache.len(), 40);
                assert!(
                    shares
                        .share(r)
                        .iter()
                        .all(|s| cache.binary_search(s).is_ok())
                );
            }
        }
        assert_ne!(
            c.shares(1).shares,
            c.shares(2).shares,
            "a fresh share each epoch"
        );
        assert!(c.step(&c.shares(1)).transfers.is_empty());
        assert!(
            CodedShares::new(100, 4, 0.2, 0).is_err(),
            "alpha below 1/ranks"
        );
    }
}
