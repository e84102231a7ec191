//! Properties of the pure plan over many (samples, ranks, Q, seed, epochs), in both exchange
//! scopes (and, for node scope, many host layouts).

use crate::common::shares::assert_partition;
use proptest::prelude::*;
use shufflefs::plan::{EpochShares, ExchangeScope, HostLayout, Plan, PlanParams, Step};

fn params() -> impl Strategy<Value = PlanParams> {
    (0u32..600, 1u32..9, 0.0f64..=1.0, any::<u64>()).prop_map(|(samples, world, fraction, seed)| {
        PlanParams {
            samples: samples.into(),
            world,
            fraction,
            seed,
        }
    })
}

/// Params and a host label per rank: from one host for all to one host per rank, labels
/// in any order (the plan renumbers them).
fn params_on_hosts() -> impl Strategy<Value = (PlanParams, Vec<u32>)> {
    params().prop_flat_map(|p| {
        let labels = 1..=p.world;
        (Just(p), labels)
            .prop_flat_map(|(p, n)| (Just(p), prop::collection::vec(0..n, p.world as usize)))
    })
}

fn assert_balanced(shares: &EpochShares) {
    let min = shares.shares.iter().map(Vec::len).min().unwrap();
    let max = shares.shares.iter().map(Vec::len).max().unwrap();
    assert!(max - min <= 1, "unbalanced: {min}..{max}");
}

/// What every step promises, in either scope: a partition, share sizes unchanged (so still
/// balanced), transfers that are exactly the difference between the epochs, and each rank
/// sending at most `k` and receiving as many as it sends.
fn assert_step(plan: &Plan, cur: &EpochShares, step: &Step) {
    let p = plan.params();
    assert_partition(&step.next, p.samples);
    assert_eq!(step.next.epoch, cur.epoch + 1);
    let sizes = |s: &EpochShares| s.shares.iter().map(Vec::len).collect::<Vec<_>>();
    assert_eq!(sizes(&step.next), sizes(cur), "share sizes changed");
    for t in &step.transfers {
        assert!(cur.share(t.from).binary_search(&t.sample).is_ok());
        assert!(step.next.share(t.to).binary_search(&t.sample).is_ok());
        assert_ne!(t.from, t.to);
    }
    let moved: usize = cur
        .shares
        .iter()
        .enumerate()
        .map(|(r, s)| {
            s.iter()
                .filter(|x| step.next.share(r as u32).binary_search(x).is_err())
                .count()
        })
        .sum();
    assert_eq!(moved, step.transfers.len());
    let k = plan.exchange_count();
    for r in 0..p.world {
        let out = step.transfers.iter().filter(|t| t.from == r).count();
        let inn = step.transfers.iter().filter(|t| t.to == r).count();
        assert!(out <= k);
        assert_eq!(out, inn);
    }
}

