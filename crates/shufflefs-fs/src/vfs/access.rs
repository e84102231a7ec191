//! Who may read the view, and who may steer it.
//!
//! Under `--allow-other` the mount has `default_permissions`: the kernel checks the owners
//! and modes the view shows as it would on the source, so they must never grant what the
//! source does not. The view's root and `epoch-N/` show the source **root**'s owner and a
//! mode derived from it (the dataset folder, or a record source's one file), less what the
//! folders above it deny ([`search_classes`]: a 0755 dataset in a 0700 home folder is
//! private). Below them, under `--allow-other`, every class folder (every folder of a
//! tree), sample and side file shows its **own** owner and mode, which rank 0's scan read
//! (`dataset::owners`, carried in the manifest to every rank, since a rank never opens the
//! source file of a sample a peer sent it): a private class folder, or a private file in a
//! public folder, stays private. The kernel checks search on every folder of a path, so a
//! public file in a private class folder is out of reach as on the source; `current` is a
//! link to `epoch-N`, and nothing else in the view leads to a sample but its folders.
//!
//! Without per-entry owners (no `--allow-other`: only the mounting user sees the view; a
//! record source, whose parts mix records of every file; a bucket, which has no modes) the
//! root's owner and mode are shown on everything. Only the control folder `.shufflefs` is
//! the mounting user's: writing `.shufflefs/epoch`, or looking up the next `epoch-N`
//! (which advances too), is accepted only from that user and root
//! ([`Access::may_control`]).
//!
//! The mapping is conservative: a class of users (owner, group, others) may list a view
//! folder only if the source grants it both read and search (`r-x`), and read a view file
//! if the source grants it read (`dataset::owners::readers`).

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use crate::dataset::owners::{Folder, Owner, search_classes};

/// Owners and modes of the view's nodes (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// The source root's owner and group: owners of the view's root and `epoch-N/`, and of
    /// every view node but `.shufflefs` where entries show no owners of their own.
    pub uid: u32,
    pub gid: u32,
    /// Mode of view files (samples, parts): read bits only.
    pub file_perm: u16,
    /// Mode of view folders (root, `epoch-N`, classes): read and search bits.
    pub dir_perm: u16,
    /// The mounting user: owner of `.shufflefs`, and who may advance.
    pub mounter_uid: u32,
    pub mounter_gid: u32,
    /// Whether class folders, samples and side files show their own owners and modes
    /// (from the manifest) instead of the root's.
    pub per_entry: bool,
}

impl Access {
    /// Everything the mounting user's, files 0444 and folders 0555: a view without a
    /// source to learn from (tests), and the fallback when the root cannot be examined.
    pub(crate) fn mounter() -> Access {
        let (uid, gid) = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        Access {
            uid,
            gid,
            file_perm: 0o444,
            dir_perm: 0o555,
            mounter_uid: uid,
            mounter_gid: gid,
            per_entry: false,
        }
    }

    /// The view's access for source `root` (one `stat`); if that fails, only the mounting
    /// user's (files 0400, folders 0500): a view never grants what it cannot check.
    pub fn of_source(root: &Path) -> Access {
        let me = Access::mounter();
        // A bucket has no owner or mode to derive from: the mounting user's alone, quietly.
        let examined = match crate::dataset::s3::is_s3(root) {
            true => Err(std::io::Error::other("an s3:// source")),
            false => examine(root),
        };
        match examined {
            Ok((meta, above)) => {
                let derived = me.derived(meta.uid(), meta.gid(), meta.mode(), meta.is_dir());
                derived.reachable_by(search_classes(meta.uid(), meta.gid(), &above))
            }
            Err(e) => {
                if !crate::dataset::s3::is_s3(root) {
                    tracing::warn!(source = %root.display(), error = %e, "cannot read the source's owner and mode; the view is the mounting user's alone");
                }
                Access {
                    file_perm: 0o400,
                    dir_perm: 0o500,
                    ..me
                }
            }
        }
    }

