//! What a source's index may keep and what it leaves out: names safe to serve as file names,
//! and the [`Skipped`] entries reported instead.
//!
//! A leaf module of its own because both index builders (`scan.rs` for ImageFolder trees,
//! `records/` for packed records) and the [`Manifest`](super::Manifest) they build use it:
//! while it lived in `manifest.rs`, the record index imported the manifest that holds it.

use serde::{Deserialize, Serialize};

/// Something left out of the manifest, with the reason; reported in the status and the log.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

/// Whether a single path component is safe to use as a file name under a folder we own.
pub(crate) fn is_safe_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != b"."
        && name != b".."
        && !name.contains(&b'/')
        && !name.contains(&0)
}
