//! Integration tests that read mounts with real Python loaders (torchvision, tf.data,
//! scikit-learn, pandas, webdataset) from the venv of `mount-helpers/install-python.sh`, some
//! under `mpirun`. They skip without the venv unless `SHUFFLEFS_REQUIRE_LOADERS=1` (CI), and
//! need FUSE (and MPI for the multi-rank ones) like the other groups.
//!
//! The group is not called `loaders` because `tests/loaders/` holds the Python scripts these
//! tests run. Each file below is one of the old `tests/*.rs` binaries; see
//! `tests/pure/main.rs` for why they share a binary.

#[path = "../common/mod.rs"]
mod common;

mod dlio;
mod python_package;
mod real_loaders;
mod records_mount;
mod records_mpi;
mod s3_train;
mod torchrun_ddp;
