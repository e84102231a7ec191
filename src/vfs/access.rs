//! Who may read the view, and who may steer it.
//!
//! The view shows the source's owner and a mode derived from the source **root** (the
//! dataset folder, or a record source's one file), on every folder and file of every
//! epoch; under `--allow-other` the mount has `default_permissions`, so the kernel checks
//! them as it would on the source. Only the control folder `.shufflefs` is the mounting
//! user's: writing `.shufflefs/epoch`, or looking up the next `epoch-N` (which advances
//! too), is accepted only from that user and root ([`Access::may_control`]).
//!
//! Why the root and not each sample's own mode: the scan reads names only (no `stat` per
//! file at a million files, often on a network filesystem), and a rank never opens the
//! source file of a sample a peer sent it, so a per-file mode would be known for some
//! samples and not others, and would differ between ranks and between epochs. The
//! kernel keeps a view's attributes for a day, so they must be right the first time and
//! never change. The root's mode (and its ancestors') is a few `stat`s per rank at mount
//! time, the same everywhere, and it bounds what anyone can read through the source: a user who cannot
//! list and enter the dataset folder cannot reach a file in it by its name either.
//!
//! The mapping is conservative: a class of users (owner, group, others) may read view
//! files and list view folders only if the root grants it both read and search (`r-x`) on
//! a folder, or read on a single record file, and every folder above the root grants it
//! search (a 0755 dataset in a 0700 home folder is private: [`search_classes`]). A file
//! more private than its dataset folder (a 0600 file in a 0755 folder) is shown with the
//! folder's mode: keep private files in a private folder, or mount without
//! `--allow-other`.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

/// Owners and modes of the view's nodes (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Access {
    /// The source root's owner and group: owners of every view node but `.shufflefs`.
    pub uid: u32,
    pub gid: u32,
    /// Mode of view files (samples, parts): read bits only.
    pub file_perm: u16,
    /// Mode of view folders (root, `epoch-N`, classes): read and search bits.
    pub dir_perm: u16,
    /// The mounting user: owner of `.shufflefs`, and who may advance.
    pub mounter_uid: u32,
    pub mounter_gid: u32,
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
        }
    }

    /// The view's access for source `root` (one `stat`); if that fails, only the mounting
    /// user's (files 0400, folders 0500): a view never grants what it cannot check.
    pub(crate) fn of_source(root: &Path) -> Access {
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
        // Per class of users (shift 6: owner, 3: group, 0: others), whether it may read.
        let needed = if is_dir { 0o5 } else { 0o4 };
        let mut file_perm = 0;
        for shift in [6, 3, 0] {
            if (mode >> shift) & needed == needed {
                file_perm |= 0o4 << shift;
            }
        }
        Access {
            uid,
            gid,
            file_perm,
            // Read implies search: a folder one may list, one may enter.
            dir_perm: file_perm | (file_perm >> 2),
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

    /// Whether user `uid` may steer the mount (advance the epoch): the mounting user or root.
    pub(crate) fn may_control(&self, uid: u32) -> bool {
        uid == 0 || uid == self.mounter_uid
    }
}

/// A folder's owner, group and mode.
type Folder = (u32, u32, u32);

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

/// Which classes of users of a view owned by `uid`/`gid` (bits 0o100 owner, 0o010 group,
/// 0o001 others) may search every folder of `above` (each as owner, group, mode).
///
/// Who a class's member is to a folder of another owner or group is not known (the view's
/// group member may own the folder, or not be in its group), so a class keeps search only
/// if every set of bits that may apply to its members grants it.
fn search_classes(uid: u32, gid: u32, above: &[Folder]) -> u32 {
    let mut classes = 0o111;
    for &(dir_uid, dir_gid, mode) in above {
        let x = |shift: u32| (mode >> shift) & 1 == 1;
        let (owner_x, group_x, other_x) = (x(6), x(3), x(0));
        // Anyone but the view's owner may be this folder's owner, if the view's owner is not.
        let as_owner_ok = dir_uid == uid || owner_x;
        let view_owner = if dir_uid == uid {
            owner_x
        } else {
            group_x && other_x
        };
        let (group, others) = if dir_gid == gid {
            (group_x, other_x)
        } else {
            (group_x && other_x, group_x && other_x)
        };
        let allowed = u32::from(view_owner) << 6
            | u32::from(as_owner_ok && group) << 3
            | u32::from(as_owner_ok && others);
        classes &= allowed;
    }
    classes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(mode: u32, is_dir: bool) -> (u16, u16) {
        let a = Access::mounter().derived(7, 8, mode, is_dir);
        assert_eq!((a.uid, a.gid), (7, 8));
        (a.file_perm, a.dir_perm)
    }

    #[test]
    fn a_folder_grants_who_may_list_and_enter_it() {
        assert_eq!(of(0o755, true), (0o444, 0o555));
        assert_eq!(of(0o700, true), (0o400, 0o500));
        assert_eq!(of(0o750, true), (0o440, 0o550));
        // Search without read, or read without search: not enough to reach a file by name.
        assert_eq!(of(0o711, true), (0o400, 0o500));
        assert_eq!(of(0o744, true), (0o400, 0o500));
        assert_eq!(of(0o40755, true), (0o444, 0o555));
    }

    #[test]
    fn a_record_file_grants_who_may_read_it() {
        assert_eq!(of(0o644, false), (0o444, 0o555));
        assert_eq!(of(0o600, false), (0o400, 0o500));
        assert_eq!(of(0o640, false), (0o440, 0o550));
    }

    #[test]
    fn a_folder_above_that_others_cannot_search_hides_the_view() {
        let (alice, staff, root) = (1000, 100, 0);
        // /data (root 0755) above a dataset of alice's: nothing hidden.
        assert_eq!(
            search_classes(alice, staff, &[(root, root, 0o40755)]),
            0o111
        );
        // /home/alice (alice 0700): only alice passes.
        let home = (alice, staff, 0o40700);
        assert_eq!(
            search_classes(alice, staff, &[home, (root, root, 0o755)]),
            0o100
        );
        // 0710 of the view's group: the group passes too, others not.
        assert_eq!(
            search_classes(alice, staff, &[(alice, staff, 0o710)]),
            0o110
        );
        // 0710 of another group: members of the view's group may not be in it.
        assert_eq!(search_classes(alice, staff, &[(alice, 7, 0o710)]), 0o100);
        // Root's 0700 folder above alice's dataset: nobody but root.
        assert_eq!(search_classes(alice, staff, &[(root, root, 0o700)]), 0);
        // 1777 (/tmp): everyone.
        assert_eq!(
            search_classes(alice, staff, &[(root, root, 0o41777)]),
            0o111
        );
        let a = Access::mounter()
            .derived(alice, staff, 0o755, true)
            .reachable_by(0o100);
        assert_eq!((a.file_perm, a.dir_perm), (0o400, 0o500));
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
