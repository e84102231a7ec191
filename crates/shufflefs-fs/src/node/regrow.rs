//! Filling the shares of a job restarted with another number of ranks (elastic restarts),
//! and resuming one that was resized before.
//!
//! The new shares are the pure plan's ([`ElasticPlan`]); what each rank actually holds is
//! whatever its cache folder kept, and that may be anything: the old share of the rank of
//! the same number, a share one epoch behind (killed mid-exchange), part of a restart that
//! was itself killed, or nothing (a new rank, or a rank now on another host). So this works
//! from the holdings, not from the plan's idea of them:
//!
//! 1. each rank takes what it lacks of its share from the caches of gone ranks on its host
//!    (the orphans `daemon::resize` found and locked): a hard link, or a checked copy
//!    ([`SampleStore::adopt_from_peer`]);
//! 2. the ranks tell each other what they still lack, and which of those samples they hold
//!    in their cache or in an orphan; every rank derives the same transfers from that (a
//!    holder on the receiver's host first, one with the sample in its own cache first, then
//!    spread over the holders by sample id);
//! 3. senders adopt from their orphans what they must send, and the exchange machinery
//!    moves everything (the [`Partial`] exchange, a step from the holders to the new owners, so
//!    same-host ranks hand samples over through the disk);
//! 4. what is still missing comes from the source (staging fetches the share in the
//!    background, readers wait for the samples they open);
//! 5. the cache is trimmed to the shares of this epoch and the next, made durable, and once
//!    every rank got that far the orphans are removed (reclaimed).
//!
//! A crash anywhere leaves only complete samples in caches that the next start reads the
//! same way: the state files already carry the new history, orphans are removed only after
//! every rank holds its share durably, and a second run finds less to do.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use super::resume::trim;
use super::resumed::{RegrowReport, Resumed};
use crate::cache::SampleStore;
use crate::comm::{Comm, CommError, agree};
use crate::exchange::{
    self, EpochExchange, ExchangeConfig, ExchangeCtx, ExchangeTracker, Partial, Peers,
};
use crate::plan::elastic::ElasticPlan;
use crate::plan::{Rank, SampleId, Step, Transfer};

/// Settings of a regrow.
pub struct RegrowConfig {
    pub exchange: ExchangeConfig,
    /// Whether same-host ranks may take samples from each other's caches (`--share-disk`).
    pub share_disk: bool,
}

/// Collective: fills this rank's share at `epoch` (see the module docs) from `orphans` (the
/// gone ranks' caches this rank locked), the other ranks and the source; then removes the
/// orphans. Every rank must call it.
pub fn regrow(
    comm: &mut dyn Comm,
    store: &SampleStore,
    plan: &ElasticPlan,
    epoch: u64,
    orphans: Vec<SampleStore>,
    cfg: &RegrowConfig,
) -> Result<Resumed, CommError> {
    let rank = comm.rank();
    // This rank's share alone: saved by an earlier run of this history, or walked back
    // across the remaps (O(share · epoch)). The transfers below come from what the ranks
    // hold, not from the plan.
    let root = store.dir().root();
    let current = super::saved::own_shares_at(root, plan.current(), rank, epoch);
    super::saved::save(root, plan.current(), rank, &current);
    let next = plan.current().own_step(rank, &current);
    let share = current.share(rank);
    let mut report = RegrowReport {
        epoch,
        history: plan.history().eras().to_vec(),
        share_samples: share.len() as u64,
        ..RegrowReport::default()
    };
    drop_unkept(store, share);
    let mut lacking: Vec<SampleId> = share
        .iter()
        .copied()
        .filter(|&id| !store.contains(id))
        // A partial cache gathers only what it keeps (the rest is read from the source).
        .filter(|&id| store.admits(id))
        .collect();
    report.kept = (share.len() - lacking.len()) as u64;
    // 1. From the gone ranks' caches on this host.
    lacking.retain(|&id| !adopt(store, &orphans, id));
    report.adopted = report.share_samples - report.kept - lacking.len() as u64;

    // 2. and 3. Who lacks what, who holds it; the exchange moves it.
    move_to_owners(comm, store, &orphans, &current, &lacking, cfg, &mut report)?;
    // 4. The source, for the rest (staging fetches the share).
    report.from_source = share.iter().filter(|&&id| !store.contains(id)).count() as u64;

    // 5. Trim, make durable, and reclaim once everybody is durable.
    trim(store, rank, &current, &next.next, &[]);
    report.reclaimed = reclaim_when_durable(comm, store, orphans)?;
    tracing::info!(
        epoch,
        kept = report.kept,
        adopted = report.adopted,
        received = report.received.values().sum::<u64>(),
        from_source = report.from_source,
        "share filled after a change of world size"
    );
    Ok(Resumed {
        current,
        next,
        resize: Some(report),
    })
}

