//! `--source s3://...` in a build without the `s3` feature (no object_store, tokio or HTTP
//! in it): refused on the command line ([`check_args`]), naming the build that has it. The
//! other answers are those of a folder source; a bucket never reaches them, since the mount
//! stops at the refusal.

use std::path::Path;
use std::sync::Arc;

use super::manifest::{Manifest, ManifestError};
use super::{Dataset, Format, ImageFolder, RecordParams};
use crate::plan::SampleId;

/// Why a URL source cannot be served by this build, and the fix.
fn refusal(source: &Path) -> String {
    format!(
        "--source {}: this shufflefs was built without S3 (the `s3` feature); build it with \
         its default features (`cargo install --path .`) to read a bucket, or give a folder",
        source.display()
    )
}

/// Whether `source` is a URL (`s3://`, or another scheme this build cannot read either).
pub fn is_s3(source: &Path) -> bool {
    source.to_str().is_some_and(|s| s.contains("://"))
}

pub fn default_staging_threads(_source: &Path) -> usize {
    4
}

pub fn store_retries() -> u64 {
    0
}

/// Refuses any URL source: this build has no client for one.
pub fn check_args(source: &Path, _format: Format, _replicate: bool) -> Result<(), String> {
    match is_s3(source) {
        true => Err(refusal(source)),
        false => Ok(()),
    }
}

pub(crate) fn check_source(source: &Path) -> Result<(), ManifestError> {
    Err(ManifestError::Store(refusal(source)))
}

pub(crate) fn build_index(
    source: &Path,
    _format: Format,
    _records: &RecordParams,
) -> Result<Manifest, ManifestError> {
    Err(ManifestError::Store(refusal(source)))
}

/// Never the same: without a client there is no bucket listing to compare with.
pub fn still_same(_: &Manifest, _: SampleId, _: &Manifest, _: SampleId, _: u64) -> bool {
    false
}

/// Not reached for a bucket (refused at [`check_args`]); a folder's reader otherwise.
pub(crate) fn open(source: &Path, manifest: Arc<Manifest>) -> Arc<dyn Dataset> {
    Arc::new(ImageFolder::new(source.to_path_buf(), manifest))
}
