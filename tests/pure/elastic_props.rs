//! Properties of elastic restarts (the pure remap and the plan over a history of world
//! sizes) over many datasets, seeds and chains of resizes M -> M' -> M'' -> ...

use crate::common::shares::assert_partition;
use proptest::prelude::*;
use shufflefs::plan::elastic::{ElasticPlan, History, remap};
use shufflefs::plan::{EpochShares, PlanParams};

fn assert_balanced(shares: &EpochShares) {
    let sizes: Vec<usize> = shares.shares.iter().map(Vec::len).collect();
    let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
    assert!(max - min <= 1, "unbalanced: {sizes:?}");
    assert!(
        sizes.windows(2).all(|w| w[0] >= w[1]),
        "larger shares first: {sizes:?}"
    );
}

/// A dataset, a seed, Q and a chain of (epochs run, then new world size).
fn job() -> impl Strategy<Value = (PlanParams, u32, Vec<(u64, u32)>)> {
    (
        0u32..400,
        0.0f64..=1.0,
        any::<u64>(),
        1u32..9,
        prop::collection::vec((0u64..3, 1u32..9), 0..4),
    )
        .prop_map(|(samples, fraction, seed, first, changes)| {
            let params = PlanParams {
                samples: samples.into(),
                world: first,
                fraction,
                seed,
            };
            (params, first, changes)
        })
}

