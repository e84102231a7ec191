//! The scan of the source into a [`Manifest`], at the cost of `find SRC -type f`: by one rank
//! here, by all ranks together, each its part, in [`split`].
//!
//! The names cost one `getdents64` per few hundred entries, and the entry type it reports
//! says which entries are regular files: those are taken without a `stat`, their sizes left
//! unknown until first read (see `manifest`). Stat'ing every sample for its size used to be
//! most of the scan: about 1 µs each warm, and a read of every inode table cold (1M files:
//! 1.8x `find` warm, 2-3x cold on this project's VM). Only entries the type does not settle
//! are stat'ed: a symlink is followed (a dangling one is skipped), and a filesystem that
//! reports no types (`DT_UNKNOWN`) gets an `lstat` per entry, as `std::fs` would.
//! - class folders are scanned by a few threads at once (`THREADS`), each taking the next
//!   unscanned class, so two cores list, and cold folder reads overlap;
//! - the stats that remain run relative to the open class folder, in inode-number order;
//! - names go into one arena per class, sorted through an index, and each finished class is
//!   appended to the manifest as soon as every class before it is in. At no point does the
//!   scan hold more than the manifest plus the classes in flight: no per-name allocation and
//!   no second copy of the whole listing.
//!
//! Under `--allow-other` ([`scan_with`]) every class folder and sample is `stat`ed for its
//! owner and mode, and links are followed only inside the source (`dataset::owners`).
//!
//! What counts as a class or a sample, the skip reasons and the errors are those of the
//! one-thread `std::fs::read_dir` scan this replaced (`tests::scan_judges_every_kind_of_entry`
//! pins them).

use std::collections::BTreeMap;
use std::ffi::{CStr, OsStr};
use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use nix::dir::{Dir, Type};
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag, fstatat};

use crate::dataset::manifest::{Manifest, ManifestError, UNKNOWN_SIZE};
use crate::dataset::names::Skipped;
use crate::dataset::owners::{self, Owner, OwnersBuilder};
use crate::sys::sync::Locked;

mod split;
mod tree;

pub use split::{Gather, SplitError, scan_split, scan_tree_split};
pub use tree::{scan_tree, scan_tree_with};

/// Threads listing class folders. Measured when every sample was stat'ed (1M files, 2-core
/// VM): warm, two threads filled two cores; cold, 8 kept more reads in flight than 2 or 4.
const THREADS: usize = 8;

/// Scans `root` the way ImageFolder sees it: sub-folders are classes (empty ones included);
/// regular files in them (or symlinks to regular files) are samples. Dangling links and
/// anything else are skipped and listed in `Manifest::skipped`.
pub fn scan(root: &Path) -> Result<Manifest, ManifestError> {
    scan_with(root, false)
}

/// [`scan`]; with `owners` (`--allow-other`), also each class folder's and sample's owner
/// and mode (a `stat` each), and links out of the source skipped (see `dataset::owners`).
pub fn scan_with(root: &Path, owners: bool) -> Result<Manifest, ManifestError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ManifestError::Io { path, source }
    };
    let meta = fs::metadata(root).map_err(io_err(root))?;
    if !meta.is_dir() {
        return Err(ManifestError::NotADir(root.to_path_buf()));
    }
    let confine = match owners {
        true => Some(fs::canonicalize(root).map_err(io_err(root))?),
        false => None,
    };
    let (classes, class_owners, skipped) = list_classes(root, confine.as_deref())?;
    let confine = confine.as_deref();
    let root_dir = fs::File::open(root).map_err(io_err(root))?;

    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let done = Mutex::new(Assembly {
        manifest: Manifest::empty(),
        pending: BTreeMap::new(),
        skipped,
        error: None,
        owners: confine.map(|_| OwnersBuilder::new()),
        class_owners,
    });
    std::thread::scope(|s| {
        for _ in 0..THREADS.min(classes.len()) {
            s.spawn(|| {
                while !failed.load(Ordering::Relaxed) {
                    let c = next.fetch_add(1, Ordering::Relaxed);
                    let Some(class) = classes.get(c) else { break };
                    let listed = scan_class(&root_dir, root, class, confine);
                    if listed.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    let mut done = done.locked();
                    done.add(c, listed, &classes);
                }
            });
        }
    });
    let done = done.into_inner().unwrap_or_else(|e| e.into_inner());
    if let Some((_, e)) = done.error {
        return Err(e);
    }
    finish_classes(root, done.manifest, done.skipped, done.owners)
}

