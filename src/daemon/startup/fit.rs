//! Does this rank's share fit its cache? (after the store opens, before `fill`)
//!
//! A rank caches its share plus what the next exchange brings in: at most the bytes of two
//! consecutive epochs' shares together, about `(1 + Q) x share`. The room is `--cache-size`,
//! or by default what the cache folder's filesystem has free plus what the cache already
//! holds (a remount of a full cache must not find itself short of its own files), less 5%
//! of the filesystem, the free space and headroom split equally between the ranks of this
//! host whose caches are on that filesystem ([`sharing`]); the job plans with its smallest rank's room, because every rank
//! plans every rank's kept set. When the share does not fit, the rank says so once, with
//! what the planned partial cache (`plan::keep`) is expected to give, simulated on the real
//! plan: the hit rate and the bytes read from the source per epoch. `--require-fit` refuses the
//! mount instead (before anything is mounted), with the same numbers and the way out.
//! A coded run is checked by `super::fit_coded` with this room and agreement.

use std::path::Path;
use std::sync::Arc;

use crate::cache::SampleStore;
use crate::cache::admission::Admission;
use crate::comm::{Comm, CommError, Reduce};
use crate::config::MountConfig;
use crate::dataset::manifest::Manifest;
use crate::node::status::PartialSnapshot;
use crate::plan::elastic::ElasticPlan;
use crate::plan::keep::{DEFAULT_HORIZON, Outcome};
use crate::plan::keep_local::{LocalKeep, SizeOf};
use crate::plan::{EpochShares, Plan, Rank, SampleId};

use super::StartError;
use super::agree::{PhaseError, agreed};

/// Epochs simulated for the estimate (epoch 0, cold, is left out of it).
const ESTIMATE_EPOCHS: u64 = 6;

/// The share of the filesystem left free by the default cache size.
const HEADROOM_PERCENT: u64 = 5;

/// The cache's room against the share, and what a partial cache is expected to give.
#[derive(Clone, Debug)]
pub(crate) struct Fit {
    /// Bytes the cache may hold.
    pub capacity: u64,
    /// The most two consecutive shares of this rank need together (first epochs).
    pub needed: u64,
    /// Bytes of this rank's share at epoch 0.
    pub share_bytes: u64,
    /// This rank's outcome per epoch under the planned kept sets, averaged over the
    /// simulated epochs after the first.
    pub expected: Outcome,
    /// Samples kept at epoch 0.
    pub kept_samples: u64,
    /// Every sample's size as a coded run's estimate counted it ([`SizeModel`]) when its
    /// cache does not fit (`super::fit_coded`: its placement needs them all); empty
    /// otherwise.
    pub sizes: std::sync::Arc<[u64]>,
    /// Sample sizes as the estimate counts them, for the partial cache's planner of this
    /// rank's kept sets, when the share does not fit; `None` otherwise.
    pub planned: Option<Planned>,
    /// A coded run's kept sets' room in samples, when its cache does not fit
    /// (`super::fit_coded`); `None` otherwise.
    pub slots: Option<usize>,
    /// Why the room is less than `--cache-size`: the cache's filesystem cannot give it
    /// ([`Room::cut`]); the messages say so.
    pub cut: Option<String>,
}

impl Fit {
    pub(crate) fn fits(&self) -> bool {
        self.needed <= self.capacity
    }

    /// The store's gate for `rank` from `start` (its own view of an epoch) on: its own
    /// kept sets (`plan::keep_local`), keeping on what its cache holds of that share
    /// (`held`, as much as fits); `None` when the share fits.
    pub(crate) fn admission(
        &self,
        plan: &Plan,
        rank: Rank,
        start: EpochShares,
        held: &[SampleId],
    ) -> Option<Admission> {
        let planned = self.planned.clone()?;
        let sizes = (planned.size, self.capacity);
        let keep = LocalKeep::new(plan.clone(), rank, start, held, sizes, DEFAULT_HORIZON);
        Some(Admission::planned(keep, planned.mean))
    }

    /// The status's `partial` section, before anything is measured.
    pub(crate) fn snapshot(&self) -> PartialSnapshot {
        PartialSnapshot {
            cache_size_bytes: self.capacity,
            kept_samples: self.kept_samples,
            expected_hit_rate: self.expected.hit_rate(),
            hit_rate: None,
            source_bytes_per_epoch: None,
            expected_source_bytes_per_epoch: self.expected.source_bytes,
        }
    }
}

