//! Checks on the plan's shares shared by the property tests (`plan_props`, `elastic_props`),
//! which include this file alone (`#[path]`), not the daemon helpers of `common`.

use shufflefs::plan::EpochShares;

/// Every sample `0..n` is owned by exactly one rank, and each share is sorted and unique.
pub fn assert_partition(shares: &EpochShares, n: u64) {
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
