//! The one error type at the filesystem boundary, and its errno mapping.
//!
//! The match in `errno` has no catch-all arm on purpose: a new variant must decide its errno.

use std::io;

use crate::node::coordinator::AdvanceError;

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
    /// The caller was signalled while its request waited (an advance): EINTR.
    #[error("interrupted while waiting: {0}")]
    Interrupted(String),
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
            FsError::Interrupted(_) => libc::EINTR,
            FsError::NotPermitted => libc::EACCES,
        }
    }

    /// Expected outcomes (a missing name, a refused write) are not worth a warning in the log.
    pub(crate) fn is_routine(&self) -> bool {
        matches!(
            self,
            FsError::NotFound
                | FsError::ReadOnly
                | FsError::NotDir
                | FsError::IsDir
                | FsError::BadHandle
                | FsError::NoIoctl
                | FsError::Interrupted(_)
                | FsError::NotPermitted
        )
    }
}

/// An advance asked through the view: a refused one is the caller's mistake (EINVAL), a
/// failed one is the daemon's (EIO).
impl From<AdvanceError> for FsError {
    fn from(e: AdvanceError) -> FsError {
        match e {
            AdvanceError::Behind { .. } | AdvanceError::NotNext { .. } => {
                FsError::Invalid(e.to_string())
            }
            AdvanceError::Prepare { .. } | AdvanceError::Persist { .. } => {
                FsError::Io(io::Error::other(e.to_string()))
            }
            AdvanceError::ShuttingDown => FsError::ShuttingDown,
            AdvanceError::Interrupted { .. } => FsError::Interrupted(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller whose wait was given up for a signal sees EINTR, one given up because the
    /// mount goes away EIO; neither is worth a warning.
    #[test]
    fn a_given_up_advance_answers_eintr_or_eio() {
        let interrupted = FsError::from(AdvanceError::Interrupted { target: 2 });
        assert_eq!(interrupted.errno(), libc::EINTR);
        assert!(interrupted.is_routine());
        assert_eq!(FsError::from(AdvanceError::ShuttingDown).errno(), libc::EIO);
    }
}