/// Steps 2 and 3: the ranks learn who lacks what (`lacking`, this rank's) and who holds
/// it; senders take from their orphans what they send; the exchange moves it all. What
/// arrived goes into `report.received`; an exchange that ends early leaves the rest to the
/// source.
fn move_to_owners(
    comm: &mut dyn Comm,
    store: &SampleStore,
    orphans: &[SampleStore],
    current: &crate::plan::EpochShares,
    lacking: &[SampleId],
    cfg: &RegrowConfig,
    report: &mut RegrowReport,
) -> Result<(), CommError> {
    let rank = comm.rank();
    let transfers = plan_transfers(comm, store, orphans, lacking)?;
    for t in transfers.iter().filter(|t| t.from == rank) {
        if !store.contains(t.sample) {
            adopt(store, orphans, t.sample);
        }
    }
    if !transfers.is_empty() {
        tracing::info!(
            epoch = current.epoch,
            samples = transfers.len(),
            "moving samples to the owners of the new shares"
        );
    }
    let step = Step {
        next: current.clone(),
        transfers,
    };
    let peers = Peers::discover(comm, store.dir().root(), cfg.share_disk)?;
    let mut partial = Partial {
        cfg: cfg.exchange,
        peers,
    };
    let ctx = ExchangeCtx {
        store,
        tracker: &ExchangeTracker::default(),
        abort: &AtomicBool::new(false),
    };
    if let Err(e) = partial.run(comm, &step, ctx, &mut |_| {}) {
        tracing::warn!(error = %e, "moving samples to the new shares ended early; the rest comes from the source");
    }
    for t in step.transfers.iter().filter(|t| t.to == rank) {
        if store.contains(t.sample) {
            *report.received.entry(t.from).or_default() += 1;
        }
    }
    Ok(())
}

/// Step 5's end (collective): makes this rank's cache durable and, once every rank's is,
/// removes the orphans; returns the folders the job removed, by every rank in rank order
/// (none when they are kept). Job-wide, so each rank's status tells it: the orphan of a
/// gone rank is removed by whichever rank locked it, and the others' `reclaimed` said `[]`.
fn reclaim_when_durable(
    comm: &mut dyn Comm,
    store: &SampleStore,
    orphans: Vec<SampleStore>,
) -> Result<Vec<PathBuf>, CommError> {
    // Only a message for the log of every rank: it travels as text.
    let synced = store.sync().map_err(|e| e.to_string());
    let failures = agree(comm, synced)?;
    if failures.is_empty() {
        let mine = reclaim(orphans);
        return every_ranks(comm, &mine);
    }
    tracing::warn!(
        ?failures,
        "some ranks could not make their caches durable; the caches of gone ranks are kept until the next start"
    );
    Ok(Vec::new())
}

/// Collective: every rank's `paths`, in rank order (a path travels as its bytes, one per
/// line; a path holding a newline is not one shufflefs names a cache with).
fn every_ranks(comm: &mut dyn Comm, paths: &[PathBuf]) -> Result<Vec<PathBuf>, CommError> {
    use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
    let mut mine = Vec::new();
    for p in paths {
        mine.extend_from_slice(p.as_os_str().as_bytes());
        mine.push(b'\n');
    }
    let all = comm.all_gather(&mine)?;
    Ok((all.iter())
        .flat_map(|b| b.split(|&c| c == b'\n').filter(|l| !l.is_empty()))
        .map(|l| PathBuf::from(std::ffi::OsString::from_vec(l.to_vec())))
        .collect())
}

/// A partial cache's kept set is planned afresh at the restart (`plan::keep`): the samples
/// of this rank's share it holds but does not keep now go first, making room for the kept
/// ones (no other rank lacks them: they are this rank's).
fn drop_unkept(store: &SampleStore, share: &[SampleId]) {
    let Some(partial) = store.partial() else {
        return;
    };
    for &id in share {
        if store.contains(id) && !partial.wanted(id) {
            let _ = store.remove(id);
        }
    }
}

/// Takes sample `id` from the first orphan that has it; whether it is now cached.
fn adopt(store: &SampleStore, orphans: &[SampleStore], id: SampleId) -> bool {
    for orphan in orphans.iter().filter(|o| o.contains(id)) {
        match store.adopt_from_store(id, orphan) {
            Ok(_) => return true,
            // A partial cache out of room: expected, the sample is read from the source.
            Err(e) if crate::cache::admission::is_not_kept(&e) => return false,
            Err(e) => {
                tracing::warn!(sample = id, error = %e, "could not take a sample from a gone rank's cache")
            }
        }
    }
    store.contains(id)
}

