//! The dataset manifest: classes, sample names and, where known, sizes. Built once (by every
//! rank together for a folder source, `scan::split`; by rank 0 for the others, shipped to the
//! other ranks as bytes), kept in each cache so a remount need not rescan.
//!
//! The scan lists names only, as `find` does: a size needs a `stat` of every file, which
//! on a cold cache means reading every inode table (on a parallel filesystem, a metadata
//! round trip per file) and cost 2-3x the whole listing. So a scanned sample's size is
//! unknown until the sample is first read (see `SampleStore::size`). Manifests built with
//! sizes (tests, synthetic sources) keep them. Under `--allow-other` the scan also keeps
//! each folder's and sample's owner and mode (`dataset::owners`), in a footer the
//! fingerprint leaves out.
//!
//! Samples are sorted by (class, name) and a sample's id is its index, so a class is a
//! contiguous id range and a share sorted by id is already grouped in listing order. Names
//! are raw bytes (Linux file names need not be UTF-8) kept in one arena: about 16 bytes of
//! bookkeeping per sample plus the name itself, well under the 100-byte budget.
//!
//! Ordering matches `torchvision.datasets.ImageFolder`, which sorts class folder names as
//! Python strings; for UTF-8 names byte order equals code-point order.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use serde::{Deserialize, Serialize};

use crate::dataset::columns::{self, Bytes, Words};
use crate::dataset::names::{Skipped, is_safe_name};
use crate::dataset::owners::{self, Owners};
use crate::dataset::records::RecordIndex;
use crate::dataset::records::scan::RecordError;
use crate::plan::SampleId;

mod etags;
mod side;
mod sizes;
pub(crate) use etags::Etags;
mod tree;

use side::Side;
pub use side::SideFile;
use sizes::SizeColumn;
use tree::Extras;
pub(crate) use tree::Tree;

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("source {0} does not exist; pass the dataset folder with --source")]
    Missing(PathBuf),
    #[error("source {path}: {source}. Check that the path exists and is readable by this user")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "source {0} is not a folder; --source must be an ImageFolder-style folder of class folders"
    )]
    NotADir(PathBuf),
    #[error(
        "source {0} has no class folders; --source must hold one sub-folder per class, or add --format tree to serve every file at any depth"
    )]
    NoClasses(PathBuf),
    #[error(
        "source {0} has class folders but no sample files in them; add --format tree if the samples lie deeper"
    )]
    NoSamples(PathBuf),
    #[error("source {0} has no sample files at any depth (--format tree)")]
    EmptyTree(PathBuf),
    #[error(
        "source has {0} samples (or over 4 GiB of names): a folder index holds at most 4294967295 of each; pack the samples into record shards (--format records), whose index has no such limit"
    )]
    TooMany(usize),
    #[error("manifest data is corrupt or from another version: {0}")]
    Decode(String),
    #[error("manifest holds an unsafe name {0:?} (empty, '.', '..', '/', NUL or over 255 bytes)")]
    UnsafeName(OsString),
    #[error(transparent)]
    Records(#[from] RecordError),
    #[error(
        "--replicate {glob:?} matches no file under {source_dir}; globs are relative to --source, `*` stays within one folder and `**` crosses folders (e.g. 'annotations/*.json', '**/*.txt')"
    )]
    ReplicateUnmatched { glob: String, source_dir: PathBuf },
    #[error(
        "--replicate {glob:?} names a folder, and side files are files: give '{glob}/*' for the files in it, or '{glob}/**' for every file below it"
    )]
    ReplicateFolder { glob: String },
    #[error(
        "side file {0:?} lies in no folder of the view (an ImageFolder view shows only the top folder and the class folders; use --format tree for files deeper down)"
    )]
    SideOutside(OsString),
    #[error("side file {0:?} collides with a sample or a folder of the same path")]
    SideCollides(OsString),
    #[error(
        "--replicate took every sample file of {0}; narrow the globs so that some files remain samples"
    )]
    AllReplicated(PathBuf),
    /// An object-store source's problem, already naming the bucket and the fix.
    #[error("{0}")]
    Store(String),
    #[error("side file {path}: {source}. Check that it is readable by this user")]
    SideIo { path: PathBuf, source: io::Error },
}

