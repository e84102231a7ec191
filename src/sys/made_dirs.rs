//! A mount point the daemon made: created like `mkdir -p` just before the mount, removed
//! again (only the folders it created, only while empty) when the mount is gone.
//!
//! On a cluster every rank's mount point lives on its own host, where a launcher running on
//! another machine cannot create it; so each daemon creates its own. It does so only once
//! every rank agreed to mount (the last phase of start-up), so a refused start leaves no
//! folder behind, and the value returned is dropped after the unmount: dropping it removes
//! the folders, deepest first, stopping at the first that is not empty (something else was
//! put there) or that is still a mount (a detach that has not happened); a folder that
//! existed before is never touched.

use std::path::{Path, PathBuf};

/// The folders this daemon created for its mount point, deepest last; removed on drop.
#[derive(Debug, Default)]
pub(crate) struct MadeDirs {
    made: Vec<PathBuf>,
}

impl MadeDirs {
    /// Creates `path` and its missing parents, remembering which were missing. On an error
    /// the folders created so far are removed again.
    pub(crate) fn create(path: &Path) -> std::io::Result<MadeDirs> {
        let mut missing = Vec::new();
        let mut at = Some(path);
        while let Some(p) = at.filter(|p| !p.as_os_str().is_empty()) {
            match std::fs::symlink_metadata(p) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => missing.push(p),
                Err(e) => return Err(e),
            }
            at = p.parent();
        }
        let mut made = MadeDirs::default();
        for dir in missing.into_iter().rev() {
            match std::fs::create_dir(dir) {
                Ok(()) => made.made.push(dir.to_path_buf()),
                // Another rank of this host made a shared parent meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir != path => {}
                Err(e) => return Err(e),
            }
        }
        if !made.made.is_empty() {
            tracing::info!(created = %made.made[0].display(), mountpoint = %path.display(), "created the missing mount point");
        }
        Ok(made)
    }
}

impl Drop for MadeDirs {
    fn drop(&mut self) {
        while let Some(dir) = self.made.pop() {
            // Fails on a folder that is not empty or still a mount: leave it and its parents.
            if let Err(e) = std::fs::remove_dir(&dir) {
                tracing::debug!(folder = %dir.display(), error = %e, "left the created mount point folder");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_missing_parents_and_removes_only_those() {
        let tmp = tempfile::tempdir().unwrap();
        let mnt = tmp.path().join("a/b/mnt");
        let made = MadeDirs::create(&mnt).unwrap();
        assert!(mnt.is_dir());
        drop(made);
        assert!(!tmp.path().join("a").exists(), "created folders removed");
        assert!(tmp.path().exists(), "an existing folder is kept");
    }

    #[test]
    fn a_folder_with_something_in_it_stays() {
        let tmp = tempfile::tempdir().unwrap();
        let mnt = tmp.path().join("a/mnt");
        let made = MadeDirs::create(&mnt).unwrap();
        std::fs::write(tmp.path().join("a/other"), b"x").unwrap();
        drop(made);
        assert!(!mnt.exists(), "the empty mount point goes");
        assert!(
            tmp.path().join("a/other").exists(),
            "a folder not empty stays"
        );
    }

    #[test]
    fn an_existing_mount_point_is_not_removed() {
        let tmp = tempfile::tempdir().unwrap();
        drop(MadeDirs::create(tmp.path()).unwrap());
        assert!(tmp.path().is_dir());
    }

    #[test]
    fn a_file_in_the_way_fails_and_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("f"), b"x").unwrap();
        assert!(MadeDirs::create(&tmp.path().join("f/mnt")).is_err());
        let made = MadeDirs::create(&tmp.path().join("new/f2"));
        drop(made);
        assert!(!tmp.path().join("new").exists());
    }
}
