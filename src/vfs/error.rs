//! The one error type at the filesystem boundary, and its errno mapping.
//!
//! The match in `errno` has no catch-all arm on purpose: a new variant must decide its errno.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such entry")]
    NotFound,
    #[error("views are read-only")]
    ReadOnly,
    #[error("not a folder")]
    NotDir,
    #[error("is a folder")]
    IsDir,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("sample unavailable: {0}")]
    Io(#[from] io::Error),
    #[error("daemon is shutting down")]
    ShuttingDown,
    #[error("no such open file, or not open for this")]
    BadHandle,
    /// `ioctl` on a view: no file here is a terminal or a device. Every `isatty()` asks
    /// (Python's `open()` does, for each sample), so this is routine.
    #[error("no ioctl commands on a view")]
    NoIoctl,
    /// Advancing the epoch by another user than the one who mounted (or root).
    #[error("only the mounting user and root may advance the epoch")]
    NotPermitted,
}

impl FsError {
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::ReadOnly => libc::EROFS,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::Invalid(_) => libc::EINVAL,
            FsError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            FsError::ShuttingDown => libc::EIO,
            FsError::BadHandle => libc::EBADF,
            FsError::NoIoctl => libc::ENOTTY,
            FsError::NotPermitted => libc::EACCES,
        }
    }

    /// Expected outcomes (a missing name, a refused write) are not worth a warning in the log.
    pub fn is_routine(&self) -> bool {
        matches!(
            self,
            FsError::NotFound
                | FsError::ReadOnly
                | FsError::NotDir
                | FsError::IsDir
                | FsError::BadHandle
                | FsError::NoIoctl
                | FsError::NotPermitted
        )
    }
}
