//! shufflefs's store, a crate of its own so that the compiler holds its wall: what a
//! source is and the local cache that holds a rank's share. It knows the plan (which
//! samples a rank holds) and nothing above it: no MPI, no exchange, no FUSE.
//!
//! - [`dataset`]: the `Dataset` trait and `Format`: how a source's index is built and its
//!   samples read (ImageFolder and tree folders, record files, S3 buckets).
//! - [`cache`]: a rank's cache folder (lock, state, manifest), its backends (one file per
//!   sample, packed segments) and the `SampleStore` over them.
//! - [`sys`]: the operating system where std stops (kernel features, atomic replaces,
//!   memory, mounts).

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cache;
pub mod dataset;
pub mod sys;

/// The plan crate, as `crate::plan` inside this one.
pub use shufflefs_plan::plan;
