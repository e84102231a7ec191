//! Phase 1: what each rank can check alone: that its source, cache folder and mount point
//! do not overlap (before anything is created), its mount point, the source (rank 0, which
//! indexes it), and its cache folder, which it locks.

use std::path::Path;

use super::agree::PhaseError;
use crate::cache::CacheDir;
use crate::config::MountConfig;
use crate::sys::mounts;

/// This rank's cache folder, open and locked, if its local checks pass.
pub(crate) fn check(
    config: &MountConfig,
    rank: u32,
    mountpoint: &Path,
    cache: &Path,
) -> Result<CacheDir, PhaseError> {
    crate::config::check_overlaps(config, rank).map_err(PhaseError::Mine)?;
    mounts::mountpoint(mountpoint).map_err(PhaseError::mine)?;
    if rank == 0 {
        config
            .format()
            .check_source(&config.source)
            .map_err(PhaseError::mine)?;
    }
    CacheDir::open(cache).map_err(PhaseError::mine)
}
