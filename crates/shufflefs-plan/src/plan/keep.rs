//! Which samples stay cached when a rank's share is larger than its cache.
//!
//! Pure and deterministic like the rest of [`crate::plan`]: a rank's kept set at any epoch
//! follows from the plan, the sample sizes and the capacity. [`KeepPlanner`] runs the rule
//! for every rank of the job at once (O(N x horizon): the reference the tests, the benches
//! and `simulate` use); a daemon runs it for its own rank only
//! ([`super::keep_local::LocalKeep`]) and asks its peers what they kept.
//!
//! # The rule (clairvoyant, as NoPFS prefetches)
//! The plan knows every future epoch's shares, so each sample of this rank's share at epoch
//! `e` has a known *stay*: how many epochs from `e` on it remains in this rank's share
//! (looked at up to `horizon` epochs ahead; anything staying longer ties). Every sample of
//! a share is read once per epoch, so a cached sample gives one hit per epoch it stays, and
//! the room it frees when it leaves is lost for an epoch (it is refilled by a read). The
//! samples worth the space are those that stay longest (Belady: evict the one needed again
//! soonest... here the one whose departure from this rank is soonest). Per epoch:
//!
//! 1. What was kept the epoch before and is still in the share stays kept: displacing it
//!    would trade a hit now for one later.
//! 2. The room left is filled with the share's other samples by stay (longest first, then
//!    id); one that does not fit is skipped, a smaller one after it may still fit.
//!
//! So samples arriving through the exchange take only room that samples leaving sooner
//! freed. A new kept sample comes through the exchange when its sender had kept it and it
//! fits beside the previous kept set (all still on disk while the exchange runs,
//! [`received`]); otherwise it is written into the cache when it is first read from the
//! source. The cache thus never holds more than `capacity`: during the exchange it holds
//! the previous kept set and what is received; after publication the samples that left
//! are evicted before anything new is read in.
//!
//! When `(1 + Q) x share` fits, the kept set is the whole share every epoch (the plain,
//! full cache). The rest of a share is read from the source when it is opened.
//!
//! # What an epoch costs ([`Outcome`])
//! Reads of samples kept here the epoch before (and still in the share) and of samples
//! received hit; every other read goes to the source. Epoch 0 starts cold.

use std::collections::VecDeque;

use std::collections::HashMap;

use super::ids::Ids;
use super::{EpochShares, Plan, Rank, SampleId, Step, Transfer};

/// How many epochs ahead a sample's stay is looked at by default.
pub const DEFAULT_HORIZON: usize = 8;

/// The rule for one rank and one epoch. `share` is the rank's share at the epoch, `later`
/// its shares in the epochs after (up to the horizon); `prev` the kept set of the epoch
/// before (empty at epoch 0). Returns the kept set, sorted.
pub fn choose<S, W, P>(
    share: &S,
    later: &[&W],
    prev: &P,
    size: &dyn Fn(SampleId) -> u64,
    capacity: u64,
) -> Vec<SampleId>
where
    S: Ids + ?Sized,
    W: Ids + ?Sized,
    P: Ids + ?Sized,
{
    let mut kept = Vec::new();
    let candidates = share.ids().filter(|&s| match prev.has(s) {
        true => {
            kept.push(s);
            false
        }
        false => true,
    });
    let order = by_stay(candidates, later);
    let mut used: u64 = kept.iter().map(|&s| size(s)).sum();
    for s in order {
        let n = size(s);
        if used + n <= capacity {
            used += n;
            kept.push(s);
        }
    }
    kept.sort_unstable();
    kept
}