/// The phase (collective): each rank's room, the job's, the fit, and for a share that does
/// not fit, the store's gate from `epoch` on. A coded run is checked by
/// `super::fit_coded` instead (`super::fill::fit_and_fill` picks).
pub(crate) fn phase(
    comm: &mut dyn Comm,
    config: &MountConfig,
    plans: (&Plan, Option<&ElasticPlan>),
    store: &SampleStore,
    cache: &Path,
    epoch: u64,
) -> Result<Option<Fit>, StartError> {
    let held = store.held_bytes();
    let sharing = sharing(comm, cache)?;
    let mine = agreed(comm, room(config, cache, held, sharing))?;
    let room = job_room(comm, mine.bytes)?;
    let rank = comm.rank();
    let model = job_sizes_bounded(comm, store.manifest(), &config.source)?;
    let sizes = model.on_disk(store.manifest(), job_block(comm, store.block())?);
    let fit = agreed(comm, check(config, plans.0, &sizes, rank, (room, mine.cut)))?;
    if !fit.fits() {
        // This rank's share at `epoch`: saved then, or walked back (across the remaps of
        // an elastic job too).
        let root = store.dir().root();
        let shares = crate::node::saved::own_shares_at(root, plans.0, rank, epoch);
        let share = shares.share(rank).to_vec();
        let held: Vec<SampleId> = (share.iter().copied())
            .filter(|&id| store.contains(id))
            .collect();
        if let Some(gate) = fit.admission(plans.0, rank, shares, &held) {
            store.set_partial(gate);
        }
        // A cache filled under a larger room is brought within this one before staging.
        crate::cache::trim::to_room(store, &share);
    }
    Ok(Some(fit))
}

/// A cache this mount made, refused by the fit phase (`--require-fit`): what it wrote goes,
/// as far as it is ours (a detached daemon's log stays for the launcher to show).
/// Returns `refusal`.
pub(crate) fn forget(
    store: std::sync::Arc<SampleStore>,
    (cache, folder): (&Path, bool),
    refusal: StartError,
) -> StartError {
    drop(store);
    if let Err(e) = crate::cache::own::remove_owned(cache, folder) {
        tracing::debug!(error = %e, "could not remove the refused mount's cache");
    }
    refusal
}

/// A rank's room ([`room`]).
#[derive(Clone, Debug)]
pub(crate) struct Room {
    pub bytes: u64,
    /// Set when `--cache-size` is more than the filesystem can give (the room is then
    /// what it can): says so with the filesystem's numbers and the fix.
    pub cut: Option<String>,
}

/// This rank's room (`held`: bytes the cache holds now; `sharing`: ranks of this host with
/// a cache on that filesystem): what its filesystem can give (its part of the free space
/// plus what the cache holds, less headroom), or `--cache-size` where that is less. A
/// `--cache-size` past what the disk gives would stage into a full disk: it is cut to the
/// disk's room, with a warning (a filesystem that cannot be looked at leaves it as given).
pub(crate) fn room(
    config: &MountConfig,
    cache: &Path,
    held: u64,
    sharing: u64,
) -> Result<Room, PhaseError> {
    let disk = default_capacity(cache, held, sharing);
    let (bytes, disk) = match (config.cache_size, disk) {
        (None, disk) => {
            return (disk.map_err(PhaseError::mine)).map(|d| Room {
                bytes: d.0,
                cut: None,
            });
        }
        (Some(bytes), Ok(disk)) if bytes > disk.0 => (bytes, disk),
        (Some(bytes), _) => return Ok(Room { bytes, cut: None }),
    };
    let cut = format!(
        "--cache-size {} is more than the cache's filesystem can give this rank: {} ({} of {} free on {}, plus {} the cache holds, less 5%, split between {} rank(s) of this host); the cache uses {}. Free space on that disk, put the cache on a larger one, or give --cache-size {} or less",
        mb(bytes),
        mb(disk.0),
        mb(disk.1.0),
        mb(disk.1.1),
        cache.display(),
        mb(held),
        sharing.max(1),
        mb(disk.0),
        mb(disk.0),
    );
    tracing::warn!("{cut}");
    Ok(Room {
        bytes: disk.0,
        cut: Some(cut),
    })
}

