//! Properties of the per-rank plan (`plan::local`): every rank computes its part alone, and
//! the parts fit together. The test plays all ranks: it routes each rank's sends to their
//! receivers by slot, as the exchange would, and checks Algorithm 1's promises every epoch:
//! a partition of the dataset, `k` sent per rank (moves to itself included), each rank
//! receiving exactly what is sent to it, share sizes unchanged, the same result from the
//! same seed; and that a rank alone finds the same slots by walking back (`slots_at`, how it
//! resumes) and the same ids at every position (`id_at`, how it names what arrives).

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use shufflefs::plan::HostLayout;
use shufflefs::plan::local::{GlobalId, LocalParams, LocalPlan};

fn params() -> impl Strategy<Value = LocalParams> {
    (0u64..700, 1u32..12, 0.0f64..=1.0, any::<u64>())
        .prop_map(|(n, m, q, seed)| LocalParams::new(n, m, q, seed).expect("valid parameters"))
}

/// A plan of `p`, under node scope when `hosts` is given (rank r on host `hosts[r % len]`).
fn plan(p: LocalParams, hosts: Option<&[u32]>) -> LocalPlan {
    let layout = hosts.map(|h| {
        let labels: Vec<u32> = (0..p.world as usize).map(|r| h[r % h.len()]).collect();
        Arc::new(HostLayout::new(&labels))
    });
    LocalPlan::new(p, layout)
}

/// Every rank's slots at epochs `0..=epochs`, stepping each rank alone and delivering by
/// slot.
fn walk(plan: &LocalPlan, epochs: u64) -> Vec<Vec<Vec<GlobalId>>> {
    let p = *plan.params();
    let m = p.world;
    let mut slots: Vec<Vec<GlobalId>> = (0..m).map(|r| plan.initial_slots(r)).collect();
    let mut history = vec![slots.clone()];
    for epoch in 0..epochs {
        let steps: Vec<_> = (0..m)
            .map(|r| plan.step(epoch, r, &slots[r as usize]))
            .collect();
        // What each sender puts on the wire, by (receiver, slot).
        let mut wire: BTreeMap<(u32, u64), GlobalId> = BTreeMap::new();
        for (from, step) in steps.iter().enumerate() {
            assert!(step.sends.len() as u64 <= p.exchange_count());
            for s in &step.sends {
                assert_ne!(s.to, from as u32);
                assert!(wire.insert((s.to, s.slot), s.sample).is_none());
            }
        }
        let mut next = Vec::new();
        for (me, step) in steps.iter().enumerate() {
            let arrived: Vec<GlobalId> = (step.receives.iter())
                .map(|r| {
                    wire.remove(&(me as u32, r.slot)).unwrap_or_else(|| {
                        panic!("rank {me} expects slot {} of {}", r.slot, r.from)
                    })
                })
                .collect();
            assert_eq!(arrived.len(), step.sends.len(), "rank {me} balanced");
            next.push(step.next_slots(&slots[me], &arrived));
        }
        assert!(wire.is_empty(), "sent but expected by nobody: {wire:?}");
        let all = plan.step_all(epoch, &slots);
        assert_eq!(all.next, next, "the whole job's step is the ranks' steps");
        slots = next;
        history.push(slots.clone());
    }
    history
}

fn assert_partition(p: &LocalParams, shares: &[Vec<GlobalId>]) {
    let mut all: Vec<GlobalId> = shares.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..p.samples).collect::<Vec<_>>());
    for (r, share) in shares.iter().enumerate() {
        let chunk = p.chunk(r as u32);
        assert_eq!(
            share.len() as u64,
            chunk.end - chunk.start,
            "rank {r}'s size"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn every_epoch_is_a_balanced_partition_and_a_rank_alone_finds_its_slots(
        p in params(), epochs in 0u64..5, node in any::<bool>()
    ) {
        let plan = plan(p, node.then_some(&[0, 0, 1, 2, 1][..]));
        for (epoch, shares) in walk(&plan, epochs).iter().enumerate() {
            assert_partition(&p, shares);
            for r in 0..p.world {
                prop_assert_eq!(&plan.slots_at(epoch as u64, r, 3), &shares[r as usize]);
            }
            if p.samples > 0 {
                let pos = p.samples / 2;
                let owner = p.chunk_of(pos);
                let offset = pos - p.chunk(owner).start;
                prop_assert_eq!(plan.id_at(epoch as u64, pos), shares[owner as usize][offset as usize]);
            }
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_shares(p in params()) {
        prop_assert_eq!(walk(&plan(p, None), 3), walk(&plan(p, None), 3));
    }

    #[test]
    fn positions_fall_in_the_chunk_that_holds_them(p in params()) {
        for r in 0..p.world {
            for pos in p.chunk(r) {
                prop_assert_eq!(p.chunk_of(pos), r);
            }
        }
    }
}

/// Exactly `k` of each share is picked; about `Q (M-1)/M` of it moves (the rest is routed
/// to its own rank), as in the paper.
#[test]
fn a_fraction_q_of_each_share_moves() {
    let p = LocalParams::new(40_000, 8, 0.3, 5).unwrap();
    let plan = LocalPlan::new(p, None);
    let (mut moved, mut k) = (0.0, 0.0);
    for epoch in 0..8 {
        let step = plan.step(epoch, 3, &plan.slots_at(epoch, 3, 2));
        moved += step.sends.len() as f64;
        k += p.exchange_count() as f64;
    }
    let expected = k * 7.0 / 8.0;
    assert!(
        (moved - expected).abs() < 0.05 * expected,
        "moved {moved}, expected about {expected}"
    );
}

/// Node scope never moves a sample off its host: each host's set is the one epoch 0 dealt.
#[test]
fn node_scope_keeps_each_hosts_samples() {
    let p = LocalParams::new(600, 6, 1.0, 9).unwrap();
    let plan = plan(p, Some(&[0, 0, 0, 1, 1, 2]));
    let history = walk(&plan, 4);
    let host_set = |shares: &Vec<Vec<GlobalId>>, ranks: std::ops::Range<usize>| {
        let mut s: Vec<GlobalId> = ranks.flat_map(|r| shares[r].clone()).collect();
        s.sort_unstable();
        s
    };
    for shares in &history[1..] {
        assert_eq!(host_set(shares, 0..3), host_set(&history[0], 0..3));
        assert_eq!(host_set(shares, 3..5), host_set(&history[0], 3..5));
        assert_eq!(
            shares[5], history[0][5],
            "a host of one rank keeps its share"
        );
    }
    assert_ne!(history[1][0], history[0][0], "samples move within a host");
}

/// A different seed deals differently; one seed deals alike.
#[test]
fn the_deal_depends_on_the_seed() {
    let a = LocalPlan::new(LocalParams::new(1000, 4, 0.5, 1).unwrap(), None);
    let b = LocalPlan::new(LocalParams::new(1000, 4, 0.5, 2).unwrap(), None);
    assert_ne!(a.initial_slots(0), b.initial_slots(0));
    assert_eq!(a.initial_slots(0), a.initial_slots(0));
}
