//! Properties of the pure plan over many (samples, ranks, Q, seed, epochs).

use proptest::prelude::*;
use shufflefs::plan::{EpochShares, Plan, PlanParams};

fn params() -> impl Strategy<Value = PlanParams> {
    (0u32..600, 1u32..9, 0.0f64..=1.0, any::<u64>()).prop_map(|(samples, world, fraction, seed)| {
        PlanParams {
            samples,
            world,
            fraction,
            seed,
        }
    })
}

fn assert_partition(shares: &EpochShares, n: u32) {
    let mut owner = vec![None; n as usize];
    for (r, share) in shares.shares.iter().enumerate() {
        assert!(
            share.windows(2).all(|w| w[0] < w[1]),
            "share {r} not sorted/unique"
        );
        for &s in share {
            assert!(s < n, "sample {s} out of range");
            assert_eq!(owner[s as usize], None, "sample {s} owned twice");
            owner[s as usize] = Some(r);
        }
    }
    assert!(owner.iter().all(Option::is_some), "a sample has no owner");
}

fn assert_balanced(shares: &EpochShares) {
    let min = shares.shares.iter().map(Vec::len).min().unwrap();
    let max = shares.shares.iter().map(Vec::len).max().unwrap();
    assert!(max - min <= 1, "unbalanced: {min}..{max}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_epoch_is_a_balanced_partition(p in params(), epochs in 1u64..6) {
        let plan = Plan::new(p).unwrap();
        let mut cur = plan.initial();
        assert_partition(&cur, p.samples);
        assert_balanced(&cur);
        let sizes: Vec<usize> = cur.shares.iter().map(Vec::len).collect();
        for _ in 0..epochs {
            let step = plan.step(&cur);
            assert_partition(&step.next, p.samples);
            // Every rank sends and receives the same number, so share sizes never change.
            prop_assert_eq!(step.next.shares.iter().map(Vec::len).collect::<Vec<_>>(), sizes.clone());
            // Transfers describe exactly the difference between the two epochs.
            for t in &step.transfers {
                prop_assert!(cur.share(t.from).binary_search(&t.sample).is_ok());
                prop_assert!(step.next.share(t.to).binary_search(&t.sample).is_ok());
                prop_assert_ne!(t.from, t.to);
            }
            let moved: usize = cur.shares.iter().enumerate().map(|(r, s)| {
                s.iter().filter(|x| step.next.share(r as u32).binary_search(x).is_err()).count()
            }).sum();
            prop_assert_eq!(moved, step.transfers.len());
            // Each rank sends at most k and receives as many as it sends.
            let k = plan.exchange_count();
            for r in 0..p.world {
                let out = step.transfers.iter().filter(|t| t.from == r).count();
                let inn = step.transfers.iter().filter(|t| t.to == r).count();
                prop_assert!(out <= k);
                prop_assert_eq!(out, inn);
            }
            cur = step.next;
        }
    }

    #[test]
    fn zero_fraction_never_moves(p in params(), epochs in 1u64..5) {
        let plan = Plan::new(PlanParams { fraction: 0.0, ..p }).unwrap();
        let first = plan.initial();
        let mut cur = first.clone();
        for _ in 0..epochs {
            let step = plan.step(&cur);
            prop_assert!(step.transfers.is_empty());
            prop_assert_eq!(&step.next.shares, &first.shares);
            cur = step.next;
        }
    }

    #[test]
    fn same_inputs_same_plan(p in params(), epoch in 0u64..5) {
        let a = Plan::new(p).unwrap().shares_at(epoch);
        let b = Plan::new(p).unwrap().shares_at(epoch);
        prop_assert_eq!(a, b);
    }

    #[test]
    fn different_seeds_differ(samples in 50u32..300, world in 2u32..6) {
        let a = Plan::new(PlanParams { samples, world, fraction: 0.5, seed: 1 }).unwrap();
        let b = Plan::new(PlanParams { samples, world, fraction: 0.5, seed: 2 }).unwrap();
        prop_assert_ne!(a.initial(), b.initial());
    }
}

/// The moved share averages Q(M-1)/M: over many seeds the mean is within a few percent.
#[test]
fn moved_fraction_matches_q_times_m_minus_one_over_m() {
    for &(world, q) in &[(2u32, 0.3f64), (4, 0.3), (4, 1.0), (8, 0.5), (3, 0.1)] {
        let samples = 4000;
        let mut moved = 0usize;
        let mut total = 0usize;
        for seed in 0..20 {
            let plan = Plan::new(PlanParams {
                samples,
                world,
                fraction: q,
                seed,
            })
            .unwrap();
            let mut cur = plan.initial();
            for _ in 0..3 {
                let step = plan.step(&cur);
                moved += step.transfers.len();
                total += samples as usize;
                cur = step.next;
            }
        }
        let observed = moved as f64 / total as f64;
        let expected = q * f64::from(world - 1) / f64::from(world);
        assert!(
            (observed - expected).abs() < 0.02,
            "M={world} Q={q}: moved {observed:.4}, expected {expected:.4}"
        );
    }
}