/// Each host's samples, sorted.
fn per_host(shares: &EpochShares, layout: &HostLayout) -> Vec<Vec<u64>> {
    layout
        .groups()
        .iter()
        .map(|g| {
            let mut s: Vec<u64> = g.iter().flat_map(|&r| shares.share(r)).copied().collect();
            s.sort_unstable();
            s
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_epoch_is_a_balanced_partition(p in params(), epochs in 1u64..6) {
        let plan = Plan::new(p).unwrap();
        let mut cur = plan.initial();
        assert_partition(&cur, p.samples);
        assert_balanced(&cur);
        for _ in 0..epochs {
            let step = plan.step(&cur);
            assert_step(&plan, &cur, &step);
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
        let a = Plan::new(PlanParams { samples: samples.into(), world, fraction: 0.5, seed: 1 }).unwrap();
        let b = Plan::new(PlanParams { samples: samples.into(), world, fraction: 0.5, seed: 2 }).unwrap();
        prop_assert_ne!(a.initial(), b.initial());
    }

    /// Node scope keeps every promise of global scope, moves samples only between ranks of
    /// one host, and so never changes which samples a host holds.
    #[test]
    fn node_scope_moves_only_within_hosts((p, hosts) in params_on_hosts(), epochs in 1u64..6) {
        let plan = Plan::with_scope(p, ExchangeScope::Node, &hosts).unwrap();
        prop_assert_eq!(plan.scope(), ExchangeScope::Node);
        let layout = plan.layout().unwrap().clone();
        prop_assert_eq!(&layout, &HostLayout::new(&hosts));
        let mut cur = plan.initial();
        // Epoch 0 does not depend on the scope.
        prop_assert_eq!(&cur, &Plan::new(p).unwrap().initial());
        assert_partition(&cur, p.samples);
        assert_balanced(&cur);
        let first = per_host(&cur, &layout);
        for _ in 0..epochs {
            let step = plan.step(&cur);
            assert_step(&plan, &cur, &step);
            for t in &step.transfers {
                prop_assert!(layout.same_host(t.from, t.to), "{:?} crosses hosts {:?}", t, hosts);
            }
            prop_assert_eq!(&per_host(&step.next, &layout), &first);
            // A rank alone on its host keeps its share.
            for g in layout.groups().iter().filter(|g| g.len() == 1) {
                prop_assert_eq!(step.next.share(g[0]), cur.share(g[0]));
            }
            cur = step.next;
        }
    }

    /// Node scope is a function of (params, which ranks share a host): the same on every
    /// rank, whatever the hosts are called.
    #[test]
    fn node_scope_is_deterministic((p, hosts) in params_on_hosts(), epoch in 0u64..5) {
        let a = Plan::with_scope(p, ExchangeScope::Node, &hosts).unwrap().shares_at(epoch);
        let b = Plan::with_scope(p, ExchangeScope::Node, &hosts).unwrap().shares_at(epoch);
        prop_assert_eq!(&a, &b);
        let relabelled: Vec<u32> = hosts.iter().map(|h| 1000 - 7 * h).collect();
        let c = Plan::with_scope(p, ExchangeScope::Node, &relabelled).unwrap().shares_at(epoch);
        prop_assert_eq!(&a, &c);
    }

    #[test]
    fn node_scope_zero_fraction_never_moves((p, hosts) in params_on_hosts(), epochs in 1u64..5) {
        let p = PlanParams { fraction: 0.0, ..p };
        let plan = Plan::with_scope(p, ExchangeScope::Node, &hosts).unwrap();
        let first = plan.initial();
        let mut cur = first.clone();
        for _ in 0..epochs {
            let step = plan.step(&cur);
            prop_assert!(step.transfers.is_empty());
            prop_assert_eq!(&step.next.shares, &first.shares);
            cur = step.next;
        }
    }

    /// With every rank on one host, node scope is the global plan, bit for bit.
    #[test]
    fn node_scope_on_one_host_is_global(p in params(), label in any::<u32>(), epoch in 0u64..5) {
        let hosts = vec![label; p.world as usize];
        let node = Plan::with_scope(p, ExchangeScope::Node, &hosts).unwrap();
        let global = Plan::new(p).unwrap();
        prop_assert_eq!(node.shares_at(epoch), global.shares_at(epoch));
    }

    /// Global scope ignores the hosts argument entirely (any length, any labels).
    #[test]
    fn global_scope_ignores_hosts(
        p in params(),
        hosts in prop::collection::vec(any::<u32>(), 0..12),
        epochs in 1u64..5,
    ) {
        let scoped = Plan::with_scope(p, ExchangeScope::Global, &hosts).unwrap();
        let plain = Plan::new(p).unwrap();
        prop_assert_eq!(scoped.scope(), ExchangeScope::Global);
        prop_assert!(scoped.layout().is_none());
        let (mut a, mut b) = (scoped.initial(), plain.initial());
        prop_assert_eq!(&a, &b);
        for _ in 0..epochs {
            let (sa, sb) = (scoped.step(&a), plain.step(&b));
            prop_assert_eq!(&sa.transfers, &sb.transfers);
            prop_assert_eq!(&sa.next, &sb.next);
            (a, b) = (sa.next, sb.next);
        }
    }
}

/// Node scope with a wrong-sized layout is refused, not planned.
#[test]
fn node_scope_needs_one_host_per_rank() {
    let p = PlanParams {
        samples: 10,
        world: 4,
        fraction: 0.5,
        seed: 1,
    };
    assert!(Plan::with_scope(p, ExchangeScope::Node, &[0, 0, 1]).is_err());
    assert!(Plan::with_scope(p, ExchangeScope::Node, &[]).is_err());
}

/// Mean moved share over many seeds, within a few percent of `expected`.
fn assert_moved_fraction(world: u32, q: f64, hosts: Option<&[u32]>, expected: f64) {
    let samples = 4000;
    let mut moved = 0usize;
    let mut total = 0usize;
    for seed in 0..20 {
        let p = PlanParams {
            samples,
            world,
            fraction: q,
            seed,
        };
        let plan = match hosts {
            None => Plan::new(p),
            Some(h) => Plan::with_scope(p, ExchangeScope::Node, h),
        }
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
    assert!(
        (observed - expected).abs() < 0.02,
        "M={world} Q={q} hosts={hosts:?}: moved {observed:.4}, expected {expected:.4}"
    );
}

/// The moved share averages Q(M-1)/M: over many seeds the mean is within a few percent.
#[test]
fn moved_fraction_matches_q_times_m_minus_one_over_m() {
    for &(world, q) in &[(2u32, 0.3f64), (4, 0.3), (4, 1.0), (8, 0.5), (3, 0.1)] {
        let expected = q * f64::from(world - 1) / f64::from(world);
        assert_moved_fraction(world, q, None, expected);
    }
}

/// Node scope: a rank on a host of G ranks moves Q(G-1)/G of its share on average.
#[test]
fn node_scope_moved_fraction_matches_q_times_g_minus_one_over_g() {
    // 8 ranks, 2 hosts of 4: Q * 3/4.
    assert_moved_fraction(8, 0.5, Some(&[0, 0, 0, 0, 1, 1, 1, 1]), 0.5 * 0.75);
    // 4 hosts of 2, interleaved: Q * 1/2.
    assert_moved_fraction(8, 1.0, Some(&[0, 1, 2, 3, 0, 1, 2, 3]), 0.5);
    // 3 ranks on one host, 1 alone: (3 * Q * 2/3 + 0) / 4.
    assert_moved_fraction(4, 0.6, Some(&[0, 0, 1, 0]), 0.6 * 2.0 / 4.0);
}