/// How many ranks of this host, this one included, have their cache on the filesystem of
/// `cache` (collective): they share its free space, so each takes its part of it by default
/// (a node's ranks with caches side by side on its local disk would each count all of it).
pub(crate) fn sharing(comm: &mut dyn Comm, cache: &Path) -> Result<u64, CommError> {
    use std::os::unix::fs::MetadataExt;
    // A folder that cannot be looked at shares with nobody (its room is refused later).
    let dev = std::fs::metadata(cache).map_or(u64::MAX - u64::from(comm.rank()), |m| m.dev());
    let all = comm.all_gather(&dev.to_le_bytes())?;
    let (hosts, me) = (comm.hosts(), comm.rank() as usize);
    let same = |(r, b): &(usize, &Vec<u8>)| {
        hosts.get(*r) == hosts.get(me) && b.as_slice() == dev.to_le_bytes()
    };
    Ok((all.iter().enumerate()).filter(same).count().max(1) as u64)
}

/// The unit the job plans disk space in: the largest of its ranks' caches' blocks
/// (collective; `cache::footprint`). Every rank plans every rank's kept set, so all plan with
/// the same sizes; a rank whose disk has smaller blocks keeps what it planned all the more.
pub(crate) fn job_block(comm: &mut dyn Comm, mine: u64) -> Result<u64, CommError> {
    let all = comm.all_reduce(&[mine], crate::comm::Reduce::Max)?;
    Ok(all.first().copied().unwrap_or(mine))
}

/// The job's room per rank: the smallest rank's (collective). Every rank plans every
/// rank's kept set (the exchange sends only what the receiver keeps), so all plan with the
/// same size.
pub(crate) fn job_room(comm: &mut dyn Comm, mine: u64) -> Result<u64, CommError> {
    let all = comm.all_reduce(&[mine], crate::comm::Reduce::Min)?;
    Ok(all.first().copied().unwrap_or(mine))
}

/// The fit of `rank`'s share in `capacity` bytes; a refusal under `--require-fit`. Logs the
/// partial-cache message when it does not fit.
pub(crate) fn check(
    config: &MountConfig,
    plan: &Plan,
    sizes: &OnDisk<'_>,
    rank: Rank,
    (capacity, cut): (u64, Option<String>),
) -> Result<Fit, PhaseError> {
    let fit = Fit {
        cut,
        ..estimate(plan, sizes, rank, capacity)
    };
    verdict(
        fit,
        config.require_fit,
        |f| refusal(f, config),
        |f| partial_message(f, config),
    )
}

/// `fit` as it is when it fits; else refused under `--require-fit` (`refusal` says why),
/// or taken with the partial-cache warning (`partial`) in the log. Partial and coded
/// runs alike.
pub(crate) fn verdict(
    fit: Fit,
    require_fit: bool,
    refusal: impl FnOnce(&Fit) -> String,
    partial: impl FnOnce(&Fit) -> String,
) -> Result<Fit, PhaseError> {
    if fit.fits() {
        return Ok(fit);
    }
    if require_fit {
        return Err(PhaseError::mine(refusal(&fit)));
    }
    tracing::warn!("{}", partial(&fit));
    Ok(fit)
}

/// Samples looked at (evenly spaced) to estimate the size of those whose size is unknown.
const SIZE_PROBES: u64 = 256;

/// Each sample's size as the index knows it; the others count as the mean of the known
/// ones, or, when few are known, of up to [`SIZE_PROBES`] evenly spaced samples that rank 0
/// looks up in a local source (an image folder's index holds no sizes) and sends to all
/// (collective: the source is asked once per job, not once per rank). The same on every
/// rank (the kept sets of all ranks are planned from it), and an estimate: enough to size a
/// cache, not to place bytes (the gate checks real sizes). A model, not a list: a rank looks
/// up the sizes of its own share (O(share)); only a cache that does not fit lists them all
/// ([`OnDisk::all`]), for the partial cache's planner of every rank's kept set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SizeModel {
    /// What an unknown size counts as.
    pub mean: u64,
    /// The upper figure of an unknown size: the largest size known or probed (a sample
    /// larger than every probed one is possible but rare: the gate refuses it, and it is
    /// read from the source).
    pub largest: u64,
}

