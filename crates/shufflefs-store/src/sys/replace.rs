//! The one way shufflefs writes a whole file in place: a new file beside it, renamed over
//! the old one, so a reader opens the old content or the new, never a mix (node_exporter's
//! textfile collector, a launcher polling `--ready-file`, a reader of `status.json`).
//!
//! The temporary file has an unpredictable name (`.NAME.XXXXXX.tmp`, six random letters
//! and digits) and is created with `O_CREAT|O_EXCL`, which never follows a link and fails
//! on any name that is already there. `--metrics-file` and `--ready-file` live in folders
//! other users may write (a shared job folder, the collector's textfile folder): with the
//! pid-numbered name shufflefs used before, another user could plant a link at that name,
//! the daemon wrote through it (truncating the link's target with the daemon's rights, a
//! root-owned file included) and then renamed the link into place. The rename itself
//! replaces whatever is at the final name (a link there included), never a link's target.
//! The `tempfile` crate makes the name and the exclusive create (and removes the temporary
//! when a write or the rename fails).

use std::fs::{File, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use tempfile::NamedTempFile;

/// Random letters and digits in a temporary's name.
const RANDOM_CHARS: usize = 6;

/// How [`replace`] writes.
#[derive(Clone, Copy, Debug)]
pub struct Replace {
    /// The new file's mode, as `open(2)` takes it (the umask applies).
    pub mode: u32,
    /// Fsync the file before the rename and its folder after it, so the new content
    /// survives a crash (without, a crash may leave the old content, the new, or an empty
    /// file).
    pub durable: bool,
}

/// Writes `bytes` to `path` through a temporary beside it (see the module docs).
pub fn replace(path: &Path, bytes: &[u8], how: Replace) -> io::Result<()> {
    let mut tmp = temporary(path, how.mode)?;
    tmp.write_all(bytes)?;
    if how.durable {
        tmp.as_file().sync_all()?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    if how.durable {
        File::open(folder(path))?.sync_all()?;
    }
    Ok(())
}

/// Whether [`replace`] can make its temporary beside `path` (made and removed at once).
pub fn can_write_beside(path: &Path) -> io::Result<()> {
    temporary(path, 0o600).map(drop)
}

/// A new, empty temporary file in `path`'s folder, named after it.
fn temporary(path: &Path, mode: u32) -> io::Result<NamedTempFile> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .rand_bytes(RANDOM_CHARS)
        .permissions(Permissions::from_mode(mode))
        .tempfile_in(folder(path))
}

/// `path`'s folder (`.` for a bare name).
fn folder(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Whether `name` is a temporary [`replace`] makes for a file named `of` (also the
/// `.of.tmp` and `.of.<pid>.tmp` of older versions): those a cache's owner may remove.
pub(crate) fn is_temporary_of(name: &str, of: &str) -> bool {
    let Some(inner) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else {
        return false;
    };
    if inner == of {
        return true;
    }
    (inner.strip_prefix(of).and_then(|r| r.strip_prefix('.')))
        .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_alphanumeric()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    const PLAIN: Replace = Replace {
        mode: 0o644,
        durable: false,
    };

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_the_content_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.prom");
        replace(&path, b"one", PLAIN).unwrap();
        replace(
            &path,
            b"two",
            Replace {
                durable: true,
                ..PLAIN
            },
        )
        .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(names(dir.path()), ["m.prom"]);
    }

    /// A link planted at the name shufflefs used to write (`.NAME.<pid>.tmp`): its target
    /// is neither written nor truncated, and the link is not renamed into place (failed
    /// before: the target held the metrics, `m.prom` was the link).
    #[test]
    fn a_link_at_the_old_temporary_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "root's file").unwrap();
        let pid = std::process::id();
        for planted in [format!(".m.prom.{pid}.tmp"), ".m.prom.tmp".into()] {
            symlink(&victim, dir.path().join(planted)).unwrap();
        }
        let path = dir.path().join("m.prom");
        replace(&path, b"metrics", PLAIN).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's file");
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.is_file(), "m.prom is a new regular file, not a link");
        assert_eq!(std::fs::read(&path).unwrap(), b"metrics");
    }

    /// A link at the final name is replaced by the file, its target left as it was.
    #[test]
    fn a_link_at_the_final_name_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "root's file").unwrap();
        let path = dir.path().join("job.ready");
        symlink(&victim, &path).unwrap();
        replace(&path, b"{}", PLAIN).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's file");
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
    }

    #[test]
    fn the_mode_is_the_one_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status.json");
        replace(
            &path,
            b"{}",
            Replace {
                mode: 0o400,
                ..PLAIN
            },
        )
        .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o400);
    }

    #[test]
    fn a_folder_that_takes_no_file_is_an_error_and_keeps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("gone/m.prom");
        assert!(replace(&missing, b"x", PLAIN).is_err());
        assert!(can_write_beside(&missing).is_err());
        assert!(can_write_beside(&dir.path().join("m.prom")).is_ok());
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn temporaries_are_recognised_by_their_file() {
        let ok = [
            ".state.json.tmp",
            ".status.json.17.tmp",
            ".metrics.prom.aZ3x9Q.tmp",
        ];
        for (name, of) in ok.iter().zip(["state.json", "status.json", "metrics.prom"]) {
            assert!(is_temporary_of(name, of), "{name}");
        }
        for name in [
            ".status.json..tmp",
            ".status.json.a-b.tmp",
            "status.json.1.tmp",
        ] {
            assert!(!is_temporary_of(name, "status.json"), "{name}");
        }
        assert!(!is_temporary_of(".state.json.x.tmp", "status.json"));
    }
}
