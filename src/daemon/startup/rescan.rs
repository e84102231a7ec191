//! `--rescan`: a remount that scans the source again and keeps what is still valid.
//!
//! Without it a remount reuses the index saved in the cache, so a source changed since is
//! not seen (the status says so: `source_scan.stale_possible`). With it the source is scanned
//! again (phase 3: by every rank, each its part, for a folder source), and each rank checks its cached samples against the source before its cache is
//! checked (phase 4): when the new index differs from the cache's, they are carried over
//! to it, and when it is the same each is still checked (a file rewritten or swapped with
//! the same name and size leaves the index as it was). A sample whose class, name, size
//! and time (nanoseconds) are unchanged keeps its bytes (under its new id), the rest is
//! dropped; under `--allow-other` (owners per entry) also one whose owner, group or
//! readers widened since the cache's index, or whose cache was made without owners: the
//! old bytes are never shown under another file's owner and mode. For a bucket, "time" is the ETag: an object keeps its bytes when both listings
//! gave it the same ETag and size (`dataset::s3::still_same`). The state then names the new index, so the cache belongs to these settings.
//!
//! The plan is a function of the number of samples, so with another index it is computed
//! anew at the job's current epoch: each rank's share of that epoch is the new plan's, and
//! the resume (phase 5) fetches what the rank lacks of it (from the source). With one rank
//! that is exactly the new samples; with several, shares move, and samples a rank kept but
//! no longer owns are dropped by the resume as in any epoch. Only the `files` layout of an
//! image folder carries samples over; a packed cache or a record source's cache is rebuilt
//! (from epoch 0 as `--reset-cache` does; the seed is kept), even with the same index
//! (a packed cache's samples cannot be dropped one by one here).

use super::agree::PhaseError;
use crate::cache::{CacheDir, CacheLayout, CacheState};
use crate::config::MountConfig;
use crate::daemon::resize;
use crate::dataset::Manifest;
use crate::dataset::rescan::{per_file, same_sample, still_valid};
use crate::plan::SampleId;

/// The state for phase 4, and the (kept, dropped) counts when samples were carried over.
type Carried = (Option<CacheState>, Option<(u64, u64)>);

/// The state phase 4 should check this rank's cache against, after `--rescan` carried its
/// samples over to `manifest` (when the cache was built on another index and otherwise
/// belongs): the old state with the new index's fingerprint, or `None` for a cache to
/// rebuild. Without `--rescan`, or with nothing to carry, `state` as it was; also returns
/// the (kept, dropped) counts when samples were carried.
pub(crate) fn carry_over(
    config: &MountConfig,
    dir: &CacheDir,
    state: Option<CacheState>,
    expected: &CacheState,
    manifest: &Manifest,
) -> Result<Carried, PhaseError> {
    let old = match state {
        Some(old) if config.rescans() && !config.reset_cache => old,
        other => return Ok((other, None)),
    };
    if old.manifest_fingerprint == expected.manifest_fingerprint {
        return recheck(config, dir, old, manifest);
    }
    let renamed = CacheState {
        manifest_fingerprint: expected.manifest_fingerprint,
        ..old.clone()
    };
    // Another setting differs (or the number of ranks): refused or resized as without
    // --rescan, naming the index too.
    if old.world_size != expected.world_size || !resize::belongs(&renamed, expected) {
        return Ok((Some(old), None));
    }
    // From here the old state no longer describes the folder: forget it first (see
    // `CacheDir::carry_samples`).
    dir.forget_state().map_err(PhaseError::mine)?;
    let old_manifest = dir.load_manifest(old.manifest_fingerprint).ok().flatten();
    let Some(old_manifest) = old_manifest.filter(|_| config.layout == CacheLayout::Files) else {
        tracing::warn!(
            "--rescan: the cache's samples cannot be carried over (packed layout, record source, or no saved index); it is rebuilt"
        );
        return Ok((None, None));
    };
    let carry = |id, cached: (u64, _)| {
        let new = (id < old_manifest.len())
            .then(|| same_sample(&old_manifest, manifest, id))
            .flatten()?;
        unchanged(config, (&old_manifest, id), (manifest, new), cached).then_some(new)
    };
    let counts = dir.carry_samples(&carry).map_err(PhaseError::mine)?;
    tracing::info!(
        kept = counts.0,
        dropped = counts.1,
        "--rescan: the source changed; cached samples still valid are kept"
    );
    Ok((Some(renamed), Some(counts)))
}

/// The same index as the cache's (same names and sizes): each cached sample is still
/// checked against the source file, as a changed index's are, since a file may have been
/// rewritten, or swapped for another user's, with the same name and size (the
/// old bytes must not be shown under the new file's owner and mode). A packed cache
/// cannot drop one sample here: it is rebuilt.
fn recheck(
    config: &MountConfig,
    dir: &CacheDir,
    old: CacheState,
    manifest: &Manifest,
) -> Result<Carried, PhaseError> {
    if !per_file(manifest) {
        return Ok((Some(old), None));
    }
    if config.layout != CacheLayout::Files {
        tracing::warn!(
            "the source is scanned again, and a packed cache's samples cannot be checked one by one against it; the cache is rebuilt"
        );
        dir.forget_state().map_err(PhaseError::mine)?;
        return Ok((None, None));
    }
    // Owners of the old index: the saved index is this one less, maybe, its owners.
    let old_manifest = dir.load_manifest(old.manifest_fingerprint).ok().flatten();
    let carry = |id, cached: (u64, _)| {
        let old_manifest = old_manifest.as_ref()?;
        (id < manifest.len() && unchanged(config, (old_manifest, id), (manifest, id), cached))
            .then_some(id)
    };
    let counts = dir.carry_samples(&carry).map_err(PhaseError::mine)?;
    if counts.1 > 0 {
        tracing::info!(
            kept = counts.0,
            dropped = counts.1,
            "the source was scanned again; cached samples whose source file changed are dropped"
        );
    }
    Ok((Some(old), Some(counts)))
}

/// Whether cached sample `old.1` of index `old.0` (of `cached` length and source time)
/// still holds the bytes of sample `new.1` of `new.0`: the source file has the cached
/// size and time (for a bucket, the same ETag and size), and, where the view shows each
/// sample's owner and mode, the old index showed the same owner and group and let read
/// at least whom the new one does (the bytes were read from a file that passed that
/// check: see `dataset::imagefolder`). An old index without owners (a mount without
/// `--allow-other`) says nothing of who the bytes were for: the sample is fetched again.
fn unchanged(
    config: &MountConfig,
    (old, old_id): (&Manifest, SampleId),
    (new, id): (&Manifest, SampleId),
    cached: (u64, Option<std::time::SystemTime>),
) -> bool {
    let same_bytes = match crate::dataset::s3::is_s3(&config.source) {
        true => crate::dataset::s3::still_same(old, old_id, new, id, cached.0),
        false => still_valid(new, &config.source, id, cached),
    };
    let same_owner = match (config.owners_per_entry(), old.owners(), new.owners()) {
        (false, _, _) => true,
        (true, Some(was), Some(now)) => was.sample(old_id).covers(now.sample(id)),
        (true, _, _) => false,
    };
    same_bytes && same_owner
}