impl SizeModel {
    /// Sample `id`'s estimated size.
    pub(crate) fn size(&self, manifest: &Manifest, id: SampleId) -> u64 {
        manifest.size(id).unwrap_or(self.mean)
    }

    /// Sample `id`'s upper size.
    pub(crate) fn upper(&self, manifest: &Manifest, id: SampleId) -> u64 {
        manifest.size(id).unwrap_or(self.largest)
    }

    /// The model as sizes take disk space in `block`s: what the plan and the gate count.
    pub(crate) fn on_disk<'m>(&self, manifest: &'m Arc<Manifest>, block: u64) -> OnDisk<'m> {
        OnDisk {
            model: *self,
            manifest,
            block,
        }
    }
}

/// [`SizeModel`] rounded up to the job's block.
pub(crate) struct OnDisk<'m> {
    model: SizeModel,
    manifest: &'m Arc<Manifest>,
    block: u64,
}

impl OnDisk<'_> {
    /// The same sizes, owned (the model and the manifest: no list), with their mean.
    pub(crate) fn planned(&self) -> Planned {
        let (model, manifest, block) = (self.model, self.manifest.clone(), self.block);
        Planned {
            mean: crate::cache::footprint::on_disk(model.mean, block),
            size: Arc::new(move |id| {
                crate::cache::footprint::on_disk(model.size(&manifest, id), block)
            }),
        }
    }

    pub(crate) fn size(&self, id: SampleId) -> u64 {
        crate::cache::footprint::on_disk(self.model.size(self.manifest, id), self.block)
    }

    /// Every sample's size (O(N): only a cache that does not fit, and coded runs, need it).
    pub(crate) fn all(&self) -> Vec<u64> {
        (0..self.manifest.len()).map(|id| self.size(id)).collect()
    }

    /// Every sample's upper size, on disk.
    pub(crate) fn all_upper(&self) -> Vec<u64> {
        let round = |s| crate::cache::footprint::on_disk(s, self.block);
        (0..self.manifest.len())
            .map(|id| round(self.model.upper(self.manifest, id)))
            .collect()
    }
}

/// The job's [`SizeModel`] (collective), no list of sizes: each rank passes over its
/// block of the index (`N/M` ids in a row, so it reads `1/M` of a record index's table and
/// of the host's shared mapping) and two all-reduces add them up.
pub(crate) fn job_sizes_bounded(
    comm: &mut dyn Comm,
    manifest: &Manifest,
    source: &Path,
) -> Result<SizeModel, CommError> {
    let n = manifest.len();
    let (rank, world) = (u64::from(comm.rank()), u64::from(comm.size()));
    let block = |r: u64| (u128::from(n) * u128::from(r) / u128::from(world)) as u64;
    let (sum, count, largest) = ((block(rank)..block(rank + 1)).filter_map(|s| manifest.size(s)))
        .fold((0u64, 0u64, 0u64), |(s, c, m), b| (s + b, c + 1, m.max(b)));
    let (mut sum, mut count) = match comm.all_reduce(&[sum, count], Reduce::Sum)?[..] {
        [s, c] => (s, c),
        _ => (sum, count),
    };
    let mut largest = comm
        .all_reduce(&[largest], Reduce::Max)?
        .first()
        .copied()
        .unwrap_or(largest);
    if count < SIZE_PROBES.min(n) {
        let probed = match comm.rank() {
            0 => probe(manifest, source),
            _ => (0, 0, 0),
        };
        let words = [probed.0, probed.1, probed.2];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let got = comm.broadcast(0, bytes)?;
        let word = |i: usize| {
            let b: Option<[u8; 8]> = got.get(i * 8..i * 8 + 8).and_then(|b| b.try_into().ok());
            b.map_or(0, u64::from_le_bytes)
        };
        sum += word(0);
        count += word(1);
        largest = largest.max(word(2));
    }
    let mean = sum.checked_div(count).unwrap_or(0);
    Ok(SizeModel {
        mean,
        largest: largest.max(mean),
    })
}

/// The bytes, number and largest size of up to [`SIZE_PROBES`] evenly spaced samples found
/// in `source`.
fn probe(manifest: &Manifest, source: &Path) -> (u64, u64, u64) {
    let n = manifest.len();
    let step = (n / SIZE_PROBES).max(1);
    let mut found = (0u64, 0u64, 0u64);
    for id in (0..n).step_by(step as usize) {
        if let Ok(meta) = std::fs::metadata(source.join(manifest.relative_path(id))) {
            found = (found.0 + meta.len(), found.1 + 1, found.2.max(meta.len()));
        }
    }
    found
}

