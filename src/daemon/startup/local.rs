//! Phase 1: what each rank can check alone: that its source, cache folder and mount point
//! do not overlap (before anything is created), its mount point, the source (rank 0, which
//! indexes it), and its cache folder, which it locks. A missing mount point passes: it is
//! created only once every rank agreed to mount (`sys::made_dirs`).

use std::path::Path;

use super::agree::PhaseError;
use crate::cache::CacheDir;
use crate::config::MountConfig;
use crate::sys::made_dirs::MountDirs;
use crate::sys::mounts;

/// This rank's cache folder, open and locked, and the folders its mount point lacks, if its
/// local checks pass.
pub(crate) fn check(
    config: &MountConfig,
    rank: u32,
    mountpoint: &Path,
    cache: &Path,
) -> Result<(CacheDir, MountDirs), PhaseError> {
    crate::config::check_overlaps(config, rank).map_err(PhaseError::Mine)?;
    let dirs = match mounts::mountpoint(mountpoint) {
        Ok(()) => MountDirs::default(),
        // Noted now, before any rank of this host can have created a shared parent.
        Err(mounts::MountpointError::Missing(_)) => MountDirs::plan(mountpoint)
            .map_err(|e| PhaseError::Mine(format!("mount point {}: {e}", mountpoint.display())))?,
        Err(e) => return Err(PhaseError::mine(e)),
    };
    if rank == 0 {
        config
            .format()
            .check_source(&config.source)
            .map_err(PhaseError::mine)?;
    }
    Ok((CacheDir::open(cache).map_err(PhaseError::mine)?, dirs))
}
