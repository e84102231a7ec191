//! The host: the mount table, kernel probes, the mount's readahead window.
pub mod kernel;
pub mod mounts;
pub mod readahead;