/// This rank's part of the free space of `cache`'s filesystem (shared by `sharing` ranks),
/// plus `held`, less its part of the headroom; and the filesystem's free and total bytes.
fn default_capacity(cache: &Path, held: u64, sharing: u64) -> std::io::Result<(u64, (u64, u64))> {
    let st = nix::sys::statvfs::statvfs(cache)?;
    let frag = st.fragment_size().max(1);
    let (total, free) = (st.blocks() * frag, st.blocks_available() * frag);
    Ok((part_of(free, total, held, sharing), (free, total)))
}

/// `held` plus a `sharing`th of `free`, less a `sharing`th of the headroom of `total`.
fn part_of(free: u64, total: u64, held: u64, sharing: u64) -> u64 {
    let k = sharing.max(1);
    (free / k + held).saturating_sub(total / 100 * HEADROOM_PERCENT / k)
}

/// The fit of `rank`'s share in `capacity` bytes, simulated on `plan` (pure).
pub(crate) fn estimate(plan: &Plan, sizes: &OnDisk<'_>, rank: Rank, capacity: u64) -> Fit {
    let bytes = |share: &[SampleId]| share.iter().map(|&s| sizes.size(s)).sum::<u64>();
    // From the start of this world's era: before it (an elastic restart's earlier epochs)
    // another number of ranks held the shares, which this plan does not step from. Walked
    // back once, for this and `simulated`.
    let start = plan.own_shares_at(rank, plan.era_start());
    let mut cur = start.clone();
    let share_bytes = bytes(cur.share(rank));
    let mut needed = share_bytes;
    for _ in 1..ESTIMATE_EPOCHS {
        let next = plan.own_step(rank, &cur).next;
        let mut union: Vec<SampleId> = cur.share(rank).to_vec();
        union.extend_from_slice(next.share(rank));
        union.sort_unstable();
        union.dedup();
        needed = needed.max(bytes(&union));
        cur = next;
    }
    let planned = (needed > capacity).then(|| sizes.planned());
    let expected = match &planned {
        // The whole share is kept: no need to simulate (every mount passes here).
        None => Outcome {
            reads: cur.share(rank).len() as u64,
            hits: cur.share(rank).len() as u64,
            read_bytes: share_bytes,
            kept: cur.share(rank).len() as u64,
            kept_bytes: share_bytes,
            ..Outcome::default()
        },
        Some(p) => simulated(plan, start, p.size.clone(), rank, capacity),
    };
    Fit {
        capacity,
        needed,
        share_bytes,
        kept_samples: expected.kept,
        expected,
        sizes: Arc::new([]),
        planned,
        slots: None,
        cut: None,
    }
}

/// `rank`'s outcome per epoch under its kept sets, averaged over the simulated epochs
/// after the first (cold) one; `kept` is the kept set of epoch 0. Only this rank is
/// planned (`plan::keep_local`): a sample arriving counts as kept by its sender as often as
/// this rank keeps the samples of its own share. `start`: this rank's view at its era's
/// start.
fn simulated(plan: &Plan, start: EpochShares, size: SizeOf, rank: Rank, capacity: u64) -> Outcome {
    let sizes = (size, capacity);
    let mut keep = LocalKeep::new(plan.clone(), rank, start, &[], sizes, DEFAULT_HORIZON);
    let kept = keep.kept().len();
    let mut total = Outcome::default();
    for _ in 1..ESTIMATE_EPOCHS {
        let keeps = keep.kept().len() as f64 / keep.share().len().max(1) as f64;
        keep.advance();
        total = total.add(&keep.outcome(keeps).unwrap_or_default());
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

/// Sample sizes for the partial cache's planner: a function of the id (the size model and
/// the manifest), and their mean.
#[derive(Clone)]
pub(crate) struct Planned {
    pub size: SizeOf,
    pub mean: u64,
}

impl std::fmt::Debug for Planned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Planned")
            .field("mean", &self.mean)
            .finish_non_exhaustive()
    }
}

