//! Equal shares (`--equal-shares drop`): every rank's view of an epoch holds exactly
//! `floor(N/M)` samples, so DDP's ranks run the same number of steps and need no `join()`.
//!
//! The plan underneath is unchanged: shares still differ by one (the first `N mod M` ranks
//! of epoch 0's deal hold one more, and an exchange keeps every share's size), every sample
//! is still staged and exchanged as before; only the view leaves samples out. A rank whose
//! share is longer than `floor(N/M)` leaves out the difference (one sample, in a
//! partial-local plan), chosen by this rule:
//!
//! **Least left out first.** In epoch `e`, a rank leaves out the samples of its share that
//! were left out the fewest times in epochs `0..e` (by any rank); among those, the smallest
//! by a fixed seeded key of the sample id (a permutation of the ids drawn from `--seed`).
//!
//! What that guarantees:
//! - a rank never leaves out a sample again while it holds one that was left out fewer times
//!   (`no_sample_is_left_out_again_before_its_peers`, a property test over random plans);
//! - where shares do not change (`--fraction 0`), each longer share's samples are left out
//!   in turn, in the key's order: none twice before every other sample of that share once;
//! - with an exchange, samples move through the longer shares and are left out in the same
//!   least-first order as they pass; every epoch leaves out exactly `N mod M` samples.
//!
//! The literal promise "no sample of the dataset is left out twice before every other one was
//! left out once" cannot hold with the plan unchanged: a view can show only samples its rank
//! holds, and a rank whose share is `floor(N/M)` long must show all of it, so only the
//! samples in the longer shares can be left out in an epoch (with `--fraction 0`, or under
//! `--exchange-scope node` on a host without a longer share, some samples never are). The
//! rule above is the strongest form of the promise within that limit.
//!
//! Each rank computes its own choice from the plan alone: the counts are replayed from
//! epoch 0 with the plan's steps (no communication; a restart at epoch `e` replays `e`
//! steps once, then one step per epoch). A job resized on the way (an elastic restart) is
//! replayed through its history of world sizes, each epoch with its own `floor(N/M)`.

use std::sync::{Arc, Mutex};

use super::elastic::ElasticPlan;
use super::{EpochShares, Plan, Rank, SampleId};

/// The domain of the seeded key that breaks ties.
const DOMAIN_EQUAL: u64 = 0x6571_7561_6c00_0000; // "equal"

