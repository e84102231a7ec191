//! Does a coded rank's cache fit its disk? (the partial exchange's check is
//! `super::fit`, whose room, agreement and refusal this shares.)
//!
//! A coded rank holds its cache `C^t` and receives the part of its next share it does not
//! cache while the current epoch is read: at most `C^t ∪ D^{t+1}` (`exchange::coded::side`
//! drops side information early, so the real peak is nearer `D^t ∪ C^{t+1}`, but a disk
//! must not fill in between). The need is a bound for every epoch, not a look at the first
//! ones: the bytes of the `|C| + |D|` largest samples (the caches and shares have the same
//! sizes every epoch), with each size the index does not know counted as the largest one
//! known or probed (`super::fit::JobSizes`). When that does not fit the job's smallest
//! room, the run goes on with kept sets (`plan::coded_keep`) of `room / slot` samples,
//! `slot` the same largest size (so the kept bytes stay within the room; the store's gate
//! checks the real bytes, and a sample larger than every probed one is read from the
//! source), and says so once with what the plan expects; `--require-fit` refuses instead.
//! A cache that fits costs no simulation. Every compute rank computes the same slots,
//! and compute rank 0 tells the server (`daemon::coded::Offer`), which plans the packets
//! over the same kept sets.

use std::collections::BTreeSet;
use std::path::Path;

use crate::cache::SampleStore;
use crate::cache::admission::Admission;
use crate::comm::Comm;
use crate::config::MountConfig;
use crate::plan::keep::Outcome;
use crate::plan::{CodedShares, Rank, SampleId};

use super::StartError;
use super::agree::{PhaseError, agreed};
use super::fit::{Fit, job_block, job_room, job_sizes_bounded, room, sharing};

/// Epochs simulated for the estimate (epoch 0, cold, is left out of it).
const ESTIMATE_EPOCHS: u64 = 6;

/// The phase for a coded run (collective over the compute ranks): the fit of this rank's
/// cache in the job's smallest room; for one that does not fit, the store's gate from
/// `epoch` on and the kept sets' slots in [`Fit::slots`].
pub(crate) fn phase(
    comm: &mut dyn Comm,
    config: &MountConfig,
    shares: &CodedShares,
    store: &SampleStore,
    cache: &Path,
    epoch: u64,
) -> Result<Fit, StartError> {
    let held = store.held_bytes();
    let sharing = sharing(comm, cache)?;
    let mine = agreed(comm, room(config, cache, held, sharing))?;
    let room = job_room(comm, mine.bytes)?;
    let rank = comm.rank();
    let model = job_sizes_bounded(comm, store.manifest(), &config.source)?;
    let block = job_block(comm, store.block())?;
    // Coded runs plan every rank's cache: every sample's size (O(N), within coded's limit).
    let on_disk = model.on_disk(store.manifest(), block);
    let sizes = JobSizes {
        sizes: on_disk.all(),
        upper: on_disk.all_upper(),
    };
    let fit = agreed(comm, check(config, shares, sizes, rank, (room, mine.cut)))?;
    if let Some(slots) = fit.slots {
        // The gate follows this rank's kept set alone (the client steps every rank's).
        let placement = (shares.clone().with_slots(Some(slots))).placement_of(epoch, rank as usize);
        let n = fit.sizes.len().max(1) as u64;
        let mean = fit.sizes.iter().sum::<u64>() / n;
        store.set_partial(Admission::coded(placement, rank, room, mean));
        // A cache filled under a larger room is brought within this one before staging.
        crate::cache::trim::to_room(store, &[]);
    }
    Ok(fit)
}

/// Every sample's size as the fit counts it, and an upper figure of each (see
/// [`super::fit::SizeModel`]).
pub(crate) struct JobSizes {
    pub sizes: Vec<u64>,
    pub upper: Vec<u64>,
}

/// The fit of `rank`'s coded cache in `capacity` bytes; a refusal under `--require-fit`.
/// Logs the partial message when it does not fit.
pub(crate) fn check(
    config: &MountConfig,
    shares: &CodedShares,
    sizes: JobSizes,
    rank: Rank,
    (capacity, cut): (u64, Option<String>),
) -> Result<Fit, PhaseError> {
    let fit = Fit {
        cut,
        ..estimate(shares, (sizes.sizes.into(), &sizes.upper), rank, capacity)
    };
    super::fit::verdict(
        fit,
        config.require_fit,
        |f| refusal(f, shares),
        |f| partial_message(f, shares),
    )
}

