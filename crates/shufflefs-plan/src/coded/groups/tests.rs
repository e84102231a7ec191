//! The paper's merging example, the chosen shapes, and properties of routing for any `n`.

use proptest::prelude::*;

use super::*;
use crate::coded::{Scheme, next_instance, plan};
use crate::plan::placement::RandomPlacement;

fn set(nodes: &[Node]) -> NodeSet {
    nodes.iter().fold(0, |m, &i| m | 1 << i)
}

#[test]
fn small_clusters_get_one_communicator_per_group() {
    let c = Communicators::new(4, DEFAULT_LIMIT).unwrap();
    assert_eq!(c.len(), 11); // 2^4 - 4 - 1
    assert_eq!(c.exact_upto(), 4);
    for g in 1u64..16 {
        let r = c.route(g).unwrap();
        assert_eq!(c.reached(r), g);
    }
    assert_eq!(c.route(0b0100).unwrap(), Route::Unicast(2));
    // n = 10 still fits the default limit exactly; n = 11 does not.
    assert_eq!(Communicators::new(10, DEFAULT_LIMIT).unwrap().len(), 1013);
    assert!(Communicators::new(11, DEFAULT_LIMIT).unwrap().exact_upto() < 11);
}

#[test]
fn paper_psi_2_merges_pairs_of_nodes() {
    // Section 4.3: n = 20, ten blocks {1,2}, {3,4}, ...; psi({2,3}) = psi({1,3}) = {1,2,3,4}
    // (1-based), i.e. {1,2} and {0,2} here both go to {0,1,2,3}.
    let c = Communicators::shape(20, 1, 10);
    assert_eq!(c.len(), 1023);
    assert_eq!(c.blocks()[0], set(&[0, 1]));
    let a = c.route(set(&[1, 2])).unwrap();
    assert_eq!(a, c.route(set(&[0, 2])).unwrap());
    assert_eq!(c.reached(a), set(&[0, 1, 2, 3]));
    assert_eq!(c.reached(c.route(set(&[0, 1])).unwrap()), set(&[0, 1]));
}

#[test]
fn twenty_nodes_get_the_papers_pairs_or_exact_pairs_for_small_caches() {
    // Unknown cache fraction: the model picks Section 4.3's ten blocks of two.
    let c = Communicators::new(20, DEFAULT_LIMIT).unwrap();
    assert_eq!(c, Communicators::shape(20, 1, 10));
    // A cache of barely more than the share (alpha = 0.06, n = 20) makes most index sets
    // pairs: they get their own communicators, and real plans receive far fewer extra bytes.
    let small = Communicators::for_cache(20, DEFAULT_LIMIT, 0.06).unwrap();
    assert!(small.len() <= DEFAULT_LIMIT);
    assert_eq!(small.exact_upto(), 2);
    assert_eq!(
        small.reached(small.route(set(&[3, 17])).unwrap()),
        set(&[3, 17])
    );
    let inst = next_instance(&mut RandomPlacement::new(2000, 20, 0.06, 3).unwrap());
    let txs = plan(&inst, Scheme::Ubershuffle { nu: 2 });
    let extra = |c: &Communicators| {
        let (_, cost) = route_all(c, txs.iter().map(|t| (group_mask(t), 1000))).unwrap();
        cost.extra_ratio()
    };
    assert!(
        extra(&small) < extra(&c) / 2.0,
        "{} vs {}",
        extra(&small),
        extra(&c)
    );
    // A large cache makes large groups: blocks again.
    assert_eq!(Communicators::for_cache(20, DEFAULT_LIMIT, 0.5).unwrap(), c);
}

#[test]
fn one_communicator_is_a_broadcast() {
    let c = Communicators::new(20, 1).unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(c.members(0), (1 << 20) - 1);
    assert_eq!(c.route(set(&[4, 9])).unwrap(), Route::Comm(0));
    assert_eq!(c.route(set(&[4])).unwrap(), Route::Unicast(4));
    assert_eq!(Communicators::new(1, 1).unwrap().len(), 0);
}

#[test]
fn bad_input_is_named() {
    assert_eq!(Communicators::new(0, 10), Err(GroupsError::Nodes(0)));
    assert_eq!(Communicators::new(65, 10), Err(GroupsError::Nodes(65)));
    assert_eq!(Communicators::new(4, 0), Err(GroupsError::ZeroLimit));
    assert_eq!(
        Communicators::new(64, 1 << 20),
        Err(GroupsError::LimitTooHigh(1 << 20))
    );
    assert_eq!(Communicators::new(64, MAX_LIMIT).unwrap().len(), 65_535);
    let c = Communicators::new(4, 100).unwrap();
    assert_eq!(
        c.route(0),
        Err(GroupsError::BadGroup { group: 0, nodes: 4 })
    );
    assert_eq!(
        c.route(0b1_0001),
        Err(GroupsError::BadGroup {
            group: 0b1_0001,
            nodes: 4
        })
    );
    assert!(GroupsError::ZeroLimit.to_string().contains("at least 1"));
}

#[test]
fn ranks_put_the_server_first() {
    let c = Communicators::new(4, DEFAULT_LIMIT).unwrap();
    let Route::Comm(i) = c.route(set(&[1, 3])).unwrap() else {
        panic!("a pair is a multicast")
    };
    assert_eq!(c.ranks(i, 0, |n| n + 1), vec![0, 2, 4]);
    // Node 3 is in the 2^3 - 1 sets of two or more nodes that contain it.
    assert_eq!(c.containing(3).count(), 7);
    assert!(c.containing(3).all(|j| c.members(j) & 0b1000 != 0));
}

