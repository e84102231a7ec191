//! `--equal-shares drop` over many plans (`plan::equal`): every view holds exactly
//! floor(N/M) samples of its share, N mod M samples are left out per epoch, and the rule
//! "least left out first" holds: a rank never leaves out a sample again while it holds one
//! left out fewer times; without an exchange each longer share's samples take turns.

use std::collections::BTreeSet;

use proptest::prelude::*;
use shufflefs::plan::equal::{Replay, view_size};
use shufflefs::plan::{Plan, PlanParams};

fn params() -> impl Strategy<Value = PlanParams> {
    (
        1u32..9,
        0u32..300,
        prop_oneof![Just(0.0), 0.0f64..=1.0],
        any::<u64>(),
    )
        .prop_map(|(world, extra, fraction, seed)| PlanParams {
            samples: u64::from(world + extra),
            world,
            fraction,
            seed,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn views_are_equal_and_no_sample_is_left_out_again_before_its_peers(
        p in params(),
        epochs in 1u64..15,
    ) {
        let plan = Plan::new(p).unwrap();
        let keep = view_size(&plan);
        prop_assert_eq!(keep as u64, p.samples / u64::from(p.world));
        let mut replay = Replay::new(&plan);
        for epoch in 0..epochs {
            replay.advance_to(&plan, epoch);
            let left = replay.left_out_all(&plan);
            let mut all_left = BTreeSet::new();
            for (rank, share) in replay.shares.shares.iter().enumerate() {
                let gone = &left[rank];
                prop_assert_eq!(share.len() - gone.len(), keep, "rank {} epoch {}", rank, epoch);
                let fewest = share.iter().map(|&s| replay.counts[s as usize]).min().unwrap_or(0);
                for &s in gone {
                    prop_assert!(share.binary_search(&s).is_ok());
                    prop_assert_eq!(replay.counts[s as usize], fewest, "rank {} left out {} again first", rank, s);
                    all_left.insert(s);
                }
            }
            prop_assert_eq!(all_left.len() as u64, p.samples % u64::from(p.world));
        }
    }

    #[test]
    fn without_an_exchange_a_longer_share_is_left_out_in_turn(
        p in params(),
        rounds in 1usize..4,
    ) {
        let p = PlanParams { fraction: 0.0, ..p };
        let plan = Plan::new(p).unwrap();
        let mut replay = Replay::new(&plan);
        let shares = plan.initial();
        for (rank, share) in shares.shares.iter().enumerate() {
            if share.len() == view_size(&plan) {
                continue;
            }
            // Over `rounds` x its length epochs, every sample of the share is left out once
            // per round: none twice before every other once.
            let mut counts = vec![0u32; p.samples as usize];
            for epoch in 0..(rounds * share.len()) as u64 {
                replay.advance_to(&plan, epoch);
                let gone = &replay.left_out_all(&plan)[rank];
                prop_assert_eq!(gone.len(), 1);
                counts[gone[0] as usize] += 1;
                let round = epoch as usize / share.len();
                for &s in share {
                    prop_assert!(counts[s as usize] <= round as u32 + 1);
                }
            }
            for &s in share {
                prop_assert_eq!(counts[s as usize], rounds as u32);
            }
        }
    }
}
