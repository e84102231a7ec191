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
//! never change. The root's mode is one `stat` per rank at mount time, the same
//! everywhere, and it bounds what anyone can read through the source: a user who cannot
//! list and enter the dataset folder cannot reach a file in it by its name either.
//!
//! The mapping is conservative: a class of users (owner, group, others) may read view
//! files and list view folders only if the root grants it both read and search (`r-x`) on
//! a folder, or read on a single record file. A file more private than its dataset folder
//! (a 0600 file in a 0755 folder) is therefore shown with the folder's mode: keep private
//! files in a private folder, or mount without `--allow-other`.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

/// Owners and modes of the view's nodes (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
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
    pub fn mounter() -> Access {
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
    pub fn of_source(root: &Path) -> Access {
        let me = Access::mounter();
        match std::fs::metadata(root) {
            Ok(meta) => me.derived(meta.uid(), meta.gid(), meta.mode(), meta.is_dir()),
            Err(e) => {
                tracing::warn!(source = %root.display(), error = %e, "cannot read the source's owner and mode; the view is the mounting user's alone");
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

    /// Whether user `uid` may steer the mount (advance the epoch): the mounting user or root.
    pub fn may_control(&self, uid: u32) -> bool {
        uid == 0 || uid == self.mounter_uid
    }
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
    fn only_the_mounting_user_and_root_steer() {
        let a = Access::mounter();
        assert!(a.may_control(a.mounter_uid));
        assert!(a.may_control(0));
        assert_eq!(a.may_control(a.mounter_uid + 1), a.mounter_uid + 1 == 0);
    }
}
