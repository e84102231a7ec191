//! The paper's Examples 1-3, and properties of every scheme over random placements.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::calc::{CalcInput, Storage, report, theorem1, theorem2};
use super::*;
use crate::plan::placement::RandomPlacement;

fn set(xs: &[SampleId]) -> BTreeSet<SampleId> {
    xs.iter().copied().collect()
}

/// Examples 1-3: n = 3, q = 9 (paper's node `k` is our node `k - 1`; sample ids as printed).
fn example() -> Instance {
    Instance::new(
        vec![set(&[2, 3, 4, 8]), set(&[6, 7, 8, 9]), set(&[1, 3, 4, 5])],
        vec![set(&[3, 5, 8]), set(&[1, 4, 9]), set(&[2, 6, 7])],
    )
    .unwrap()
}

fn parts(txs: &[Transmission]) -> Vec<Vec<(SampleId, Node)>> {
    txs.iter().map(|t| t.parts.clone()).collect()
}

#[test]
fn example_1_uncoded_is_six_unicasts() {
    let txs = plan(&example(), Scheme::Uncoded);
    assert_eq!(
        parts(&txs),
        vec![
            vec![(5, 0)],
            vec![(1, 1)],
            vec![(4, 1)],
            vec![(2, 2)],
            vec![(6, 2)],
            vec![(7, 2)]
        ]
    );
    assert!(txs.iter().all(|t| t.group.len() == 1));
    verify(&example(), &txs).unwrap();
}

#[test]
fn example_2_coded_is_four_broadcasts() {
    let inst = example();
    let table = index::index(&inst);
    // Fig. 3's encoding tables: {1,3}: d5 | d2; {2,3}: d1 | d6, d7; {1,2,3}: d4 in column 2.
    let z = |s: &[Node], i| table.sets[&s.iter().fold(0, |m, &k| m | 1 << k)][&i].clone();
    assert_eq!(z(&[0, 2], 0), vec![5]);
    assert_eq!(z(&[0, 2], 2), vec![2]);
    assert_eq!(z(&[1, 2], 1), vec![1]);
    assert_eq!(z(&[1, 2], 2), vec![6, 7]);
    assert_eq!(z(&[0, 1, 2], 1), vec![4]);
    assert_eq!(table.sets.len(), 3);
    let txs = plan(&inst, Scheme::Coded);
    assert_eq!(txs.len(), 4);
    assert_eq!(txs[0].parts, vec![(5, 0), (2, 2)]); // d2 + d5, the example's first packet
    assert_eq!(txs[0].group, vec![0, 2]);
    verify(&inst, &txs).unwrap();
}

#[test]
fn example_3_ubershuffle_is_three_broadcasts() {
    let inst = example();
    let txs = plan(&inst, Scheme::Ubershuffle { nu: DEFAULT_NU });
    assert_eq!(txs.len(), 3);
    // d4 rides with d7 in table {2,3}.
    assert!(
        txs.iter()
            .any(|t| t.group == vec![1, 2] && t.parts.contains(&(4, 1)))
    );
    verify(&inst, &txs).unwrap();
    assert_eq!(plan(&inst, Scheme::Ubershuffle { nu: 0 }).len(), 4);
}

#[test]
fn decoder_check_rejects_bad_packets() {
    let inst = example();
    let mut txs = plan(&inst, Scheme::Coded);
    // Node 0 (paper's node 1) does not cache d1, so d1 + d5 is not decodable there.
    txs[0].parts = vec![(5, 0), (1, 1)];
    txs[0].group = vec![0, 1];
    assert!(matches!(
        verify(&inst, &txs),
        Err(DecodeError::Undecodable { .. })
    ));
    let mut txs = plan(&inst, Scheme::Uncoded);
    txs.push(txs[0].clone());
    assert!(matches!(
        verify(&inst, &txs),
        Err(DecodeError::Duplicate { .. })
    ));
    txs.truncate(4);
    assert!(matches!(
        verify(&inst, &txs),
        Err(DecodeError::Missing { .. })
    ));
    assert!(matches!(
        Instance::new(vec![set(&[]), set(&[])], vec![set(&[1]), set(&[1])]),
        Err(InstanceError::SharedDemand { .. })
    ));
}

#[test]
fn placement_keeps_the_share_and_the_cache_size() {
    let mut p = RandomPlacement::new(103, 4, 0.4, 7).unwrap();
    let s = p.cache_size();
    assert_eq!(s, 41);
    let mut prev = next_instance(&mut p);
    for _ in 0..3 {
        let next = next_instance(&mut p);
        for i in 0..4 {
            // The cache after an epoch holds that epoch's share and s samples in all.
            assert!(prev.demand(i).is_subset(next.cache(i)));
            assert_eq!(next.cache(i).len(), s);
            // Retained samples come from the old cache.
            assert!(
                next.cache(i)
                    .is_subset(&prev.cache(i).union(prev.demand(i)).copied().collect())
            );
        }
        let all: BTreeSet<SampleId> = (0..4).flat_map(|i| next.demand(i).clone()).collect();
        assert_eq!(all.len(), 103);
        prev = next;
    }
    let again: Vec<_> = {
        let mut p = RandomPlacement::new(103, 4, 0.4, 7).unwrap();
        (0..4).map(|_| next_instance(&mut p)).collect()
    };
    let mut p = RandomPlacement::new(103, 4, 0.4, 7).unwrap();
    assert_eq!(
        again,
        (0..4).map(|_| next_instance(&mut p)).collect::<Vec<_>>()
    );
    assert!(RandomPlacement::new(100, 4, 0.2, 0).is_err());
}

