//! Integration tests that make real FUSE mounts from one process (`shufflefs mount
//! --foreground` children, no MPI). They need `/dev/fuse` and `fusermount3` (or root) and
//! skip without them, unless `SHUFFLEFS_REQUIRE_FUSE=1` (CI) turns the skip into a failure.
//! One `page_cache` test also needs root (to raise a readahead window) and skips without it.
//!
//! Each file below is one of the old `tests/*.rs` binaries; see `tests/pure/main.rs` for why
//! they share a binary.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod cache_safety;
mod corrupt_cache;
mod entry_modes;
mod host_calls;
mod layouts;
mod layouts_bad_input;
mod mount_point_made;
mod mount_single;
mod overlaps;
mod packed_cache;
mod page_cache;
mod partial_counts;
mod partial_read_through;
mod permissions;
mod planted_links;
mod rescan;
mod slow_source;
mod status_hints;
mod unmount_safety;
