//! `statfs` (what `df` shows) for a mount.
//!
//! A view holds no bytes of its own: every sample it serves lies in the cache folder, and
//! the cache is what fills up. So the mount reports the space of the filesystem under the
//! cache folder, which is what a user watching `df` on the mount wants to know. File counts
//! are the dataset's: `files` is the number of samples (across all ranks and epochs; a view
//! lists a share of them), and no file can be created, so none are free.

use crate::vfs::ShuffleFs;
use crate::vfs::error::FsError;

/// The longest name a view holds: source names come from a filesystem that allows 255
/// bytes, and the scan keeps them as they are.
pub(crate) const NAME_MAX: u32 = 255;

/// What `statfs` answers, in the kernel's units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StatFs {
    /// Preferred I/O size (`f_bsize`).
    pub block_size: u32,
    /// The unit of the block counts (`f_frsize`).
    pub fragment_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    /// Free blocks an unprivileged user may use.
    pub blocks_available: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

impl ShuffleFs {
    /// Space of the cache folder's filesystem, and the dataset's sample count.
    pub(crate) fn statfs(&self) -> Result<StatFs, FsError> {
        let cache = nix::sys::statvfs::statvfs(self.store.dir().root())
            .map_err(|e| FsError::Io(e.into()))?;
        Ok(StatFs {
            block_size: cache.block_size() as u32,
            fragment_size: cache.fragment_size() as u32,
            blocks: cache.blocks(),
            blocks_free: cache.blocks_free(),
            blocks_available: cache.blocks_available(),
            files: self.store.manifest().len(),
            files_free: 0,
            name_max: NAME_MAX,
        })
    }
}
