//! Elastic restarts: a job that goes on at epoch E with another number of ranks.
//!
//! Users change node counts between job allocations; the shuffle must go on from where the
//! job was, not start over. Still pure and deterministic: ownership at any epoch is a
//! function of `(samples, fraction, seed)` and the job's [`History`] of world sizes, so every
//! run with the same history gets the same shares, and a later restart at epoch E2 finds
//! them by walking the plan for M over `0..E`, remapping to M', then walking the plan for M'
//! over `E..E2` ([`ElasticPlan::shares_at`]).
//!
//! # The remap ([`remap`])
//! New rank `r` "is" old rank `r`: it keeps what old rank `r` held, up to its new share's
//! size (`N / M'`, the first `N % M'` ranks one more, as in epoch 0). What does not fit, and
//! the whole share of every old rank `>= M'` (the removed ranks' orphaned shares), goes into
//! one pool, which a stream seeded by `(seed, E, M')` shuffles and deals in rank order to
//! the ranks still short: the new ranks `>= M` (whose samples therefore come from the removed
//! ranks and the survivors' surplus) and survivors that grew. Which surplus samples a
//! survivor gives up is drawn from its own stream keyed by `(seed, E, M', r)`.
//!
//! Only what balance requires moves: a survivor keeps `min(old, new)` samples, which is the
//! most any remap that keeps rank numbers can keep (shares sizes never increase with the
//! rank, in epoch 0 and after every remap, so handing the extra samples to the lowest ranks
//! pairs big with big). Growing `M -> M'` moves about `N (M' - M) / M'` samples, shrinking
//! about `N (M - M') / M`.
//!
//! # What it does to the shuffle
//! Partial-local shuffling goes on unchanged after E (the plan for M' from E's shares;
//! its exchange count `floor(Q N / M')` is what every rank can send, since shares stay
//! balanced). The remap itself is a one-off random reassignment of the samples that must
//! move: a survivor's share stays as random as it was (a random subset of the dataset) plus
//! a random part of the pool, so no rank ends up with a biased share; but the remap is not a
//! global reshuffle, and a survivor's view overlaps its previous epoch more than a regular
//! step's would (it kept up to all of its share instead of `1 - Q`). Training sees one epoch
//! whose shares were reshuffled less (shrinking) or more (growing) than usual.
//!
//! # Node scope
//! `--exchange-scope node` fixes each host's set of samples at epoch 0 and never moves a
//! sample between hosts. A resize must break one of those promises (removed ranks' samples
//! must go somewhere, new hosts need samples), so the daemon refuses to resize a node-scope
//! cache; histories here are global-scope only.

use serde::{Deserialize, Serialize};

use super::{
    EpochShares, Plan, PlanError, PlanParams, Rank, SampleId, Transfer, partial_shuffle, shuffle,
    stream,
};

/// Surplus picks of a survivor, and the deal of the pool: independent of the plan's streams.
const DOMAIN_SURPLUS: u64 = 4;
const DOMAIN_DEAL: u64 = 5;

/// From epoch `epoch` on, the job ran on `world` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Era {
    pub epoch: u64,
    pub world: u32,
}

/// The world sizes a job ran with: the first era starts at epoch 0, every later one at the
/// epoch the job was restarted at with another number of ranks (several may start at one
/// epoch: a job resized twice before it advanced).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct History {
    eras: Vec<Era>,
}

impl History {
    /// A job that always ran on `world` ranks.
    pub fn new(world: u32) -> History {
        History {
            eras: vec![Era { epoch: 0, world }],
        }
    }

    /// A recorded history, checked: starts at epoch 0, epochs never decrease, worlds are at
    /// least 1 and each era changes the world size.
    pub fn from_eras(eras: Vec<Era>) -> Result<History, PlanError> {
        let bad = |why: &str| Err(PlanError::History(format!("{why}: {eras:?}")));
        match eras.first() {
            None => return bad("no era"),
            Some(first) if first.epoch != 0 => return bad("the first era must start at epoch 0"),
            _ => {}
        }
        if eras.iter().any(|e| e.world == 0) {
            return bad("a world of 0 ranks");
        }
        if eras
            .windows(2)
            .any(|w| w[1].epoch < w[0].epoch || w[1].world == w[0].world)
        {
            return bad("eras out of order or repeating a world size");
        }
        Ok(History { eras })
    }

    pub fn eras(&self) -> &[Era] {
        &self.eras
    }

    /// The world size now (of the last era).
    pub fn world(&self) -> u32 {
        self.eras.last().expect("never empty").world
    }

    /// Whether the world size ever changed.
    pub(crate) fn is_resized(&self) -> bool {
        self.eras.len() > 1
    }

    /// The epoch the last era started at (0 if never resized).
    pub fn last_change(&self) -> u64 {
        self.eras.last().expect("never empty").epoch
    }

