//! Phase 3b: the side files (`--replicate`) copied once per host, before anything mounts:
//! the host's first rank copies them into its cache, then each other rank of the host
//! reads that copy, or copies them itself if it cannot (see `cache::side`). Both steps end
//! in an agreement, so a side file that cannot be read stops every rank, naming it.

use super::StartError;
use super::agree::{PhaseError, agreed};
use crate::cache::CacheDir;
use crate::cache::side::{Replicated, SIDE_DIR, copy_missing, readable};
use crate::comm::Comm;
use crate::config::{MountConfig, for_rank};
use crate::dataset::Manifest;

/// Places the side files of `manifest` where this rank's view reads them (collective; no
/// collective at all when the source has none, the same on every rank).
pub(crate) fn place(
    comm: &mut dyn Comm,
    config: &MountConfig,
    manifest: &Manifest,
    dir: &mut CacheDir,
) -> Result<(), StartError> {
    let files = manifest.side_files();
    if files.is_empty() {
        return Ok(());
    }
    let me = comm.rank();
    let hosts = comm.hosts();
    let first = hosts
        .iter()
        .position(|&h| h == hosts[me as usize])
        .unwrap_or(0) as u32;
    let own = dir.root().join(SIDE_DIR);
    let copied = match me == first {
        true => copy_missing(&config.source, &own, files).map_err(PhaseError::Mine),
        false => Ok(0),
    };
    let copied = agreed(comm, copied)?;
    let host_copy = for_rank(&config.cache, first).join(SIDE_DIR);
    let placed = if me == first {
        Ok((own, me, copied))
    } else if readable(&host_copy, files) {
        Ok((host_copy, first, 0))
    } else {
        tracing::info!(copy = %host_copy.display(), "the host's copy of the side files cannot be read here; copying them into this rank's cache");
        copy_missing(&config.source, &own, files)
            .map(|n| (own, me, n))
            .map_err(PhaseError::Mine)
    };
    let (dir_used, copy_rank, fetched) = agreed(comm, placed)?;
    let replicated = Replicated {
        dir: dir_used,
        copy_rank,
        files: files.len() as u64,
        bytes: files.iter().map(|f| f.size).sum(),
        fetched_bytes: fetched,
    };
    tracing::info!(files = replicated.files, bytes = replicated.bytes, fetched = fetched, from = %replicated.dir.display(), "side files in place");
    dir.set_replicated(replicated);
    Ok(())
}
