//! What the kernel is told about a node, and for how long it may believe it.
//!
//! Policy lives here, not in the fuser binding: `fuse` only converts an [`Entry`] into the
//! kernel's attribute struct (adding the mount time).

use std::time::{Duration, SystemTime};

use crate::vfs::inodes::Node;

/// Published views never change: the kernel may keep them for a day.
pub(crate) const VIEW_TTL: Duration = Duration::from_secs(24 * 3600);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
}

/// What `getattr`/`lookup` know about a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub node: Node,
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    /// Owner and group (see `access`): the source's on the view, the mounting user's on
    /// the control files.
    pub uid: u32,
    pub gid: u32,
    /// Whether the kernel may cache it for long: true for published views, except samples
    /// whose size is not known yet (listed with size 0; see `ShuffleFs::resolved`).
    pub immutable: bool,
    /// When the content last changed; `None`: never since mounting (the mount time is
    /// reported). Only the epoch file on a mount without opens sets it (see `OpenFiles`).
    pub mtime: Option<SystemTime>,
}

impl Entry {
    /// How long the kernel may keep this entry and its attributes: a day for what never
    /// changes, not at all for the rest (control files, samples of unknown size).
    pub(crate) fn ttl(&self) -> Duration {
        if self.immutable {
            VIEW_TTL
        } else {
            Duration::ZERO
        }
    }

    /// Hard links: folders count their `.` (no folder here has subfolders that hold a `..`
    /// the kernel would count).
    pub(crate) fn nlink(&self) -> u32 {
        match self.kind {
            Kind::Dir => 2,
            Kind::File | Kind::Symlink => 1,
        }
    }

    /// 512-byte blocks, as `stat` reports them: what the bytes would take, not what the
    /// cache file takes (it may not exist yet).
    pub(crate) fn blocks(&self) -> u64 {
        self.size.div_ceil(512)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: Kind, size: u64, immutable: bool) -> Entry {
        Entry {
            node: Node::Root,
            kind,
            size,
            perm: 0o444,
            uid: 0,
            gid: 0,
            immutable,
            mtime: None,
        }
    }

    #[test]
    fn only_what_never_changes_is_cached() {
        assert_eq!(entry(Kind::File, 10, true).ttl(), VIEW_TTL);
        assert_eq!(entry(Kind::File, 0, false).ttl(), Duration::ZERO);
        assert_eq!(entry(Kind::Dir, 0, false).ttl(), Duration::ZERO);
    }

    #[test]
    fn links_and_blocks() {
        assert_eq!(entry(Kind::Dir, 0, true).nlink(), 2);
        assert_eq!(entry(Kind::Symlink, 7, false).nlink(), 1);
        assert_eq!(entry(Kind::File, 0, true).blocks(), 0);
        assert_eq!(entry(Kind::File, 1, true).blocks(), 1);
        assert_eq!(entry(Kind::File, 513, true).blocks(), 2);
    }
}
