//! The dataset manifest: classes, sample names, sizes. Built once by rank 0, shipped to the
//! other ranks as bytes, kept in each cache so a remount need not rescan.
//!
//! Samples are sorted by (class, name) and a sample's id is its index, so a class is a
//! contiguous id range and a share sorted by id is already grouped in listing order. Names
//! are raw bytes (Linux file names need not be UTF-8) kept in one arena: about 16 bytes of
//! bookkeeping per sample plus the name itself, well under the 100-byte budget.
//!
//! Ordering matches `torchvision.datasets.ImageFolder`, which sorts class folder names as
//! Python strings; for UTF-8 names byte order equals code-point order.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::plan::SampleId;

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("source {path}: {source}. Check that the path exists and is readable by this user")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "source {0} is not a folder; --source must be an ImageFolder-style folder of class folders"
    )]
    NotADir(PathBuf),
    #[error("source {0} has no class folders; --source must hold one sub-folder per class")]
    NoClasses(PathBuf),
    #[error("source {0} has class folders but no sample files in them")]
    NoSamples(PathBuf),
    #[error("source has {0} samples; shufflefs supports at most 4294967295")]
    TooMany(usize),
    #[error("manifest data is corrupt or from another version: {0}")]
    Decode(String),
    #[error("manifest holds an unsafe name {0:?} (empty, '.', '..', '/', NUL or over 255 bytes)")]
    UnsafeName(OsString),
}

/// Something left out of the manifest, with the reason; reported in the status and the log.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

/// A class folder's name and its `(sample name, size)` entries, as scanned.
pub type ClassListing = (Vec<u8>, Vec<(Vec<u8>, u64)>);

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    classes: Vec<Vec<u8>>,
    /// `class_start[c]..class_start[c+1]` are the ids of class `c` (len = classes + 1).
    class_start: Vec<u32>,
    names: Vec<u8>,
    /// End offset of each sample's name in `names`.
    name_end: Vec<u32>,
    sizes: Vec<u64>,
    pub skipped: Vec<Skipped>,
}

/// Whether a single path component is safe to use as a file name under a folder we own.
pub fn is_safe_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != b"."
        && name != b".."
        && !name.contains(&b'/')
        && !name.contains(&0)
}

impl Manifest {
    pub fn len(&self) -> u32 {
        self.sizes.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    pub fn class_count(&self) -> u32 {
        self.classes.len() as u32
    }

    pub fn class_name(&self, class: u32) -> &OsStr {
        OsStr::from_bytes(&self.classes[class as usize])
    }

    pub fn class_by_name(&self, name: &OsStr) -> Option<u32> {
        self.classes
            .binary_search_by(|c| c.as_slice().cmp(name.as_bytes()))
            .ok()
            .map(|c| c as u32)
    }

    /// Sample ids of `class`, in listing order.
    pub fn class_range(&self, class: u32) -> std::ops::Range<SampleId> {
        self.class_start[class as usize]..self.class_start[class as usize + 1]
    }

    pub fn class_of(&self, id: SampleId) -> u32 {
        (self.class_start.partition_point(|&s| s <= id) - 1) as u32
    }

    pub fn name(&self, id: SampleId) -> &OsStr {
        let end = self.name_end[id as usize] as usize;
        let start = if id == 0 {
            0
        } else {
            self.name_end[id as usize - 1] as usize
        };
        OsStr::from_bytes(&self.names[start..end])
    }

    pub fn size(&self, id: SampleId) -> u64 {
        self.sizes[id as usize]
    }

    pub fn total_bytes(&self) -> u64 {
        self.sizes.iter().sum()
    }

    /// The sample called `name` in `class`.
    pub fn find(&self, class: u32, name: &OsStr) -> Option<SampleId> {
        let range = self.class_range(class);
        let (mut lo, mut hi) = (range.start, range.end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.name(mid).as_bytes().cmp(name.as_bytes()) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// Relative path of a sample under the source root: `<class>/<name>`.
    pub fn relative_path(&self, id: SampleId) -> PathBuf {
        Path::new(self.class_name(self.class_of(id))).join(self.name(id))
    }

    /// Builds a manifest from `(class name, [(sample name, size)])`, sorting both levels.
    pub fn from_parts(mut classes: Vec<ClassListing>) -> Result<Manifest, ManifestError> {
        classes.sort_by(|a, b| a.0.cmp(&b.0));
        let mut m = Manifest {
            class_start: vec![0],
            ..Manifest::default()
        };
        for (class, mut samples) in classes {
            samples.sort_by(|a, b| a.0.cmp(&b.0));
            m.classes.push(class);
            for (name, size) in samples {
                m.names.extend_from_slice(&name);
                m.name_end.push(
                    u32::try_from(m.names.len())
                        .map_err(|_| ManifestError::TooMany(m.sizes.len()))?,
                );
                m.sizes.push(size);
            }
            let count =
                u32::try_from(m.sizes.len()).map_err(|_| ManifestError::TooMany(m.sizes.len()))?;
            m.class_start.push(count);
        }
        Ok(m)
    }

    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("manifest serialization cannot fail")
    }

    /// Decodes bytes from the cache or a peer, refusing anything inconsistent or unsafe.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let m: Manifest =
            postcard::from_bytes(bytes).map_err(|e| ManifestError::Decode(e.to_string()))?;
        m.validate()?;
        Ok(m)
    }

    fn validate(&self) -> Result<(), ManifestError> {
        let bad = |what: &str| Err(ManifestError::Decode(what.to_string()));
        if self.class_start.len() != self.classes.len() + 1
            || self.class_start.first() != Some(&0)
            || self.class_start.last().copied() != Some(self.sizes.len() as u32)
            || self.class_start.windows(2).any(|w| w[0] > w[1])
        {
            return bad("class ranges are inconsistent");
        }
        if self.name_end.len() != self.sizes.len()
            || self.name_end.windows(2).any(|w| w[0] > w[1])
            || self
                .name_end
                .last()
                .is_some_and(|&e| e as usize != self.names.len())
        {
            return bad("name table is inconsistent");
        }
        for c in &self.classes {
            if !is_safe_name(c) {
                return Err(ManifestError::UnsafeName(OsString::from_vec(c.clone())));
            }
        }
        for id in 0..self.len() {
            if !is_safe_name(self.name(id).as_bytes()) {
                return Err(ManifestError::UnsafeName(self.name(id).to_owned()));
            }
        }
        Ok(())
    }

    /// A short fingerprint of the manifest, to tell whether two caches describe the same data.
    pub fn fingerprint(&self) -> u32 {
        crc32c::crc32c(&self.encode())
    }
}

/// Scans `root` the way ImageFolder sees it: sub-folders are classes (empty ones included);
/// regular files in them (or symlinks to regular files) are samples. Dangling links and
/// anything else are skipped and listed in `Manifest::skipped`.
pub fn scan(root: &Path) -> Result<Manifest, ManifestError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ManifestError::Io { path, source }
    };
    let meta = fs::metadata(root).map_err(io_err(root))?;
    if !meta.is_dir() {
        return Err(ManifestError::NotADir(root.to_path_buf()));
    }
    let mut classes = Vec::new();
    let mut skipped = Vec::new();
    for entry in fs::read_dir(root).map_err(io_err(root))? {
        let entry = entry.map_err(io_err(root))?;
        let path = entry.path();
        // ImageFolder follows links to class folders too.
        if fs::metadata(&path).map(|m| m.is_dir()).unwrap_or(false) {
            classes.push((
                entry.file_name().into_vec(),
                scan_class(&path, &mut skipped)?,
            ));
        }
    }
    if classes.is_empty() {
        return Err(ManifestError::NoClasses(root.to_path_buf()));
    }
    let mut manifest = Manifest::from_parts(classes)?;
    if manifest.is_empty() {
        return Err(ManifestError::NoSamples(root.to_path_buf()));
    }
    skipped.sort_by(|a: &Skipped, b| a.path.cmp(&b.path));
    manifest.skipped = skipped;
    Ok(manifest)
}

