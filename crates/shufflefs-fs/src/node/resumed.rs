//! What picking up a cache at start-up hands on: where the plan walk ended ([`Resumed`]) and,
//! for a job restarted with another number of ranks, how its share was filled
//! ([`RegrowReport`], for the status).
//!
//! A leaf module of its own because both ways of picking up produce them: `resume` (after a
//! crash) and `regrow` (after a resize, which also uses `resume`'s trim). While `Resumed`
//! lived in `resume.rs` and `RegrowReport` in `regrow.rs`, each imported the other.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use crate::plan::elastic::Era;
use crate::plan::{EpochShares, Rank, Step};

/// Where the plan walk of [`resume`](super::resume::resume) ended: the shares of the epoch
/// resumed at and the step out of it. The daemon starts its `Epochs` from these, so start-up walks the plan once
/// (at 1 M samples each walk costs tens of milliseconds, and resuming at epoch E walks E
/// steps).
pub struct Resumed {
    pub current: EpochShares,
    pub next: Step,
    /// How a resized job's share was filled (see `regrow`), for the status.
    pub resize: Option<RegrowReport>,
}

/// How a restart of a resized job filled this rank's share: `.shufflefs/status` "resize".
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct RegrowReport {
    /// The epoch the job went on at.
    pub epoch: u64,
    /// The job's world sizes (`world` ranks from `epoch` on).
    pub history: Vec<Era>,
    /// Samples of this rank's share at `epoch`.
    pub share_samples: u64,
    /// Already in this rank's cache.
    pub kept: u64,
    /// Taken from caches of gone ranks on this host.
    pub adopted: u64,
    /// Sent by other ranks, by sender.
    pub received: BTreeMap<Rank, u64>,
    /// Left to the source (fetched in the background, or when read).
    pub from_source: u64,
    /// Cache folders of gone ranks the job removed (by any rank, in rank order: the same
    /// list on every rank).
    pub reclaimed: Vec<PathBuf>,
}