/// `candidates` in the order the rule fills the room in: longest stay first, then smallest
/// id. Sorted as one `u64` each (the stay inverted in the top byte, the id below) where ids
/// and the horizon allow, half the memory of `(stay, id)` pairs (80 MB for a share of 10^7
/// candidates); as pairs otherwise.
fn by_stay<W: Ids + ?Sized>(
    candidates: impl Iterator<Item = SampleId>,
    later: &[&W],
) -> Vec<SampleId> {
    const ID_BITS: u32 = 56;
    let (mut packed, mut wide) = (Vec::new(), Vec::new());
    for s in candidates {
        let stay = stay(later, s);
        match wide.is_empty() && stay <= 0xFF && s >> ID_BITS == 0 {
            true => packed.push((u64::from(0xFF - stay) << ID_BITS) | s),
            false => wide.push((stay, s)),
        }
    }
    if wide.is_empty() {
        packed.sort_unstable();
        packed.iter_mut().for_each(|k| *k &= (1 << ID_BITS) - 1);
        return packed;
    }
    let unpacked = packed
        .iter()
        .map(|&k| (0xFF - (k >> ID_BITS) as u32, k & ((1 << ID_BITS) - 1)));
    wide.extend(unpacked);
    wide.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    wide.into_iter().map(|(_, s)| s).collect()
}

/// Epochs `s` stays in this rank's share from the epoch before `later` on (1 if it leaves
/// next epoch).
fn stay<W: Ids + ?Sized>(later: &[&W], s: SampleId) -> u32 {
    1 + later.iter().take_while(|w| w.has(s)).count() as u32
}

/// What one rank's epoch costs under the kept sets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Samples read (the share).
    pub reads: u64,
    /// Reads served from the cache: samples kept here the epoch before and still in the
    /// share, and samples received from a peer that had kept them.
    pub hits: u64,
    /// Bytes of the share.
    pub read_bytes: u64,
    /// Bytes read from the source: misses plus kept samples not already cached.
    pub source_bytes: u64,
    /// Bytes of kept samples received from a peer that had kept them.
    pub peer_bytes: u64,
    /// Samples in the kept set.
    pub kept: u64,
    /// Bytes of the kept set.
    pub kept_bytes: u64,
}

impl Outcome {
    /// Hits over reads (1 for an empty share).
    pub fn hit_rate(&self) -> f64 {
        if self.reads == 0 {
            1.0
        } else {
            self.hits as f64 / self.reads as f64
        }
    }

    /// The sum of two outcomes (for totals over ranks or epochs).
    pub fn add(&self, o: &Outcome) -> Outcome {
        Outcome {
            reads: self.reads + o.reads,
            hits: self.hits + o.hits,
            read_bytes: self.read_bytes + o.read_bytes,
            source_bytes: self.source_bytes + o.source_bytes,
            peer_bytes: self.peer_bytes + o.peer_bytes,
            kept: self.kept + o.kept,
            kept_bytes: self.kept_bytes + o.kept_bytes,
        }
    }
}

/// Every rank's kept set, epoch after epoch: holds the plan's shares from the current epoch
/// to `horizon` epochs ahead and the kept sets of the current epoch.
#[derive(Clone, Debug)]
pub struct KeepPlanner {
    plan: Plan,
    sizes: std::sync::Arc<[u64]>,
    capacity: u64,
    /// `window[0]` is the current epoch.
    window: VecDeque<EpochShares>,
    /// Per rank, at the current epoch.
    kept: Vec<Vec<SampleId>>,
    /// Per rank, what the current epoch costs.
    outcomes: Vec<Outcome>,
    /// The shares it was planned from (for [`KeepPlanner::at_epoch`] before the current).
    start: EpochShares,
}

impl KeepPlanner {
    /// The kept sets of epoch 0. `sizes[s]` is sample `s`'s length in bytes; `capacity` is
    /// each rank's cache in bytes.
    pub fn new(
        plan: Plan,
        sizes: impl Into<std::sync::Arc<[u64]>>,
        capacity: u64,
        horizon: usize,
    ) -> KeepPlanner {
        let start = plan.initial();
        KeepPlanner::from_shares(plan, start, sizes, capacity, horizon)
    }