/// The history of `first` ranks changed after `gap` more epochs to each world of `changes`.
fn history(first: u32, changes: &[(u64, u32)]) -> History {
    let mut h = History::new(first);
    let mut epoch = 0;
    for &(gap, world) in changes {
        epoch += gap;
        h = h.resized(epoch, world).unwrap();
    }
    h
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// One remap from any balanced shares: a partition, balanced, every move a real move
    /// that the shares show, and survivors keep exactly `min(old, new)` samples — the most a
    /// remap that keeps rank numbers can keep.
    #[test]
    fn remap_is_a_balanced_partition_keeping_the_most(
        (params, first, changes) in job(),
        epochs in 0u64..4,
        world in 1u32..9,
    ) {
        let old = ElasticPlan::new(params, history(first, &changes)).unwrap();
        let epoch = old.history().last_change() + epochs;
        let before = old.shares_at(epoch);
        let r = remap(&before, world, params.seed);
        assert_partition(&r.next, params.samples);
        assert_balanced(&r.next);
        prop_assert_eq!(r.next.epoch, epoch);
        let best: usize = (0..world.min(before.shares.len() as u32) as usize)
            .map(|i| before.shares[i].len().min(r.next.shares[i].len()))
            .sum();
        prop_assert_eq!(r.kept as usize, best);
        prop_assert_eq!(r.kept as usize + r.transfers.len(), params.samples as usize);
        for t in &r.transfers {
            prop_assert_ne!(t.from, t.to);
            prop_assert!(before.shares[t.from as usize].binary_search(&t.sample).is_ok());
            prop_assert!(r.next.share(t.to).binary_search(&t.sample).is_ok());
        }
        // Whatever is not a transfer stayed with the rank of the same number.
        for (i, share) in r.next.shares.iter().enumerate() {
            for s in share {
                let moved = r.transfers.iter().any(|t| t.sample == *s);
                prop_assert!(moved || before.shares[i].binary_search(s).is_ok());
            }
        }
        // Deterministic.
        prop_assert_eq!(remap(&before, world, params.seed).next, r.next);
    }

    /// Over a whole chain M -> M' -> M'' ...: every epoch is a balanced partition among the
    /// world of its era, steps within an era are the plain plan's steps from the era's first
    /// shares, and walking again gives the same shares (the next restart finds them).
    #[test]
    fn chains_partition_every_epoch_and_replay_identically(
        (params, first, changes) in job(),
        after in 0u64..3,
    ) {
        let h = history(first, &changes);
        let plan = ElasticPlan::new(params, h.clone()).unwrap();
        let end = h.last_change() + after;
        let mut prev: Option<EpochShares> = None;
        for epoch in 0..=end {
            let shares = plan.shares_at(epoch);
            prop_assert_eq!(shares.epoch, epoch);
            assert_partition(&shares, params.samples);
            assert_balanced(&shares);
            let world = h.eras().iter().rfind(|e| e.epoch <= epoch).unwrap().world;
            prop_assert_eq!(shares.shares.len(), world as usize);
            if let (Some(prev), None) = (&prev, plan.change_at(epoch)) {
                // No change at this epoch: one step of the current era's plan.
                let era_plan = shufflefs::plan::Plan::new(PlanParams { world, ..params }).unwrap();
                prop_assert_eq!(&era_plan.step(prev).next, &shares);
            }
            prev = Some(shares);
        }
        // Same history, same shares; a history whose next era is later changes nothing before.
        let again = ElasticPlan::new(params, History::from_eras(h.eras().to_vec()).unwrap()).unwrap();
        prop_assert_eq!(again.shares_at(end), plan.shares_at(end));
        let longer = ElasticPlan::new(params, h.resized(end + 1, h.world() % 8 + 1).unwrap()).unwrap();
        prop_assert_eq!(longer.shares_at(end), plan.shares_at(end));
    }

    /// Each rank alone, walking its positions back across every remap, finds its share of
    /// the whole job's walk at every epoch of a random history, and its own step into the
    /// next epoch of an era is the whole job's (no rank computes another's share;
    /// before the remap on positions an era after a resize could not be walked back).
    #[test]
    fn each_rank_walks_back_across_the_remaps_to_the_whole_jobs_shares(
        (params, first, changes) in job(),
        after in 0u64..3,
    ) {
        let h = history(first, &changes);
        let plan = ElasticPlan::new(params, h.clone()).unwrap();
        for epoch in 0..=h.last_change() + after {
            let whole = plan.shares_at(epoch);
            let era = plan.plan_at(epoch);
            prop_assert!(era.is_per_rank());
            let next = plan.shares_at(epoch + 1);
            let changes_next = plan.change_at(epoch + 1).is_some();
            for rank in 0..whole.shares.len() as u32 {
                let own = era.own_shares_at(rank, epoch);
                prop_assert_eq!(own.share(rank), whole.share(rank), "epoch {} rank {}", epoch, rank);
                prop_assert_eq!(&own.slots[rank as usize], &whole.slots[rank as usize]);
                if !changes_next {
                    let step = era.own_step(rank, &own);
                    prop_assert_eq!(step.next.share(rank), next.share(rank));
                }
            }
        }
    }

    /// The last change into an epoch is the remap of the shares the job had just before it.
    #[test]
    fn change_at_is_the_remap_of_the_shares_before(
        (params, first, changes) in job(),
        world in 1u32..9,
        gap in 0u64..3,
    ) {
        let h = history(first, &changes);
        let epoch = h.last_change() + gap;
        let before = ElasticPlan::new(params, h.clone()).unwrap().shares_at(epoch);
        let resized = h.resized(epoch, world).unwrap();
        if world == h.world() {
            prop_assert_eq!(resized, h, "the same world size is no change");
            return Ok(());
        }
        let plan = ElasticPlan::new(params, resized).unwrap();
        let (old, r) = plan.change_at(epoch).expect("a change at this epoch");
        prop_assert_eq!(&old, &before);
        prop_assert_eq!(&r.next, &plan.shares_at(epoch));
        prop_assert_eq!(r.next, remap(&before, world, params.seed).next);
    }
}

/// A worked case for the README: 4 -> 2 -> 3 ranks over 120 samples.
#[test]
fn four_two_three_moves_only_what_balance_requires() {
    let params = PlanParams {
        samples: 120,
        world: 4,
        fraction: 0.3,
        seed: 5,
    };
    let h = History::new(4).resized(2, 2).unwrap();
    let two = ElasticPlan::new(params, h.clone()).unwrap();
    let (_, shrink) = two.change_at(2).unwrap();
    assert_eq!(shrink.kept, 60, "ranks 0 and 1 keep their 30 each");
    assert_eq!(
        shrink.transfers.len(),
        60,
        "ranks 2 and 3's shares are dealt out"
    );
    let three = ElasticPlan::new(params, h.resized(4, 3).unwrap()).unwrap();
    let (_, grow) = three.change_at(4).unwrap();
    assert_eq!(grow.kept, 80, "ranks 0 and 1 keep 40 of their 60");
    assert!(grow.transfers.iter().all(|t| t.to == 2));
    assert_eq!(three.shares_at(6).shares.len(), 3);
}
