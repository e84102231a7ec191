//! Algorithm 1 on positions: the plan any rank computes for itself, in O(share) per epoch,
//! without anyone else's share.
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
const DOMAIN_REMAP: u64 = 14;

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
    /// An era after an elastic restart: the remap into it and the plan of the era before
    /// it, where a walk back goes on ([`LocalPlan::after`]). `None` for the first era.
    before: Option<Arc<Before>>,
}

/// Where an era's walk back continues: across its remap, into the era before.
#[derive(Clone, Debug)]
struct Before {
    rechunk: Rechunk,
    plan: LocalPlan,
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
            before: None,
        }
    }

    /// This plan as the era that starts at `epoch` after `previous`'s (an elastic restart:
    /// the world changed from `previous`'s to this one's, the samples did not). A walk back
    /// from this era crosses the remap ([`Rechunk`]) into `previous`.
    pub fn after(mut self, epoch: u64, previous: LocalPlan) -> LocalPlan {
        let rechunk = Rechunk::new(previous.params, self.params, epoch);
        self.before = Some(Arc::new(Before {
            rechunk,
            plan: previous,
        }));
        self
    }

    /// The epoch this plan's era starts at (0 for the first era).
    pub fn origin(&self) -> u64 {
        self.before.as_ref().map_or(0, |b| b.rechunk.epoch)
    }

    /// `(start epoch, world)` of every era up to this one, oldest first.
    pub fn eras(&self) -> Vec<(u64, u32)> {
        let mut eras = match &self.before {
            Some(b) => b.plan.eras(),
            None => Vec::new(),
        };
        eras.push((self.origin(), self.params.world));
        eras
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
    /// its sender's share). O(len · epoch), on up to `threads` threads. Earlier eras are
    /// walked through their remaps (O(log M) each); an `epoch` before this era's
    /// [`LocalPlan::origin`] is the plain plan's for this world (as if it had run from
    /// epoch 0: what the fit estimate simulates).
    pub fn ids_at(&self, epoch: u64, positions: &[u64], threads: usize) -> Vec<GlobalId> {
        let before = self.before.as_deref().filter(|b| epoch >= b.rechunk.epoch);
        let origin = before.map_or(0, |b| b.rechunk.epoch);
        let keys: Vec<Keys> = (origin..epoch).map(|e| self.keys(e)).collect();
        let deal = self.deal();
        let mut ids = positions.to_vec();
        let per = ids.len().div_ceil(threads.max(1)).max(1);
        std::thread::scope(|s| {
            for part in ids.chunks_mut(per) {
                let (keys, deal) = (&keys, &deal);
                s.spawn(move || {
                    for p in part.iter_mut() {
                        let at = keys.iter().rev().fold(*p, |q, k| self.back_with(k, q));
                        *p = match before {
                            None => deal.apply(at),
                            Some(b) => b.rechunk.old_of(at),
                        };
                    }
                });
            }
        });
        match before {
            None => ids,
            // The positions of the era before, at the epoch this one starts.
            Some(b) => b.plan.ids_at(origin, &ids, threads),
        }
    }

    /// Every rank's slots at `epoch + 1` from every rank's at `epoch` (the whole job:
    /// O(N); for tests, and the plans that need the whole job: the whole job's elastic
    /// walk, the partial cache's planner, equal shares).
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

/// The remap of positions where an elastic job's world changes from `old.world` to
/// `new.world` ranks at `epoch` (same samples): which old position's sample each new
/// position holds. See `plan::elastic` for why it is this one.
///
/// New rank `r < old.world` keeps its old chunk's first `min(old_len, new_len)` offsets
/// (same offsets); the other new positions (the ranks that grew, the new ranks) are dealt,
/// through a keyed permutation of the deal index, the *pool*: every old position not kept
/// (a survivor's offsets from its new length on, every removed rank's chunk), in old
/// position order. Prefix sums over the ranks make [`Rechunk::old_of`] O(log M) in O(M)
/// memory, so a rank walks its positions back across the change without anyone's share.
#[derive(Clone, Debug)]
pub struct Rechunk {
    old: LocalParams,
    new: LocalParams,
    epoch: u64,
    /// Pool positions in the old ranks before each old rank (`old.world + 1` entries).
    pool_before: Vec<u64>,
    /// Dealt positions in the new ranks before each new rank (`new.world + 1` entries).
    dealt_before: Vec<u64>,
    /// Dealt index -> pool index.
    deal: KeyedPermutation,
}

impl Rechunk {
    /// The remap from `old`'s chunks to `new`'s (`samples` must agree) at `epoch`.
    pub fn new(old: LocalParams, new: LocalParams, epoch: u64) -> Rechunk {
        debug_assert_eq!(old.samples, new.samples, "a remap keeps the samples");
        let prefix = |world: u32, params: &LocalParams| {
            let mut before = vec![0u64];
            for r in 0..world {
                let len = params.chunk(r).end - params.chunk(r).start;
                let kept = kept_of(&old, &new, r);
                before.push(before[before.len() - 1] + len - kept);
            }
            before
        };
        let pool_before = prefix(old.world, &old);
        let dealt_before = prefix(new.world, &new);
        let pool = pool_before[pool_before.len() - 1];
        let key = (u64::from(old.world) << 32) | u64::from(new.world);
        let deal = KeyedPermutation::new(pool, new.seed, DOMAIN_REMAP, epoch, key);
        Rechunk {
            old,
            new,
            epoch,
            pool_before,
            dealt_before,
            deal,
        }
    }

    /// Samples that stay with the rank of the same number.
    pub fn kept(&self) -> u64 {
        self.old.samples - self.pool_before[self.pool_before.len() - 1]
    }

    /// The old position whose sample new position `q` holds after the change. O(log M).
    pub fn old_of(&self, q: u64) -> u64 {
        let r = self.new.chunk_of(q);
        let offset = q - self.new.chunk(r).start;
        let kept = kept_of(&self.old, &self.new, r);
        if offset < kept {
            return self.old.chunk(r).start + offset;
        }
        let i = self
            .deal
            .apply(self.dealt_before[r as usize] + offset - kept);
        // The old rank whose pool part holds pool index `i`.
        let s = self.pool_before.partition_point(|&b| b <= i) - 1;
        self.old.chunk(s as Rank).start + kept_of(&self.old, &self.new, s as Rank) + i
            - self.pool_before[s]
    }
}

/// Offsets rank `r` keeps across a change from `old` to `new`: the most it can.
fn kept_of(old: &LocalParams, new: &LocalParams, r: Rank) -> u64 {
    if r >= old.world || r >= new.world {
        return 0;
    }
    let len = |p: &LocalParams| p.chunk(r).end - p.chunk(r).start;
    len(old).min(len(new))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(samples: u64, world: u32) -> LocalParams {
        LocalParams::new(samples, world, 0.5, 3).unwrap()
    }

    /// Every new position takes a distinct old one; survivors keep their first offsets;
    /// the rest comes from the pool (old positions no survivor kept).
    #[test]
    fn a_rechunk_is_a_bijection_that_keeps_what_survivors_can() {
        for (n, m, m2) in [
            (10, 2, 3),
            (103, 4, 2),
            (103, 2, 7),
            (7, 3, 9),
            (0, 2, 3),
            (64, 8, 8),
        ] {
            let (old, new) = (params(n, m), params(n, m2));
            let re = Rechunk::new(old, new, 5);
            let mut seen = vec![false; n as usize];
            let mut kept = 0;
            for r in 0..m2 {
                for q in new.chunk(r) {
                    let p = re.old_of(q);
                    assert!(!std::mem::replace(&mut seen[p as usize], true), "{p} twice");
                    let keep = kept_of(&old, &new, r);
                    let offset = q - new.chunk(r).start;
                    if offset < keep {
                        assert_eq!(p, old.chunk(r).start + offset);
                        kept += 1;
                    } else {
                        let s = old.chunk_of(p);
                        assert!(
                            p - old.chunk(s).start >= kept_of(&old, &new, s),
                            "{p} was kept"
                        );
                    }
                }
            }
            assert!(seen.iter().all(|&s| s), "{n} {m} -> {m2}");
            assert_eq!(re.kept(), kept);
        }
    }
}