pub(crate) fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn numbers(fit: &Fit, config: &MountConfig) -> String {
    format!(
        "this rank's share needs up to {} in its cache (the most two consecutive epochs' shares take together: its share of {} and what the exchange brings in, at most --fraction {} of it), which holds {} ({}); with a partial cache, {:.1}% of reads would hit and {} per epoch would be read from the source",
        mb(fit.needed),
        mb(fit.share_bytes),
        config.fraction,
        mb(fit.capacity),
        room_source(fit, config),
        100.0 * fit.expected.hit_rate(),
        mb(fit.expected.source_bytes),
    )
}

/// Where a rank's room came from, for the messages.
pub(crate) fn room_source(fit: &Fit, config: &MountConfig) -> String {
    match (&fit.cut, config.cache_size) {
        (Some(cut), _) => cut.clone(),
        (None, Some(_)) => "--cache-size".into(),
        (None, None) => "its part of the free space of its filesystem, less 5%".into(),
    }
}

fn partial_message(fit: &Fit, config: &MountConfig) -> String {
    format!(
        "{}. Going on with a partial cache: the {} samples that stay longest are kept, the rest are read from the source when opened (docs/partial-cache.md). To cache the whole share give it {} (--cache-size, a larger disk, or more ranks); --require-fit refuses instead.",
        numbers(fit, config),
        fit.kept_samples,
        mb(fit.needed),
    )
}

fn refusal(fit: &Fit, config: &MountConfig) -> String {
    format!(
        "--require-fit: {}. Give the cache {} (--cache-size, a larger disk, or more ranks), or drop --require-fit to mount with a partial cache.",
        numbers(fit, config),
        mb(fit.needed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::LocalComm;

    #[test]
    fn ranks_sharing_a_filesystem_share_its_free_space() {
        // 1000 free of 2000: headroom 100.
        assert_eq!(part_of(1000, 2000, 0, 1), 900);
        assert_eq!(part_of(1000, 2000, 300, 1), 1200);
        assert_eq!(part_of(1000, 2000, 0, 2), 450);
        assert_eq!(part_of(1000, 2000, 300, 2), 750);
        assert_eq!(part_of(10, 2000, 0, 1), 0);
    }

    /// Sizes an index does not know are rank 0's probe of the source, on every rank (rank 1
    /// here sees no source at all): the mean as the estimate, the largest as the upper one.
    #[test]
    fn unknown_sizes_are_rank_0s_probe_everywhere() {
        use crate::dataset::manifest::UNKNOWN_SIZE;
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("c")).unwrap();
        std::fs::write(tmp.path().join("c/a"), [0; 100]).unwrap();
        std::fs::write(tmp.path().join("c/b"), [0; 300]).unwrap();
        let names = [b"a".to_vec(), b"b".to_vec()];
        let entries = names.iter().map(|n| (n.clone(), UNKNOWN_SIZE)).collect();
        let manifest = Arc::new(Manifest::from_parts(vec![(b"c".to_vec(), entries)]).unwrap());
        let handles: Vec<_> = LocalComm::world(2)
            .into_iter()
            .map(|mut comm| {
                let (m, root) = (manifest.clone(), tmp.path().to_path_buf());
                let source = match comm.rank() {
                    0 => root,
                    _ => root.join("nowhere"),
                };
                std::thread::spawn(move || job_sizes_bounded(&mut comm, &m, &source).unwrap())
            })
            .collect();
        for h in handles {
            let got = h.join().unwrap().on_disk(&manifest, 1);
            assert_eq!(got.all(), [200, 200]);
            assert_eq!((got.size(0), got.size(1)), (200, 200));
            // The slot of a coded partial cache: the largest probed, not the mean.
            assert_eq!(got.all_upper(), [300, 300]);
        }
    }

    /// Ranks 0 and 1 on one host with caches on one filesystem share it; rank 2, alone on
    /// its host, does not (though the folder is the same filesystem here).
    #[test]
    fn sharing_counts_this_hosts_ranks_on_the_same_filesystem() {
        let tmp = tempfile::tempdir().unwrap();
        let handles: Vec<_> = LocalComm::world_on_hosts(&[0, 0, 1])
            .into_iter()
            .map(|mut comm| {
                let dir = tmp.path().join(format!("cache{}", comm.rank()));
                std::fs::create_dir(&dir).unwrap();
                std::thread::spawn(move || sharing(&mut comm, &dir).unwrap())
            })
            .collect();
        let got: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(got, [2, 2, 1]);
    }
}
