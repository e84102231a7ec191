//! Algorithm 1 on positions: the plan any rank computes for itself, in O(share) per epoch,
//! without anyone else's share (issue 41).
//!
//! # Positions
//! The dataset's `N` samples sit at positions `0..N`; rank `r` owns the contiguous chunk of
//! positions [`LocalParams::chunk`] (sizes differ by at most one), in every epoch. What moves
//! is which sample sits where: epoch 0 deals a keyed permutation `π` of the ids over the
//! positions, and each epoch `e -> e+1` applies a permutation `τ_e` of the positions. So a
//! rank's share is "the samples at my positions", kept as a *slot* array (offset in the chunk
//! -> sample id), and every epoch is a partition of the dataset by construction.
//!
//! # The step `τ_e` (Nguyen et al., "Why globally re-shuffle?", Algorithm 1)
//! `k = floor(Q * floor(N/M))`, the same on every rank. Rank `r`'s chunk is permuted by a
//! keyed permutation `ρ_{e,r}` of its offsets: the offset `ρ⁻¹(i)` is its `i`-th outgoing
//! sample for `i < k` (a uniform random `k`-subset, in random order). Slot `i`'s sample goes
//! to rank `σ_{e,i}(r)`, where `σ_{e,i}` is a keyed permutation of the ranks (under node
//! scope: of each host's ranks), and lands at the offset its receiver vacated for slot `i`,
//! `ρ_{e,σ(r)}⁻¹(i)`. Because `σ_{e,i}` is a permutation, every rank sends and receives
//! exactly `k` (moves to itself included) and shares keep their sizes; `σ(r) == r` keeps the
//! sample in place. About `Q (M-1)/M` of a share moves, as in the paper.
//!
//! # What a rank can compute alone
//! * its sends: `k` evaluations of `ρ⁻¹` and `σ` ([`LocalPlan::step`]);
//! * who sends to it in slot `i`: `σ_{e,i}⁻¹(r)`;
//! * where any position's sample was one epoch earlier ([`LocalPlan::back`], O(1)), hence
//!   the id at any position at any epoch by walking back to epoch 0 and applying `π`
//!   ([`LocalPlan::id_at`], O(epoch)). That is how a rank resumes at epoch `e` with nothing
//!   but its chunk ([`LocalPlan::slots_at`], O(share · e), threads over the share), and how it
//!   names what arrives in an exchange without anyone's share.
//!
//! Every permutation here is a [`KeyedPermutation`] keyed by `(seed, use, epoch, ...)`, so
//! two runs with one seed plan alike and a cache written by one build resumes under the next.

use std::sync::Arc;

use super::keyed::KeyedPermutation;
use super::{HostLayout, PlanError, Rank};

/// A sample's index in the dataset: 64-bit, so 5·10⁹ samples can be named.
pub type GlobalId = u64;

/// Keeps these permutations independent of each other and of the other plans' streams.
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

    /// The positions `rank` owns in every epoch.
    pub fn chunk(&self, rank: Rank) -> std::ops::Range<u64> {
        let (m, r) = (u64::from(self.world), u64::from(rank));
        let (base, extra) = (self.samples / m, self.samples % m);
        let start = r * base + r.min(extra);
        start..start + base + u64::from(r < extra)
    }

    /// The rank whose chunk holds position `p` (`< samples`).
    pub fn chunk_of(&self, p: u64) -> Rank {
        let m = u64::from(self.world);
        let (base, extra) = (self.samples / m, self.samples % m);
        let long = extra * (base + 1);
        let r = if p < long {
            p / (base + 1)
        } else {
            extra + (p - long) / base
        };
        r as Rank
    }
}

/// The per-rank plan for one world: global scope, or node scope with its hosts.
#[derive(Clone, Debug)]
pub struct LocalPlan {
    params: LocalParams,
    /// Node scope: slot permutations stay within each host's ranks.
    layout: Option<Arc<HostLayout>>,
    /// Node scope: each rank's index within its host's group.
    index: Vec<u32>,
}

/// One of this rank's outgoing samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Send {
    pub slot: u64,
    pub sample: GlobalId,
    pub to: Rank,
}

/// One sample this rank receives: the one `from` sends in `slot`, stored at chunk offset
/// `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Receive {
    pub slot: u64,
    pub from: Rank,
    pub offset: u64,
}

/// One rank's part of the step from `epoch` to `epoch + 1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalStep {
    pub epoch: u64,
    /// Real moves out, in slot order.
    pub sends: Vec<Send>,
    /// Samples arriving from other ranks, in slot order.
    pub receives: Vec<Receive>,
}

