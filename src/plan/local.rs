//! The plan as one rank computes it for itself: its epoch-0 share and, each epoch, what it
//! sends where and from whom it receives, from `(seed, epoch, M, Q)` and its own share, in
//! O(share) time and memory (issue 41). Not wired into the daemon yet; [`super::Plan`]
//! (every rank computes the whole job's plan, O(N) per rank) is what runs today.
//!
//! # Algorithm 1, per rank
//! * Epoch 0: a keyed permutation `π` of `0..N` ([`KeyedPermutation`]) dealt into `M`
//!   contiguous chunks whose sizes differ by at most one: rank `r`'s share is `π(j)` for
//!   the positions `j` of its chunk, computed without anyone else's.
//! * Epoch e -> e+1: `k = floor(Q * floor(N/M))`, the same on every rank (shares keep their
//!   sizes, so `floor(N/M)` is the smallest). Rank `r` shuffles its own share with a stream
//!   seeded by `(seed, e, r)` and takes the first `k` as its outgoing samples; its `i`-th
//!   goes to `σ_i(r)`, where `σ_i` is a keyed permutation of the ranks for slot `i` of epoch
//!   `e`. Rank `r` receives slot `i`'s sample of `σ_i⁻¹(r)`: one sample per slot, so every
//!   rank sends and receives exactly `k` (moves to itself included) and shares keep their
//!   sizes. `σ_i(r) == r` keeps the sample in place.
//!
//! What a receiver cannot compute is *which* ids arrive (that would need the sender's
//! share): they travel with the bytes, in the size lists. So a rank's next share is its
//! kept samples plus what arrived ([`LocalStep::next_share`]), and resuming needs the saved
//! share of the epoch, never a replay from epoch 0.

use super::keyed::KeyedPermutation;
use super::{PlanError, Rank, partial_shuffle, stream};

/// A sample's index in the dataset: 64-bit, so 5·10⁹ samples can be named.
pub type GlobalId = u64;

/// Keeps these permutations independent of the global plan's streams.
const DOMAIN_DEAL: u64 = 11;
const DOMAIN_PICK: u64 = 12;
const DOMAIN_ROUTE: u64 = 13;

/// Inputs of the per-rank plan: the same on every rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LocalParams {
    pub samples: u64,
    pub world: u32,
    pub fraction: f64,
    pub seed: u64,
}

impl LocalParams {
    pub fn new(samples: u64, world: u32, fraction: f64, seed: u64) -> Result<Self, PlanError> {
        if !(0.0..=1.0).contains(&fraction) || fraction.is_nan() {
            return Err(PlanError::Fraction(fraction));
        }
        if world == 0 {
            return Err(PlanError::EmptyWorld);
        }
        Ok(LocalParams {
            samples,
            world,
            fraction,
            seed,
        })
    }

    /// Samples every rank sends (and receives) per epoch, moves to itself included.
    pub fn exchange_count(&self) -> u64 {
        let min_share = self.samples / u64::from(self.world);
        (self.fraction * min_share as f64).floor() as u64
    }

    /// Positions `start..end` of `rank`'s epoch-0 chunk.
    fn chunk(&self, rank: Rank) -> (u64, u64) {
        let (m, r) = (u64::from(self.world), u64::from(rank));
        let (base, extra) = (self.samples / m, self.samples % m);
        let start = r * base + r.min(extra);
        (start, start + base + u64::from(r < extra))
    }

    /// `rank`'s share at epoch 0, sorted.
    pub fn initial_share(&self, rank: Rank) -> Vec<GlobalId> {
        let deal = KeyedPermutation::new(self.samples, self.seed, DOMAIN_DEAL, 0, 0);
        let (start, end) = self.chunk(rank);
        let mut share: Vec<GlobalId> = (start..end).map(|j| deal.apply(j)).collect();
        share.sort_unstable();
        share
    }

    /// What `me`, holding `share` (sorted) at `epoch`, sends and receives into `epoch + 1`.
    pub fn step(&self, epoch: u64, me: Rank, share: &[GlobalId]) -> LocalStep {
        let k = (self.exchange_count() as usize).min(share.len());
        let mut picked = share.to_vec();
        partial_shuffle(
            &mut picked,
            k,
            &mut stream(self.seed, DOMAIN_PICK, epoch, u64::from(me)),
        );
        let mut kept = picked.split_off(k);
        let route = KeyedPermutation::new(u64::from(self.world), self.seed, DOMAIN_ROUTE, epoch, 0);
        let (mut sends, mut receives) = (Vec::new(), Vec::new());
        for (i, &sample) in picked.iter().enumerate() {
            let slot = route.tweaked(i as u64);
            let to = slot.apply(u64::from(me)) as Rank;
            let from = slot.invert(u64::from(me)) as Rank;
            match to == me {
                true => kept.push(sample),
                false => sends.push(Send {
                    slot: i as u64,
                    sample,
                    to,
                }),
            }
            if from != me {
                receives.push(Receive {
                    slot: i as u64,
                    from,
                });
            }
        }
        kept.sort_unstable();
        LocalStep {
            epoch,
            kept,
            sends,
            receives,
        }
    }
}

/// One of this rank's outgoing samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Send {
    pub slot: u64,
    pub sample: GlobalId,
    pub to: Rank,
}

/// One sample this rank receives: the one `from` sends in `slot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Receive {
    pub slot: u64,
    pub from: Rank,
}

/// One rank's part of the step from `epoch` to `epoch + 1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalStep {
    pub epoch: u64,
    /// The share's samples that stay (sorted).
    pub kept: Vec<GlobalId>,
    /// Real moves, in slot order.
    pub sends: Vec<Send>,
    /// Samples arriving from other ranks, in slot order.
    pub receives: Vec<Receive>,
}

impl LocalStep {
    /// How many samples arrive from `peer`, in slot order: the length of its stream.
    pub fn expected_from(&self, peer: Rank) -> usize {
        self.receives.iter().filter(|r| r.from == peer).count()
    }

    /// The share at `epoch + 1`: the kept samples and those that arrived (sorted).
    pub fn next_share(&self, arrived: impl IntoIterator<Item = GlobalId>) -> Vec<GlobalId> {
        let mut next = self.kept.clone();
        next.extend(arrived);
        next.sort_unstable();
        next
    }
}
