//! shufflefs's network layer, a crate of its own so that the compiler holds its wall: how
//! ranks talk ([`comm`]: the `Comm` trait, MPI behind the default `mpi` feature, ranks as
//! threads of one process, fault-injecting doubles behind `testing`) and how samples move
//! between their caches before an epoch ([`exchange`]: the partial exchange's executor and
//! the coded exchange). It knows the plan and the store below it, nothing above: no FUSE,
//! no daemon.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod comm;
pub mod exchange;

/// The lower crates, as `crate::plan`, `crate::coded`, `crate::cache`, `crate::dataset`
/// and `crate::sys` inside this one.
pub use shufflefs_plan::{coded, plan};
pub use shufflefs_store::{cache, dataset, sys};
