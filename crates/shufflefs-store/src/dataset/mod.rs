//! Datasets: how the index of samples is built and how a sample's bytes are read.
//!
//! Everything above this layer (cache, exchange, views) names samples by id only and asks a
//! [`Dataset`] for their bytes; the index itself is a [`Manifest`] (names in view order,
//! class ranges, sizes where known): a folder source is listed by every rank, each its part,
//! and combined on every rank (`scan::split`); a record or bucket index is built by rank 0
//! and shipped to the other ranks.
//! The [`Format`] chosen on the command line (`--format`) decides how the index is built
//! and which `Dataset` reads the source: ImageFolder trees or any tree of folders
//! (`--format tree`), one file per sample, or packed
//! [`records`] (an offset table into large record files, whose units are groups of records;
//! their `read_batch` coalesces reads by file and offset).

use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use crate::plan::SampleId;

pub(crate) mod columns;
pub(crate) mod footer;
pub(crate) mod imagefolder;
pub mod manifest;
pub mod names;
pub mod owners;
pub mod records;
pub mod rescan;
#[cfg(feature = "s3")]
pub mod s3;
#[cfg(not(feature = "s3"))]
#[path = "s3_off.rs"]
pub mod s3;
pub mod scan;
pub mod side;
pub(crate) mod synthetic;

pub use imagefolder::ImageFolder;
pub use manifest::{Manifest, ManifestError};
pub use records::{Framing, Grouping, RecordParams, RecordSource};
pub use synthetic::{SyntheticSource, synthetic_byte};

/// What a whole-sample copy learned about the sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copied {
    pub len: u64,
    /// The sample's modification time in the source, where the source has one.
    pub mtime: Option<SystemTime>,
}

/// Where sample bytes come from when no cache holds them.
pub trait Dataset: Send + Sync {
    /// Writes the whole of sample `id` to `out`.
    fn copy_to(&self, id: SampleId, out: &mut dyn Write) -> io::Result<Copied>;
    /// Reads up to `buf.len()` bytes of sample `id` at `offset`; short only at its end.
    fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
    /// Sample `id`'s length in the source now, where the source can tell without reading
    /// it (a file's metadata); `None` where only reading it tells. A reader that must
    /// stream a sample too large for memory needs it before the first byte.
    fn stat_len(&self, _id: SampleId) -> io::Result<Option<u64>> {
        Ok(None)
    }
    /// Reads the whole of every sample in `ids`, handing each to `each` (in any order: a
    /// packed source sorts by file and offset and coalesces neighbours). One failure is
    /// that sample's alone.
    fn read_batch(&self, ids: &[SampleId], each: &mut dyn FnMut(SampleId, io::Result<Vec<u8>>)) {
        for &id in ids {
            let mut bytes = Vec::new();
            let got = self.copy_to(id, &mut bytes).map(|_| bytes);
            each(id, got);
        }
    }
    /// Staging is about to copy `ids` (this rank's missing share, in order): a source that
    /// reads neighbours together (a bucket's records) plans its reads; the rest ignore it.
    fn will_read(&self, _ids: &[SampleId]) {}
    /// A human-readable location for errors and the log.
    fn describe(&self, id: SampleId) -> String;
}

/// The dataset formats `--format` selects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// A folder of class folders of sample files (torchvision's ImageFolder).
    #[default]
    Imagefolder,
    /// Every regular file at any depth is a sample; `epoch-N/` mirrors the folders.
    Tree,
    /// Packed records in one file or a folder of shard files (see `--framing`).
    Records,
}

impl Format {
    /// Checks, before anything else starts, that `source` can be this format's source
    /// (rank 0 only: other ranks make no metadata calls on the source).
    pub fn check_source(self, source: &Path) -> Result<(), ManifestError> {
        if s3::is_s3(source) {
            return s3::check_source(source);
        }
        match self {
            Format::Imagefolder | Format::Tree => imagefolder::check_source(source),
            Format::Records => {
                records::scan::list_files(source, &mut Vec::new())?;
                Ok(())
            }
        }
    }

    /// Builds the index of `source` (rank 0's one pass over it); `records` are the record
    /// settings (`--framing` and the rest), used by `Format::Records` only; `owners`: also
    /// each folder's and file's owner and mode (`--allow-other`; see `owners`).
    pub fn build_index(
        self,
        source: &Path,
        records: &RecordParams,
        owners: bool,
    ) -> Result<Manifest, ManifestError> {
        if s3::is_s3(source) {
            return s3::build_index(source, self, records);
        }
        match self {
            Format::Imagefolder => scan::scan_with(source, owners),
            Format::Tree => scan::scan_tree_with(source, owners),
            Format::Records => {
                let (index, skipped) = records::build_index(source, records)?;
                Ok(Manifest::from_records(index, skipped))
            }
        }
    }

    /// The reader of `source`'s samples, as `manifest` names them.
    pub fn open(self, source: &Path, manifest: Arc<Manifest>) -> Arc<dyn Dataset> {
        if s3::is_s3(source) {
            return s3::open(source, manifest);
        }
        match self {
            // A tree's sample is a file under its folder path, read as an ImageFolder's is.
            Format::Imagefolder | Format::Tree => {
                Arc::new(ImageFolder::new(source.to_path_buf(), manifest))
            }
            Format::Records => Arc::new(RecordSource::new(source.to_path_buf(), manifest)),
        }
    }

    /// Whether a manifest (from the cache, say) fits this format and these record settings.
    pub fn fits(self, manifest: &Manifest, records: &RecordParams) -> bool {
        match (self, manifest.records()) {
            (Format::Imagefolder, None) => !manifest.is_tree(),
            (Format::Tree, None) => manifest.is_tree(),
            (Format::Records, Some(index)) => index.params == *records,
            _ => false,
        }
    }
}