fn scan_class(
    dir: &Path,
    skipped: &mut Vec<Skipped>,
) -> Result<Vec<(Vec<u8>, u64)>, ManifestError> {
    let io_err = |source| ManifestError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut samples = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        let kind = entry.file_type().map_err(io_err)?;
        let mut skip = |reason: &str| {
            skipped.push(Skipped {
                path: entry.path().display().to_string(),
                reason: reason.into(),
            })
        };
        let meta = if kind.is_symlink() {
            match fs::metadata(entry.path()) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    skip("dangling symlink");
                    continue;
                }
                Err(e) => {
                    skip(&format!("cannot follow symlink: {e}"));
                    continue;
                }
            }
        } else if kind.is_file() {
            entry.metadata().map_err(io_err)?
        } else {
            skip(if kind.is_dir() {
                "nested folder (not supported; flatten the class folder)"
            } else {
                "not a regular file"
            });
            continue;
        };
        if meta.is_file() {
            samples.push((entry.file_name().into_vec(), meta.len()));
        } else {
            skip("symlink to something other than a regular file");
        }
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn sample_manifest() -> Manifest {
        Manifest::from_parts(vec![
            (
                b"dog".to_vec(),
                vec![(b"b.png".to_vec(), 3), (b"a.png".to_vec(), 5)],
            ),
            (b"cat".to_vec(), vec![(b"z.png".to_vec(), 7)]),
            (b"empty".to_vec(), vec![]),
        ])
        .unwrap()
    }

    #[test]
    fn sorted_by_class_then_name() {
        let m = sample_manifest();
        assert_eq!(m.class_name(0), "cat");
        assert_eq!(m.class_name(1), "dog");
        assert_eq!(m.class_range(2), 3..3);
        assert_eq!(m.name(1), "a.png");
        assert_eq!(m.size(1), 5);
        assert_eq!(m.class_of(2), 1);
        assert_eq!(m.find(1, OsStr::new("b.png")), Some(2));
        assert_eq!(m.find(1, OsStr::new("c.png")), None);
        assert_eq!(m.relative_path(0), Path::new("cat/z.png"));
    }

    #[test]
    fn encode_roundtrip_and_rejects_unsafe_names() {
        let m = sample_manifest();
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
        let evil = Manifest::from_parts(vec![(
            b"c".to_vec(),
            vec![(b"../../etc/passwd".to_vec(), 1)],
        )])
        .unwrap();
        assert!(matches!(
            Manifest::decode(&evil.encode()),
            Err(ManifestError::UnsafeName(_))
        ));
        assert!(Manifest::decode(b"junk").is_err());
    }
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
        let expected: Vec<(PathBuf, u64)> = [
            (&b"a/10.png"[..], 1),
            (b"a/2.png", 2),
            (b"a/link.png", 5),
            ("a/ä.png".as_bytes(), 0),
            (b"a/\xff raw", 3),
            (b"b/only.png", 10),
            (b"c-link/x", 2),
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
