//! shufflefs's plan, a crate of its own so that the compiler holds its wall: which rank
//! holds which sample in every epoch, computed from (seed, epoch, ranks, fraction, a rank's
//! own share) alone. Nothing here reads a file, talks to another rank or starts a thread
//! pool of its own; the daemon (the `shufflefs` crate) feeds it and carries out what it
//! says. It builds and tests on a machine without Open MPI or libclang
//! (`cargo test -p shufflefs-plan`).
//!
//! - [`plan`]: partial-local shuffling (the paper's Algorithm 1, per rank in O(share)),
//!   equal shares, elastic remaps, the partial cache's keep sets, host scopes.
//! - [`coded`]: the coded exchange's planning (placement, groups, XOR packets' layout and
//!   their arithmetic), which the daemon's coded mode moves over MPI.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod coded;
pub mod plan;