    /// `self`'s mounting user, with the view owned by `uid`/`gid` and modes from `mode`.
    fn derived(self, uid: u32, gid: u32, mode: u32, is_dir: bool) -> Access {
        self.owned(Owner::of(uid, gid, mode, is_dir))
    }

    /// `self`'s mounting user, with the view shown as `owner`.
    fn owned(self, owner: Owner) -> Access {
        Access {
            uid: owner.uid,
            gid: owner.gid,
            file_perm: owner.file_perm(),
            dir_perm: owner.dir_perm(),
            ..self
        }
    }

    /// `self` with read (and search) kept only for the classes in `classes` (bits 0o100
    /// owner, 0o010 group, 0o001 others).
    fn reachable_by(self, classes: u32) -> Access {
        let keep = (classes * 0o7) as u16;
        Access {
            file_perm: self.file_perm & keep,
            dir_perm: self.dir_perm & keep,
            ..self
        }
    }

    /// `self`, showing each folder's and sample's own owner and mode where the manifest has
    /// them (`--allow-other`; see the module docs).
    pub fn per_entry(self, on: bool) -> Access {
        Access {
            per_entry: on,
            ..self
        }
    }

    /// The owner, group and mode a view entry shows (a folder if `is_dir`): its own
    /// `owner` (from the manifest) under per-entry owners, else the source root's.
    pub(crate) fn shown(&self, owner: Option<Owner>, is_dir: bool) -> (u32, u32, u16) {
        match owner.filter(|_| self.per_entry) {
            Some(o) if is_dir => (o.uid, o.gid, o.dir_perm()),
            Some(o) => (o.uid, o.gid, o.file_perm()),
            None if is_dir => (self.uid, self.gid, self.dir_perm),
            None => (self.uid, self.gid, self.file_perm),
        }
    }

    /// Whether user `uid` may steer the mount (advance the epoch): the mounting user or root.
    pub(crate) fn may_control(&self, uid: u32) -> bool {
        uid == 0 || uid == self.mounter_uid
    }
}

/// The source root's metadata, and every folder above it.
fn examine(root: &Path) -> std::io::Result<(std::fs::Metadata, Vec<Folder>)> {
    let root = std::fs::canonicalize(root)?;
    let meta = std::fs::metadata(&root)?;
    let above = root
        .ancestors()
        .skip(1)
        .map(|dir| std::fs::metadata(dir).map(|m| (m.uid(), m.gid(), m.mode())))
        .collect::<std::io::Result<_>>()?;
    Ok((meta, above))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_above_that_others_cannot_search_hides_the_view() {
        let (alice, staff) = (1000, 100);
        let a = Access::mounter()
            .derived(alice, staff, 0o755, true)
            .reachable_by(search_classes(alice, staff, &[(alice, staff, 0o700)]));
        assert_eq!(
            (a.uid, a.gid, a.file_perm, a.dir_perm),
            (alice, staff, 0o400, 0o500)
        );
        let a = Access::mounter().derived(alice, staff, 0o640, false);
        assert_eq!((a.file_perm, a.dir_perm), (0o440, 0o550));
    }

    #[test]
    fn the_source_is_examined_up_to_the_root_folder() {
        let t = tempfile::tempdir().unwrap();
        let ds = t.path().join("ds");
        std::fs::create_dir(&ds).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&ds, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        // Whatever lies above the temp folder, its 0700 hides the 0755 dataset.
        let a = Access::of_source(&ds);
        assert_eq!((a.file_perm, a.dir_perm), (0o400, 0o500));
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn only_the_mounting_user_and_root_steer() {
        let a = Access::mounter();
        assert!(a.may_control(a.mounter_uid));
        assert!(a.may_control(0));
        assert_eq!(a.may_control(a.mounter_uid + 1), a.mounter_uid + 1 == 0);
    }
}
