//! The kept sets a partial cache's gate (`super::admission`) steps through: the partial
//! exchange's (`plan::keep`) or a coded run's (`plan::coded_keep`). One enum rather than a
//! trait: the gate needs the few operations below, and the coded kind has no transfers to
//! filter and no early refill (its exchange drops what leaves, `exchange::coded`).

use super::early::Early;
use crate::plan::coded_keep::CodedPlacement;
use crate::plan::keep::KeepPlanner;
use crate::plan::{Rank, SampleId, Step};

#[derive(Clone, Debug)]
pub(crate) enum Planned {
    Partial(KeepPlanner),
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
            Planned::Partial(p) => {
                while p.epoch() < epoch {
                    p.advance();
                }
            }
            Planned::Coded(p) => p.advance_to(epoch),
        }
    }

    /// `rank`'s kept set at the current epoch, sorted.
    pub(crate) fn kept(&self, rank: Rank) -> Vec<SampleId> {
        match self {
            Planned::Partial(p) => p.kept(rank).to_vec(),
            Planned::Coded(p) => p.caches()[rank as usize].iter().copied().collect(),
        }
    }

    /// `rank`'s early refill at the current epoch (idle for a coded run).
    pub(crate) fn early(&self, rank: Rank) -> Early {
        match self {
            Planned::Partial(p) => early_of(p, rank),
            Planned::Coded(_) => Early::default(),
        }
    }

    /// The transfers of `step` that carry what their receiver keeps and gets through the
    /// exchange; `None` when `step` leaves an epoch before the one planned from (a coded
    /// step has no transfers: unchanged).
    pub(crate) fn exchanged(&self, step: &Step) -> Option<Step> {
        let Planned::Partial(planner) = self else {
            return Some(step.clone());
        };
        let from = step.next.epoch.saturating_sub(1);
        let p = planner.at_epoch(from)?;
        Some(Step {
            next: step.next.clone(),
            transfers: p.exchanged(step),
        })
    }
}

/// `rank`'s early refill at `planner`'s epoch: its kept samples leaving next epoch, and the
/// next epoch's new kept samples already in its share.
fn early_of(planner: &KeepPlanner, rank: Rank) -> Early {
    let mut next = planner.clone();
    next.advance();
    let (kept, share) = (planner.kept(rank), planner.shares().share(rank));
    let next_share = next.shares().share(rank);
    let leavers = (kept.iter().copied())
        .filter(|s| next_share.binary_search(s).is_err())
        .collect();
    let next_new = (next.kept(rank).iter().copied())
        .filter(|s| kept.binary_search(s).is_err() && share.binary_search(s).is_ok())
        .collect();
    Early::new(planner.epoch(), leavers, next_new)
}
