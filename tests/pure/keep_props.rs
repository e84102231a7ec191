//! Properties of the planned partial cache (`plan::keep`): the kept set fits the
//! cache, is part of the share, never drops a kept sample that stays, is what a
//! plain reference computation of the rule gives, and is the same every time.

use proptest::prelude::*;
use shufflefs::plan::keep::{KeepPlanner, choose};
use shufflefs::plan::{Plan, PlanParams, SampleId};

fn case() -> impl Strategy<Value = (Plan, Vec<u64>, u64, usize)> {
    (1u32..80, 1u32..5, 0.0f64..=1.0, any::<u64>(), 0usize..5).prop_flat_map(
        |(samples, world, fraction, seed, horizon)| {
            let plan = Plan::new(PlanParams {
                samples: samples.into(),
                world,
                fraction,
                seed,
            })
            .unwrap();
            let sizes = prop::collection::vec(1u64..100, samples as usize);
            (Just(plan), sizes, 0u64..3000, Just(horizon))
        },
    )
}

fn bytes(set: &[SampleId], sizes: &[u64]) -> u64 {
    set.iter().map(|&s| sizes[s as usize]).sum()
}

/// The rule as the module docs state it, computed the plain way: stays by scanning, the
/// order by repeatedly taking the best sample left.
fn reference(
    window: &[Vec<SampleId>],
    prev: &[SampleId],
    sizes: &[u64],
    cap: u64,
) -> Vec<SampleId> {
    let stay = |s: SampleId| {
        let mut n = 1;
        while n < window.len() && window[n].contains(&s) {
            n += 1;
        }
        n
    };
    let mut kept: Vec<SampleId> = window[0]
        .iter()
        .copied()
        .filter(|s| prev.contains(s))
        .collect();
    let mut left: Vec<SampleId> = window[0]
        .iter()
        .copied()
        .filter(|s| !prev.contains(s))
        .collect();
    let mut used = bytes(&kept, sizes);
    while let Some(i) = (0..left.len()).max_by_key(|&i| (stay(left[i]), std::cmp::Reverse(left[i])))
    {
        let s = left.swap_remove(i);
        if used + sizes[s as usize] <= cap {
            used += sizes[s as usize];
            kept.push(s);
        }
    }
    kept.sort();
    kept
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn kept_fits_is_in_the_share_and_matches_the_reference(
        (plan, sizes, cap, horizon) in case()
    ) {
        let mut p = KeepPlanner::new(plan.clone(), sizes.clone(), cap, horizon);
        let world = plan.params().world;
        let mut prev: Vec<Vec<SampleId>> = vec![Vec::new(); world as usize];
        for _ in 0..5 {
            let e = p.epoch();
            let window: Vec<_> = (0..=horizon as u64).map(|i| plan.shares_at(e + i)).collect();
            for r in 0..world {
                let kept = p.kept(r);
                let share = window[0].share(r);
                prop_assert!(bytes(kept, &sizes) <= cap);
                prop_assert!(kept.iter().all(|s| share.binary_search(s).is_ok()));
                // Kept samples still in the share are never displaced.
                prop_assert!(prev[r as usize].iter().filter(|s| share.binary_search(s).is_ok())
                    .all(|s| kept.binary_search(s).is_ok()));
                let w: Vec<Vec<SampleId>> = window.iter().map(|s| s.share(r).to_vec()).collect();
                prop_assert_eq!(kept, &reference(&w, &prev[r as usize], &sizes, cap)[..]);
                let o = p.outcome_of(r);
                prop_assert!(o.hits <= o.reads);
                prop_assert!(o.peer_bytes <= o.read_bytes - o.source_bytes);
                if e == 0 {
                    prop_assert_eq!(o.source_bytes, o.read_bytes);
                }
                prev[r as usize] = kept.to_vec();
            }
            p.advance();
        }
    }

    /// The exchange moves only samples its sender kept and its receiver keeps next, and
    /// exactly the bytes the outcome counts as coming from peers.
    #[test]
    fn the_exchange_moves_only_what_both_ends_keep((plan, sizes, cap, horizon) in case()) {
        let mut p = KeepPlanner::new(plan.clone(), sizes.clone(), cap, horizon);
        for _ in 0..4 {
            let step = plan.step(p.shares());
            let moved = p.exchanged(&step);
            let before = p.clone();
            p.advance();
            for t in &moved {
                prop_assert!(step.transfers.contains(t));
                prop_assert!(before.kept(t.from).binary_search(&t.sample).is_ok());
                prop_assert!(p.kept(t.to).binary_search(&t.sample).is_ok());
            }
            for r in 0..plan.params().world {
                let bytes: u64 = moved.iter().filter(|t| t.to == r).map(|t| sizes[t.sample as usize]).sum();
                prop_assert_eq!(bytes, p.outcome_of(r).peer_bytes);
            }
        }
    }

    #[test]
    fn kept_sets_are_deterministic((plan, sizes, cap, horizon) in case(), epoch in 0u64..6) {
        let a = KeepPlanner::at(plan.clone(), sizes.clone(), cap, horizon, epoch);
        let b = KeepPlanner::at(plan.clone(), sizes, cap, horizon, epoch);
        for r in 0..plan.params().world {
            prop_assert_eq!(a.kept(r), b.kept(r));
        }
    }

    /// With equal sizes and nothing kept before, the kept set is a set of the share that
    /// fits and whose total stay no other such set beats (checked over every subset).
    #[test]
    fn equal_sizes_keep_the_most_stay(
        share in prop::collection::btree_set(0u64..40, 0..10),
        later in prop::collection::vec(prop::collection::btree_set(0u64..40, 0..30), 0..4),
        fits in 0u64..12,
    ) {
        let mut window: Vec<Vec<SampleId>> = vec![share.into_iter().collect()];
        window.extend(later.into_iter().map(|s| s.into_iter().collect::<Vec<_>>()));
        let refs: Vec<&[SampleId]> = window.iter().map(Vec::as_slice).collect();
        let none: &[SampleId] = &[];
        let kept = choose(refs[0], &refs[1..], none, &|_| 1, fits);
        let stay = |s: &SampleId| 1 + window[1..].iter().take_while(|w| w.contains(s)).count();
        let total = |set: &[SampleId]| set.iter().map(stay).sum::<usize>();
        let n = window[0].len();
        let best = (0u32..1 << n)
            .filter(|m| u64::from(m.count_ones()) <= fits)
            .map(|m| {
                let set: Vec<SampleId> = (0..n).filter(|i| m >> i & 1 == 1).map(|i| window[0][i]).collect();
                total(&set)
            })
            .max()
            .unwrap_or(0);
        prop_assert_eq!(total(&kept), best);
        prop_assert_eq!(kept.len() as u64, fits.min(n as u64));
    }
}
