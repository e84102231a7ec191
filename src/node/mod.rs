//! One rank's moving parts, without the kernel.
pub mod epochs;
pub mod resume;
pub mod staging;
pub mod status;
