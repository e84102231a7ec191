//! Phase 4: does each cache belong to these settings? Resume at the furthest epoch any rank
//! saved (with another number of ranks too: an elastic restart, see `resize`). Under
//! `--exchange-scope node` the settings include the host layout (see "Host layout on
//! resume" in the parent module).

use super::StartError;
use super::agree::{PhaseError, agreed};
use crate::cache::{CacheBackend, CacheDir, CacheError, CacheState};
use crate::comm::Comm;
use crate::config::MountConfig;
use crate::daemon::coded::{check_mode, record_mode};
use crate::daemon::resize::{self, Job};

/// This rank's state if it belongs to `expected` (its world size aside), `None` for a
/// cache to rebuild, or why it cannot be used. Refused before the backend opens: opening
/// creates its folders (another layout's, for a cache refused for its layout).
fn kept(
    config: &MountConfig,
    dir: &CacheDir,
    state: Option<CacheState>,
    expected: &CacheState,
) -> Result<Option<CacheState>, PhaseError> {
    // Coded or partial-local, and alpha: recorded beside the state (`coded::check_mode`).
    let same_mode = check_mode(dir.root(), config);
    match (state, same_mode) {
        // Another world size is an elastic restart (`resize`), not a mismatch.
        (Some(s), Ok(())) if resize::belongs(&s, expected) => match s.history() {
            Ok(_) => Ok(Some(s)),
            Err(e) => Err(PhaseError::mine(CacheError::Corrupt {
                path: dir.root().to_path_buf(),
                what: "a state file",
                detail: e.to_string(),
            })),
        },
        (Some(_), Err(e)) if !config.reset_cache => Err(PhaseError::Mine(e)),
        (Some(s), _) if !config.reset_cache => Err(PhaseError::Mine(format!(
            "cache folder {} was built with other settings; pass --reset-cache to rebuild it, or use the old settings:\n  {}",
            dir.root().display(),
            differences(config, &s, expected).join("\n  ")
        ))),
        _ => Ok(None),
    }
}

/// What differs, for the refusal. Without `--seed` the seed is not the user's setting (it
/// was rank 0's cache's, or random when that cache did not fit): no line for it.
fn differences(config: &MountConfig, state: &CacheState, expected: &CacheState) -> Vec<String> {
    let mut lines = resize::differences(state, expected);
    if config.seed.is_none() {
        lines.retain(|l| !l.starts_with("--seed:"));
    }
    lines
}

/// The backend of this start's layout; a cache not kept is emptied (and other layouts'
/// files and the old state go).
fn open_backend(
    config: &MountConfig,
    dir: &CacheDir,
    kept: bool,
    (samples, world): (u64, u32),
) -> Result<Box<dyn CacheBackend>, PhaseError> {
    let backend = dir
        .backend_for(config.layout, samples, world)
        .map_err(PhaseError::mine)?;
    if !kept {
        backend.clear().map_err(|e| {
            PhaseError::mine(CacheError::Io {
                path: dir.root().to_path_buf(),
                source: e,
            })
        })?;
        dir.remove_other_layouts(config.layout)
            .map_err(PhaseError::mine)?;
        dir.forget_state().map_err(PhaseError::mine)?;
    }
    Ok(backend)
}

/// Phase 4 on this rank (collective): the job this start continues, with the backend of
/// its cache; the state is saved at the job's epoch.
pub(crate) fn belongs(
    comm: &mut dyn Comm,
    config: &MountConfig,
    dir: &CacheDir,
    state: Option<CacheState>,
    expected: &CacheState,
    samples: u64,
) -> Result<(Job, Box<dyn CacheBackend>), StartError> {
    let local = kept(config, dir, state, expected).and_then(|kept| {
        let backend = open_backend(config, dir, kept.is_some(), (samples, comm.size()))?;
        Ok((kept, backend))
    });
    let (mine, backend) = agreed(comm, local)?;
    // After a crash ranks may be one epoch apart; training had reached the furthest one. A
    // restart with another number of ranks goes on from there as well (see `resize`).
    let job = resize::find_job(comm, config, mine.as_ref(), expected)?;
    let job = agreed(comm, job.map_err(PhaseError::Shared))?;
    let mut state = CacheState {
        epoch: job.epoch,
        ..expected.clone()
    };
    state.set_history(&job.history);
    dir.save_state(&state)?;
    record_mode(dir.root(), config).map_err(|source| CacheError::Io {
        path: dir.root().to_path_buf(),
        source,
    })?;
    Ok((job, backend))
}

/// Only a shortcut for the next start, so a failure is a warning (see `save_manifest`).
pub(crate) fn save_manifest(dir: &CacheDir, bytes: &[u8]) {
    if let Err(e) = dir.save_manifest(bytes) {
        tracing::warn!(error = %e, "could not save the manifest; the next start rescans the source");
    }
}
