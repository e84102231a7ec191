//! Picking up a cache after a crash, so the epochs that follow are those of a run that was
//! never interrupted and nothing already cached is fetched from the source again.
//!
//! The ranks may have died anywhere: some already in epoch E (their exchange into E done),
//! others still in E-1 with that exchange half done. Everyone resumes at E, the furthest epoch
//! reached (the daemon takes the maximum of the saved epochs). What each rank lacks of its E
//! share is then sent again by the ranks the plan moved it from. They still hold it: a sender
//! drops a sample only after advancing past the exchange, which ends with each receiver's
//! `syncfs` and its confirmation to the sender, so a sample was dropped only if its receiver
//! holds it durably.
//! Anything still missing (a lost cache file) comes from the source when read, as always.
//!
//! Finally the cache is trimmed to the E and E+1 shares, keeping it within about (1+Q) of
//! the share whatever moment the crash hit.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::resumed::Resumed;
use super::saved;
use crate::cache::SampleStore;
use crate::comm::{Comm, CommError};
use crate::exchange::{self, ExchangeConfig, ExchangeTracker};
use crate::plan::{EpochShares, Plan, Rank, SampleId, Step};

/// Completes the exchange into `epoch` for the samples some rank still lacks, then drops
/// what belongs to neither `epoch` nor `epoch + 1`. Every rank must call it.
pub fn resume(
    comm: &mut dyn Comm,
    store: &SampleStore,
    plan: &Plan,
    epoch: u64,
) -> Result<Resumed, CommError> {
    let rank = comm.rank();
    // This rank's share at `epoch - 1` is read from what it saved then (O(share), `saved`)
    // or walked back (O(share · epoch)), then stepped into `epoch` (what may need redoing)
    // and one step on. This rank's own part only: its arrivals named by their senders
    // (`exchange::arrivals`, O(k)), no other rank's share computed.
    let abort = AtomicBool::new(false);
    let current = if epoch == 0 {
        plan.own_initial(rank)
    } else {
        let previous = Arc::new(saved::own_shares_at(
            store.dir().root(),
            plan,
            rank,
            epoch - 1,
        ));
        let step = exchange::arrivals::named(comm, plan, &previous, &|_| true, &abort);
        redo_missing(comm, store, &step)?;
        // A rank that crashed before saving `epoch` (the job resumes at the furthest
        // epoch any rank reached) has it saved now, for a crash before the next advance.
        saved::save(store.dir().root(), plan, rank, &step.next);
        step.next
    };
    let current = Arc::new(current);
    let next = exchange::arrivals::named(comm, plan, &current, &|_| true, &abort);
    // The step let go of it: the share itself, not a copy.
    let current = Arc::try_unwrap(current).unwrap_or_else(|c| EpochShares::clone(&c));
    // A coded run's cache also keeps retained samples (`plan::coded`).
    let retained = plan.retained(rank, current.epoch);
    trim(store, rank, &current, &next.next, &retained);
    Ok(Resumed {
        current,
        next,
        resize: None,
    })
}

/// Drops what belongs to neither `current` nor `next`'s share of `rank`, nor `retained`
/// (ascending: the samples a coded run's cache keeps beyond the share, `Plan::retained`).
pub(crate) fn trim(
    store: &SampleStore,
    rank: Rank,
    current: &EpochShares,
    next: &EpochShares,
    retained: &[SampleId],
) {
    let keep = |id: &SampleId| {
        current.share(rank).binary_search(id).is_ok()
            || next.share(rank).binary_search(id).is_ok()
            || retained.binary_search(id).is_ok()
    };
    let mut dropped = 0u64;
    for id in store.held().into_iter().filter(|id| !keep(id)) {
        // Not fatal: the other ranks are already on their way to mounting.
        let removed = store.remove(id);
        store.forget(id);
        match removed {
            Ok(()) => dropped += 1,
            Err(e) => tracing::warn!(sample = id, error = %e, "cannot drop a stale cached sample"),
        }
    }
    if dropped > 0 {
        tracing::info!(
            samples = dropped,
            "dropped cached samples that belong to no current or next share"
        );
    }
}

/// Sends again, per `step`, the samples some rank still lacks of its share after `step`.
fn redo_missing(comm: &mut dyn Comm, store: &SampleStore, step: &Step) -> Result<(), CommError> {
    let missing: Vec<SampleId> = step
        .next
        .share(comm.rank())
        .iter()
        .copied()
        .filter(|&id| !store.contains(id))
        // A partial cache asks only for what it keeps (the rest is read from the source).
        .filter(|&id| store.admits(id))
        .collect();
    let lacking: Vec<HashSet<SampleId>> = comm
        .all_gather(&exchange::encode_ids(&missing))?
        .iter()
        .map(|b| exchange::decode_ids(b).collect())
        .collect();
    let transfers: Vec<_> = step
        .transfers
        .iter()
        .filter(|t| lacking[t.to as usize].contains(&t.sample))
        .copied()
        .collect();
    if transfers.is_empty() {
        return Ok(());
    }
    tracing::info!(
        epoch = step.next.epoch,
        samples = transfers.len(),
        "resuming an interrupted exchange"
    );
    let redo = Step {
        next: step.next.clone(),
        transfers,
    };
    if let Err(e) = exchange::run(
        comm,
        store,
        &redo,
        ExchangeConfig::default(),
        &ExchangeTracker::default(),
        &AtomicBool::new(false),
    ) {
        tracing::warn!(error = %e, "resumed exchange incomplete; the rest comes from the source");
    }
    Ok(())
}
