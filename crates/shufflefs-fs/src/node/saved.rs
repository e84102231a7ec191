//! This rank's share saved each epoch and read back at a resume (resume in
//! O(share), not by walking the plan back to epoch 0). The file format lives in
//! `cache::slots`; here is what the plan makes of it.
//!
//! Saving is a shortcut, never a requirement: a rank that cannot save (a full disk) warns
//! and goes on, and a resume that finds no usable file (missing, cut short, corrupt, saved
//! for another epoch or other settings) walks back as before and says why in the log.

use std::path::Path;

use crate::cache::slots::{self, SlotsKey, SlotsMiss};
use crate::plan::{EpochShares, Plan, Rank};

/// What a saved file of `rank`'s slots at `epoch` must match under `plan`.
fn key(plan: &Plan, rank: Rank, epoch: u64) -> SlotsKey {
    let params = plan.params();
    SlotsKey {
        epoch,
        rank,
        world: params.world,
        samples: params.samples,
        seed: params.seed,
        fraction_bits: params.fraction.to_bits(),
        plan: plan.fingerprint(),
    }
}

/// Saves `rank`'s slots of `shares` in the cache folder `root` (the files of all but this
/// epoch and the one before go). Nothing for a plan without slots (coded).
pub(crate) fn save(root: &Path, plan: &Plan, rank: Rank, shares: &EpochShares) {
    let Some(own) = shares.slots.get(rank as usize) else {
        return;
    };
    if !plan.is_per_rank() {
        return;
    }
    let key = key(plan, rank, shares.epoch);
    if let Err(e) = slots::save(root, &key, own) {
        tracing::warn!(epoch = shares.epoch, error = %e, "cannot save this rank's share; a resume will recompute it");
    }
}

/// `rank`'s view of `epoch`: read from its slots saved under `root` when they match
/// (O(share)), else walked back (`Plan::own_shares_at`, O(share · epoch)).
pub fn own_shares_at(root: &Path, plan: &Plan, rank: Rank, epoch: u64) -> EpochShares {
    match load(root, plan, rank, epoch) {
        Ok(shares) => shares,
        Err(why) => {
            match &why {
                SlotsMiss::Missing(_) => tracing::debug!(epoch, "{why}; walking the plan back"),
                _ => tracing::info!(epoch, "saved share not used: {why}; walking the plan back"),
            }
            plan.own_shares_at(rank, epoch)
        }
    }
}

fn load(root: &Path, plan: &Plan, rank: Rank, epoch: u64) -> Result<EpochShares, SlotsMiss> {
    if !plan.is_per_rank() {
        return Err(SlotsMiss::Missing(epoch));
    }
    let slots = slots::load(root, &key(plan, rank, epoch))?;
    (plan.own_from_slots(rank, epoch, slots)).ok_or(SlotsMiss::Unfit(epoch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{ExchangeScope, PlanParams};

    const RANK: Rank = 2;

    fn plan(seed: u64) -> Plan {
        let params = PlanParams {
            samples: 103,
            world: 4,
            fraction: 0.5,
            seed,
        };
        Plan::new(params).unwrap()
    }

    /// What `own_shares_at` gave, and whether it equals the walk-back.
    fn resumed(root: &Path, plan: &Plan, epoch: u64) -> (EpochShares, bool) {
        let got = own_shares_at(root, plan, RANK, epoch);
        let walked = got == plan.own_shares_at(RANK, epoch);
        (got, walked)
    }

    #[test]
    fn a_resume_reads_the_saved_share_and_it_equals_the_walk_back() {
        let tmp = tempfile::tempdir().unwrap();
        let p = plan(5);
        for epoch in 0..6 {
            save(tmp.path(), &p, RANK, &p.own_shares_at(RANK, epoch));
        }
        for epoch in [4, 5] {
            assert!(resumed(tmp.path(), &p, epoch).1, "epoch {epoch}");
        }
        // It is the file that answers: a different (valid) share saved for epoch 5 is read.
        let mut other = p.own_shares_at(RANK, 5);
        other.slots[RANK as usize].reverse();
        save(tmp.path(), &p, RANK, &other);
        let (got, walked) = resumed(tmp.path(), &p, 5);
        assert!(!walked);
        assert_eq!(got.slots, other.slots);
    }

    #[test]
    fn a_missing_cut_corrupt_or_other_file_falls_back_to_the_walk_back() {
        let tmp = tempfile::tempdir().unwrap();
        let p = plan(5);
        let file = tmp.path().join(slots::SLOTS).join("3.bin");
        // Saved with a reversed share, so only the walk-back gives the right one.
        let mut wrong = p.own_shares_at(RANK, 3);
        wrong.slots[RANK as usize].reverse();
        save(tmp.path(), &p, RANK, &wrong);
        let good = std::fs::read(&file).unwrap();
        assert!(!resumed(tmp.path(), &p, 3).1, "the saved file is read");
        assert!(resumed(tmp.path(), &p, 2).1, "missing");
        std::fs::write(&file, &good[..good.len() - 9]).unwrap();
        assert!(resumed(tmp.path(), &p, 3).1, "truncated");
        let mut flipped = good.clone();
        flipped[good.len() / 2] ^= 0x10;
        std::fs::write(&file, &flipped).unwrap();
        assert!(resumed(tmp.path(), &p, 3).1, "corrupt");
        std::fs::write(&file, &good).unwrap();
        std::fs::rename(&file, file.with_file_name("4.bin")).unwrap();
        assert!(resumed(tmp.path(), &p, 4).1, "another epoch's file");
        std::fs::rename(file.with_file_name("4.bin"), &file).unwrap();
        assert!(resumed(tmp.path(), &plan(6), 3).1, "another seed");
        let node = Plan::with_scope(*p.params(), ExchangeScope::Node, &[0, 0, 1, 1]).unwrap();
        assert!(resumed(tmp.path(), &node, 3).1, "another scope");
    }
}
