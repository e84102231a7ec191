//! The host: the mount table, kernel probes, mount points the daemon made, the mount's readahead window, positioned reads, replacing a file whole, the allocator's arenas.
pub(crate) mod io;
pub(crate) mod kernel;
pub(crate) mod made_dirs;
pub mod memory;
pub mod mounts;
pub(crate) mod readahead;
pub(crate) mod replace;
