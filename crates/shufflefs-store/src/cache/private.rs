//! The cache folder is private to the user who mounts: folders 0700, files 0600.
//!
//! A cached sample is a copy of a source file, and the cache cannot know who may read the
//! original (a 0600 file, a 0700 dataset folder, an ACL): so nobody but the daemon's user
//! may read the copy. Every folder and file shufflefs makes in a cache takes its mode here,
//! whatever the umask; the view (`vfs::access`) is where other users get what the source
//! allows them. Ranks of one job on one host run as the same user, so a peer still reads
//! and hard-links the samples of another rank's 0700 cache folder (`files.rs`); a hard link
//! shares the peer's inode, mode included, and `fs.protected_hardlinks` allows it because
//! the linker owns the file.
//!
//! A folder made by an older shufflefs (0755) is tightened when it is opened: the root
//! folder at 0700 keeps everyone else out of whatever older files (0644) it still holds,
//! without touching them one by one.

use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

/// Mode of every folder shufflefs makes in a cache.
pub(crate) const DIR_MODE: u32 = 0o700;
/// Mode of every file shufflefs makes in a cache.
pub(crate) const FILE_MODE: u32 = 0o600;

/// Makes folder `path` (0700) and any missing parents (those with the usual mode: they are
/// not the cache's); an existing `path` is tightened to 0700 (see the module docs), or
/// left as it is with a warning where that is not allowed (a folder of another owner's).
pub(crate) fn create_dir(path: &Path) -> io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent)?;
    }
    match DirBuilder::new().mode(DIR_MODE).create(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {
            if let Err(e) = tighten(path) {
                tracing::warn!(folder = %path.display(), error = %e, "could not make a cache folder private (mode 0700)");
            }
            Ok(())
        }
        other => other,
    }
}

/// Sets `path`'s mode to 0700 unless it has no group or other bits already.
fn tighten(path: &Path) -> io::Result<()> {
    let mode = fs::metadata(path)?.permissions().mode();
    if mode & 0o077 == 0 {
        return Ok(());
    }
    fs::set_permissions(path, Permissions::from_mode(DIR_MODE))
}

/// Options that create a file with mode 0600 (add `create`/`create_new` and access).
pub(crate) fn file_options() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(FILE_MODE);
    options
}

/// Creates (or truncates) `path` for writing, 0600 when new: `File::create`, private.
pub(crate) fn create_file(path: &Path) -> io::Result<fs::File> {
    file_options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn folders_and_files_are_private_whatever_the_umask() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("parent/cache");
        create_dir(&dir).unwrap();
        assert_eq!(mode(&dir), DIR_MODE);
        assert_eq!(mode(&t.path().join("parent")) & 0o700, 0o700);
        let f = dir.join("f");
        create_file(&f).unwrap();
        assert_eq!(mode(&f), FILE_MODE);
    }

    #[test]
    fn an_older_open_folder_is_tightened() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("old");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, Permissions::from_mode(0o755)).unwrap();
        create_dir(&dir).unwrap();
        assert_eq!(mode(&dir), DIR_MODE);
        // Already private: left as it is (no chmod, so no ctime change either).
        fs::set_permissions(&dir, Permissions::from_mode(0o500)).unwrap();
        create_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o500);
        fs::set_permissions(&dir, Permissions::from_mode(0o700)).unwrap();
    }
}