/// Holdings of one sample, as a rank reports them.
const IN_CACHE: u8 = 1;
const IN_ORPHAN: u8 = 2;

/// Collective: the transfers every rank derives from everybody's lacking samples and
/// holdings (the same list on every rank).
fn plan_transfers(
    comm: &mut dyn Comm,
    store: &SampleStore,
    orphans: &[SampleStore],
    lacking: &[SampleId],
) -> Result<Vec<Transfer>, CommError> {
    let lacks: Vec<Vec<SampleId>> = comm
        .all_gather(&exchange::encode_ids(lacking))?
        .iter()
        .map(|b| exchange::decode_ids(b).collect())
        .collect();
    let mut wanted: Vec<SampleId> = lacks.iter().flatten().copied().collect();
    wanted.sort_unstable();
    wanted.dedup();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let mine: Vec<u8> = wanted
        .iter()
        .map(|&id| {
            if store.contains(id) {
                IN_CACHE
            } else if orphans.iter().any(|o| o.contains(id)) {
                IN_ORPHAN
            } else {
                0
            }
        })
        .collect();
    let holds = comm.all_gather(&mine)?;
    Ok(choose_senders(&lacks, &wanted, &holds, comm.hosts()))
}

/// For each sample a rank lacks, the holder that sends it: one on the receiver's host before
/// others (no network), one holding it in its cache before one holding it in an orphan, and
/// among equals the `id mod n`-th by rank, which spreads the sending. Pure.
fn choose_senders(
    lacks: &[Vec<SampleId>],
    wanted: &[SampleId],
    holds: &[Vec<u8>],
    hosts: &[u32],
) -> Vec<Transfer> {
    let mut transfers = Vec::new();
    for (to, samples) in lacks.iter().enumerate() {
        for &sample in samples {
            let at = wanted
                .binary_search(&sample)
                .expect("wanted lists every lack");
            let tier = |from: usize| {
                let held = holds[from].get(at).copied().unwrap_or(0);
                let remote = u8::from(hosts.get(from) != hosts.get(to));
                match held {
                    IN_CACHE => Some(2 * remote),
                    IN_ORPHAN => Some(2 * remote + 1),
                    _ => None,
                }
            };
            let best = (0..holds.len())
                .filter(|&from| from != to)
                .filter_map(tier)
                .min();
            let Some(best) = best else { continue };
            let holders: Vec<usize> = (0..holds.len())
                .filter(|&from| from != to && tier(from) == Some(best))
                .collect();
            let from = holders[sample as usize % holders.len()];
            transfers.push(Transfer {
                sample,
                from: from as Rank,
                to: to as Rank,
            });
        }
    }
    transfers.sort_unstable_by_key(|t| (t.from, t.to, t.sample));
    transfers
}

/// Removes the orphans' folders; returns those removed.
fn reclaim(orphans: Vec<SampleStore>) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for orphan in orphans {
        // Removed while still locked, so no daemon starts on it meanwhile.
        let root = orphan.dir().root().to_path_buf();
        // Only our own files: a folder holding anything else stays, with that in it.
        match crate::cache::remove_owned(&root, true) {
            Ok(left) if left.is_empty() => {
                tracing::info!(folder = %root.display(), "removed the cache of a gone rank");
                removed.push(root);
            }
            Ok(left) => {
                tracing::warn!(folder = %root.display(), left = ?left, "removed shufflefs's files from the cache of a gone rank; left the files it did not make")
            }
            Err(e) => {
                tracing::warn!(folder = %root.display(), error = %e, "could not remove the cache of a gone rank")
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn senders_prefer_their_cache_then_their_host_then_spread() {
        // Ranks 0, 1 on host 0, rank 2 on host 1. Rank 2 lacks 10, 11, 12; rank 0 lacks 13.
        let lacks = vec![vec![13], vec![], vec![10, 11, 12]];
        let wanted = vec![10, 11, 12, 13];
        let holds = vec![
            vec![IN_CACHE, IN_ORPHAN, 0, 0],
            vec![IN_CACHE, IN_CACHE, 0, IN_ORPHAN],
            vec![0, 0, 0, IN_CACHE],
        ];
        let t = choose_senders(&lacks, &wanted, &holds, &[0, 0, 1]);
        let sent = |sample| {
            t.iter()
                .find(|t| t.sample == sample)
                .map(|t| (t.from, t.to))
        };
        assert_eq!(sent(10), Some((0, 2)), "10 % 2 holders picks rank 0");
        assert_eq!(sent(11), Some((1, 2)), "a cache beats an orphan");
        assert_eq!(sent(12), None, "nobody holds 12: the source");
        assert_eq!(
            sent(13),
            Some((1, 0)),
            "same host's orphan beats a remote cache"
        );
    }
}