/// An ImageFolder manifest once every class is in: refused without samples, its skipped
/// entries sorted, its owners set. The one tail of [`scan_with`] and of the split listing
/// (`split`), so both give the same bytes.
fn finish_classes(
    root: &Path,
    mut manifest: Manifest,
    mut skipped: Vec<Skipped>,
    owners: Option<OwnersBuilder>,
) -> Result<Manifest, ManifestError> {
    if manifest.is_empty() {
        return Err(ManifestError::NoSamples(root.to_path_buf()));
    }
    skipped.sort_by(|a, b| a.path.cmp(&b.path));
    manifest.skipped = skipped;
    manifest.shrink_to_fit();
    if let Some(owners) = owners {
        manifest.set_owners(owners.finish())?;
    }
    Ok(manifest)
}

/// Lists each of `items` (folders relative to the root) with `list`, by a few threads at
/// once (`THREADS`), each taking the next unlisted one: the results in `items`' order, or,
/// of several failures, the first item's error.
fn list_each<T: Send>(
    items: &[Vec<u8>],
    list: impl Fn(&[u8]) -> Result<T, ManifestError> + Sync,
) -> Result<Vec<T>, ManifestError> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Mutex<Vec<Option<Result<T, ManifestError>>>> =
        Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..THREADS.min(items.len()) {
            s.spawn(|| {
                while !failed.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let listed = list(item);
                    if listed.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    results.locked()[i] = Some(listed);
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    // Stopped early only after a failure, which the first `None` cannot precede.
    results.into_iter().map_while(|r| r).collect()
}

/// The class folders of `root`, sorted: its sub-folders and links to folders. Under
/// `confine` (the canonical root, `--allow-other`), also each one's owner, and links out
/// of the source skipped with the reason.
type Classes = (Vec<Vec<u8>>, Vec<Owner>, Vec<Skipped>);

fn list_classes(root: &Path, confine: Option<&Path>) -> Result<Classes, ManifestError> {
    let io_err = |source| ManifestError::Io {
        path: root.to_path_buf(),
        source,
    };
    let mut classes = Vec::new();
    let mut skipped = Vec::new();
    for entry in fs::read_dir(root).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        // ImageFolder follows links to class folders too.
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir())
            || fs::metadata(entry.path()).is_ok_and(|m| m.is_dir());
        if !is_dir {
            continue;
        }
        let owner = match confine {
            None => None,
            Some(confine) => {
                let is_link = entry.file_type().is_ok_and(|t| t.is_symlink());
                match owners::of_path(confine, &entry.path(), is_link) {
                    Ok(owner) => Some(owner),
                    Err(reason) => {
                        let path = entry.path().display().to_string();
                        skipped.push(Skipped { path, reason });
                        continue;
                    }
                }
            }
        };
        classes.push((entry.file_name().into_vec(), owner));
    }
    if classes.is_empty() {
        return Err(ManifestError::NoClasses(root.to_path_buf()));
    }
    classes.sort_by(|a, b| a.0.cmp(&b.0));
    let (names, owners): (Vec<_>, Vec<_>) = classes.into_iter().unzip();
    Ok((names, owners.into_iter().flatten().collect(), skipped))
}

/// Classes scanned so far: those whose predecessors are all in are already in `manifest`,
/// the others wait in `pending`. Of several failures, the first class's error wins.
struct Assembly {
    manifest: Manifest,
    pending: BTreeMap<usize, ClassScan>,
    skipped: Vec<Skipped>,
    error: Option<(usize, ManifestError)>,
    /// Under `--allow-other`: the owners so far, and every class folder's.
    owners: Option<OwnersBuilder>,
    class_owners: Vec<Owner>,
}

