//! Integration tests that need nothing from the machine: property tests of the plan, the
//! model-based test, and several ranks' worth of exchange, coded exchange, resume and view
//! logic in one process over `LocalComm`. They never skip, so `cargo test --test pure` is the
//! quick check on any machine.
//!
//! One binary per need (`pure`, `fuse`, `mpi`, `cluster`, `loaders_real`) instead of one per
//! file: each binary links the library once, which is most of a test build. Each file below
//! is one of the old `tests/*.rs` binaries, so a test keeps its name under the file's module
//! (`cargo test --test pure plan_props::`).
//!
//! Proptest keeps its regressions next to the folder holding `main.rs`:
//! `tests/proptest-regressions/<file>.txt`.

#[path = "../common/mod.rs"]
mod common;

mod coded_inproc;
mod coded_keep_props;
mod elastic_props;
mod equal_props;
mod exchange_inproc;
mod keep_props;
mod local_plan_props;
mod plan_props;
mod reftest;
mod resume_inproc;
mod view_logic;