    /// This history continued on `world` ranks from `epoch` (unchanged if `world` is the
    /// current world size). `epoch` may not be before the last change.
    pub fn resized(&self, epoch: u64, world: u32) -> Result<History, PlanError> {
        if world == 0 {
            return Err(PlanError::EmptyWorld);
        }
        if epoch < self.last_change() {
            return Err(PlanError::History(format!(
                "cannot resize at epoch {epoch}, before the last change at epoch {}",
                self.last_change()
            )));
        }
        let mut eras = self.eras.clone();
        if world != self.world() {
            eras.push(Era { epoch, world });
        }
        Ok(History { eras })
    }

    /// Whether `other` is this history, possibly continued by more eras.
    pub(crate) fn is_prefix_of(&self, other: &History) -> bool {
        other.eras.starts_with(&self.eras)
    }

    /// For messages: `"4 ranks, 2 from epoch 3, 3 from epoch 5"`.
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("{} ranks", self.eras[0].world)];
        for e in &self.eras[1..] {
            parts.push(format!("{} from epoch {}", e.world, e.epoch));
        }
        parts.join(", ")
    }
}

/// The result of a remap: ownership under the new world and the samples that change owner.
#[derive(Clone, Debug)]
pub struct Remap {
    /// Shares of the new world at the same epoch.
    pub next: EpochShares,
    /// Every sample that changes owner, `from` an old rank (possibly one that no longer
    /// exists) `to` a new one, sorted by `(from, to, sample)`.
    pub transfers: Vec<Transfer>,
    /// Samples that stay with the rank of the same number.
    pub kept: u64,
}

/// Re-deals `old` (any shares, balanced or not) over `world` ranks; see the module docs.
pub fn remap(old: &EpochShares, world: u32, seed: u64) -> Remap {
    let m = world as usize;
    let n: usize = old.shares.iter().map(Vec::len).sum();
    let size = |r: usize| n / m + usize::from(r < n % m);
    let mut next: Vec<Vec<SampleId>> = vec![Vec::new(); m];
    let mut pool: Vec<(SampleId, Rank)> = Vec::new();
    let mut kept = 0u64;
    for (r, share) in old.shares.iter().enumerate() {
        if r >= m {
            pool.extend(share.iter().map(|&s| (s, r as Rank)));
            continue;
        }
        let surplus = share.len().saturating_sub(size(r));
        let mut mine = share.clone();
        if surplus > 0 {
            let key = (u64::from(world) << 32) | r as u64;
            let mut rng = stream(seed, DOMAIN_SURPLUS, old.epoch, key);
            partial_shuffle(&mut mine, surplus, &mut rng);
            pool.extend(mine.drain(..surplus).map(|s| (s, r as Rank)));
            mine.sort_unstable();
        }
        kept += mine.len() as u64;
        next[r] = mine;
    }
    shuffle(
        &mut pool,
        &mut stream(seed, DOMAIN_DEAL, old.epoch, u64::from(world)),
    );
    let mut dealt = pool.into_iter();
    let mut transfers = Vec::new();
    let mut slots = kept_slots(old, &next);
    for (r, share) in next.iter_mut().enumerate() {
        while share.len() < size(r) {
            let (sample, from) = dealt.next().expect("the pool holds every missing sample");
            share.push(sample);
            slots[r].push(sample);
            transfers.push(Transfer {
                sample,
                from,
                to: r as Rank,
            });
        }
    }
    transfers.sort_unstable_by_key(|t| (t.from, t.to, t.sample));
    Remap {
        next: EpochShares::from_slots(old.epoch, slots),
        transfers,
        kept,
    }
}

/// The new ranks' slots before the deal: what each survivor kept, in its old slot order
/// (the dealt samples go after them, in the deal's order).
fn kept_slots(old: &EpochShares, kept: &[Vec<SampleId>]) -> Vec<Vec<SampleId>> {
    (kept.iter().enumerate())
        .map(|(r, mine)| match old.slots.get(r) {
            Some(slots) if slots.len() == old.shares[r].len() => (slots.iter())
                .copied()
                .filter(|s| mine.binary_search(s).is_ok())
                .collect(),
            _ => mine.clone(),
        })
        .collect()
}

/// The plan of a job with a [`History`]: one [`Plan`] per era, joined by [`remap`]s.
#[derive(Clone, Debug)]
pub struct ElasticPlan {
    /// The plan of every era, in order.
    eras: Vec<(Era, Plan)>,
    history: History,
}

impl ElasticPlan {
    /// `params.world` is ignored: each era's world comes from `history`. Global scope only
    /// (see the module docs).
    pub fn new(params: PlanParams, history: History) -> Result<ElasticPlan, PlanError> {
        let eras = history
            .eras()
            .iter()
            .map(|&era| {
                let plan = Plan::new(PlanParams {
                    world: era.world,
                    ..params
                })?
                .stepping_from(era.epoch);
                Ok((era, plan))
            })
            .collect::<Result<_, PlanError>>()?;
        Ok(ElasticPlan { eras, history })
    }

    pub fn history(&self) -> &History {
        &self.history
    }

    /// The plan of the last era: what the job follows from now on.
    pub(crate) fn current(&self) -> &Plan {
        &self.eras.last().expect("never empty").1
    }

    /// The plan of the era `epoch` is in (the last one started at or before it).
    pub fn plan_at(&self, epoch: u64) -> &Plan {
        let i = self.eras.iter().rposition(|(era, _)| era.epoch <= epoch);
        &self.eras[i.unwrap_or(0)].1
    }

