//! Datasets: how the index of samples is built and how a sample's bytes are read.
pub mod manifest;
pub mod scan;
pub mod source;
