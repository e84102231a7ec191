//! One rank's kept sets ([`LocalKeep`]): the rule of [`super::keep`] run on this rank's own
//! shares only, so a partial cache costs O(share x horizon) per rank, not the
//! whole job's shares over the horizon (O(N x horizon) on every rank: 7 GB at 10^8 samples
//! with the default horizon) and a walk from epoch 0 at every start.
//!
//! [`super::keep::choose`] needs only this rank's shares and its kept set of the epoch
//! before, so each rank computes its own: its share `horizon + 1` epochs ahead comes from
//! [`Plan::own_step`]. What it cannot know alone is whether a sender kept a sample it sends
//! (only a kept sample is worth sending, [`super::keep::received`]); the exchange asks: each
//! sender says which of its sends it keeps ([`Handshake::kept_flags`]), each receiver
//! answers which it takes ([`Handshake::wanted`]), and both sides filter the step alike. Run from epoch 0 with the same sizes, every rank's kept sets and the
//! filtered transfers are the whole-job [`super::keep::KeepPlanner`]'s (a property test
//! holds them to it); a rank that starts later (a resume) starts from what its cache holds.

use std::collections::VecDeque;
use std::sync::Arc;

use super::ids::{Ids, SampleSet};
use super::keep::{Outcome, choose, received};
use super::{EpochShares, Plan, Rank, SampleId, Transfer};

/// A sample's size in bytes as planned (on the cache's disk).
pub type SizeOf = Arc<dyn Fn(SampleId) -> u64 + Send + Sync>;

/// Kept sets remembered before the current epoch's, for a step out of an epoch the
/// planner has already gone past (advances went on while an exchange stalled).
const HISTORY: usize = 3;

/// This rank's kept sets, epoch after epoch.
#[derive(Clone)]
pub struct LocalKeep {
    plan: Plan,
    rank: Rank,
    size: SizeOf,
    capacity: u64,
    horizon: usize,
    /// This rank's share from the current epoch to `horizon + 1` epochs ahead (compact:
    /// [`super::ids`]).
    window: VecDeque<SampleSet>,
    /// The current epoch.
    epoch: u64,
    /// This rank's view at the far end of the window, whose slots the next step needs
    /// (the other epochs keep only their sorted shares: half the memory).
    last: EpochShares,
    /// `(epoch, kept set)`, oldest first; the last two are the current epoch's and the next.
    kept: VecDeque<(u64, SampleSet)>,
}