/// A class folder's name and its `(sample name, size)` entries; [`UNKNOWN_SIZE`] for a size
/// not known yet.
pub(crate) type ClassListing = (Vec<u8>, Vec<(Vec<u8>, u64)>);

/// The bytes `value` encodes to, and a trailer's 16 more.
fn encoded_size<T: Serialize + ?Sized>(value: &T) -> usize {
    postcard::experimental::serialized_size(value).unwrap_or(0) + 16
}

/// The size of a sample nobody has read yet.
pub const UNKNOWN_SIZE: u64 = u64::MAX;

/// A dataset's units, what the source is made of, and what was left out.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    index: Index,
    pub skipped: Vec<Skipped>,
    /// Files shown whole on every rank (`--replicate`), not samples.
    side: Side,
    /// A bucket's objects' ETags as listed (per sample, or per shard of a record source);
    /// empty for a folder, whose encoding they leave unchanged (see `etags`).
    etags: Etags,
    /// Under `--allow-other`, each folder's, sample's and side file's owner and mode (see
    /// `dataset::owners`); `None` for a stat-free scan, a bucket or a record source.
    owners: Option<Owners>,
}

/// What a source's units are: one or the other, never both.
#[derive(Clone, Debug, PartialEq)]
pub enum Index {
    /// An ImageFolder source: named files in class folders.
    Folders(Folders),
    /// A tree (`--format tree`): named files in folders at any depth; its "classes" are
    /// every folder of the source by relative path, the root first (see `tree`).
    Tree(Box<Tree>),
    /// A record source (`--format records`): its units are groups of records, with no
    /// classes or names.
    Records(Box<RecordIndex>),
}

/// The classes and sample names of an ImageFolder source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Folders {
    classes: Vec<Vec<u8>>,
    /// `class_start[c]..class_start[c+1]` are the ids of class `c` (len = classes + 1).
    class_start: Vec<u32>,
    /// Decoded as bytes, not as a sequence: allocated once at its size (as a sequence it
    /// grew by doubling, 33.5 MB held for 20 MB of names at 10^6), or borrowed from a
    /// mapped encoding (see `dataset::columns`).
    names: Bytes,
    /// End offset of each sample's name in `names`: fixed-width, so that a mapped decode
    /// borrows it too (as varints every rank decoded its own, 4 bytes per sample of N).
    name_end: Words<u32>,
    /// Each sample's size plus one; 0 if unknown (one byte each when encoded).
    size_plus_one: SizeColumn,
}

/// The folder tables a record source has: none (what `folders` lends for one, and what its
/// encoding holds in their place).
static NO_FOLDERS: Folders = Folders::empty();

impl Folders {
    const fn empty() -> Folders {
        Folders {
            classes: Vec::new(),
            class_start: Vec::new(),
            names: Bytes::Owned(Vec::new()),
            name_end: Words::new(),
            size_plus_one: SizeColumn::EMPTY,
        }
    }

    /// No classes yet, ready to [`push_class`](Manifest::push_class) into.
    fn new() -> Folders {
        Folders {
            class_start: vec![0],
            ..Folders::empty()
        }
    }
}

/// The encoding: the folder tables (empty ones for a record source, as every earlier
/// version wrote them), the skipped entries, then a record source's index. An ImageFolder
/// manifest's bytes, and its fingerprint in existing caches, are what they always were.
#[derive(Serialize)]
struct WireRef<'a> {
    folders: &'a Folders,
    skipped: &'a [Skipped],
}

#[derive(Deserialize)]
struct Wire {
    folders: Folders,
    skipped: Vec<Skipped>,
}

impl Default for Manifest {
    fn default() -> Manifest {
        Manifest::empty()
    }
}

