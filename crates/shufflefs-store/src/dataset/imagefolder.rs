//! An ImageFolder tree on a (parallel) filesystem: `root/<class>/<name>`, one file a sample.
//! Its index is built by [`scan`](super::scan).

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::Mode;

use super::manifest::{Manifest, ManifestError};
use super::owners::Owner;
use super::{Copied, Dataset};
use crate::plan::SampleId;
use crate::sys::io::read_full_at;

pub struct ImageFolder {
    root: PathBuf,
    manifest: Arc<Manifest>,
    /// Under `--allow-other` (the manifest has owners): the source root, opened, that every
    /// sample is opened beneath (see [`Confined`]); an error to report on every read if it
    /// could not be opened.
    confined: Option<Result<Confined, String>>,
}

/// What a read checks under `--allow-other`, where the view shows each sample's owner and
/// mode as the scan saw them: the source may have changed since (a file swapped for a
/// link out of the source, or for a more private file), so a sample is opened only
/// beneath the source root (`RESOLVE_BENEATH`: links inside it still work), and the file
/// opened must have the owner and group the view shows and grant read to every class the
/// view does. Otherwise the read fails (the view answers EIO) rather than serve others
/// what the source would not.
///
/// `RESOLVE_BENEATH` refuses every absolute link, even one whose target is inside the
/// source (which the scan serves): such a path is resolved by `realpath`, and served if
/// that lies beneath the source's own real path, opened from the root again with no link
/// followed at all (`RESOLVE_NO_SYMLINKS`), so a link swapped in between cannot lead out.
struct Confined {
    dir: OwnedFd,
    /// The source root's real path (links resolved), if it has one.
    real: Option<PathBuf>,
}

impl ImageFolder {
    pub fn new(root: PathBuf, manifest: Arc<Manifest>) -> ImageFolder {
        let confined = manifest.owners().map(|_| {
            let open = || -> io::Result<Confined> {
                let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
                Ok(Confined {
                    dir: nix::fcntl::open(&root, flags, Mode::empty())?,
                    real: fs::canonicalize(&root).ok(),
                })
            };
            open().map_err(|e| format!("source {}: {e}", root.display()))
        });
        ImageFolder {
            root,
            manifest,
            confined,
        }
    }

    fn path(&self, id: SampleId) -> PathBuf {
        self.root.join(self.manifest.relative_path(id))
    }

    /// Opens sample `id` for reading: by its path, or under `--allow-other` only as
    /// [`Confined`] allows.
    fn open(&self, id: SampleId) -> io::Result<File> {
        let (Some(confined), Some(owners)) = (&self.confined, self.manifest.owners()) else {
            return File::open(self.path(id));
        };
        let confined = confined.as_ref().map_err(|e| io::Error::other(e.clone()))?;
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let refused = |why: &str| {
            let path = self.path(id).display().to_string();
            let why = format!("{path}: {why}; not served to other users (remount to scan again)");
            io::Error::new(io::ErrorKind::PermissionDenied, why)
        };
        let rel = self.manifest.relative_path(id);
        let file = match open_beneath(&confined.dir, &rel, how) {
            Ok(fd) => File::from(fd),
            Err(nix::Error::EXDEV) => match self.through_absolute_link(confined, id) {
                Some(Ok(file)) => file,
                Some(Err(e)) => return Err(e),
                None => return Err(refused("now a link out of the source")),
            },
            // A kernel before 5.6 has no openat2: the owner check below still holds.
            Err(nix::Error::ENOSYS) => File::open(self.path(id))?,
            Err(e) => return Err(io::Error::from(e)),
        };
        if !Owner::of_meta(&file.metadata()?).covers(owners.sample(id)) {
            return Err(refused("its owner or mode changed since the scan"));
        }
        Ok(file)
    }

    /// Sample `id` reached through an absolute link (see [`Confined`]): `None` when its
    /// real path is not beneath the source's; an error when it changed while resolved.
    fn through_absolute_link(&self, confined: &Confined, id: SampleId) -> Option<io::Result<File>> {
        let real = fs::canonicalize(self.path(id)).ok()?;
        let inside = real.strip_prefix(confined.real.as_ref()?).ok()?;
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
        Some(match open_beneath(&confined.dir, inside, how) {
            Ok(fd) => Ok(File::from(fd)),
            // A link swapped in since the `realpath`: not followed.
            Err(nix::Error::ELOOP | nix::Error::EXDEV) => return None,
            Err(e) => Err(io::Error::from(e)),
        })
    }
}

/// How often [`open_beneath`] tries again.
const BENEATH_TRIES: usize = 16;

/// `openat2` under `RESOLVE_BENEATH`, tried again on `EAGAIN`: the kernel answers that when
/// a rename or a mount anywhere on the machine raced the lookup (it cannot then vouch that
/// the path stayed beneath), and asks the caller to retry; a busy machine (CI running
/// dozens of daemons that rename their state files) met it on a plain read.
fn open_beneath(
    dir: &impl std::os::fd::AsFd,
    path: &Path,
    how: OpenHow,
) -> nix::Result<std::os::fd::OwnedFd> {
    let mut tries = 1;
    loop {
        match openat2(dir, path, how) {
            Err(nix::Error::EAGAIN) if tries < BENEATH_TRIES => tries += 1,
            done => return done,
        }
    }
}