impl std::fmt::Debug for LocalKeep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (f.debug_struct("LocalKeep"))
            .field("rank", &self.rank)
            .field("epoch", &self.epoch())
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl LocalKeep {
    /// The kept sets of `rank` from `start` (its own view of an epoch) on; `held` is what
    /// its cache holds of that epoch's share (sorted; empty at epoch 0): kept on, as much
    /// of it as fits, longest stay first, as if it were the kept set of the epoch before.
    pub fn new(
        plan: Plan,
        rank: Rank,
        start: EpochShares,
        held: &[SampleId],
        (size, capacity): (SizeOf, u64),
        horizon: usize,
    ) -> LocalKeep {
        let (epoch, mut window) = (start.epoch, VecDeque::with_capacity(horizon + 2));
        window.push_back(SampleSet::from_ids(start.share(rank)));
        let mut last = start;
        while window.len() < horizon + 2 {
            last = plan.own_step(rank, &last).next;
            window.push_back(SampleSet::from_ids(last.share(rank)));
        }
        let mut keep = LocalKeep {
            plan,
            rank,
            size,
            capacity,
            horizon,
            window,
            epoch,
            last,
            kept: VecDeque::new(),
        };
        let later: Vec<&SampleSet> = keep.window.iter().skip(1).take(horizon).collect();
        let none: &[SampleId] = &[];
        let prev = choose(held, &later, none, &*keep.size, capacity);
        let first = keep.choose_at(0, &prev[..]);
        let second = keep.choose_at(1, &first);
        let epoch = keep.epoch();
        keep.kept.extend([(epoch, first), (epoch + 1, second)]);
        keep
    }

    /// The kept set at `window[at]`, after `prev` (the kept set the epoch before).
    fn choose_at<P: Ids + ?Sized>(&self, at: usize, prev: &P) -> SampleSet {
        let later: Vec<&SampleSet> = (self.window.iter().skip(at + 1).take(self.horizon)).collect();
        let kept = choose(&self.window[at], &later, prev, &*self.size, self.capacity);
        SampleSet::from_ids(&kept)
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn rank(&self) -> Rank {
        self.rank
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Sample `s`'s size as planned.
    pub fn size(&self, s: SampleId) -> u64 {
        (self.size)(s)
    }

    /// This rank's share at the current epoch.
    pub fn share(&self) -> &SampleSet {
        &self.window[0]
    }

    /// This rank's share at the next epoch.
    pub fn next_share(&self) -> &SampleSet {
        &self.window[1]
    }

    /// The kept set at the current epoch.
    pub fn kept(&self) -> &SampleSet {
        self.kept_at(self.epoch())
            .expect("the current epoch's is held")
    }

    /// The kept set at the next epoch.
    pub fn next_kept(&self) -> &SampleSet {
        self.kept_at(self.epoch() + 1)
            .expect("the next epoch's is held")
    }

    /// The kept set at `epoch`, if still held (the next epoch's and a few before).
    pub fn kept_at(&self, epoch: u64) -> Option<&SampleSet> {
        (self.kept.iter().find(|(e, _)| *e == epoch)).map(|(_, k)| k)
    }

    /// Moves to the next epoch: one step of this rank's plan at the far end of the window.
    pub fn advance(&mut self) {
        self.last = (self.plan).own_step(self.rank, &self.last).next;
        (self.window).push_back(SampleSet::from_ids(self.last.share(self.rank)));
        self.window.pop_front();
        self.epoch += 1;
        let after = self.choose_at(1, self.kept());
        self.kept.push_back((self.epoch() + 1, after));
        while self.kept.len() > HISTORY + 2 {
            self.kept.pop_front();
        }
    }

    /// This rank's cost at the current epoch as [`super::keep::KeepPlanner`] counts it,
    /// with its senders' kept sets unknown: a sample arriving was kept by its sender with
    /// probability `peer_keeps` (drawn by a hash of its id). What the fit estimate reports
    /// (`None` at the epoch the planner started from: everything comes from the source).
    pub fn outcome(&self, peer_keeps: f64) -> Option<Outcome> {
        let prev = self.kept_at(self.epoch().checked_sub(1)?)?;
        let (share, kept) = (self.share(), self.kept());
        let bytes = |set: &mut dyn Iterator<Item = SampleId>| set.map(|s| self.size(s)).sum();
        let read_bytes: u64 = bytes(&mut share.iter());
        let carried: Vec<SampleId> = kept.iter().filter(|&s| prev.contains(s)).collect();
        let by_peer = |s: SampleId| drawn(s) < peer_keeps;
        let got = received(prev, kept, &by_peer, &*self.size, self.capacity);
        let peer_bytes = bytes(&mut got.iter().copied());
        Some(Outcome {
            reads: share.len(),
            hits: (carried.len() + got.len()) as u64,
            read_bytes,
            source_bytes: read_bytes - bytes(&mut carried.iter().copied()) - peer_bytes,
            peer_bytes,
            kept: kept.len(),
            kept_bytes: bytes(&mut kept.iter()),
        })
    }

    /// Steps on to `epoch` (no-op if there or past it).
    pub fn advance_to(&mut self, epoch: u64) {
        while self.epoch() < epoch {
            self.advance();
        }
    }

    /// What the exchange out of `epoch` asks of this rank's kept sets ([`Handshake`]);
    /// `None` if those of `epoch` and `epoch + 1` are no longer held (or not yet: the
    /// caller advances first).
    pub fn handshake(&self, epoch: u64) -> Option<Handshake> {
        Some(Handshake {
            kept: self.kept_at(epoch)?.clone(),
            next: self.kept_at(epoch + 1)?.clone(),
            size: self.size.clone(),
            capacity: self.capacity,
        })
    }
}

/// This rank's part of the exchange out of one epoch for a partial cache: its kept sets
/// of that epoch and the next, to tell its receivers what it keeps and its senders what it
/// takes.
pub struct Handshake {
    kept: SampleSet,
    next: SampleSet,
    size: SizeOf,
    capacity: u64,
}

impl Handshake {
    /// A handshake that keeps and takes nothing (for kept sets no longer held): the
    /// exchange then moves nothing for this rank.
    pub fn empty(keep: &LocalKeep) -> Handshake {
        Handshake {
            kept: SampleSet::default(),
            next: SampleSet::default(),
            size: keep.size.clone(),
            capacity: keep.capacity,
        }
    }

    /// For each of `sends` (this rank's transfers to one peer, in order): whether this
    /// rank kept its sample, one bit each ([`bits`]).
    pub fn kept_flags(&self, sends: &[Transfer]) -> Vec<u8> {
        bits(sends.iter().map(|t| self.kept.contains(t.sample)))
    }

    /// Of `incoming` (every transfer into this rank, sorted by sample), the ones it takes
    /// through the exchange ([`received`]): its sender kept it (`peer_kept`, in
    /// `incoming`'s order), this rank keeps it next epoch and it fits beside what it kept
    /// this epoch. One flag per transfer, in `incoming`'s order.
    pub fn wanted(&self, incoming: &[Transfer], peer_kept: &[bool]) -> Vec<bool> {
        let kept_by_sender: Vec<SampleId> = (incoming.iter().zip(peer_kept))
            .filter(|(_, k)| **k)
            .map(|(t, _)| t.sample)
            .collect();
        let by_peer = |s: SampleId| kept_by_sender.binary_search(&s).is_ok();
        let got = received(&self.kept, &self.next, &by_peer, &*self.size, self.capacity);
        (incoming.iter())
            .map(|t| got.binary_search(&t.sample).is_ok())
            .collect()
    }
}

/// A number in `[0, 1)` drawn from `s` alone (SplitMix64's finaliser).
fn drawn(s: SampleId) -> f64 {
    let mut z = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

/// `flags` packed into bytes, bit `i % 8` of byte `i / 8`.
pub fn bits(flags: impl Iterator<Item = bool>) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, f) in flags.enumerate() {
        if i % 8 == 0 {
            out.push(0);
        }
        if f {
            *out.last_mut().expect("pushed") |= 1 << (i % 8);
        }
    }
    out
}

/// Flag `i` of bytes packed by [`bits`].
pub fn bit(bytes: &[u8], i: usize) -> bool {
    bytes.get(i / 8).is_some_and(|b| b >> (i % 8) & 1 == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlanParams;
    use crate::plan::keep::KeepPlanner;

    fn plan(samples: u64, world: u32) -> Plan {
        let params = PlanParams {
            samples,
            world,
            fraction: 0.5,
            seed: 11,
        };
        Plan::new(params).unwrap()
    }

    /// Every rank's own kept sets, and the transfers the handshake lets through, are the
    /// whole-job planner's, epoch after epoch (sizes of 1..4 units, room for a share and
    /// some of its arrivals).
    #[test]
    fn each_rank_alone_keeps_what_the_whole_job_planner_keeps() {
        let (n, world, horizon) = (120u64, 4u32, 3);
        let sizes: Vec<u64> = (0..n).map(|s| 1 + s % 4).collect();
        // A share (about 30 x 2.5 units) fits with room for some arrivals, not all.
        let cap = 95;
        let p = plan(n, world);
        let mut whole = KeepPlanner::new(p.clone(), sizes.clone(), cap, horizon);
        let size: SizeOf = Arc::new(move |s| 1 + s % 4);
        let mut ranks: Vec<LocalKeep> = (0..world)
            .map(|r| {
                LocalKeep::new(
                    p.clone(),
                    r,
                    p.own_initial(r),
                    &[],
                    (size.clone(), cap),
                    horizon,
                )
            })
            .collect();
        let mut moved = 0;
        for epoch in 0..6 {
            for (r, local) in ranks.iter().enumerate() {
                assert_eq!(local.epoch(), epoch);
                assert_eq!(
                    local.kept().to_vec(),
                    whole.kept(r as Rank),
                    "rank {r} epoch {epoch}"
                );
                assert_eq!(local.share().to_vec(), whole.shares().share(r as Rank));
            }
            let step = p.step(whole.shares());
            let want = whole.exchanged(&step);
            let mut got = Vec::new();
            for (r, local) in ranks.iter().enumerate() {
                let r = r as Rank;
                let incoming: Vec<Transfer> = (step.transfers.iter())
                    .filter(|t| t.to == r)
                    .copied()
                    .collect();
                let mut incoming = incoming;
                incoming.sort_unstable_by_key(|t| t.sample);
                let peer_kept: Vec<bool> = (incoming.iter())
                    .map(|t| {
                        let sender = ranks[t.from as usize].handshake(epoch).unwrap();
                        bit(&sender.kept_flags(&[*t]), 0)
                    })
                    .collect();
                let wanted = local
                    .handshake(epoch)
                    .unwrap()
                    .wanted(&incoming, &peer_kept);
                got.extend(
                    incoming
                        .iter()
                        .zip(wanted)
                        .filter(|(_, w)| *w)
                        .map(|(t, _)| *t),
                );
            }
            got.sort_unstable_by_key(|t| (t.from, t.to, t.sample));
            assert_eq!(got, want, "epoch {epoch}");
            moved += got.len();
            whole.advance();
            ranks.iter_mut().for_each(LocalKeep::advance);
        }
        assert!(moved > 0, "some transfers go through");
        assert!(
            ranks[0].kept_at(3).is_some() && ranks[0].kept_at(2).is_none(),
            "three epochs back are held"
        );
    }

    #[test]
    fn bits_round_trip() {
        let flags = [true, false, false, true, true, false, true, false, true];
        let b = bits(flags.iter().copied());
        assert_eq!(b.len(), 2);
        assert!((0..flags.len()).all(|i| bit(&b, i) == flags[i]));
        assert!(!bit(&b, 100));
    }
}
