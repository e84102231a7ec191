//! Properties of the per-rank plan (`plan::local`): every rank computes its part alone, and
//! the parts fit together. The test plays all ranks: it routes each rank's sends to their
//! receivers by slot, as the exchange would, and checks Algorithm 1's promises every epoch:
//! a partition of the dataset, `k` sent per rank (moves to itself included), each rank
//! receiving exactly what is sent to it, share sizes unchanged, and the same result from
//! the same seed.

use std::collections::BTreeMap;

use proptest::prelude::*;
use shufflefs::plan::local::{GlobalId, LocalParams};

fn params() -> impl Strategy<Value = LocalParams> {
    (0u64..700, 1u32..12, 0.0f64..=1.0, any::<u64>())
        .prop_map(|(n, m, q, seed)| LocalParams::new(n, m, q, seed).expect("valid parameters"))
}

/// Every rank's share at `epochs`, stepping each rank alone and delivering by slot.
fn walk(p: &LocalParams, epochs: u64) -> Vec<Vec<Vec<GlobalId>>> {
    let m = p.world;
    let mut shares: Vec<Vec<GlobalId>> = (0..m).map(|r| p.initial_share(r)).collect();
    let mut history = vec![shares.clone()];
    for epoch in 0..epochs {
        let steps: Vec<_> = (0..m)
            .map(|r| p.step(epoch, r, &shares[r as usize]))
            .collect();
        // What each sender puts on the wire, by (receiver, slot).
        let mut wire: BTreeMap<(u32, u64), GlobalId> = BTreeMap::new();
        for (from, step) in steps.iter().enumerate() {
            assert_eq!(step.kept.len() + step.sends.len(), shares[from].len());
            assert!(
                step.sends.len() as u64 <= p.exchange_count(),
                "rank {from} sends {} > k {}",
                step.sends.len(),
                p.exchange_count()
            );
            for s in &step.sends {
                assert_ne!(s.to, from as u32);
                assert!(wire.insert((s.to, s.slot), s.sample).is_none());
            }
        }
        let mut next = Vec::new();
        for (me, step) in steps.iter().enumerate() {
            let arrived: Vec<GlobalId> = step
                .receives
                .iter()
                .map(|r| {
                    wire.remove(&(me as u32, r.slot)).unwrap_or_else(|| {
                        panic!("rank {me} expects slot {} of {}", r.slot, r.from)
                    })
                })
                .collect();
            assert_eq!(arrived.len(), step.sends.len(), "rank {me} balanced");
            let share = step.next_share(arrived);
            assert_eq!(
                share.len(),
                shares[me].len(),
                "rank {me} keeps its share size"
            );
            next.push(share);
        }
        assert!(wire.is_empty(), "sent but expected by nobody: {wire:?}");
        shares = next;
        history.push(shares.clone());
    }
    history
}

fn assert_partition(shares: &[Vec<GlobalId>], n: u64) {
    let mut all: Vec<GlobalId> = shares.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..n).collect::<Vec<_>>());
    let min = shares.iter().map(Vec::len).min().unwrap();
    let max = shares.iter().map(Vec::len).max().unwrap();
    assert!(max - min <= 1, "unbalanced: {min}..{max}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_epoch_is_a_balanced_partition_and_every_send_arrives(p in params(), epochs in 0u64..5) {
        for shares in walk(&p, epochs) {
            assert_partition(&shares, p.samples);
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_shares(p in params()) {
        prop_assert_eq!(walk(&p, 3), walk(&p, 3));
    }
}

/// About `Q (M-1)/M` of a share moves each epoch, as in the paper.
#[test]
fn a_fraction_q_of_each_share_moves() {
    let p = LocalParams::new(40_000, 8, 0.3, 5).unwrap();
    let share = p.initial_share(3);
    let step = p.step(0, 3, &share);
    let k = p.exchange_count() as f64;
    let moved = step.sends.len() as f64;
    let expected = k * 7.0 / 8.0;
    assert!(
        (moved - expected).abs() < 0.05 * expected,
        "moved {moved}, expected about {expected}"
    );
}

/// Epoch 0 matches a dealt permutation: ranks' chunks differ in size by at most one, and
/// a different seed deals differently.
#[test]
fn the_deal_depends_on_the_seed() {
    let a = LocalParams::new(1000, 4, 0.5, 1).unwrap();
    let b = LocalParams::new(1000, 4, 0.5, 2).unwrap();
    assert_ne!(a.initial_share(0), b.initial_share(0));
    assert_eq!(a.initial_share(0), a.initial_share(0));
}
