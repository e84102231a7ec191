//! `--rescan`: a remount that scans the source again and keeps what is still valid.
//!
//! Without it a remount reuses the index saved in the cache, so a source changed since is
//! not seen (the status says so: `source_scan.stale_possible`). With it rank 0 scans (phase
//! 3), and when the new index differs from the cache's, each rank carries its cached
//! samples over to the new index before its cache is checked (phase 4): a sample whose
//! class, name, size and time are unchanged keeps its bytes under its new id, the rest is
//! dropped. For a bucket, "time" is the ETag: an object keeps its bytes when both listings
//! gave it the same ETag and size (`dataset::s3::still_same`). The state then names the new index, so the cache belongs to these settings.
//!
//! The plan is a function of the number of samples, so with another index it is computed
//! anew at the job's current epoch: each rank's share of that epoch is the new plan's, and
//! the resume (phase 5) fetches what the rank lacks of it (from the source). With one rank
//! that is exactly the new samples; with several, shares move, and samples a rank kept but
//! no longer owns are dropped by the resume as in any epoch. Only the `files` layout of an
//! image folder carries samples over; a packed cache or a record source's cache is rebuilt
//! (from epoch 0 as `--reset-cache` does; the seed is kept).

use super::agree::PhaseError;
use crate::cache::{CacheDir, CacheLayout, CacheState};
use crate::config::MountConfig;
use crate::daemon::resize;
use crate::dataset::Manifest;
use crate::dataset::rescan::{same_sample, still_valid};

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
        return Ok((Some(old), None));
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
    let bucket = crate::dataset::s3::is_s3(&config.source);
    let carry = |id, cached: (u64, _)| {
        let new = (id < old_manifest.len())
            .then(|| same_sample(&old_manifest, manifest, id))
            .flatten()?;
        let valid = match bucket {
            true => crate::dataset::s3::still_same(&old_manifest, id, manifest, new, cached.0),
            false => still_valid(manifest, &config.source, new, cached),
        };
        valid.then_some(new)
    };
    let counts = dir.carry_samples(&carry).map_err(PhaseError::mine)?;
    tracing::info!(
        kept = counts.0,
        dropped = counts.1,
        "--rescan: the source changed; cached samples still valid are kept"
    );
    Ok((Some(renamed), Some(counts)))
}
