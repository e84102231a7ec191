//! Integration tests across emulated hosts (`mount-helpers/shufflefs-cluster`: network
//! namespaces joined by shaped links, one `mpirun` across them). They need root, iproute2,
//! `nsenter`, `unshare`, `mpirun`, `python3` and `/dev/fuse`, and skip without them unless
//! `SHUFFLEFS_REQUIRE_CLUSTER=1` (CI) turns the skip into a failure.
//!
//! A binary of its own because it is the slowest and needs the most; see
//! `tests/pure/main.rs` for the grouping.

#[path = "../common/mod.rs"]
mod common;

mod cluster_mpi;
mod harness;
mod host_job;
mod private_hosts;
mod slow_steady;
mod slurm;
mod slurm_private;
mod torchrun_hosts;
