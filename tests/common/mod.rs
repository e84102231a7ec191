//! Helpers shared by the integration-test groups (`tests/<group>/main.rs` includes this
//! folder with `#[path]`), one file per concern:
//!
//! - [`skip`]: `require_fuse` / `require_mpi` / `require_cluster` / `require_root`: skip (or,
//!   under CI's `SHUFFLEFS_REQUIRE_*=1`, fail) when the machine lacks a need.
//! - [`dataset`]: `DatasetBuilder`, ImageFolder trees whose bytes are a pure function of
//!   (file, offset).
//! - [`daemon`]: `Daemon`, a foreground mount that is always unmounted and reaped.
//! - [`refused`]: `mount_refused` (a mount that must fail, leaving nothing behind) and
//!   `DetachedMount`.
//! - [`view`]: reading a mounted view (status, epoch, listings) and errno assertions.
//! - [`mounts`], [`process`], [`venv`]: the mount table, child processes, the Python venv.
//! - [`mpi_job`], [`records`], [`shares`], [`trees`]: multi-rank jobs, record datasets,
//!   plan checks, `--format tree` sources and views.
//!
//! Everything but the last four is re-exported here, so tests `use crate::common::*`.
//! Each group uses a different subset, hence the `dead_code` and `unused_imports` allowances.
#![allow(dead_code, unused_imports)]

pub mod daemon;
pub mod dataset;
pub mod ddp;
pub mod mounts;
pub mod mpi_job;
pub mod process;
pub mod records;
pub mod refused;
pub mod s3;
pub mod shares;
pub mod skip;
pub mod trees;
pub mod venv;
pub mod view;

pub use daemon::*;
pub use dataset::*;
pub use mounts::*;
pub use process::*;
pub use refused::*;
pub use skip::*;
pub use venv::*;
pub use view::*;
