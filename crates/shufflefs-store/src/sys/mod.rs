//! The host: the mount table, kernel probes, mount points the daemon made, the mount's readahead window, positioned reads, replacing a file whole, the allocator's arenas, the one way to take a lock.
pub mod io;
pub mod kernel;
pub mod made_dirs;
pub mod memory;
pub mod mounts;
pub mod readahead;
pub mod replace;
pub mod sync;
