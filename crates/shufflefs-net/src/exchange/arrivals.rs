//! Naming what arrives: one small round before an exchange in which each sender tells each
//! of its receivers the ids it sends there (8 bytes an id, in slot order), so a rank's step
//! costs O(k) instead of walking every arrival back to epoch 0 (`plan::unnamed`).
//!
//! Only peers the step moves samples with get a message; a rank with no transfer sends and
//! waits for nothing. Each message starts with the epoch the step leads into, so a list
//! left over from a round that failed half-way is not taken for the next one's. What a
//! peer told is checked against the plan; a list that does not fit, or a round that fails
//! (a peer gone), leaves this rank to walk the plan instead ([`told_or_walked`]), which
//! gives the same step: the round only saves time.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::comm::{Batch, Comm, CommError};
use crate::plan::unnamed::{NamingError, Unnamed};
use crate::plan::{EpochShares, Plan, Rank, SampleId, Step};

use super::{ID_BYTES, decode_ids, encode_ids};

/// The round's tag into `target`: the fourth of the exchange's tags of that epoch (the
/// executor's `tags` use the low bits 0..=2), so a list that a failed round left
/// unreceived is never matched by a later round (and its epoch would be refused if it were).
fn tag(target: u64) -> u16 {
    (((target & 0x1FFF) as u16) << 2) | 3
}

/// Whether `tag` is a naming round's (for test transports that inject faults into the
/// exchange alone).
pub fn is_names_tag(tag: u16) -> bool {
    tag & 3 == 3
}

/// Why the round did not name the arrivals.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RoundError {
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error(transparent)]
    Naming(#[from] NamingError),
    #[error("rank {from} named the samples it sends into epoch {told}, not {target}")]
    Epoch { from: Rank, told: u64, target: u64 },
}

/// `unnamed`'s step, its arrivals named by their senders (collective over the peers it
/// moves samples with that `takes_part` accepts: each of them must run it for the same
/// epoch, and agree on who takes part). What a peer left out sends is named by walking
/// back.
pub(crate) fn told(
    comm: &mut dyn Comm,
    plan: &Plan,
    unnamed: &Unnamed,
    takes_part: &dyn Fn(Rank) -> bool,
    abort: &AtomicBool,
) -> Result<Step, RoundError> {
    let target = unnamed.target();
    let message = |ids: &[SampleId]| [target.to_le_bytes().to_vec(), encode_ids(ids)].concat();
    let batch = Batch {
        sends: (unnamed.told().into_iter())
            .filter(|(to, _)| takes_part(*to))
            .map(|(to, ids)| (to, message(&ids)))
            .collect(),
        recvs: (unnamed.expected().into_iter())
            .filter(|(from, _)| takes_part(*from))
            .map(|(from, n)| (from, vec![0; (n + 1) * ID_BYTES]))
            .collect(),
    };
    let mut heard = plan.walked_lists(unnamed, |q| !takes_part(q));
    if !batch.sends.is_empty() || !batch.recvs.is_empty() {
        for (from, bytes) in comm.transfer(tag(target), batch, abort)?.recvs {
            let mut ids = decode_ids(&bytes);
            let told = ids.next().unwrap_or(u64::MAX);
            if told != target {
                return Err(RoundError::Epoch { from, told, target });
            }
            heard.insert(from, ids.collect());
        }
    }
    Ok(unnamed.named(&heard)?)
}

/// [`told`], or where the round fails (said in the log) the walk back: the same step.
pub fn told_or_walked(
    comm: &mut dyn Comm,
    plan: &Plan,
    unnamed: &Unnamed,
    takes_part: &dyn Fn(Rank) -> bool,
    abort: &AtomicBool,
) -> Step {
    told(comm, plan, unnamed, takes_part, abort).unwrap_or_else(|e| {
        let target = unnamed.target();
        tracing::warn!(
            "naming the samples arriving into epoch {target}: {e}; walking the plan back instead"
        );
        plan.walked(unnamed)
    })
}

/// `rank`'s step out of `cur`: named by the round for a per-rank plan (with the peers
/// `takes_part` accepts), walked back if the round fails (said in the log); the whole job's
/// step for a plan that is not per rank. Collective, as [`told`].
pub fn named(
    comm: &mut dyn Comm,
    plan: &Plan,
    cur: &Arc<EpochShares>,
    takes_part: &dyn Fn(Rank) -> bool,
    abort: &AtomicBool,
) -> Step {
    match plan.own_unnamed(comm.rank(), cur) {
        Some(unnamed) => told_or_walked(comm, plan, &unnamed, takes_part, abort),
        None => plan.step(cur),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::LocalComm;
    use crate::plan::PlanParams;

    /// Five ranks in one process name their arrivals through the round, epoch after
    /// epoch, exactly as the walk does.
    #[test]
    fn the_round_names_what_the_walk_names() {
        let plan = Plan::new(PlanParams {
            samples: 997,
            world: 5,
            fraction: 0.4,
            seed: 2,
        })
        .unwrap();
        let ranks: Vec<_> = (LocalComm::world(5).into_iter())
            .map(|mut comm| {
                let plan = plan.clone();
                std::thread::spawn(move || {
                    let me = comm.rank();
                    let mut cur = Arc::new(plan.own_initial(me));
                    let abort = AtomicBool::new(false);
                    for _ in 0..5 {
                        let unnamed = plan.own_unnamed(me, &cur).unwrap();
                        let step = told(&mut comm, &plan, &unnamed, &|_| true, &abort).unwrap();
                        let walked = plan.walked(&unnamed);
                        assert_eq!(step.next, walked.next);
                        assert_eq!(step.transfers, walked.transfers);
                        cur = Arc::new(step.next);
                    }
                    cur
                })
            })
            .collect();
        let whole = plan.shares_at(5);
        for (r, h) in ranks.into_iter().enumerate() {
            assert_eq!(h.join().unwrap().share(r as Rank), whole.share(r as Rank));
        }
    }
}