impl Dataset for ImageFolder {
    fn copy_to(&self, id: SampleId, out: &mut dyn Write) -> io::Result<Copied> {
        let mut file = self.open(id)?;
        // The open file's size and times cost no extra lookup on the source.
        let meta = file.metadata().ok();
        let mtime = meta.as_ref().and_then(|m| m.modified().ok());
        let len = copy_large(&mut file, out)?;
        // A network filesystem whose server went away mid-read (sshfs) can end the file
        // early instead of failing: fewer bytes than the open file's size is an I/O error,
        // not a shorter sample.
        if meta.is_some_and(|m| len < m.len()) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(Copied { len, mtime })
    }

    fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        read_full_at(&self.open(id)?, offset, buf)
    }

    fn stat_len(&self, id: SampleId) -> io::Result<Option<u64>> {
        Ok(Some(fs::metadata(self.path(id))?.len()))
    }

    fn describe(&self, id: SampleId) -> String {
        self.path(id).display().to_string()
    }
}

/// The source must be a readable folder.
pub(crate) fn check_source(path: &Path) -> Result<(), ManifestError> {
    match fs::read_dir(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(ManifestError::Missing(path.to_path_buf()))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            Err(ManifestError::NotADir(path.to_path_buf()))
        }
        Err(source) => Err(ManifestError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// `io::copy` with a 1 MiB buffer: parallel filesystems like large requests.
fn copy_large(from: &mut dyn Read, to: &mut dyn Write) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{PermissionsExt as _, symlink};

    use super::*;

    /// Under `--allow-other` a sample swapped after the scan for a link out of the source,
    /// or for a more private file, is not read; a link inside the source still is. Without
    /// owners, reads go by path as before.
    #[test]
    fn reads_under_owners_stay_beneath_the_source_and_as_private_as_shown() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("src");
        fs::create_dir_all(root.join("c")).unwrap();
        fs::write(tmp.path().join("secret"), b"secret").unwrap();
        for name in ["a", "b", "d", "e"] {
            fs::write(root.join("c").join(name), name).unwrap();
            fs::set_permissions(root.join("c").join(name), fs::Permissions::from_mode(0o644))
                .unwrap();
        }
        let owned = Arc::new(crate::dataset::scan::scan_with(&root, true).unwrap());
        let plain = Arc::new(crate::dataset::scan::scan(&root).unwrap());
        let (confined, by_path) = (
            ImageFolder::new(root.clone(), owned),
            ImageFolder::new(root.clone(), plain),
        );
        let read = |ds: &ImageFolder, id| {
            let mut out = Vec::new();
            ds.copy_to(id, &mut out).map(|_| out)
        };
        assert_eq!(read(&confined, 0).unwrap(), b"a");
        // a: now a link out of the source; b: now 0600; d: a link to e, inside.
        fs::remove_file(root.join("c/a")).unwrap();
        symlink(tmp.path().join("secret"), root.join("c/a")).unwrap();
        fs::set_permissions(root.join("c/b"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::remove_file(root.join("c/d")).unwrap();
        symlink("e", root.join("c/d")).unwrap();
        let err = read(&confined, 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert!(err.to_string().contains("link out of the source"), "{err}");
        let err = read(&confined, 1).unwrap_err();
        assert!(err.to_string().contains("owner or mode changed"), "{err}");
        assert_eq!(read(&confined, 2).unwrap(), b"e");
        let mut buf = [0u8; 6];
        assert!(confined.read_at(0, 0, &mut buf).is_err());
        // Without owners (no --allow-other), the mounting user's own view reads by path.
        assert_eq!(read(&by_path, 0).unwrap(), b"secret");
        assert_eq!(read(&by_path, 1).unwrap(), b"b");
    }

    /// An absolute link to a file inside the source is read (`RESOLVE_BENEATH` alone
    /// refused it: the view answered EIO even to root); one that leads out, even through
    /// the source's own path (`<src>/../secret`), is not.
    #[test]
    fn absolute_links_inside_the_source_are_read_and_out_of_it_are_not() {
        let tmp = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(tmp.path()).unwrap();
        let root = base.join("src");
        fs::create_dir_all(root.join("c")).unwrap();
        fs::create_dir_all(root.join("data")).unwrap();
        fs::write(root.join("data/t"), b"target").unwrap();
        fs::write(base.join("secret"), b"secret").unwrap();
        symlink(root.join("data/t"), root.join("c/abs")).unwrap();
        symlink(root.join("data/../data/t"), root.join("c/dots")).unwrap();
        fs::write(root.join("c/out"), b"x").unwrap();
        // Given by a path through a link, as `--source` may be.
        symlink(&root, base.join("via")).unwrap();
        let owned = Arc::new(crate::dataset::scan::scan_with(&root, true).unwrap());
        let ds = ImageFolder::new(base.join("via"), owned);
        let read = |id| {
            let mut out = Vec::new();
            ds.copy_to(id, &mut out).map(|_| out)
        };
        let names: Vec<_> = (0..ds.manifest.len())
            .map(|id| ds.manifest.name(id).to_owned())
            .collect();
        assert_eq!(names, ["abs", "dots", "out", "t"]);
        assert_eq!(read(0).unwrap(), b"target");
        assert_eq!(read(1).unwrap(), b"target");
        // Swapped after the scan for an absolute link out, through the source's path.
        fs::remove_file(root.join("c/out")).unwrap();
        symlink(root.join("../secret"), root.join("c/out")).unwrap();
        let err = read(2).unwrap_err();
        assert!(err.to_string().contains("link out of the source"), "{err}");
    }
}
