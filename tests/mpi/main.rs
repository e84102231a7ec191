//! Integration tests under a real `mpirun` on this machine: several ranks, each with a real
//! FUSE mount. They need `mpirun` and FUSE and skip without them, unless
//! `SHUFFLEFS_REQUIRE_MPI=1` / `SHUFFLEFS_REQUIRE_FUSE=1` (CI) turn the skip into a failure.
//! `disk_full` also needs root (its caches sit on small tmpfs mounts).
//!
//! Each file below is one of the old `tests/*.rs` binaries; see `tests/pure/main.rs` for why
//! they share a binary.

#[path = "../common/mod.rs"]
mod common;

mod clean_stop;
mod coded_live;
mod coded_mpi;
mod coded_partial;
mod comm_mpi;
mod demo_script;
mod disk_full;
mod elastic_mpi;
mod interrupt_mpi;
mod job_end;
mod jobview_mpi;
mod launch_mpi;
mod layouts_modes;
mod layouts_mpi;
mod many_ranks;
mod mpi_exchange;
mod partial_cache;
mod partial_cache_room;
mod rank_leaves;
mod rescan_mpi;
mod resume_mpi;
mod s3_mpi;
mod signal_mpi;
mod stress_mpi;
mod tcp_torchrun;