/// The fit of the job's coded caches in `capacity` bytes (the same on every rank), and what
/// `rank` is expected to hit, simulated on `shares` (pure). `sizes` are the estimates,
/// `upper` the upper figures (`super::fit::JobSizes`): the need and the slot come from
/// those, so a cache said to fit fits every epoch, and kept sets stay within the room.
pub(crate) fn estimate(
    shares: &CodedShares,
    (sizes, upper): (std::sync::Arc<[u64]>, &[u64]),
    rank: Rank,
    capacity: u64,
) -> Fit {
    let r = rank as usize;
    let bytes = |set: &BTreeSet<SampleId>| set.iter().map(|&s| sizes[s as usize]).sum::<u64>();
    let p = shares.clone().with_slots(None).placement_at(0);
    let share_bytes = bytes(&p.shares(0)[r]);
    // The job's most, not this rank's: every rank and the server must plan the same kept
    // sets, so either all ranks keep parts or none does.
    let needed = need_bound(&p, upper);
    let slot = upper.iter().copied().max().unwrap_or(0).max(1);
    let slots = (needed > capacity).then(|| (capacity / slot) as usize);
    let expected = match slots {
        Some(_) => simulated(&shares.clone().with_slots(slots), &sizes, r),
        None => whole(&p, &sizes, r),
    };
    Fit {
        capacity,
        needed,
        share_bytes,
        kept_samples: expected.kept,
        expected,
        sizes,
        planned: None,
        slots,
        cut: None,
    }
}

/// An upper bound of any rank's bytes on disk in any epoch: a rank holds at most its coded
/// cache and the next share (`|C| + |D|` samples, every epoch alike), so the sum of that
/// many of the largest `upper` sizes bounds every epoch, not only the first ones.
fn need_bound(p: &crate::plan::coded_keep::CodedPlacement, upper: &[u64]) -> u64 {
    let cache = p
        .coded_caches()
        .iter()
        .map(BTreeSet::len)
        .max()
        .unwrap_or(0);
    let share = p.shares(0).iter().map(BTreeSet::len).max().unwrap_or(0);
    let count = (cache + share).min(upper.len());
    if count == upper.len() {
        return upper.iter().sum();
    }
    let mut all = upper.to_vec();
    all.select_nth_unstable_by(count, |a, b| b.cmp(a));
    all[..count].iter().sum()
}

/// `rank`'s outcome per epoch with its whole coded cache (it fits): every read a hit.
fn whole(p: &crate::plan::coded_keep::CodedPlacement, sizes: &[u64], r: usize) -> Outcome {
    let bytes = |set: &BTreeSet<SampleId>| set.iter().map(|&s| sizes[s as usize]).sum::<u64>();
    let share = &p.shares(0)[r];
    let cache = &p.coded_caches()[r];
    Outcome {
        reads: share.len() as u64,
        hits: share.len() as u64,
        read_bytes: bytes(share),
        source_bytes: 0,
        peer_bytes: bytes(share),
        kept: cache.len() as u64,
        kept_bytes: bytes(cache),
    }
}

