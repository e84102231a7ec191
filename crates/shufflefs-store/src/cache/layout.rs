//! `--cache-layout`: how a cache folder lays samples out on disk, and which layout a
//! dataset format gets by default.
//!
//! A cache is written in one layout for its life: the layout is recorded in the state file
//! and a remount with the other one is refused like any other changed setting (the message
//! names both and points at `--reset-cache`). Refusing rather than converting keeps start-up
//! predictable: a conversion would rewrite the whole cache (hours for a large share) at the
//! moment training wants its first epoch, and rebuilding from the source (`--reset-cache`)
//! costs about the same while staying simple and crash-safe.

use serde::{Deserialize, Serialize};

use crate::dataset::Format;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum CacheLayout {
    /// One file per sample (`samples/<id>`): FUSE passthrough and hard links between the
    /// caches of ranks on one host. For samples of tens of KB and up.
    #[default]
    Files,
    /// Records appended to large segment files (`segments/*.seg`) with an in-memory index:
    /// no file per sample, for millions of small records. Reads go through the daemon.
    Packed,
}

impl CacheLayout {
    /// The layout a dataset format gets when `--cache-layout` is not given.
    pub fn default_for(format: Format) -> CacheLayout {
        match format {
            Format::Imagefolder | Format::Tree => CacheLayout::Files,
            Format::Records => CacheLayout::Packed,
        }
    }

    /// The name `--cache-layout` takes (and the state file and status show).
    pub(crate) fn name(self) -> &'static str {
        match self {
            CacheLayout::Files => "files",
            CacheLayout::Packed => "packed",
        }
    }

    pub fn is_files(&self) -> bool {
        *self == CacheLayout::Files
    }
}

impl std::fmt::Display for CacheLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
