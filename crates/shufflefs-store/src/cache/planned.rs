//! The kept sets a partial cache's gate (`super::admission`) steps through: the partial
//! exchange's (this rank's own, `plan::keep_local`) or a coded run's (`plan::coded_keep`).
//! One enum rather than a trait: the gate needs the few operations below, and the coded
//! kind has no transfers to filter and no early refill (its exchange drops what leaves,
//! `exchange::coded`).

use super::early::Early;
use crate::plan::coded_keep::CodedPlacement;
use crate::plan::ids::SampleSet;
use crate::plan::keep_local::LocalKeep;
use crate::plan::{Rank, SampleId};

#[derive(Clone, Debug)]
pub(crate) enum Planned {
    /// This rank's own kept sets (`plan::keep_local`).
    Partial(LocalKeep),
    Coded(CodedPlacement),
}

impl Planned {
    pub(crate) fn epoch(&self) -> u64 {
        match self {
            Planned::Partial(p) => p.epoch(),
            Planned::Coded(p) => p.epoch(),
        }
    }

    /// Steps on to `epoch` (no-op if there or past it).
    pub(crate) fn advance_to(&mut self, epoch: u64) {
        match self {
            Planned::Partial(p) => p.advance_to(epoch),
            Planned::Coded(p) => p.advance_to(epoch),
        }
    }

    /// `rank`'s kept set at the current epoch, sorted (a partial plan holds its own rank's
    /// only).
    pub(crate) fn kept(&self, rank: Rank) -> SampleSet {
        match self {
            Planned::Partial(p) => p.kept().clone(),
            Planned::Coded(p) => {
                let ids: Vec<SampleId> = p.caches()[rank as usize].iter().copied().collect();
                SampleSet::from_ids(&ids)
            }
        }
    }

    /// `rank`'s early refill at the current epoch (idle for a coded run).
    pub(crate) fn early(&self) -> Early {
        match self {
            Planned::Partial(p) => early_of(p),
            Planned::Coded(_) => Early::default(),
        }
    }
}

/// The early refill at `planner`'s epoch: its kept samples leaving next epoch, and the next
/// epoch's new kept samples already in its share.
fn early_of(planner: &LocalKeep) -> Early {
    let (kept, share) = (planner.kept(), planner.share());
    let next_share = planner.next_share();
    let leavers = kept.iter().filter(|&s| !next_share.contains(s)).collect();
    let next_new = (planner.next_kept().iter())
        .filter(|&s| !kept.contains(s) && share.contains(s))
        .collect();
    Early::new(planner.epoch(), leavers, next_new)
}
