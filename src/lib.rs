//! shufflefs: per-rank FUSE views of a dataset for distributed training, with partial-local
//! shuffling (Nguyen et al., "Why globally re-shuffle?") done in the background between epochs.
//!
//! The folders are the layers, from pure to outside-facing (README "Architecture" has the
//! tree and the path a sample's bytes take):
//! - [`plan`]: who owns which sample in every epoch (pure, deterministic, no I/O), also
//!   across restarts with another number of ranks (`plan::elastic`).
//! - [`coded`]: coded shuffling (UberShuffle) planning: which XOR packets the server sends,
//!   their bytes, the communicator set (pure); the `shufflefs plan` calculator. The coded
//!   exchange that moves them is `exchange::coded`, its job layout `daemon::coded`.
//! - [`dataset`]: what a source is (its index, how a sample's bytes are read): ImageFolder
//!   trees, or packed-record files (an offset table; a unit is a group of records).
//! - [`cache`]: this rank's local copy of its share, behind the `CacheBackend` trait.
//! - [`comm`]: the other ranks (MPI, or in-process ranks and fault-injecting doubles for tests).
//! - [`exchange`]: moving samples between ranks: a schedule (strategy) and its executor.
//! - [`node`]: one rank's moving parts without the kernel: the epoch coordinator, staging,
//!   status, resume after a crash.
//! - [`vfs`]: the filesystem's behaviour as plain Rust (names, nodes, bytes, errors; the
//!   per-epoch part files of a record source).
//! - [`fuse`]: the thin fuser binding over [`vfs`].
//! - [`sys`]: the host: mount table, kernel probes, the mount's readahead window.
//! - `daemon`, [`launch`], [`config`], [`cli`]: wiring, process life, the validated
//!   settings and the command line (clap only; nothing below `daemon` imports it).
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cli;
pub mod config;
pub(crate) mod daemon;
pub mod jobtable;
pub mod launch;
/// One rank's moving parts, the views and the fuser binding live in `shufflefs-fs` (no MPI,
/// no command line).
pub use shufflefs_fs::{fuse, node, vfs};
/// The transport and the exchanges live in `shufflefs-net` (MPI behind its `mpi` feature).
pub use shufflefs_net::{comm, exchange};
/// The plan and the coded exchange's planning live in their own crate (`shufflefs-plan`:
/// pure, no I/O, no MPI); re-exported so that `crate::plan` and `crate::coded` read as
/// before.
pub use shufflefs_plan::{coded, plan};
/// The dataset, the cache and the system calls live in `shufflefs-store` (no MPI, no FUSE).
pub use shufflefs_store::{cache, dataset, sys};