    /// The kept sets planned afresh from `start` (nothing kept before it), the epochs
    /// after stepped with `plan`: for a job whose earlier epochs another plan made (an
    /// elastic restart).
    pub fn from_shares(
        plan: Plan,
        start: EpochShares,
        sizes: impl Into<std::sync::Arc<[u64]>>,
        capacity: u64,
        horizon: usize,
    ) -> KeepPlanner {
        let mut window = VecDeque::with_capacity(horizon + 1);
        window.push_back(start.clone());
        while window.len() <= horizon {
            let next = plan.step(window.back().expect("not empty")).next;
            window.push_back(next);
        }
        let world = plan.params().world as usize;
        let mut planner = KeepPlanner {
            plan,
            sizes: sizes.into(),
            capacity,
            window,
            kept: vec![Vec::new(); world],
            outcomes: Vec::new(),
            start,
        };
        planner.kept = (0..world as Rank).map(|r| planner.choose(r)).collect();
        planner.outcomes = (0..world as Rank)
            .map(|r| planner.outcome(r, None))
            .collect();
        planner
    }

    /// The planner moved on to `epoch` (from epoch 0).
    pub fn at(
        plan: Plan,
        sizes: impl Into<std::sync::Arc<[u64]>>,
        capacity: u64,
        horizon: usize,
        epoch: u64,
    ) -> KeepPlanner {
        let mut p = KeepPlanner::new(plan, sizes, capacity, horizon);
        while p.epoch() < epoch {
            p.advance();
        }
        p
    }

    pub fn epoch(&self) -> u64 {
        self.window[0].epoch
    }

    /// This planner at `epoch`, which may be before its current one (planned again from the
    /// shares it started from); `None` before those.
    pub fn at_epoch(&self, epoch: u64) -> Option<KeepPlanner> {
        let mut p = match epoch >= self.epoch() {
            true => self.clone(),
            false if epoch >= self.start.epoch => {
                let (plan, start) = (self.plan.clone(), self.start.clone());
                let horizon = self.window.len() - 1;
                KeepPlanner::from_shares(plan, start, self.sizes.clone(), self.capacity, horizon)
            }
            false => return None,
        };
        while p.epoch() < epoch {
            p.advance();
        }
        Some(p)
    }

    /// Every rank's share at the current epoch.
    pub fn shares(&self) -> &EpochShares {
        &self.window[0]
    }

    /// `rank`'s kept set at the current epoch, sorted.
    pub fn kept(&self, rank: Rank) -> &[SampleId] {
        &self.kept[rank as usize]
    }