impl LocalStep {
    /// How many samples arrive from `peer`: the length of its stream.
    pub fn expected_from(&self, peer: Rank) -> usize {
        self.receives.iter().filter(|r| r.from == peer).count()
    }

    /// The slots at `epoch + 1`: `slots` with each receive's offset holding what arrived
    /// for it (`arrived[j]` for `receives[j]`).
    pub fn next_slots(&self, slots: &[GlobalId], arrived: &[GlobalId]) -> Vec<GlobalId> {
        let mut next = slots.to_vec();
        for (r, &id) in self.receives.iter().zip(arrived) {
            next[r.offset as usize] = id;
        }
        next
    }
}

/// The whole job's step: every rank's slots after it, and every real move
/// `(sample, from, to)`.
pub struct AllStep<T> {
    pub next: Vec<Vec<T>>,
    pub moves: Vec<(T, Rank, Rank)>,
}

/// The permutations of one epoch's step: `ρ` for both chunk lengths (tweaked per rank) and
/// `σ` (tweaked per slot), one base per host under node scope.
struct Keys {
    pick: [KeyedPermutation; 2],
    base_len: u64,
    route: Vec<KeyedPermutation>,
    k: u64,
}

impl LocalPlan {
    /// The global-scope plan (`layout` `None`) or the node-scope one.
    pub fn new(params: LocalParams, layout: Option<Arc<HostLayout>>) -> LocalPlan {
        let mut index = Vec::new();
        if let Some(layout) = &layout {
            index = vec![0; params.world as usize];
            for group in layout.groups() {
                for (j, &r) in group.iter().enumerate() {
                    index[r as usize] = j as u32;
                }
            }
        }
        LocalPlan {
            params,
            layout,
            index,
        }
    }

    pub fn params(&self) -> &LocalParams {
        &self.params
    }

    /// `π`: the sample id dealt to each position at epoch 0.
    fn deal(&self) -> KeyedPermutation {
        KeyedPermutation::new(self.params.samples, self.params.seed, DOMAIN_DEAL, 0, 0)
    }

    /// `rank`'s slots at epoch 0 (chunk offset -> sample id).
    pub fn initial_slots(&self, rank: Rank) -> Vec<GlobalId> {
        let deal = self.deal();
        self.params.chunk(rank).map(|p| deal.apply(p)).collect()
    }

    fn keys(&self, epoch: u64) -> Keys {
        let (p, seed) = (&self.params, self.params.seed);
        let base_len = p.samples / u64::from(p.world);
        let pick =
            [base_len, base_len + 1].map(|n| KeyedPermutation::new(n, seed, DOMAIN_PICK, epoch, n));
        let route = match &self.layout {
            None => vec![KeyedPermutation::new(
                u64::from(p.world),
                seed,
                DOMAIN_ROUTE,
                epoch,
                0,
            )],
            Some(layout) => (layout.groups().iter().enumerate())
                .map(|(g, group)| {
                    KeyedPermutation::new(group.len() as u64, seed, DOMAIN_ROUTE, epoch, g as u64)
                })
                .collect(),
        };
        Keys {
            pick,
            base_len,
            route,
            k: p.exchange_count(),
        }
    }

    /// `ρ_{e,rank}`: the permutation of `rank`'s chunk offsets.
    fn pick(&self, keys: &Keys, rank: Rank) -> KeyedPermutation {
        let len = self.params.chunk(rank);
        let base = &keys.pick[usize::from(len.end - len.start != keys.base_len)];
        base.tweaked(u64::from(rank))
    }

    /// `σ_{e,slot}(rank)`, or its inverse.
    fn route(&self, keys: &Keys, slot: u64, rank: Rank, inverse: bool) -> Rank {
        let step = |perm: &KeyedPermutation, x: u64| {
            let perm = perm.tweaked(slot);
            if inverse {
                perm.invert(x)
            } else {
                perm.apply(x)
            }
        };
        match &self.layout {
            None => step(&keys.route[0], u64::from(rank)) as Rank,
            Some(layout) => {
                let g = layout.host_of(rank) as usize;
                let j = step(&keys.route[g], u64::from(self.index[rank as usize]));
                layout.groups()[g][j as usize]
            }
        }
    }