/// The fixed seeded key of sample `id` (splitmix64 of the seed and id): a permutation of
/// the ids, the same in every build.
fn key(seed: u64, id: SampleId) -> u64 {
    let mut z = seed ^ DOMAIN_EQUAL ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The samples of `share` left out so that `keep` remain: those left out the fewest times
/// so far (`counts`), ties by the seeded key. Sorted by id.
pub fn left_out(share: &[SampleId], keep: usize, counts: &[u32], seed: u64) -> Vec<SampleId> {
    let drop = share.len().saturating_sub(keep);
    let mut out = match drop {
        0 => Vec::new(),
        1 => {
            let by = |&&s: &&SampleId| (counts[s as usize], key(seed, s));
            share.iter().min_by_key(by).into_iter().copied().collect()
        }
        _ => {
            let mut all = share.to_vec();
            all.select_nth_unstable_by_key(drop - 1, |&s| (counts[s as usize], key(seed, s)));
            all.truncate(drop);
            all
        }
    };
    out.sort_unstable();
    out
}

/// The counts of left-out samples, replayed with the plan from epoch 0.
#[derive(Clone, Debug)]
pub struct Replay {
    /// Times each sample was left out in epochs before `shares.epoch`.
    pub counts: Vec<u32>,
    pub shares: EpochShares,
}

impl Replay {
    pub fn new(plan: &Plan) -> Replay {
        Replay {
            counts: vec![0; plan.params().samples as usize],
            shares: plan.initial(),
        }
    }

    /// What each rank leaves out in the replay's epoch.
    pub fn left_out_all(&self, plan: &Plan) -> Vec<Vec<SampleId>> {
        let keep = view_size(plan);
        let seed = plan.params().seed;
        let shares = &self.shares.shares;
        shares
            .iter()
            .map(|s| left_out(s, keep, &self.counts, seed))
            .collect()
    }

    /// Moves the replay on to `epoch` (back to epoch 0 first if it is past it).
    pub fn advance_to(&mut self, plan: &Plan, epoch: u64) {
        if self.shares.epoch > epoch {
            *self = Replay::new(plan);
        }
        while self.shares.epoch < epoch {
            for id in self.left_out_all(plan).into_iter().flatten() {
                self.counts[id as usize] += 1;
            }
            self.shares = plan.step(&self.shares).next;
        }
    }

    /// A replay of a job resized on the way ([`ElasticPlan`]), from epoch 0.
    pub fn of_history(elastic: &ElasticPlan) -> Replay {
        let shares = elastic.shares_at(0);
        Replay {
            counts: vec![0; elastic.plan_at(0).params().samples as usize],
            shares,
        }
    }

    /// [`Replay::advance_to`] through the job's real history: each epoch's left-out samples
    /// counted with the world size of its era (`floor(N/M)` of that era), the shares
    /// remapped where the world changed. So the rule's counts after an elastic restart are
    /// those of the epochs that ran, not of a job that always had the new world size.
    pub fn advance_through(&mut self, elastic: &ElasticPlan, epoch: u64) {
        if self.shares.epoch > epoch {
            *self = Replay::of_history(elastic);
        }
        while self.shares.epoch < epoch {
            let plan = elastic.plan_at(self.shares.epoch);
            for id in self.left_out_all(plan).into_iter().flatten() {
                self.counts[id as usize] += 1;
            }
            self.shares = elastic.step_from(&self.shares);
        }
    }
}

/// The samples every view of an epoch holds: `floor(N/M)`.
pub fn view_size(plan: &Plan) -> usize {
    (plan.params().samples / u64::from(plan.params().world)) as usize
}

/// One rank's equal-shares view: what it leaves out of the current epoch's share.
#[derive(Debug)]
pub struct EqualShares {
    plan: Plan,
    /// The job's history when it was resized (the counts are replayed through it).
    history: Option<ElasticPlan>,
    rank: Rank,
    state: Mutex<(Replay, Option<LeftOut>)>,
}

/// What a rank leaves out of one epoch: the epoch, and the ids (sorted).
type LeftOut = (u64, Arc<Vec<SampleId>>);

impl EqualShares {
    pub fn new(plan: Plan, rank: Rank) -> EqualShares {
        let replay = Replay::new(&plan);
        EqualShares {
            plan,
            history: None,
            rank,
            state: Mutex::new((replay, None)),
        }
    }

    /// As [`EqualShares::new`] for a job resized on the way: `elastic`'s last era is the
    /// plan it follows now, and its history is replayed for the counts.
    pub fn of_history(elastic: ElasticPlan, rank: Rank) -> EqualShares {
        let replay = Replay::of_history(&elastic);
        EqualShares {
            plan: elastic.current().clone(),
            history: Some(elastic),
            rank,
            state: Mutex::new((replay, None)),
        }
    }

    /// The samples every view holds.
    pub fn view_size(&self) -> usize {
        view_size(&self.plan)
    }

    /// What this rank leaves out of `cur` (its epoch's shares), sorted by id.
    pub fn left_out(&self, cur: &EpochShares) -> Arc<Vec<SampleId>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((epoch, left)) = &state.1
            && *epoch == cur.epoch
        {
            return left.clone();
        }
        match &self.history {
            Some(elastic) => state.0.advance_through(elastic, cur.epoch),
            None => state.0.advance_to(&self.plan, cur.epoch),
        }
        let share = cur.share(self.rank);
        let seed = self.plan.params().seed;
        let left = Arc::new(left_out(share, self.view_size(), &state.0.counts, seed));
        state.1 = Some((cur.epoch, left.clone()));
        left
    }
}