/// `rank`'s outcome per epoch under the kept sets (or the whole cache), averaged over the
/// simulated epochs after the first; `kept` is the kept set of epoch 0, `peer_bytes` what
/// the server sends this rank (uncoded: the kept part of its share it does not hold).
fn simulated(shares: &CodedShares, sizes: &[u64], r: usize) -> Outcome {
    let bytes = |set: &BTreeSet<SampleId>| set.iter().map(|&s| sizes[s as usize]).sum::<u64>();
    let mut p = shares.placement_at(0);
    let kept = p.caches()[r].len() as u64;
    let mut total = Outcome::default();
    for _ in 1..ESTIMATE_EPOCHS {
        let held = p.caches()[r].clone();
        p.advance();
        let share = &p.shares(p.epoch())[r];
        let hits: BTreeSet<SampleId> = share.intersection(&p.caches()[r]).copied().collect();
        let missed: BTreeSet<SampleId> = share.difference(&hits).copied().collect();
        let sent: BTreeSet<SampleId> = hits.difference(&held).copied().collect();
        total = total.add(&Outcome {
            reads: share.len() as u64,
            hits: hits.len() as u64,
            read_bytes: bytes(share),
            source_bytes: bytes(&missed),
            peer_bytes: bytes(&sent),
            kept: 0,
            kept_bytes: bytes(&p.caches()[r]),
        });
    }
    let n = ESTIMATE_EPOCHS - 1;
    Outcome {
        reads: total.reads / n,
        hits: total.hits / n,
        read_bytes: total.read_bytes / n,
        source_bytes: total.source_bytes / n,
        peer_bytes: total.peer_bytes / n,
        kept,
        kept_bytes: total.kept_bytes / n,
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn numbers(fit: &Fit, shares: &CodedShares) -> String {
    let cut = fit
        .cut
        .as_ref()
        .map_or(String::new(), |c| format!(" ({c})"));
    format!(
        "a rank's coded cache needs up to {} on disk (its cache of --cache-fraction {} and the next share it receives; this rank's share is {}), which holds {}{cut}; kept sets of {} samples would give a hit rate of {:.1}% and read {} per epoch from the source, the server sending this rank {} per epoch (before coding)",
        mb(fit.needed),
        shares.alpha(),
        mb(fit.share_bytes),
        mb(fit.capacity),
        fit.slots.unwrap_or(0),
        100.0 * fit.expected.hit_rate(),
        mb(fit.expected.source_bytes),
        mb(fit.expected.peer_bytes),
    )
}

fn partial_message(fit: &Fit, shares: &CodedShares) -> String {
    format!(
        "{}. Going on with a partial coded cache: each rank keeps the planned part of its cache that fits, the server codes over the kept parts, the rest is read from the source when opened (docs/coded.md). To cache it all give it {} (--cache-size, a larger disk, or more ranks); --require-fit refuses instead.",
        numbers(fit, shares),
        mb(fit.needed),
    )
}

fn refusal(fit: &Fit, shares: &CodedShares) -> String {
    format!(
        "--require-fit: {}. Give the cache {} (--cache-size, a larger disk, or more ranks), or drop --require-fit to run with a partial coded cache.",
        numbers(fit, shares),
        mb(fit.needed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache of half a share does not fit: kept sets of as many samples as the room holds,
    /// a hit rate the kept sets give; a room for the whole peak fits and plans no slots.
    #[test]
    fn a_small_room_plans_kept_sets() {
        let shares = CodedShares::new(90, 3, 0.5, 4).unwrap();
        let sizes: std::sync::Arc<[u64]> = vec![1000u64; 90].into();
        let fit = estimate(&shares, (sizes.clone(), &sizes), 1, 15_000);
        assert!(!fit.fits());
        assert_eq!(fit.slots, Some(15));
        assert_eq!(fit.share_bytes, 30_000);
        let rate = fit.expected.hit_rate();
        assert!(rate > 0.1 && rate <= 0.5, "{rate}");
        // Averages over the epochs, each rounded down.
        let read = fit.expected.source_bytes + fit.expected.hits * 1000;
        assert!((29_000..=30_000).contains(&read), "{read}");
        let whole = estimate(&shares, (sizes.clone(), &sizes), 1, fit.needed);
        assert!(whole.fits() && whole.slots.is_none());
        assert_eq!(whole.expected.hit_rate(), 1.0);
    }

    /// Sizes varying from 20 to 80 kB: a room said to fit holds `C ∪ D'` of every rank in
    /// every epoch (not only the first six), and kept sets planned with the largest size as
    /// their slot never hold more than the room, also where the estimates are all the mean
    /// (an image folder's index: the upper figures are then the largest probed).
    #[test]
    fn the_need_bounds_every_epoch_and_kept_sets_stay_in_the_room() {
        let shares = CodedShares::new(90, 3, 0.5, 4).unwrap();
        let varied: Vec<u64> = (0..90u64).map(|s| 20_000 + (s * 7919) % 60_001).collect();
        let sizes: std::sync::Arc<[u64]> = varied.clone().into();
        let bytes = |set: &BTreeSet<SampleId>| set.iter().map(|&s| varied[s as usize]).sum::<u64>();
        let fit = estimate(&shares, (sizes.clone(), &varied), 0, u64::MAX);
        let mut p = shares.placement_at(0);
        for _ in 0..20 {
            let next = p.shares(p.epoch() + 1);
            for (c, d) in p.coded_caches().iter().zip(&next) {
                assert!(bytes(&c.union(d).copied().collect()) <= fit.needed);
            }
            p.advance();
        }
        let mean = varied.iter().sum::<u64>() / 90;
        let upper = vec![*varied.iter().max().unwrap(); 90];
        let room = 1_100_000;
        let fit = estimate(&shares, (vec![mean; 90].into(), &upper), 0, room);
        assert_eq!(fit.slots, Some((room / upper[0]) as usize));
        let mut p = shares.clone().with_slots(fit.slots).placement_at(0);
        for _ in 0..20 {
            let held = p.caches().to_vec();
            p.advance();
            for (h, k) in held.iter().zip(p.caches()) {
                assert!(
                    bytes(&h.union(k).copied().collect()) <= room,
                    "{}",
                    p.epoch()
                );
            }
        }
    }
}