    /// What the current epoch costs `rank`.
    pub fn outcome_of(&self, rank: Rank) -> Outcome {
        self.outcomes[rank as usize]
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Sample `s`'s size as planned.
    pub fn size(&self, s: SampleId) -> u64 {
        self.sizes[s as usize]
    }

    /// The transfers of `step` (out of the current epoch) that carry a sample its receiver
    /// keeps and gets through the exchange ([`received`]): the others are read from the
    /// source by whoever needs them, so they are not sent. Every rank computes the same.
    pub fn exchanged(&self, step: &Step) -> Vec<Transfer> {
        let mut next = self.clone();
        next.advance();
        let mut senders: Vec<HashMap<SampleId, Rank>> = vec![HashMap::new(); self.kept.len()];
        for t in &step.transfers {
            senders[t.to as usize].insert(t.sample, t.from);
        }
        let got: Vec<Vec<SampleId>> = (0..self.kept.len())
            .map(|r| {
                let peer_kept = |s: SampleId| {
                    (senders[r].get(&s))
                        .is_some_and(|&p| self.kept[p as usize].binary_search(&s).is_ok())
                };
                let size = |s: SampleId| self.size(s);
                received(
                    &self.kept[r][..],
                    &next.kept[r][..],
                    &peer_kept,
                    &size,
                    self.capacity,
                )
            })
            .collect();
        (step.transfers.iter())
            .filter(|t| got[t.to as usize].binary_search(&t.sample).is_ok())
            .copied()
            .collect()
    }

    /// Moves to the next epoch.
    pub fn advance(&mut self) {
        let next = self.plan.step(self.window.back().expect("not empty")).next;
        self.window.push_back(next);
        let before_shares = self.window.pop_front().expect("not empty");
        let world = self.kept.len() as Rank;
        let new_kept: Vec<Vec<SampleId>> = (0..world).map(|r| self.choose(r)).collect();
        let before_kept = std::mem::replace(&mut self.kept, new_kept);
        let owners = owners(&before_shares, self.sizes.len());
        let before = (&owners[..], &before_kept[..]);
        self.outcomes = (0..world).map(|r| self.outcome(r, Some(before))).collect();
    }

    fn choose(&self, rank: Rank) -> Vec<SampleId> {
        let later: Vec<&[SampleId]> = self.window.iter().skip(1).map(|e| e.share(rank)).collect();
        choose(
            self.window[0].share(rank),
            &later,
            &self.kept[rank as usize][..],
            &|s| self.size(s),
            self.capacity,
        )
    }

    /// `rank`'s cost at the current epoch, given the epoch before (`None` at epoch 0, when
    /// everything comes from the source).
    fn outcome(&self, rank: Rank, before: Option<(&[Rank], &[Vec<SampleId>])>) -> Outcome {
        let share = self.window[0].share(rank);
        let kept = &self.kept[rank as usize];
        let bytes = |set: &mut dyn Iterator<Item = &SampleId>| set.map(|&s| self.size(s)).sum();
        let read_bytes: u64 = bytes(&mut share.iter());
        let mut o = Outcome {
            reads: share.len() as u64,
            read_bytes,
            source_bytes: read_bytes,
            kept: kept.len() as u64,
            kept_bytes: bytes(&mut kept.iter()),
            ..Outcome::default()
        };
        let Some((owners, kept_before)) = before else {
            return o;
        };
        let prev = &kept_before[rank as usize];
        let carried: Vec<SampleId> = (kept.iter().copied())
            .filter(|s| prev.binary_search(s).is_ok())
            .collect();
        let peer_kept = |s: SampleId| {
            let p = owners[s as usize] as usize;
            kept_before
                .get(p)
                .is_some_and(|k| k.binary_search(&s).is_ok())
        };
        let got = received(
            &prev[..],
            &kept[..],
            &peer_kept,
            &|s| self.size(s),
            self.capacity,
        );
        o.hits = (carried.len() + got.len()) as u64;
        o.peer_bytes = bytes(&mut got.iter());
        o.source_bytes -= bytes(&mut carried.iter()) + o.peer_bytes;
        o
    }
}

/// The samples of `kept` (this epoch's kept set) that come through the exchange: new here
/// (not in `prev`, the kept set of the epoch before), kept by their sender in the epoch
/// before (`peer_kept`), in id order while they fit beside `prev`, which is all still on
/// disk while the exchange runs. The rest of `kept`'s new samples are written when first
/// read from the source.
pub fn received<P: Ids + ?Sized, K: Ids + ?Sized>(
    prev: &P,
    kept: &K,
    peer_kept: &dyn Fn(SampleId) -> bool,
    size: &dyn Fn(SampleId) -> u64,
    capacity: u64,
) -> Vec<SampleId> {
    let mut used: u64 = prev.ids().map(size).sum();
    let mut got = Vec::new();
    for s in kept.ids() {
        if prev.has(s) || !peer_kept(s) {
            continue;
        }
        if used + size(s) <= capacity {
            used += size(s);
            got.push(s);
        }
    }
    got
}

/// The rank whose share holds each of `samples` samples (`Rank::MAX` for none).
fn owners(shares: &EpochShares, samples: usize) -> Vec<Rank> {
    let mut out = vec![Rank::MAX; samples];
    for (r, share) in shares.shares.iter().enumerate() {
        for &s in share {
            out[s as usize] = r as Rank;
        }
    }
    out
}

/// The first `epochs` epochs under the kept sets: per epoch, every rank's outcome.
pub fn simulate(
    plan: Plan,
    sizes: impl Into<std::sync::Arc<[u64]>>,
    capacity: u64,
    horizon: usize,
    epochs: u64,
) -> Vec<Vec<Outcome>> {
    let mut p = KeepPlanner::new(plan, sizes, capacity, horizon);
    let mut out = Vec::new();
    for e in 0..epochs {
        if e > 0 {
            p.advance();
        }
        out.push(p.outcomes.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlanParams;

    fn plan(samples: u64, world: u32, fraction: f64) -> Plan {
        Plan::new(PlanParams {
            samples,
            world,
            fraction,
            seed: 7,
        })
        .unwrap()
    }

    #[test]
    fn longest_stay_wins_and_kept_samples_stay() {
        let s0: &[SampleId] = &[1, 2, 3, 4];
        let s1: &[SampleId] = &[2, 3, 4, 9];
        let s2: &[SampleId] = &[3, 4, 9];
        let one = |_| 1;
        // 3 and 4 stay three epochs, 2 two, 1 one.
        let none: &[SampleId] = &[];
        assert_eq!(choose(s0, &[s1, s2], none, &one, 3), [2, 3, 4]);
        // 9 arrives and outstays 2, but 2 was kept and is still here.
        let kept: &[SampleId] = &[2, 3, 4];
        assert_eq!(choose(s1, &[s2], kept, &one, 3), [2, 3, 4]);
        // 1 left: its room goes to the longest stay, 9 before 2.
        let kept: &[SampleId] = &[3, 4];
        assert_eq!(choose(s1, &[s2], kept, &one, 3), [3, 4, 9]);
    }

    /// Packed or not (an id of 2^56 or more), candidates come longest stay first, then by id.
    #[test]
    fn candidates_are_ordered_by_stay_then_id_packed_or_not() {
        let big: SampleId = 1 << 60;
        let s1: &[SampleId] = &[3, 5, 9, big];
        let s2: &[SampleId] = &[5, big];
        let later = [s1, s2];
        assert_eq!(by_stay([9, 7, 5, 3].into_iter(), &later), [5, 3, 9, 7]);
        assert_eq!(
            by_stay([9, big, 7, 5, 3].into_iter(), &later),
            [5, big, 3, 9, 7]
        );
    }

    #[test]
    fn received_fit_beside_the_previous_kept_set() {
        let one = |_| 1;
        let all = |_| true;
        // 1 and 2 (leaving) are still on disk during the exchange: room for one of 5, 6.
        let (prev, kept): (&[SampleId], &[SampleId]) = (&[1, 2], &[5, 6]);
        assert_eq!(received(prev, kept, &all, &one, 3), [5]);
        let (prev, kept): (&[SampleId], &[SampleId]) = (&[1], &[1, 5, 6]);
        assert_eq!(received(prev, kept, &|s| s == 6, &one, 3), [6]);
    }

    #[test]
    fn a_planner_goes_back_to_an_earlier_epoch() {
        let sizes = vec![10u64; 40];
        let at = |e| KeepPlanner::at(plan(40, 2, 0.5), sizes.clone(), 100, 4, e);
        let late = at(3);
        for e in [0, 1, 3, 4] {
            let p = late.at_epoch(e).unwrap();
            assert_eq!(
                (p.epoch(), p.kept(0), p.kept(1)),
                (e, at(e).kept(0), at(e).kept(1))
            );
        }
        let start = plan(40, 2, 0.5).step(&plan(40, 2, 0.5).initial()).next;
        let fresh = KeepPlanner::from_shares(plan(40, 2, 0.5), start, sizes.clone(), 100, 4);
        assert!(fresh.at_epoch(0).is_none() && fresh.at_epoch(1).is_some());
    }

    #[test]
    fn a_share_that_fits_is_kept_whole() {
        let p = plan(40, 2, 0.5);
        let sizes = vec![10u64; 40];
        // (1 + Q) x 20 samples x 10 bytes = 300.
        let out = simulate(p, sizes, 300, DEFAULT_HORIZON, 4);
        for epoch in &out[1..] {
            for o in epoch {
                assert_eq!(o.hits, o.reads);
                // What came from elsewhere came from peers.
                assert_eq!(o.source_bytes, 0);
            }
        }
    }
}