#[test]
fn route_all_counts_extra_receptions_and_bytes() {
    let c = Communicators::shape(4, 1, 2); // blocks {0,1}, {2,3}
    let (routes, cost) = route_all(
        &c,
        [(set(&[0, 2]), 100), (set(&[0, 1]), 10), (set(&[3]), 7)],
    )
    .unwrap();
    assert_eq!(c.reached(routes[0]), 0b1111);
    assert_eq!(routes[2], Route::Unicast(3));
    assert_eq!(
        cost,
        MergeCost {
            packets: 3,
            needed_receptions: 5,
            extra_receptions: 2,
            needed_bytes: 200 + 20 + 7,
            extra_bytes: 200,
        }
    );
    assert!((cost.extra_ratio() - 200.0 / 227.0).abs() < 1e-12);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_group_rides_a_superset_within_the_limit(
        n in 1usize..=64,
        limit in 1usize..3000,
        groups in proptest::collection::vec(any::<u64>(), 1..50),
    ) {
        let c = Communicators::new(n, limit).unwrap();
        prop_assert!(c.len() <= limit);
        prop_assert_eq!(&c, &Communicators::new(n, limit).unwrap());
        let all = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        prop_assert!(c.iter().all(|m| m & !all == 0 && m.count_ones() >= 2));
        for g in groups {
            let g = g & all;
            if g == 0 {
                prop_assert!(c.route(g).is_err());
                continue;
            }
            let r = c.route(g).unwrap();
            prop_assert_eq!(r, c.route(g).unwrap());
            prop_assert_eq!(c.reached(r) & g, g);
            match r {
                Route::Unicast(node) => prop_assert_eq!(g, 1 << node),
                Route::Comm(i) => {
                    prop_assert!(i < c.len());
                    prop_assert!(g.count_ones() >= 2);
                    // No communicator of the set that contains g is smaller.
                    let best = c.iter().filter(|&m| m & g == g).map(u64::count_ones).min();
                    prop_assert_eq!(Some(c.members(i).count_ones()), best);
                }
            }
        }
    }

    #[test]
    fn planned_packets_all_route_and_exact_sets_cost_nothing(
        n in 2usize..=14,
        q in 30u32..200,
        seed in any::<u64>(),
        limit in 1usize..2000,
    ) {
        let q = q.max(n as u32);
        let alpha = ((q as usize).div_ceil(n) as f64 / f64::from(q) * 2.0).min(1.0);
        let inst = next_instance(&mut RandomPlacement::new(u64::from(q), n, alpha, seed).unwrap());
        let txs = plan(&inst, Scheme::Ubershuffle { nu: 2 });
        let c = Communicators::new(n, limit).unwrap();
        let (routes, cost) = route_all(&c, txs.iter().map(|t| (group_mask(t), 1))).unwrap();
        prop_assert_eq!(routes.len(), txs.len());
        let needed: u64 = txs.iter().map(|t| t.group.len() as u64).sum();
        prop_assert_eq!(cost.needed_receptions, needed);
        let reached: u64 = routes.iter().map(|&r| u64::from(c.reached(r).count_ones())).sum();
        prop_assert_eq!(cost.extra_receptions, reached - needed);
        if c.exact_upto() == n {
            prop_assert_eq!(cost.extra_receptions, 0);
        }
    }
}

#[test]
#[ignore = "prints the chosen shapes; run with --ignored --nocapture"]
fn print_shapes() {
    for n in [8, 10, 11, 12, 16, 20, 24, 32, 48, 64] {
        for limit in [64, 256, DEFAULT_LIMIT, 4096] {
            let c = Communicators::new(n, limit).unwrap();
            println!(
                "n {n:>2} limit {limit:>4}: {:>4} comms, exact up to {}, {} blocks, model extra {:.3}",
                c.len(),
                c.exact_upto(),
                c.blocks().len(),
                expected_cost(&c, &TRAFFIC_OVERLAPS)
            );
        }
    }
}

#[test]
#[ignore = "compares shapes on real plans; run with --ignored --nocapture"]
fn print_measured() {
    let n = 20;
    for alpha in [0.06, 0.1, 0.2, 0.35, 0.55, 0.8] {
        let mut p = RandomPlacement::new(4000, n, alpha, 1).unwrap();
        let inst = next_instance(&mut p);
        let txs = plan(&inst, Scheme::Ubershuffle { nu: 2 });
        let sizes: Vec<usize> = txs.iter().map(|t| t.group.len()).collect();
        let mean = sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
        let mut line = format!("alpha {alpha:.2} mean group {mean:.1}:");
        let cands = [
            ("paper", Communicators::shape(n, 1, 10)),
            ("new", Communicators::new(n, DEFAULT_LIMIT).unwrap()),
            (
                "alpha",
                Communicators::for_cache(n, DEFAULT_LIMIT, alpha).unwrap(),
            ),
            ("k2b9", Communicators::shape(n, 2, 9)),
            ("k3b8", Communicators::shape(n, 3, 8)),
        ];
        for (name, c) in cands {
            let (_, cost) = route_all(&c, txs.iter().map(|t| (group_mask(t), 1))).unwrap();
            line += &format!(
                " {name}(k{} b{} n{}) {:.3}",
                c.exact_upto(),
                c.blocks().len(),
                c.len(),
                cost.extra_ratio()
            );
        }
        println!("{line}");
    }
}
