//! The scan of a tree (`--format tree`): every regular file at any depth is a sample,
//! every folder a folder of the view (see `manifest::tree`).
//!
//! The same listing as the ImageFolder scan (one `getdents64` per few hundred entries, no
//! `stat` of a regular file, a stat only for what the entry type does not settle), one
//! depth at a time: the folders of a depth are listed by `THREADS` threads at once, each
//! taking the next unlisted folder, and their sub-folders make the next depth. A tree of
//! 1M files six folders deep costs what `find SRC -type f` costs.
//!
//! Links to folders are not followed: a tree has no depth limit, so following them could
//! loop (`a/loop -> ..`) or list one folder twice; they are skipped with that reason.

use std::ffi::{CStr, OsStr};
use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, fstat, fstatat};

use super::{ClassScan, judge, list_each, pack, read_entries, type_of};
use crate::dataset::manifest::{Manifest, ManifestError};
use crate::dataset::names::Skipped;
use crate::dataset::owners::{Owner, OwnersBuilder};

/// One folder's listing: its samples, and the names of its sub-folders.
#[derive(Default)]
pub(super) struct DirScan {
    pub(super) files: ClassScan,
    pub(super) subdirs: Vec<Vec<u8>>,
    /// The folder's own owner, under `--allow-other`.
    pub(super) owner: Option<Owner>,
}

/// Scans `root` as a tree: regular files (and links to them) at any depth are samples, and
/// every folder, empty or not, is kept. Anything else is skipped and listed.
pub fn scan_tree(root: &Path) -> Result<Manifest, ManifestError> {
    scan_tree_with(root, false)
}

/// The root opened for listing and, under `owners`, its canonical path (the scans' checks).
pub(super) fn open_root(
    root: &Path,
    owners: bool,
) -> Result<(fs::File, Option<PathBuf>), ManifestError> {
    let io_err = |source| ManifestError::Io {
        path: root.to_path_buf(),
        source,
    };
    if !fs::metadata(root).map_err(io_err)?.is_dir() {
        return Err(ManifestError::NotADir(root.to_path_buf()));
    }
    let confine = match owners {
        true => Some(fs::canonicalize(root).map_err(io_err)?),
        false => None,
    };
    Ok((fs::File::open(root).map_err(io_err)?, confine))
}

/// [`scan_tree`]; with `owners` (`--allow-other`), also each folder's and sample's owner
/// and mode (a `stat` each), and links out of the source skipped (see `dataset::owners`).
pub fn scan_tree_with(root: &Path, owners: bool) -> Result<Manifest, ManifestError> {
    let (root_dir, confine) = open_root(root, owners)?;
    let mut level: Vec<Vec<u8>> = vec![Vec::new()];
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    while !level.is_empty() {
        let scans = scan_level(&root_dir, root, &level, confine.as_deref())?;
        let mut next = Vec::new();
        for (path, mut scan) in level.into_iter().zip(scans) {
            next.extend(scan.subdirs.iter().map(|name| join(&path, name)));
            skipped.append(&mut scan.files.skipped);
            found.push((path, scan.files, scan.owner));
        }
        level = next;
    }
    tree_manifest(root, found, skipped, confine.is_some())
}

/// The tree's manifest from every folder's listing (in any order) and the entries skipped:
/// folders sorted by path. The one tail of [`scan_tree_with`] and of the split listing
/// (`split`), so both give the same bytes.
pub(super) fn tree_manifest(
    root: &Path,
    mut found: Vec<(Vec<u8>, ClassScan, Option<Owner>)>,
    mut skipped: Vec<Skipped>,
    owners: bool,
) -> Result<Manifest, ManifestError> {
    found.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut manifest = Manifest::empty();
    let mut owners = owners.then(OwnersBuilder::new);
    for (path, scan, owner) in found {
        if let (Some(owners), Some(owner)) = (&mut owners, owner) {
            owners.push_class(owner);
            owners.push_samples(&scan.owners);
        }
        manifest.push_class(path, &scan.names, &scan.ends, &scan.sizes)?;
    }
    if manifest.is_empty() {
        return Err(ManifestError::EmptyTree(root.to_path_buf()));
    }
    skipped.sort_by(|a, b| a.path.cmp(&b.path));
    manifest.skipped = skipped;
    manifest.shrink_to_fit();
    if let Some(owners) = owners {
        manifest.set_owners(owners.finish())?;
    }
    manifest.into_tree()
}