/// `share` without the sorted ids `left`: position `skip` of the visible ids on, as an
/// iterator that costs nothing per skipped id.
pub fn visible_from<'a>(
    share: &'a [SampleId],
    left: &'a [SampleId],
    skip: usize,
) -> impl Iterator<Item = SampleId> + 'a {
    // The raw position of visible position `skip`: each left-out id before it moves it on.
    let mut raw = skip;
    loop {
        let hidden = left
            .iter()
            .filter(|&&l| share[..raw.min(share.len())].binary_search(&l).is_ok())
            .count();
        if raw == skip + hidden || raw >= share.len() {
            break;
        }
        raw = skip + hidden;
    }
    let rest = share.get(raw..).unwrap_or_default();
    rest.iter()
        .copied()
        .filter(move |id| left.binary_search(id).is_err())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlanParams;

    fn plan(samples: u64, world: u32, fraction: f64, seed: u64) -> Plan {
        Plan::new(PlanParams {
            samples,
            world,
            fraction,
            seed,
        })
        .unwrap()
    }

    #[test]
    fn without_an_exchange_each_longer_share_is_left_out_in_turn() {
        let p = plan(23, 4, 0.0, 5);
        let mut replay = Replay::new(&p);
        let share0: Vec<_> = p.initial().share(0).to_vec();
        assert_eq!(share0.len(), 6);
        let mut seen = Vec::new();
        for epoch in 0..12 {
            replay.advance_to(&p, epoch);
            let left = replay.left_out_all(&p);
            assert_eq!(left.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 1, 0]);
            seen.push(left[0][0]);
        }
        // Epochs 0..6 leave out each of rank 0's six samples once, then the same order again.
        let mut first: Vec<_> = seen[..6].to_vec();
        first.sort_unstable();
        assert_eq!(first, share0);
        assert_eq!(seen[..6], seen[6..]);
    }

    #[test]
    fn visible_ids_skip_without_walking() {
        let share = [1, 3, 5, 7, 9, 11];
        let all = |left: &[u64], skip| visible_from(&share, left, skip).collect::<Vec<_>>();
        assert_eq!(all(&[5], 0), [1, 3, 7, 9, 11]);
        assert_eq!(all(&[5], 2), [7, 9, 11]);
        assert_eq!(all(&[1], 0), [3, 5, 7, 9, 11]);
        assert_eq!(all(&[1], 1), [5, 7, 9, 11]);
        assert_eq!(all(&[11], 4), [9]);
        assert_eq!(all(&[11], 5), [] as [u64; 0]);
        assert_eq!(all(&[3, 9], 2), [7, 11]);
        assert_eq!(all(&[], 7), [] as [u64; 0]);
    }

    /// A job of 4 ranks resized to 3 at epoch 2 and to 5 at epoch 4: the replay walks the
    /// real shares (those `ElasticPlan::shares_at` gives) and each epoch leaves out `N mod M`
    /// of its own era, from the longer shares.
    #[test]
    fn a_resized_job_is_replayed_through_its_history() {
        use crate::plan::elastic::{ElasticPlan, History};
        let history = History::new(4).resized(2, 3).unwrap();
        let history = history.resized(4, 5).unwrap();
        let params = PlanParams {
            samples: 39,
            world: 0,
            fraction: 0.5,
            seed: 3,
        };
        let elastic = ElasticPlan::new(params, history).unwrap();
        let mut replay = Replay::of_history(&elastic);
        for epoch in 0..7 {
            replay.advance_through(&elastic, epoch);
            assert_eq!(replay.shares, elastic.shares_at(epoch), "epoch {epoch}");
            let plan = elastic.plan_at(epoch);
            let world = plan.params().world;
            assert_eq!(world, [4, 4, 3, 3, 5, 5, 5][epoch as usize]);
            let left = replay.left_out_all(plan);
            assert_eq!(left.iter().flatten().count() as u32, 39 % world);
            for (r, l) in left.iter().enumerate() {
                let share = replay.shares.share(r as Rank);
                assert_eq!(share.len() - l.len(), (39 / world) as usize, "rank {r}");
            }
        }
        let total: u32 = replay.counts.iter().sum();
        // 39 mod 4, twice; 39 mod 3 = 0, twice; 39 mod 5, twice.
        assert_eq!(total, 2 * 3 + 2 * 4, "epochs 0..6 counted");
    }
}