    /// The shares of the epoch after `cur`'s under this history: `cur`'s era steps, then the
    /// eras that start at the new epoch remap, as [`ElasticPlan::shares_at`] walks. One
    /// step at a time for who walks every epoch (`plan::equal`'s replay).
    pub fn step_from(&self, cur: &EpochShares) -> EpochShares {
        let mut next = self.plan_at(cur.epoch).step(cur).next;
        for (era, plan) in &self.eras[1..] {
            if era.epoch == next.epoch {
                next = remap(&next, era.world, plan.params().seed).next;
            }
        }
        next
    }

    /// Ownership at `epoch` under this history: eras that start after `epoch` are ignored,
    /// and at an epoch where the world changed, the shares are those after the change.
    pub fn shares_at(&self, epoch: u64) -> EpochShares {
        self.walk(epoch).0
    }

    /// The world's shares just before the last change into `epoch` (the old ownership a
    /// restart at `epoch` remaps from), if the world changed at `epoch`, with the remap.
    pub fn change_at(&self, epoch: u64) -> Option<(EpochShares, Remap)> {
        let (_, last) = self.walk(epoch);
        last
    }

    /// Walks to `epoch`; also returns the last remap done at `epoch` itself, with the
    /// shares it started from.
    fn walk(&self, epoch: u64) -> (EpochShares, Option<(EpochShares, Remap)>) {
        let mut cur = self.eras[0].1.initial();
        let mut last = None;
        for (i, (era, plan)) in self.eras.iter().enumerate() {
            if era.epoch > epoch {
                break;
            }
            if i > 0 {
                let remap = remap(&cur, era.world, plan.params().seed);
                let before = std::mem::replace(&mut cur, remap.next.clone());
                last = (era.epoch == epoch).then_some((before, remap));
            }
            let end = match self.eras.get(i + 1) {
                Some((next, _)) if next.epoch <= epoch => next.epoch,
                _ => epoch,
            };
            while cur.epoch < end {
                cur = plan.step(&cur).next;
                last = None;
            }
        }
        (cur, last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(samples: u32) -> PlanParams {
        PlanParams {
            samples,
            world: 0,
            fraction: 0.5,
            seed: 11,
        }
    }

    fn eras(list: &[(u64, u32)]) -> History {
        History::from_eras(
            list.iter()
                .map(|&(epoch, world)| Era { epoch, world })
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn known_answer_pins_the_remap_streams() {
        // Changing this output breaks resume of resized caches: bump the cache format instead.
        let plan = ElasticPlan::new(params(10), eras(&[(0, 2), (1, 3)])).unwrap();
        let snapshot = format!("{:?}", plan.shares_at(1).shares);
        assert_eq!(snapshot, KNOWN_ANSWER, "remap output changed");
    }
    const KNOWN_ANSWER: &str = "[[1, 2, 4, 6], [0, 7, 8], [3, 5, 9]]";

    #[test]
    fn without_a_change_it_is_the_plain_plan() {
        let elastic = ElasticPlan::new(params(50), History::new(4)).unwrap();
        let plain = Plan::new(PlanParams {
            world: 4,
            ..params(50)
        })
        .unwrap();
        assert_eq!(elastic.shares_at(5), plain.shares_at(5));
        assert!(elastic.change_at(0).is_none() && elastic.change_at(5).is_none());
    }

    #[test]
    fn shares_before_a_change_are_the_old_worlds() {
        let plan = ElasticPlan::new(params(50), eras(&[(0, 4), (3, 2)])).unwrap();
        let four = ElasticPlan::new(params(50), History::new(4)).unwrap();
        assert_eq!(plan.shares_at(2), four.shares_at(2));
        assert_eq!(plan.shares_at(3).shares.len(), 2);
        let (before, remap) = plan.change_at(3).unwrap();
        assert_eq!(before, four.shares_at(3));
        assert_eq!(remap.next, plan.shares_at(3));
        assert!(plan.change_at(4).is_none());
        assert_eq!(plan.current().params().world, 2);
    }

    #[test]
    fn histories_are_checked() {
        for bad in [
            vec![],
            vec![Era { epoch: 1, world: 2 }],
            vec![Era { epoch: 0, world: 0 }],
            vec![Era { epoch: 0, world: 2 }, Era { epoch: 3, world: 2 }],
            vec![
                Era { epoch: 0, world: 2 },
                Era { epoch: 3, world: 4 },
                Era { epoch: 2, world: 3 },
            ],
        ] {
            assert!(History::from_eras(bad.clone()).is_err(), "{bad:?}");
        }
        let h = History::new(4);
        assert_eq!(h.resized(2, 4).unwrap(), h, "same world: no era");
        let h = h.resized(2, 2).unwrap().resized(2, 3).unwrap();
        assert_eq!(h.describe(), "4 ranks, 2 from epoch 2, 3 from epoch 2");
        assert!(h.resized(1, 5).is_err());
        assert!(History::new(4).is_prefix_of(&h) && !h.is_prefix_of(&History::new(4)));
    }
}