impl Assembly {
    fn add(&mut self, c: usize, listed: Result<ClassScan, ManifestError>, classes: &[Vec<u8>]) {
        let err = match listed {
            Ok(scan) => {
                self.pending.insert(c, scan);
                let mut result = Ok(());
                while result.is_ok()
                    && let Some(scan) = self.pending.remove(&self.manifest.class_count_usize())
                {
                    let c = self.manifest.class_count_usize();
                    if let Some(owners) = &mut self.owners {
                        owners.push_class(self.class_owners[c]);
                        owners.push_samples(&scan.owners);
                    }
                    result = (self.manifest).push_class(
                        classes[c].clone(),
                        &scan.names,
                        &scan.ends,
                        &scan.sizes,
                    );
                    self.skipped.extend(scan.skipped);
                }
                match result {
                    Ok(()) => return,
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        if self.error.as_ref().is_none_or(|(first, _)| c < *first) {
            self.error = Some((c, err));
        }
    }
}

/// One class's samples, sorted by name: `ends[i]` is where name `i` ends in `names`.
#[derive(Default)]
struct ClassScan {
    names: Vec<u8>,
    ends: Vec<u32>,
    sizes: Vec<u64>,
    skipped: Vec<Skipped>,
    /// Each sample's owner, under `--allow-other` (else empty).
    owners: Vec<Owner>,
}

/// An entry of a class folder as `getdents64` reported it; its name is
/// `names[start..start + len]` of the class's raw arena (NUL included, for the stat).
struct Entry {
    ino: u64,
    start: u32,
    len: u16,
    kind: Option<Type>,
    size: Option<u64>,
    owner: Option<Owner>,
}

fn scan_class(
    root_dir: &fs::File,
    root: &Path,
    class: &[u8],
    confine: Option<&Path>,
) -> Result<ClassScan, ManifestError> {
    let dir_path = root.join(OsStr::from_bytes(class));
    let io_err = |e: nix::Error| ManifestError::Io {
        path: dir_path.clone(),
        source: io::Error::from(e),
    };
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut dir = Dir::openat(root_dir.as_fd(), class, flags, Mode::empty()).map_err(io_err)?;
    let (raw, mut entries) = read_entries(&mut dir).map_err(io_err)?;
    let mut out = ClassScan::default();
    // In inode order: what stats there are find their inodes near each other.
    entries.sort_unstable_by_key(|e| e.ino);
    for e in &mut entries {
        let name = CStr::from_bytes_with_nul(e.name(&raw)).expect("one NUL, at the end");
        match judge(&dir, &dir_path, name, e.kind, confine).map_err(io_err)? {
            Ok((size, owner)) => (e.size, e.owner) = (Some(size), owner),
            Err(reason) => out.skipped.push(Skipped {
                path: dir_path
                    .join(OsStr::from_bytes(name.to_bytes()))
                    .display()
                    .to_string(),
                reason,
            }),
        }
    }
    pack(&mut out, entries, &raw);
    Ok(out)
}

/// Sample `name` of `dir` (at `dir_path`): its size and, under `--allow-other`
/// (`confine`, the canonical source), its owner; or why it is skipped.
pub(super) fn judge(
    dir: &Dir,
    dir_path: &Path,
    name: &CStr,
    kind: Option<Type>,
    confine: Option<&Path>,
) -> nix::Result<Result<(u64, Option<Owner>), String>> {
    let size = match sample_size(dir, name, kind)? {
        Ok(size) => size,
        Err(reason) => return Ok(Err(reason)),
    };
    Ok(match confine {
        None => Ok((size, None)),
        Some(confine) => sample_owner(dir, dir_path, name, confine)?.map(|o| (size, Some(o))),
    })
}

/// Under `--allow-other`: the owner of sample `name` of `dir` (at `dir_path`), or why it
/// is skipped: a link is followed only inside the source (`confine`, canonical).
fn sample_owner(
    dir: &Dir,
    dir_path: &Path,
    name: &CStr,
    confine: &Path,
) -> nix::Result<Result<Owner, String>> {
    let st = fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    if type_of(&st) == Type::Symlink {
        let path = dir_path.join(OsStr::from_bytes(name.to_bytes()));
        return Ok(owners::of_path(confine, &path, true));
    }
    Ok(Ok(Owner::of(st.st_uid, st.st_gid, st.st_mode, false)))
}

impl Entry {
    /// Its NUL-terminated name in the buffer of names.
    fn name<'a>(&self, raw: &'a [u8]) -> &'a [u8] {
        &raw[self.start as usize..self.start as usize + self.len as usize]
    }
}

/// The entries of `dir` but `.` and `..`, their NUL-terminated names packed in one buffer
/// (one allocation for a class of a million files, not one per name).
fn read_entries(dir: &mut Dir) -> nix::Result<(Vec<u8>, Vec<Entry>)> {
    let mut raw = Vec::new();
    let mut entries = Vec::new();
    for entry in dir.iter() {
        let entry = entry?;
        let name = entry.file_name().to_bytes_with_nul();
        if name == b".\0" || name == b"..\0" {
            continue;
        }
        entries.push(Entry {
            ino: entry.ino(),
            start: raw.len() as u32,
            len: name.len() as u16,
            kind: entry.file_type(),
            size: None,
            owner: None,
        });
        raw.extend_from_slice(name);
    }
    Ok((raw, entries))
}

/// What the entry `name` of `dir` is as a sample: its size, or why it is skipped. A regular
/// file known by its entry type alone (`hint`) costs no stat at all: its size is left
/// unknown (`UNKNOWN_SIZE`, learned when the sample is first read).
fn sample_size(dir: &Dir, name: &CStr, hint: Option<Type>) -> nix::Result<Result<u64, String>> {
    let stat = |flags| fstatat(dir.as_fd(), name, flags);
    let kind = match hint {
        Some(kind) => kind,
        // No type from the filesystem: find it out the way `std::fs` does.
        None => type_of(&stat(AtFlags::AT_SYMLINK_NOFOLLOW)?),
    };
    let meta = match kind {
        Type::File if hint.is_some() => return Ok(Ok(UNKNOWN_SIZE)),
        Type::Symlink => match stat(AtFlags::empty()) {
            Ok(m) => m,
            Err(nix::Error::ENOENT) => return Ok(Err("dangling symlink".into())),
            Err(err) => {
                return Ok(Err(format!(
                    "cannot follow symlink: {}",
                    io::Error::from(err)
                )));
            }
        },
        Type::File => stat(AtFlags::AT_SYMLINK_NOFOLLOW)?,
        Type::Directory => {
            return Ok(Err(
                "nested folder (not supported; flatten the class folder)".into(),
            ));
        }
        _ => return Ok(Err("not a regular file".into())),
    };
    Ok(if type_of(&meta) == Type::File {
        Ok(meta.st_size as u64)
    } else {
        Err("symlink to something other than a regular file".into())
    })
}

/// Keeps the entries that are samples (those with a size), in name order, as `out`'s
/// packed names, their ends and sizes.
fn pack(out: &mut ClassScan, mut entries: Vec<Entry>, raw: &[u8]) {
    entries.retain(|e| e.size.is_some());
    entries.sort_unstable_by(|a, b| a.name(raw).cmp(b.name(raw)));
    out.names
        .reserve_exact(entries.iter().map(|e| e.len as usize - 1).sum());
    out.ends.reserve_exact(entries.len());
    out.sizes.reserve_exact(entries.len());
    for e in &entries {
        let name = e.name(raw);
        out.names.extend_from_slice(&name[..name.len() - 1]);
        out.ends.push(out.names.len() as u32);
        out.sizes.push(e.size.expect("kept above"));
        out.owners.extend(e.owner);
    }
}

fn type_of(meta: &FileStat) -> Type {
    match SFlag::from_bits_truncate(meta.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG => Type::File,
        SFlag::S_IFDIR => Type::Directory,
        SFlag::S_IFLNK => Type::Symlink,
        SFlag::S_IFIFO => Type::Fifo,
        SFlag::S_IFSOCK => Type::Socket,
        SFlag::S_IFCHR => Type::CharacterDevice,
        _ => Type::BlockDevice,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt};
    use std::path::PathBuf;

    /// A tree with every kind of entry `scan` must judge; the expected result was recorded
    /// with the first, one-thread `read_dir` scan, so a faster scan must give exactly this.
    #[test]
    fn scan_judges_every_kind_of_entry() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("src");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("real.bin"), b"12345").unwrap();
        fs::create_dir_all(outside.join("linked-class")).unwrap();
        fs::write(outside.join("linked-class/x"), b"xx").unwrap();
        for class in ["b", "a", "empty"] {
            fs::create_dir_all(root.join(class)).unwrap();
        }
        fs::write(root.join("a/2.png"), b"22").unwrap();
        fs::write(root.join("a/10.png"), b"1").unwrap();
        fs::write(root.join("a/ä.png"), b"").unwrap();
        fs::write(root.join("a").join(OsStr::from_bytes(b"\xff raw")), b"333").unwrap();
        symlink(outside.join("real.bin"), root.join("a/link.png")).unwrap();
        symlink(tmp.path().join("gone"), root.join("a/dangling.png")).unwrap();
        symlink(&outside, root.join("a/link-to-dir")).unwrap();
        fs::create_dir(root.join("b/nested")).unwrap();
        fs::write(root.join("b/nested/deep.png"), b"deep").unwrap();
        fs::write(root.join("b/only.png"), b"0123456789").unwrap();
        nix::unistd::mkfifo(&root.join("b/fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        symlink(outside.join("linked-class"), root.join("c-link")).unwrap();
        symlink(tmp.path().join("nowhere"), root.join("d-dangling")).unwrap();
        fs::write(root.join("README"), b"not a class").unwrap();

        let m = scan(&root).unwrap();
        let classes: Vec<_> = (0..m.class_count()).map(|c| m.class_name(c)).collect();
        assert_eq!(classes, ["a", "b", "c-link", "empty"]);
        let samples: Vec<_> = (0..m.len())
            .map(|id| (m.relative_path(id), m.size(id)))
            .collect();
        // Regular files are not stat'ed (sizes unknown); links are followed, so theirs is known.
        let expected: Vec<(PathBuf, Option<u64>)> = [
            (&b"a/10.png"[..], None),
            (b"a/2.png", None),
            (b"a/link.png", Some(5)),
            ("a/ä.png".as_bytes(), None),
            (b"a/\xff raw", None),
            (b"b/only.png", None),
            (b"c-link/x", None),
        ]
        .iter()
        .map(|(p, s)| (PathBuf::from(OsStr::from_bytes(p)), *s))
        .collect();
        assert_eq!(samples, expected);
        assert_eq!(m.class_range(3), 7..7);
        let r = root.display();
        let skipped: Vec<_> = m
            .skipped
            .iter()
            .map(|s| (s.path.clone(), s.reason.clone()))
            .collect();
        assert_eq!(
            skipped,
            [
                (
                    format!("{r}/a/dangling.png"),
                    "dangling symlink".to_string()
                ),
                (
                    format!("{r}/a/link-to-dir"),
                    "symlink to something other than a regular file".into()
                ),
                (format!("{r}/b/fifo"), "not a regular file".into()),
                (
                    format!("{r}/b/nested"),
                    "nested folder (not supported; flatten the class folder)".into()
                ),
            ]
        );
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }

    /// Under `--allow-other` the scan keeps each class folder's and sample's owner and
    /// mode, follows links only inside the source, and shows a link's target less what
    /// the folders on the way to it deny.
    #[test]
    fn scan_with_owners_keeps_modes_and_confines_links() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("src");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(outside.join("dir")).unwrap();
        fs::write(outside.join("secret"), b"s").unwrap();
        fs::write(outside.join("dir/x"), b"x").unwrap();
        for class in ["pub", "priv"] {
            fs::create_dir_all(root.join(class)).unwrap();
        }
        let chmod = |p: &Path, m| fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
        fs::write(root.join("pub/open"), b"o").unwrap();
        fs::write(root.join("pub/mine"), b"m").unwrap();
        fs::write(root.join("pub/group"), b"g").unwrap();
        fs::write(root.join("priv/inside"), b"i").unwrap();
        chmod(&root.join("pub"), 0o755);
        chmod(&root.join("priv"), 0o700);
        chmod(&root.join("pub/open"), 0o644);
        chmod(&root.join("pub/mine"), 0o600);
        chmod(&root.join("pub/group"), 0o640);
        chmod(&root.join("priv/inside"), 0o644);
        symlink(outside.join("secret"), root.join("pub/leak")).unwrap();
        symlink("../../outside/secret", root.join("pub/relative-leak")).unwrap();
        symlink("../priv/inside", root.join("pub/via-private")).unwrap();
        symlink("open", root.join("pub/alias")).unwrap();
        symlink(outside.join("dir"), root.join("linked-out")).unwrap();
        symlink("pub", root.join("linked-in")).unwrap();

        // Without owners, as before: every link followed, nothing stat'ed for modes.
        let plain = scan(&root).unwrap();
        assert!(plain.owners().is_none());
        assert_eq!(plain.len(), 16);

        let m = scan_with(&root, true).unwrap();
        let classes: Vec<_> = (0..m.class_count()).map(|c| m.class_name(c)).collect();
        assert_eq!(classes, ["linked-in", "priv", "pub"]);
        let o = m.owners().unwrap();
        let read = |rel: &str| {
            let (class, name) = rel.split_once('/').unwrap();
            let c = m.class_by_name(OsStr::new(class)).unwrap();
            let id = m
                .find(c, OsStr::new(name))
                .unwrap_or_else(|| panic!("{rel}"));
            o.sample(id).file_perm()
        };
        assert_eq!(o.class(1).dir_perm(), 0o500, "a private folder");
        assert_eq!(o.class(2).dir_perm(), 0o555);
        // A class folder linked inside the source shows its target's mode.
        assert_eq!(o.class(0).dir_perm(), 0o555);
        assert_eq!(read("pub/open"), 0o444);
        assert_eq!(read("pub/mine"), 0o400, "a private file in a public folder");
        assert_eq!(read("pub/group"), 0o440);
        assert_eq!(
            read("priv/inside"),
            0o444,
            "reached only through its 0700 folder"
        );
        assert_eq!(read("pub/alias"), 0o444);
        // A link into the private folder may not lead others around it.
        assert_eq!(read("pub/via-private"), 0o400);
        let uid = fs::metadata(root.join("pub/open")).unwrap().uid();
        assert_eq!(o.sample(0).uid, uid);
        let skipped: Vec<_> = (m.skipped.iter())
            .map(|s| {
                (
                    s.path.strip_prefix(&*root.to_string_lossy()).unwrap(),
                    &*s.reason,
                )
            })
            .collect();
        assert_eq!(
            skipped,
            [
                ("/linked-in/leak", owners::OUTSIDE),
                ("/linked-in/relative-leak", owners::OUTSIDE),
                ("/linked-out", owners::OUTSIDE),
                ("/pub/leak", owners::OUTSIDE),
                ("/pub/relative-leak", owners::OUTSIDE),
            ]
        );
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn scan_refuses_what_is_not_a_dataset() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("missing");
        assert!(matches!(scan(&missing), Err(ManifestError::Io { path, .. }) if path == missing));
        let file = tmp.path().join("file");
        fs::write(&file, b"x").unwrap();
        assert!(matches!(scan(&file), Err(ManifestError::NotADir(_))));
        let root = tmp.path().join("root");
        fs::create_dir(&root).unwrap();
        fs::write(root.join("loose.png"), b"x").unwrap();
        assert!(matches!(scan(&root), Err(ManifestError::NoClasses(_))));
        fs::create_dir(root.join("cls")).unwrap();
        fs::create_dir(root.join("cls/sub")).unwrap();
        assert!(matches!(scan(&root), Err(ManifestError::NoSamples(_))));
        // A class folder that cannot be listed stops the scan, naming the folder.
        fs::write(root.join("cls/ok.png"), b"x").unwrap();
        let locked = root.join("locked");
        fs::create_dir(&locked).unwrap();
        fs::set_permissions(&locked, fs::Permissions::from_mode(0o000)).unwrap();
        if nix::unistd::geteuid().is_root() {
            // root reads it anyway: an empty class.
            assert_eq!(scan(&root).unwrap().class_count(), 2);
        } else {
            assert!(matches!(scan(&root), Err(ManifestError::Io { path, .. }) if path == locked));
        }
    }
}