pub(super) fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = parent.to_vec();
    if !path.is_empty() {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// The folders of one depth, listed by a few threads; of several failures, the first
/// folder's error is returned.
pub(super) fn scan_level(
    root_dir: &fs::File,
    root: &Path,
    level: &[Vec<u8>],
    confine: Option<&Path>,
) -> Result<Vec<DirScan>, ManifestError> {
    list_each(level, |rel| scan_dir(root_dir, root, rel, confine))
}

/// Lists the folder `rel` (relative to the root; empty for the root itself).
fn scan_dir(
    root_dir: &fs::File,
    root: &Path,
    rel: &[u8],
    confine: Option<&Path>,
) -> Result<DirScan, ManifestError> {
    let dir_path = root.join(OsStr::from_bytes(rel));
    let io_err = |e: nix::Error| ManifestError::Io {
        path: dir_path.clone(),
        source: io::Error::from(e),
    };
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let at: &[u8] = if rel.is_empty() { b"." } else { rel };
    let mut dir = Dir::openat(root_dir.as_fd(), at, flags, Mode::empty()).map_err(io_err)?;
    let (raw, mut entries) = read_entries(&mut dir).map_err(io_err)?;
    let mut out = DirScan::default();
    if confine.is_some() {
        let st = fstat(dir.as_fd()).map_err(io_err)?;
        out.owner = Some(Owner::of(st.st_uid, st.st_gid, st.st_mode, true));
    }
    // In inode order when something needs a stat: those find their inodes near each other.
    if entries
        .iter()
        .any(|e| !matches!(e.kind, Some(Type::File | Type::Directory)))
    {
        entries.sort_unstable_by_key(|e| e.ino);
    }
    for e in &mut entries {
        let name = CStr::from_bytes_with_nul(e.name(&raw)).expect("one NUL, at the end");
        let kind = match e.kind {
            Some(kind) => kind,
            None => {
                type_of(&fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(io_err)?)
            }
        };
        if kind == Type::Directory {
            out.subdirs.push(name.to_bytes().to_vec());
            continue;
        }
        match judge(&dir, &dir_path, name, Some(kind), confine).map_err(io_err)? {
            Ok((size, owner)) => (e.size, e.owner) = (Some(size), owner),
            Err(reason) => out.files.skipped.push(Skipped {
                path: dir_path
                    .join(OsStr::from_bytes(name.to_bytes()))
                    .display()
                    .to_string(),
                reason: tree_reason(&dir, name, kind, reason),
            }),
        }
    }
    pack(&mut out.files, entries, &raw);
    Ok(out)
}

/// The reason a tree gives for skipping an entry: the ImageFolder scan's, but a link to a
/// folder says why it is not followed.
fn tree_reason(dir: &Dir, name: &CStr, kind: Type, reason: String) -> String {
    let to_dir = kind == Type::Symlink
        && fstatat(dir.as_fd(), name, AtFlags::empty())
            .is_ok_and(|m| type_of(&m) == Type::Directory);
    match to_dir {
        true => "symlink to a folder (not followed by --format tree, where a link could loop; \
            link the files or copy the folder instead)"
            .into(),
        false => reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};
    use std::path::PathBuf;

    #[test]
    fn every_file_at_any_depth_and_every_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("src");
        for d in ["spk1/ch1", "spk1/ch2", "spk2/ch9/empty", "a/b/c/d/e/f"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        fs::write(root.join("spk1/ch1/1.flac"), b"one").unwrap();
        fs::write(root.join("spk1/ch1/0.flac"), b"zero").unwrap();
        fs::write(root.join("spk1/ch2/2.flac"), b"2").unwrap();
        fs::write(root.join("a/b/c/d/e/f/deep.npz"), b"deep").unwrap();
        fs::write(root.join("top.npz"), b"top").unwrap();
        symlink(root.join("top.npz"), root.join("spk2/link.npz")).unwrap();
        symlink("..", root.join("spk2/loop")).unwrap();
        symlink(tmp.path().join("gone"), root.join("spk2/dangling")).unwrap();
        nix::unistd::mkfifo(&root.join("a/fifo"), Mode::S_IRWXU).unwrap();

        let m = scan_tree(&root).unwrap();
        let folders: Vec<_> = (0..m.class_count()).map(|c| m.class_name(c)).collect();
        assert_eq!(
            folders,
            [
                "",
                "a",
                "a/b",
                "a/b/c",
                "a/b/c/d",
                "a/b/c/d/e",
                "a/b/c/d/e/f",
                "spk1",
                "spk1/ch1",
                "spk1/ch2",
                "spk2",
                "spk2/ch9",
                "spk2/ch9/empty"
            ]
        );
        let samples: Vec<_> = (0..m.len())
            .map(|id| (m.relative_path(id), m.size(id)))
            .collect();
        let expected: Vec<(PathBuf, Option<u64>)> = [
            ("top.npz", None),
            ("a/b/c/d/e/f/deep.npz", None),
            ("spk1/ch1/0.flac", None),
            ("spk1/ch1/1.flac", None),
            ("spk1/ch2/2.flac", None),
            ("spk2/link.npz", Some(3)),
        ]
        .iter()
        .map(|(p, s)| (PathBuf::from(p), *s))
        .collect();
        assert_eq!(samples, expected);
        let reasons: Vec<_> = m.skipped.iter().map(|s| s.reason.as_str()).collect();
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert!(m.skipped[0].path.ends_with("a/fifo"));
        assert!(m.skipped[1].path.ends_with("spk2/dangling"));
        assert!(reasons[2].contains("symlink to a folder"), "{reasons:?}");
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }

    /// Under `--allow-other` every folder at any depth keeps its own owner and mode, and a
    /// file link out of the source is skipped.
    #[test]
    fn with_owners_every_folder_keeps_its_mode_and_links_stay_inside() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("src");
        fs::create_dir_all(root.join("a/private/deeper")).unwrap();
        fs::write(tmp.path().join("secret"), b"s").unwrap();
        fs::write(root.join("a/private/deeper/f"), b"f").unwrap();
        fs::write(root.join("a/mine"), b"m").unwrap();
        let chmod = |p: &Path, m| fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
        chmod(&root.join("a/private"), 0o700);
        chmod(&root.join("a/private/deeper"), 0o755);
        chmod(&root.join("a/private/deeper/f"), 0o644);
        chmod(&root.join("a/mine"), 0o600);
        symlink(tmp.path().join("secret"), root.join("a/leak")).unwrap();
        symlink("private/deeper/f", root.join("a/around")).unwrap();

        assert_eq!(scan_tree(&root).unwrap().len(), 4);
        let m = scan_tree_with(&root, true).unwrap();
        let o = m.owners().unwrap();
        let folders: Vec<_> = (0..m.class_count()).map(|c| m.class_name(c)).collect();
        assert_eq!(folders, ["", "a", "a/private", "a/private/deeper"]);
        let dirs: Vec<_> = (0..4).map(|c| o.class(c).dir_perm()).collect();
        assert_eq!(dirs, [0o755 & 0o555, 0o555, 0o500, 0o555]);
        let files: Vec<_> = (0..m.len())
            .map(|id| (m.relative_path(id), o.sample(id).file_perm()))
            .collect();
        let expected: Vec<(PathBuf, u16)> = [
            ("a/around", 0o400),
            ("a/mine", 0o400),
            ("a/private/deeper/f", 0o444),
        ]
        .iter()
        .map(|(p, m)| (PathBuf::from(p), *m))
        .collect();
        assert_eq!(files, expected);
        assert_eq!(m.skipped.len(), 1);
        assert!(m.skipped[0].path.ends_with("a/leak"));
        assert_eq!(m.skipped[0].reason, crate::dataset::owners::OUTSIDE);
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn refuses_what_is_no_tree_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        fs::create_dir_all(root.join("x/y")).unwrap();
        let err = scan_tree(&root).unwrap_err();
        assert!(
            err.to_string().contains("no sample files at any depth"),
            "{err}"
        );
        fs::write(root.join("x/a"), b"a").unwrap();
        let locked = root.join("x/y/locked");
        fs::create_dir(&locked).unwrap();
        fs::set_permissions(&locked, fs::Permissions::from_mode(0o000)).unwrap();
        if !nix::unistd::geteuid().is_root() {
            let err = scan_tree(&root).unwrap_err();
            assert!(
                matches!(&err, ManifestError::Io { path, .. } if *path == locked),
                "{err}"
            );
        }
        fs::set_permissions(&locked, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(scan_tree(&root).unwrap().len(), 1);
    }
}

/// The scan's cost on a real tree, against `find DIR -type f` (not run by default):
/// `SHUFFLEFS_TREE_SCAN=DIR cargo test --release --lib tree_scan_at_scale -- --ignored --nocapture`.
#[cfg(test)]
mod scale {
    #[test]
    #[ignore = "needs SHUFFLEFS_TREE_SCAN=DIR, a large tree"]
    fn tree_scan_at_scale() {
        let dir = std::path::PathBuf::from(std::env::var_os("SHUFFLEFS_TREE_SCAN").unwrap());
        for round in 0..3 {
            let t = std::time::Instant::now();
            let out = std::process::Command::new("find")
                .arg(&dir)
                .args(["-type", "f"])
                .output();
            let find = t.elapsed().as_secs_f64();
            let files = out.unwrap().stdout.iter().filter(|&&b| b == b'\n').count();
            let t = std::time::Instant::now();
            let m = super::scan_tree(&dir).unwrap();
            let scan = t.elapsed().as_secs_f64();
            assert_eq!(m.len() as usize, files);
            // Under --allow-other: a stat per folder and file besides.
            let t = std::time::Instant::now();
            let owned = super::scan_tree_with(&dir, true).unwrap();
            let owners = t.elapsed().as_secs_f64();
            assert_eq!(owned.len(), m.len());
            println!(
                "round {round}: {files} files in {} folders: find {find:.3} s, scan {scan:.3} s ({:.2}x), with owners {owners:.3} s ({:.2}x)",
                m.class_count(),
                scan / find,
                owners / find
            );
        }
    }
}
