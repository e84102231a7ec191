//! A mount point the daemon made: created like `mkdir -p` just before the mount, removed
//! again (only the folders that were missing, only while empty) when the mount is gone.
//!
//! On a cluster every rank's mount point lives on its own host, where a launcher running on
//! another machine cannot create it; so each daemon creates its own. Which folders are
//! missing is noted during the local checks ([`MountDirs::plan`]), before any rank can have
//! created one, and they are created only once every rank agreed to mount (the last phase
//! of start-up), so a refused start leaves no folder behind. The [`MadeDirs`] returned is
//! dropped after the unmount: it removes the folders, deepest first, stopping at the first
//! that is not empty (something else is in it) or still a mount. A parent shared by ranks of
//! one host (`/mnt/job/{rank}`) was missing for each of them, so each tries it after its
//! own folder and the last rank to leave removes it; a folder that existed before the job is
//! never touched.

use std::path::{Path, PathBuf};

/// The folders missing for a mount point, outermost first, to create at the mount.
#[derive(Debug, Default)]
pub struct MountDirs {
    missing: Vec<PathBuf>,
}

/// The folders made for the mount point, outermost first; removed on drop.
#[derive(Debug, Default)]
pub struct MadeDirs {
    made: Vec<PathBuf>,
}

impl MountDirs {
    /// Notes which of `path` and its parents do not exist (none: the mount point exists).
    pub fn plan(path: &Path) -> std::io::Result<MountDirs> {
        let mut missing = Vec::new();
        let mut at = Some(path);
        while let Some(p) = at.filter(|p| !p.as_os_str().is_empty()) {
            match std::fs::symlink_metadata(p) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => missing.push(p.into()),
                Err(e) => return Err(e),
            }
            at = p.parent();
        }
        missing.reverse();
        Ok(MountDirs { missing })
    }

    /// Creates the missing folders. On an error the ones created so far are removed again.
    pub fn create(self) -> std::io::Result<MadeDirs> {
        let mut made = MadeDirs::default();
        for dir in self.missing {
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                // Another rank of this host made a shared parent meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
                Err(e) => return Err(e),
            }
            made.made.push(dir);
        }
        if let Some(top) = made.made.first() {
            tracing::info!(created = %top.display(), "created the missing mount point");
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

    fn made(path: &Path) -> std::io::Result<MadeDirs> {
        MountDirs::plan(path)?.create()
    }

    #[test]
    fn creates_missing_parents_and_removes_only_those() {
        let tmp = tempfile::tempdir().unwrap();
        let mnt = tmp.path().join("a/b/mnt");
        let dirs = made(&mnt).unwrap();
        assert!(mnt.is_dir());
        drop(dirs);
        assert!(!tmp.path().join("a").exists(), "created folders removed");
        assert!(tmp.path().exists(), "an existing folder is kept");
    }

    #[test]
    fn a_shared_parent_goes_with_the_last_rank() {
        let tmp = tempfile::tempdir().unwrap();
        let plans = [0, 1].map(|r| MountDirs::plan(&tmp.path().join(format!("job/{r}"))));
        let [a, b] = plans.map(|p| p.unwrap().create().unwrap());
        drop(a);
        assert!(
            tmp.path().join("job/1").is_dir(),
            "the other rank's folder stays"
        );
        drop(b);
        assert!(
            !tmp.path().join("job").exists(),
            "the last rank removes the parent"
        );
    }

    #[test]
    fn a_folder_with_something_in_it_stays() {
        let tmp = tempfile::tempdir().unwrap();
        let mnt = tmp.path().join("a/mnt");
        let dirs = made(&mnt).unwrap();
        std::fs::write(tmp.path().join("a/other"), b"x").unwrap();
        drop(dirs);
        assert!(!mnt.exists(), "the empty mount point goes");
        assert!(
            tmp.path().join("a/other").exists(),
            "a folder not empty stays"
        );
    }

    #[test]
    fn an_existing_mount_point_is_not_removed() {
        let tmp = tempfile::tempdir().unwrap();
        drop(made(tmp.path()).unwrap());
        assert!(tmp.path().is_dir());
    }

    #[test]
    fn a_file_in_the_way_fails() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("f"), b"x").unwrap();
        assert!(made(&tmp.path().join("f/mnt")).is_err());
    }
}