#[test]
fn theorems_match_their_limits() {
    let (q, n) = (1e6, 20);
    assert!((theorem1(q, q / 2.0) - q / 2.0).abs() < 1e-6);
    // Large n: R_c approaches q(1 - alpha)/(alpha n) (the paper's remark after Theorem 2).
    let alpha = 0.5;
    let rc = theorem2(q, n, alpha * q);
    let limit = q * (1.0 - alpha) / (alpha * n as f64);
    assert!((rc - limit).abs() / limit < 0.1, "{rc} vs {limit}");
    // p = 0 (each rank caches exactly its share): every missing sample is cached only by its
    // previous owner, pairs of nodes swap, and half as many packets as unicasts go out.
    let r0 = theorem2(q, n, q / n as f64);
    assert!((r0 - theorem1(q, q / n as f64) / 2.0).abs() < 1.0, "{r0}");
}

#[test]
fn calculator_report_for_a_small_case() {
    let input = CalcInput {
        samples: 90,
        ranks: 3,
        storage: Storage::CacheFraction(0.5),
        schemes: vec![
            Scheme::Uncoded,
            Scheme::Coded,
            Scheme::Ubershuffle { nu: DEFAULT_NU },
        ],
        seed: 1,
        sample_bytes: 100_000,
        epochs: 3,
    };
    let text = report(&input).unwrap();
    assert!(
        text.contains("s = floor(alpha q) = 45 samples each (4.5 MB)"),
        "{text}"
    );
    for name in [
        "uncoded",
        "coded",
        "ubershuffle(nu=2)",
        "Theorem 1",
        "multicast: 4 MPI communicators (limit 1024; one per group)",
        "shufflefs serve",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
    let partial = report(&CalcInput {
        storage: Storage::Fraction(0.3),
        ..input
    })
    .unwrap();
    assert!(
        partial.contains("each rank sends 9 and receives 9 samples"),
        "{partial}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_scheme_delivers_each_missing_demand_once_and_decodably(
        n in 1usize..=8,
        q in 8u32..300,
        alpha_milli in 0u32..=1000,
        seed in any::<u64>(),
        nu in 0usize..4,
    ) {
        let q = q.max(n as u32);
        let min_alpha = (q as usize).div_ceil(n) as f64 / f64::from(q);
        let alpha = min_alpha + (1.0 - min_alpha) * f64::from(alpha_milli) / 1000.0;
        let mut p = RandomPlacement::new(u64::from(q), n, alpha, seed).unwrap();
        for _ in 0..2 {
            let inst = next_instance(&mut p);
            let u = plan(&inst, Scheme::Uncoded);
            let c = plan(&inst, Scheme::Coded);
            let ub = plan(&inst, Scheme::Ubershuffle { nu });
            for txs in [&u, &c, &ub] {
                prop_assert_eq!(verify(&inst, txs), Ok(()));
                // XOR on stand-in payloads: each receiver recovers its sample's bytes.
                let payload = |s: SampleId| s.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xABCD;
                for t in txs.iter() {
                    let packet = t.parts.iter().fold(0, |x, &(s, _)| x ^ payload(s));
                    for &(s, r) in &t.parts {
                        let others = t.parts.iter().filter(|&&(o, _)| o != s)
                            .fold(0, |x, &(o, _)| { assert!(inst.cache(r).contains(&o)); x ^ payload(o) });
                        prop_assert_eq!(packet ^ others, payload(s));
                    }
                }
            }
            prop_assert_eq!(u.len(), inst.missing_count());
            prop_assert!(c.len() <= u.len());
            prop_assert!(ub.len() <= c.len());
            prop_assert_eq!(plan(&inst, Scheme::Ubershuffle { nu }), ub.clone());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Pairing by size changes which samples share a packet, never how many packets each
    /// group gets, and never sends more payload bytes than pairing by id.
    #[test]
    fn plan_by_size_keeps_the_groups_and_cuts_padding(
        n in 2usize..=8,
        q in 20u32..300,
        seed in any::<u64>(),
        salt in any::<u64>(),
        nu in 0usize..3,
    ) {
        let q = q.max(n as u32);
        let alpha = ((q as usize).div_ceil(n) as f64 / f64::from(q) * 1.5).min(1.0);
        let inst = next_instance(&mut RandomPlacement::new(u64::from(q), n, alpha, seed).unwrap());
        let len = |s: SampleId| (s ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48;
        for scheme in [Scheme::Uncoded, Scheme::Coded, Scheme::Ubershuffle { nu }] {
            let by_id = plan(&inst, scheme);
            let by_size = plan_by_size(&inst, scheme, &len);
            prop_assert_eq!(verify(&inst, &by_size), Ok(()));
            // Same groups in the same order: ranks can follow the server's broadcasts
            // with plain plan().
            let groups = |txs: &[Transmission]| -> Vec<Vec<Node>> {
                txs.iter().map(|t| t.group.clone()).collect()
            };
            prop_assert_eq!(groups(&by_id), groups(&by_size));
            let payload = |txs: &[Transmission]| -> u64 {
                txs.iter().map(|t| t.parts.iter().map(|&(s, _)| len(s)).max().unwrap_or(0)).sum()
            };
            prop_assert!(payload(&by_size) <= payload(&by_id));
        }
    }
}
