//! The host: the mount table, kernel probes, the mount's readahead window, positioned reads.
pub mod io;
pub mod kernel;
pub mod mounts;
pub mod readahead;
