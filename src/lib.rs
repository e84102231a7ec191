//! shufflefs: per-rank FUSE views of an ImageFolder dataset, with partial-local shuffling
//! (Nguyen et al., "Why globally re-shuffle?") done in the background between epochs.
//!
//! Layers, from pure to outside-facing:
//! - [`plan`]: who owns which sample in every epoch (pure, deterministic).
//! - [`manifest`], [`scan`], [`view`]: the dataset's names, how rank 0 reads them from the
//!   source, and the mounted tree's inode scheme.
//! - [`cache`], [`source`], [`staging`]: bytes on local disk, where they come from, and the
//!   background worker that fills the cache.
//! - [`epochs`], [`fs`]: epoch advance and the filesystem's behaviour as plain Rust.
//! - [`fuse`]: the thin fuser binding ([`readahead`]: the mount's window); [`comm`]: MPI or
//!   in-process ranks.
//! - [`daemon`], [`launch`], [`cli`]: wiring and the command line.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cache;
pub mod checks;
pub mod cli;
pub mod comm;
pub mod daemon;
pub mod epochs;
pub mod error;
pub mod exchange;
pub mod fs;
pub mod fuse;
pub mod launch;
pub mod manifest;
pub mod plan;
pub mod readahead;
pub mod resume;
pub mod scan;
pub mod source;
pub mod staging;
pub mod status;
pub mod view;
