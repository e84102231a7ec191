//! shufflefs's filesystem, a crate of its own so that the compiler holds its wall: one
//! rank's moving parts and the views the kernel reads, with no MPI and no command line (the
//! `shufflefs` binary crate builds the config, starts the daemon and hands this crate its
//! parts).
//!
//! - [`node`]: one rank's moving parts without the kernel: the epoch coordinator, staging,
//!   status, resume after a crash, the job-wide view and the metrics.
//! - [`vfs`]: the filesystem's behaviour as plain Rust (names, nodes, bytes, errors; the
//!   per-epoch part files of a record source).
//! - [`fuse`]: the thin fuser binding over [`vfs`] (errno mapping in one place).

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod fuse;
pub mod node;
pub mod vfs;

/// The lower crates, as `crate::plan`, `crate::cache`, `crate::comm`, ... inside this one.
pub use shufflefs_net::{comm, exchange};
pub use shufflefs_plan::{coded, plan};
pub use shufflefs_store::{cache, dataset, sys};