impl Manifest {
    pub fn len(&self) -> u64 {
        match &self.index {
            Index::Folders(f) => f.size_plus_one.len() as u64,
            Index::Tree(t) => t.folders.size_plus_one.len() as u64,
            Index::Records(r) => r.groups(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The manifest of a record source: units are `index`'s groups.
    pub fn from_records(index: RecordIndex, skipped: Vec<Skipped>) -> Manifest {
        Manifest {
            index: Index::Records(Box::new(index)),
            skipped,
            side: Side::default(),
            etags: Etags::default(),
            owners: None,
        }
    }

    /// What the source's units are.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// The record index, for a record source.
    pub fn records(&self) -> Option<&RecordIndex> {
        match &self.index {
            Index::Records(r) => Some(r),
            Index::Folders(_) | Index::Tree(_) => None,
        }
    }

    /// The class and name tables: empty ones for a record source, which has neither.
    fn folders(&self) -> &Folders {
        match &self.index {
            Index::Folders(f) => f,
            Index::Tree(t) => &t.folders,
            Index::Records(_) => &NO_FOLDERS,
        }
    }

    pub fn class_count(&self) -> u32 {
        self.folders().classes.len() as u32
    }

    pub(crate) fn class_name(&self, class: u32) -> &OsStr {
        OsStr::from_bytes(&self.folders().classes[class as usize])
    }

    pub fn class_by_name(&self, name: &OsStr) -> Option<u32> {
        (self.folders().classes)
            .binary_search_by(|c| c.as_slice().cmp(name.as_bytes()))
            .ok()
            .map(|c| c as u32)
    }

    /// Sample ids of `class`, in listing order.
    pub fn class_range(&self, class: u32) -> std::ops::Range<SampleId> {
        let starts = &self.folders().class_start;
        u64::from(starts[class as usize])..u64::from(starts[class as usize + 1])
    }

    pub(crate) fn class_of(&self, id: SampleId) -> u32 {
        (self
            .folders()
            .class_start
            .partition_point(|&s| u64::from(s) <= id)
            - 1) as u32
    }

    pub fn name(&self, id: SampleId) -> &OsStr {
        let f = self.folders();
        let end = f.name_end.at(id as usize) as usize;
        let start = match id {
            0 => 0,
            _ => f.name_end.at(id as usize - 1) as usize,
        };
        OsStr::from_bytes(&f.names[start..end])
    }

    /// The size recorded for `id`, if the manifest was built knowing it.
    pub fn size(&self, id: SampleId) -> Option<u64> {
        match &self.index {
            Index::Folders(f) => f.size_plus_one.get(id as usize).checked_sub(1),
            Index::Tree(t) => t.folders.size_plus_one.get(id as usize).checked_sub(1),
            Index::Records(r) => Some(r.group_len(id)),
        }
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

    /// Relative path of a sample under the source root: `<class>/<name>` (a tree's
    /// "class" is the sample's folder, the root's is empty).
    pub fn relative_path(&self, id: SampleId) -> PathBuf {
        Path::new(self.class_name(self.class_of(id))).join(self.name(id))
    }

    /// A manifest without classes, to [`push_class`](Self::push_class) into.
    pub(crate) fn empty() -> Manifest {
        Manifest {
            index: Index::Folders(Folders::new()),
            skipped: Vec::new(),
            side: Side::default(),
            etags: Etags::default(),
            owners: None,
        }
    }

    /// Builds a manifest from `(class name, [(sample name, size)])`, sorting both levels.
    pub fn from_parts(mut classes: Vec<ClassListing>) -> Result<Manifest, ManifestError> {
        classes.sort_by(|a, b| a.0.cmp(&b.0));
        let mut m = Manifest::empty();
        for (class, mut samples) in classes {
            samples.sort_by(|a, b| a.0.cmp(&b.0));
            let (mut names, mut ends) = (Vec::new(), Vec::new());
            for (name, _) in &samples {
                names.extend_from_slice(name);
                ends.push(names.len() as u32);
            }
            let sizes: Vec<u64> = samples.iter().map(|s| s.1).collect();
            m.push_class(class, &names, &ends, &sizes)?;
        }
        Ok(m)
    }

    /// Appends the class after the last one, its samples already sorted by name: `names` holds
    /// them back to back and `ends[i]` is where name `i` ends in `names`. Only for a
    /// manifest of folders (as [`empty`](Self::empty) makes).
    pub(crate) fn push_class(
        &mut self,
        class: Vec<u8>,
        names: &[u8],
        ends: &[u32],
        sizes: &[u64],
    ) -> Result<(), ManifestError> {
        let Index::Folders(f) = &mut self.index else {
            unreachable!("classes are pushed into a manifest of folders only");
        };
        let too_many = || ManifestError::TooMany(f.size_plus_one.len() + sizes.len());
        let base = u32::try_from(f.names.len()).map_err(|_| too_many())?;
        u32::try_from(f.names.len() + names.len()).map_err(|_| too_many())?;
        let count = u32::try_from(f.size_plus_one.len() + sizes.len()).map_err(|_| too_many())?;
        f.classes.push(class);
        f.names.to_mut().extend_from_slice(names);
        ends.iter().for_each(|&e| f.name_end.push(base + e));
        f.size_plus_one
            .extend(sizes.iter().map(|&s| s.wrapping_add(1)));
        f.class_start.push(count);
        Ok(())
    }

    /// Room for `samples` more samples of `names` bytes of names in all (a manifest of
    /// folders), so pushing them grows nothing by doubling.
    #[cfg_attr(not(feature = "s3"), allow(dead_code))] // used by the S3 listing
    pub(crate) fn reserve(&mut self, names: usize, samples: usize) {
        if let Index::Folders(f) = &mut self.index {
            f.names.to_mut().reserve_exact(names);
            f.name_end.reserve_exact(samples);
        }
    }

    pub(crate) fn class_count_usize(&self) -> usize {
        self.folders().classes.len()
    }

    /// Gives back the spare capacity left by growing while scanning.
    pub(crate) fn shrink_to_fit(&mut self) {
        let f = match &mut self.index {
            Index::Folders(f) => f,
            Index::Tree(t) => &mut t.folders,
            Index::Records(_) => return,
        };
        f.classes.shrink_to_fit();
        f.class_start.shrink_to_fit();
        f.names.to_mut().shrink_to_fit();
        f.name_end.shrink_to_fit();
        f.size_plus_one.shrink_to_fit();
    }

    pub fn encode(&self) -> Vec<u8> {
        let bytes = etags::encode(self.encode_index(), &self.etags);
        owners::encode(bytes, self.owners.as_ref())
    }

    /// The encoding without the ETags: a folder's whole encoding.
    fn encode_index(&self) -> Vec<u8> {
        let records_folders = Folders::new();
        let folders = match &self.index {
            Index::Folders(f) => f,
            Index::Tree(t) => &t.folders,
            Index::Records(_) => &records_folders,
        };
        let wire = WireRef {
            folders,
            skipped: &self.skipped,
        };
        // The room for the whole encoding at once (the trailers reserve what they miss).
        let mut room = encoded_size(&wire) + encoded_size(&self.etags) + 4096;
        if let Index::Records(r) = &self.index {
            room += encoded_size(r.as_ref());
        }
        let bytes = Vec::with_capacity(room);
        let bytes = postcard::to_extend(&wire, bytes).expect("manifest serialization cannot fail");
        let extras = || Extras {
            tree: self.is_tree(),
            replicate: self.side.globs.clone(),
            side: self.side.files().to_vec(),
        };
        match &self.index {
            Index::Folders(_) if self.side == Side::default() => bytes,
            Index::Folders(_) | Index::Tree(_) => tree::encode_extras(bytes, &extras()),
            Index::Records(r) => {
                postcard::to_extend(r, bytes).expect("record index serialization cannot fail")
            }
        }
    }

    /// Decodes a mapped encoding as [`decode`](Self::decode) does, but with the sample names
    /// and a record index's offsets left in the mapping (see `dataset::columns`): ranks
    /// mapping the same file share them.
    /// `checked`: these bytes were decoded and checked already (by the host's first rank),
    /// so the borrowed columns' per-value checks are skipped (see `columns::decoding_from`).
    pub fn decode_mapped(map: &Arc<Mmap>, checked: bool) -> Result<Manifest, ManifestError> {
        columns::decoding_from(map, checked, Manifest::decode)
    }

    /// Whether the sample names (or a record index's offsets) lie in a mapping
    /// ([`decode_mapped`](Self::decode_mapped)).
    #[cfg(any(test, feature = "testing"))]
    pub fn names_mapped(&self) -> bool {
        match &self.index {
            Index::Records(r) => r.table_mapped(),
            _ => self.folders().names.is_mapped() && self.folders().name_end.is_mapped(),
        }
    }

    /// Decodes bytes from the cache or a peer, refusing anything inconsistent or unsafe.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let (bytes, owners) = owners::decode(bytes).map_err(ManifestError::Decode)?;
        let (bytes, etags) = etags::decode(bytes)?;
        let mut m = Manifest::decode_index(bytes)?;
        if !etags.is_empty() && etags.len() != m.etag_count() {
            return Err(ManifestError::Decode(
                "ETags do not match the objects".into(),
            ));
        }
        m.etags = etags;
        if let Some(o) = owners {
            m.set_owners(o)?;
        }
        Ok(m)
    }

    /// Each folder's, sample's and side file's owner, if the scan learned them
    /// (`--allow-other`; see `dataset::owners`).
    pub fn owners(&self) -> Option<&Owners> {
        self.owners.as_ref()
    }

    /// Forgets the owners (a view only its mounting user sees shows none).
    pub fn clear_owners(&mut self) {
        self.owners = None;
    }

    /// Keeps `owners`, refusing ones that do not cover exactly this manifest's folders,
    /// samples and side files (or any of a record source's).
    pub(crate) fn set_owners(&mut self, owners: Owners) -> Result<(), ManifestError> {
        let (classes, samples) = (self.class_count() as usize, self.len() as usize);
        if self.records().is_some() || !owners.fits(classes, samples, self.side_files().len()) {
            return Err(ManifestError::Decode(
                "owners do not match the entries".into(),
            ));
        }
        self.owners = Some(owners);
        Ok(())
    }

    /// The objects (samples, or a record source's shards) an ETag is kept for.
    fn etag_count(&self) -> usize {
        match &self.index {
            Index::Records(r) => r.files.len(),
            _ => self.len() as usize,
        }
    }

    /// Keeps a bucket's ETags as listed: one per sample, or per shard of a record source.
    #[cfg_attr(not(feature = "s3"), allow(dead_code))] // used by the S3 listing
    pub(crate) fn set_etags(&mut self, etags: Etags) {
        assert_eq!(etags.len(), self.etag_count(), "one ETag per object");
        self.etags = etags;
    }

    /// The listed ETag of sample `i` (or of shard `i` of a record source), if any.
    #[cfg_attr(not(feature = "s3"), allow(dead_code))] // used by the S3 listing
    pub(crate) fn etag(&self, i: usize) -> Option<std::borrow::Cow<'_, str>> {
        self.etags.get(i)
    }

    fn decode_index(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let decode_err = |e: postcard::Error| ManifestError::Decode(e.to_string());
        let (wire, rest): (Wire, _) = postcard::take_from_bytes(bytes).map_err(decode_err)?;
        if let Some(extras) = tree::decode_extras(rest)? {
            let index = match extras.tree {
                true => Index::Tree(Box::new(Tree::new(wire.folders)?)),
                false => {
                    wire.folders.validate()?;
                    Index::Folders(wire.folders)
                }
            };
            let m = Manifest {
                index,
                skipped: wire.skipped,
                side: Side::default(),
                etags: Etags::default(),
                owners: None,
            };
            return m.with_side(extras.replicate, extras.side);
        }
        wire.folders.validate()?;
        let index = if rest.is_empty() {
            Index::Folders(wire.folders)
        } else {
            if !wire.folders.classes.is_empty() || !wire.folders.size_plus_one.is_empty() {
                return Err(ManifestError::Decode(
                    "a record manifest has classes".into(),
                ));
            }
            let index: RecordIndex = postcard::from_bytes(rest).map_err(decode_err)?;
            index.validate().map_err(ManifestError::Decode)?;
            Index::Records(Box::new(index))
        };
        Ok(Manifest {
            index,
            skipped: wire.skipped,
            side: Side::default(),
            etags: Etags::default(),
            owners: None,
        })
    }

    /// A short fingerprint of the manifest, to tell whether two caches describe the same data.
    pub fn fingerprint(&self) -> u32 {
        fingerprint_of(&self.encode())
    }
}

/// The fingerprint of an encoded manifest: of everything but the owners and modes, so a
/// cache still belongs to the same samples after a `chmod`, and whether the view was made
/// for other users (`--allow-other`) or not.
pub fn fingerprint_of(bytes: &[u8]) -> u32 {
    crc32c::crc32c(owners::without_footer(bytes))
}

impl Folders {
    fn validate(&self) -> Result<(), ManifestError> {
        self.validate_tables()?;
        for c in &self.classes {
            if !is_safe_name(c) {
                return Err(ManifestError::UnsafeName(OsString::from_vec(c.clone())));
            }
        }
        self.validate_names()
    }

    /// The class ranges and the name table agree with each other.
    fn validate_tables(&self) -> Result<(), ManifestError> {
        let bad = |what: &str| Err(ManifestError::Decode(what.to_string()));
        if self.class_start.len() != self.classes.len() + 1
            || self.class_start.first() != Some(&0)
            || self.class_start.last().copied() != Some(self.size_plus_one.len() as u32)
            || self.class_start.windows(2).any(|w| w[0] > w[1])
        {
            return bad("class ranges are inconsistent");
        }
        // Ends the host's first rank checked in the mapping it shares are not read again.
        let each = !self.name_end.checked_elsewhere();
        let ends = || self.name_end.iter();
        if self.name_end.len() != self.size_plus_one.len()
            || (each && ends().zip(ends().skip(1)).any(|(a, b)| a > b))
            || (self.name_end.last()).is_some_and(|e| e as usize != self.names.len())
        {
            return bad("name table is inconsistent");
        }
        Ok(())
    }

    /// Every sample name is safe to serve as a file name (names the host's first rank
    /// checked in the mapping it shares are not read again: `columns::checked_elsewhere`).
    fn validate_names(&self) -> Result<(), ManifestError> {
        if columns::checked_elsewhere(&self.names) {
            return Ok(());
        }
        let mut start = 0;
        for end in self.name_end.iter() {
            let name = &self.names[start as usize..end as usize];
            if !is_safe_name(name) {
                return Err(ManifestError::UnsafeName(
                    OsStr::from_bytes(name).to_owned(),
                ));
            }
            start = end;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The tables as plain arrays, but the name ends as their little-endian bytes (cache
    /// format 5, so a mapped decode borrows them): names decoded as bytes and sizes kept as
    /// a column changed the memory, not the bytes.
    #[test]
    fn the_encoding_is_the_plain_arrays_with_the_name_ends_as_bytes() {
        #[derive(Serialize)]
        struct Plain {
            classes: Vec<Vec<u8>>,
            class_start: Vec<u32>,
            names: Vec<u8>,
            name_end: Vec<u8>,
            size_plus_one: Vec<u64>,
        }
        let ends: Vec<u8> = [5u32, 10, 15]
            .iter()
            .flat_map(|e| e.to_le_bytes())
            .collect();
        let plain = |size_plus_one: Vec<u64>| Plain {
            classes: vec![b"cat".to_vec(), b"dog".to_vec(), b"empty".to_vec()],
            class_start: vec![0, 1, 3, 3],
            names: b"z.pnga.pngb.png".to_vec(),
            name_end: ends.clone(),
            size_plus_one,
        };
        let skipped: Vec<Skipped> = Vec::new();
        let encoded = |p: Plain| postcard::to_allocvec(&(p, &skipped)).unwrap();
        assert_eq!(sample_manifest().encode(), encoded(plain(vec![8, 6, 4])));
        let unknown = |name: &[u8]| (name.to_vec(), UNKNOWN_SIZE);
        let scanned = Manifest::from_parts(vec![
            (b"dog".to_vec(), vec![unknown(b"b.png"), unknown(b"a.png")]),
            (b"cat".to_vec(), vec![unknown(b"z.png")]),
            (b"empty".to_vec(), vec![]),
        ])
        .unwrap();
        assert_eq!(scanned.encode(), encoded(plain(vec![0, 0, 0])));
        assert_eq!(Manifest::decode(&scanned.encode()).unwrap(), scanned);
    }

    #[test]
    fn sorted_by_class_then_name() {
        let m = sample_manifest();
        assert_eq!(m.class_name(0), "cat");
        assert_eq!(m.class_name(1), "dog");
        assert_eq!(m.class_range(2), 3..3);
        assert_eq!(m.name(1), "a.png");
        assert_eq!(m.size(1), Some(5));
        let unknown =
            Manifest::from_parts(vec![(b"c".to_vec(), vec![(b"x".to_vec(), UNKNOWN_SIZE)])])
                .unwrap();
        assert_eq!(unknown.size(0), None);
        assert_eq!(Manifest::decode(&unknown.encode()).unwrap().size(0), None);
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
}

#[cfg(test)]
mod owned {
    use super::*;
    use crate::dataset::owners::{Owner, OwnersBuilder};

    /// Owners travel with the manifest (to every rank, and into the cache), but leave its
    /// fingerprint as it was: a cache belongs to the same samples whatever their modes.
    #[test]
    fn owners_round_trip_outside_the_fingerprint() {
        let plain = Manifest::from_parts(vec![
            (b"a".to_vec(), vec![(b"x".to_vec(), 1), (b"y".to_vec(), 2)]),
            (b"b".to_vec(), vec![(b"z".to_vec(), 3)]),
        ])
        .unwrap();
        let mut owned = plain.clone();
        let mut b = OwnersBuilder::new();
        for c in [0o755, 0o700] {
            b.push_class(Owner::of(5, 6, c, true));
        }
        b.push_samples(&[0o644, 0o600, 0o640].map(|m| Owner::of(5, 6, m, false)));
        owned.set_owners(b.finish()).unwrap();
        let bytes = owned.encode();
        assert_ne!(bytes, plain.encode());
        assert_eq!(owned.fingerprint(), plain.fingerprint());
        assert_eq!(fingerprint_of(&bytes), crc32c::crc32c(&plain.encode()));
        let back = Manifest::decode(&bytes).unwrap();
        assert_eq!(back, owned);
        assert_eq!(back.owners().unwrap().sample(2).file_perm(), 0o440);
        assert_eq!(back.owners().unwrap().class(1).dir_perm(), 0o500);
        // Owners of another manifest's entries are refused.
        let mut wrong = OwnersBuilder::new();
        wrong.push_class(Owner::of(5, 6, 0o755, true));
        assert!(plain.clone().set_owners(wrong.finish()).is_err());
    }
}

/// The encoding is what caches hold (and its fingerprint names the data in them): these
/// bytes change only with `cache::FORMAT_VERSION` (5: a folder manifest's name ends as
/// little-endian bytes, `dataset::columns`; 6: a record index's group starts as 8-byte
/// words).
#[cfg(test)]
mod format {
    use super::*;
    use crate::dataset::records::{Framing, Grouping, RecordParams, build_index};

    #[test]
    fn folder_manifests_encode_as_they_always_did() {
        let m = Manifest::from_parts(vec![
            (
                b"dog".to_vec(),
                vec![(b"b.png".to_vec(), 3), (b"a.png".to_vec(), UNKNOWN_SIZE)],
            ),
            (b"cat".to_vec(), vec![(b"z.png".to_vec(), 7)]),
        ])
        .unwrap();
        let golden: &[u8] = &[
            2, 3, 99, 97, 116, 3, 100, 111, 103, 3, 0, 1, 3, 15, 122, 46, 112, 110, 103, 97, 46,
            112, 110, 103, 98, 46, 112, 110, 103, 12, 5, 0, 0, 0, 10, 0, 0, 0, 15, 0, 0, 0, 3, 8,
            0, 4, 0,
        ];
        assert_eq!(m.encode(), golden);
        assert_eq!(Manifest::decode(golden).unwrap(), m);
    }

    #[test]
    fn record_manifests_encode_as_they_always_did() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.dat"), vec![1u8; 2000]).unwrap();
        std::fs::write(dir.path().join("b.dat"), vec![2u8; 1000]).unwrap();
        let params = RecordParams {
            framing: Framing::Fixed,
            record_size: 1000,
            grouping: Grouping::Records,
            header_line: false,
        };
        let (index, skipped) = build_index(dir.path(), &params).unwrap();
        let m = Manifest::from_records(index, skipped);
        let golden: &[u8] = &[
            0, 1, 0, 0, 0, 0, 0, 0, 232, 7, 1, 0, 2, 5, 97, 46, 100, 97, 116, 208, 15, 0, 0, 0, 5,
            98, 46, 100, 97, 116, 232, 7, 2, 2, 0, 0, 3, 3, 0, 3, 100, 97, 116,
        ];
        assert_eq!(m.encode(), golden);
        assert_eq!(Manifest::decode(golden).unwrap(), m);
    }
}