    /// What `me`, holding `slots` at `epoch`, sends and receives into `epoch + 1`. O(k).
    pub fn step<T: Copy + Into<GlobalId>>(&self, epoch: u64, me: Rank, slots: &[T]) -> LocalStep {
        let keys = self.keys(epoch);
        let (mut sends, mut receives) = (Vec::new(), Vec::new());
        for (slot, offset, to) in self.outgoing(&keys, me, slots.len() as u64) {
            let sample = slots[offset as usize].into();
            sends.push(Send { slot, sample, to });
            let from = self.route(&keys, slot, me, true);
            receives.push(Receive { slot, from, offset });
        }
        LocalStep {
            epoch,
            sends,
            receives,
        }
    }

    /// `me`'s real moves out: `(slot, chunk offset, to)` in slot order. A rank's send in a
    /// slot and its receive in it use one offset (the arrival takes the place it left).
    fn outgoing(&self, keys: &Keys, me: Rank, len: u64) -> Vec<(u64, u64, Rank)> {
        let rho = self.pick(keys, me);
        (0..keys.k.min(len))
            .filter_map(|slot| {
                let to = self.route(keys, slot, me, false);
                (to != me).then(|| (slot, rho.invert(slot), to))
            })
            .collect()
    }

    /// Where `receive`'s sample sat at `epoch` (in its sender's chunk).
    pub fn source(&self, epoch: u64, receive: &Receive) -> u64 {
        let keys = self.keys(epoch);
        self.params.chunk(receive.from).start + self.pick(&keys, receive.from).invert(receive.slot)
    }

    /// `τ_epoch⁻¹`: the position whose sample moves to position `q` in the step out of
    /// `epoch`.
    pub fn back(&self, epoch: u64, q: u64) -> u64 {
        self.back_with(&self.keys(epoch), q)
    }

    fn back_with(&self, keys: &Keys, q: u64) -> u64 {
        let rank = self.params.chunk_of(q);
        let chunk = self.params.chunk(rank);
        let slot = self.pick(keys, rank).apply(q - chunk.start);
        if slot >= keys.k {
            return q;
        }
        let from = self.route(keys, slot, rank, true);
        if from == rank {
            return q;
        }
        self.params.chunk(from).start + self.pick(keys, from).invert(slot)
    }

    /// The sample at position `p` in `epoch`: walks back to epoch 0. O(epoch).
    pub fn id_at(&self, epoch: u64, p: u64) -> GlobalId {
        self.ids_at(epoch, &[p], 1)[0]
    }

    /// `rank`'s slots at `epoch`, from nothing but the plan: every position of its chunk
    /// walked back to epoch 0. O(share · epoch), on up to `threads` threads.
    pub fn slots_at(&self, epoch: u64, rank: Rank, threads: usize) -> Vec<GlobalId> {
        let chunk: Vec<u64> = self.params.chunk(rank).collect();
        self.ids_at(epoch, &chunk, threads)
    }

    /// The samples at `positions` in `epoch` (how a receiver names what arrives without
    /// its sender's share). O(len · epoch), on up to `threads` threads.
    pub fn ids_at(&self, epoch: u64, positions: &[u64], threads: usize) -> Vec<GlobalId> {
        let keys: Vec<Keys> = (0..epoch).map(|e| self.keys(e)).collect();
        let deal = self.deal();
        let mut ids = positions.to_vec();
        let per = ids.len().div_ceil(threads.max(1)).max(1);
        std::thread::scope(|s| {
            for part in ids.chunks_mut(per) {
                let (keys, deal) = (&keys, &deal);
                s.spawn(move || {
                    for p in part.iter_mut() {
                        let at = keys.iter().rev().fold(*p, |q, k| self.back_with(k, q));
                        *p = deal.apply(at);
                    }
                });
            }
        });
        ids
    }

    /// Every rank's slots at `epoch + 1` from every rank's at `epoch` (the whole job:
    /// O(N); for tests, and the plans that need the whole job: elastic eras, the partial
    /// cache's planner, equal shares).
    pub fn step_all<T: Copy>(&self, epoch: u64, slots: &[Vec<T>]) -> AllStep<T> {
        let keys = self.keys(epoch);
        let mut next = slots.to_vec();
        let mut moves = Vec::new();
        for (me, share) in slots.iter().enumerate() {
            for (slot, offset, to) in self.outgoing(&keys, me as Rank, share.len() as u64) {
                let there = self.pick(&keys, to).invert(slot);
                next[to as usize][there as usize] = share[offset as usize];
                moves.push((share[offset as usize], me as Rank, to));
            }
        }
        AllStep { next, moves }
    }
}
