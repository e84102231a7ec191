//! Properties of a coded run's kept sets (`plan::coded_keep`): every rank's kept
//! set is part of its coded cache, what it holds during a step and what it receives fit its
//! slots together, only samples of the new share travel, the kept sets are what a plain
//! reference computation of the rule gives, the same on every walk, and the coded packets
//! over the kept sets deliver every kept sample of the new share exactly once, each
//! decodable with kept samples alone.

use std::collections::BTreeSet;

use proptest::prelude::*;
use shufflefs::coded::{self, Scheme};
use shufflefs::plan::coded_keep::CODED_HORIZON;
use shufflefs::plan::{Plan, PlanParams, SampleId};

fn case() -> impl Strategy<Value = (Plan, usize)> {
    (2u32..70, 1u32..5, 0.0f64..=1.0, any::<u64>(), 0usize..40).prop_map(
        |(samples, ranks, a, seed, slots)| {
            // A cache of between a share and the whole dataset.
            let share = samples.div_ceil(ranks);
            let cache = share + (a * f64::from(samples - share)) as u32;
            let alpha = (f64::from(cache) + 0.5) / f64::from(samples);
            let params = PlanParams {
                samples: samples.into(),
                world: ranks,
                fraction: 0.0,
                seed,
            };
            let plan = Plan::coded(params, alpha.min(1.0)).unwrap();
            (plan.with_coded_slots(Some(slots)), slots)
        },
    )
}

/// The rule as the module docs state it, the plain way: for each sample of the cache that
/// is held or in the share, its distance and hits by scanning; then repeatedly the best
/// sample left that may still be taken.
fn reference(
    window: &[(BTreeSet<SampleId>, BTreeSet<SampleId>)],
    prev: &BTreeSet<SampleId>,
    slots: usize,
    room: usize,
) -> BTreeSet<SampleId> {
    let (share, cache) = &window[0];
    let score = |s: SampleId| {
        let stays = window.iter().take_while(|(_, c)| c.contains(&s)).count();
        let ins: Vec<usize> = (0..stays).filter(|&i| window[i].0.contains(&s)).collect();
        ins.first().map(|&d| (d, ins.len()))
    };
    let mut left: Vec<SampleId> = (cache.iter().copied())
        .filter(|s| (prev.contains(s) || share.contains(s)) && score(*s).is_some())
        .collect();
    let (mut kept, mut new) = (BTreeSet::new(), 0);
    let key = |s: SampleId| {
        let (d, h) = score(s).unwrap();
        (d, !prev.contains(&s), std::cmp::Reverse(h), s)
    };
    while let Some(i) = (0..left.len()).min_by_key(|&i| key(left[i])) {
        let s = left.remove(i);
        if kept.len() == slots {
            break;
        }
        if !prev.contains(&s) {
            if new == room {
                continue;
            }
            new += 1;
        }
        kept.insert(s);
    }
    kept
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn kept_sets_are_the_rules_and_fit((plan, slots) in case()) {
        let shares = plan.coded_shares().unwrap();
        let whole = plan.clone().with_coded_slots(None);
        let whole = whole.coded_shares().unwrap();
        let mut p = shares.placement_at(0);
        prop_assert!(p.is_partial());
        for epoch in 0..5u64 {
            let replay = shares.placement_at(epoch);
            prop_assert_eq!(p.caches(), replay.caches(), "a walk is a replay");
            let held = p.caches().to_vec();
            let window = |r: usize| -> Vec<(BTreeSet<SampleId>, BTreeSet<SampleId>)> {
                (epoch + 1..=epoch + CODED_HORIZON as u64)
                    .map(|e| {
                        let w = whole.placement_at(e);
                        (w.shares(e).swap_remove(r), w.coded_caches()[r].clone())
                    })
                    .collect()
            };
            let inst = coded::next_placed_instance(&mut p);
            for (r, held) in held.iter().enumerate() {
                let kept = &p.caches()[r];
                prop_assert!(kept.is_subset(&p.coded_caches()[r]));
                prop_assert!(held.union(kept).count() <= slots);
                let share = &p.shares(epoch + 1)[r];
                prop_assert!(kept.difference(held).all(|s| share.contains(s)));
                let room = slots.saturating_sub(held.len());
                prop_assert_eq!(kept, &reference(&window(r), held, slots, room));
            }
            let txs = coded::plan(&inst, Scheme::Ubershuffle { nu: 2 });
            prop_assert!(coded::verify(&inst, &txs).is_ok(), "{:?}", coded::verify(&inst, &txs));
        }
    }
}
