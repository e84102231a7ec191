//! The host: the mount table, kernel probes, the mount's readahead window, positioned reads.
pub(crate) mod io;
pub(crate) mod kernel;
pub mod mounts;
pub(crate) mod readahead;
