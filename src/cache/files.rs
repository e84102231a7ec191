//! One file per sample: `samples/<id>`, written under `tmp/<id>` and renamed in.
//!
//! The backend of ImageFolder-sized samples: each cached sample is a file the kernel can
//! read directly (FUSE passthrough). A file appears under `samples/` only by `rename` from
//! `tmp/` after its full length was written, so a crash leaves either nothing or a complete
//! file. Each carries, in the extended attribute `user.shufflefs.crc32c`, the CRC-32C of its
//! bytes and their length (set before the rename, so as atomic as the file); at start-up a
//! file whose length disagrees with the recorded one (a power loss after the rename but
//! before the data reached the disk) is dropped. On a filesystem without user xattrs the
//! values are not kept, and only the transfer itself is checked. The file's mtime is set to
//! the source file's, so remounts report the same times.
//!
//! Names are sample ids, never the dataset's names, so nothing a peer or the source says
//! can make us write outside `samples/`; the temporary name is the id alone because a
//! [`Claim`] guarantees one writer per sample (and the cache lock one daemon per folder).

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use xattr::FileExt as _;

use super::backend::{CacheBackend, Claim, Commit, Recovered, SampleWriter, Stored};
use super::store::Bitset;
use crate::plan::SampleId;
use crate::sys::io::read_full_at;

/// Extended attribute holding a cached sample's CRC-32C (4 bytes, little-endian) and, since
/// it was added, its length (8 more bytes), checked at start-up.
const CRC_XATTR: &str = "user.shufflefs.crc32c";

pub struct FileBackend {
    root: PathBuf,
    present: Bitset,
}

impl FileBackend {
    /// The backend in cache folder `root` for a dataset of `samples` samples; creates its
    /// folders and empties `tmp/` (leftovers of a crash mid-write).
    pub fn open(root: &Path, samples: u32) -> io::Result<FileBackend> {
        for sub in ["samples", "tmp"] {
            fs::create_dir_all(root.join(sub))?;
        }
        for entry in fs::read_dir(root.join("tmp"))? {
            let _ = fs::remove_file(entry?.path());
        }
        Ok(FileBackend {
            root: root.to_path_buf(),
            present: Bitset::new(samples),
        })
    }

    /// Where sample `id` lives in the cache folder `root` (tests inject faults there).
    pub fn path_in(root: &Path, id: SampleId) -> PathBuf {
        root.join("samples").join(id.to_string())
    }

    fn path(&self, id: SampleId) -> PathBuf {
        Self::path_in(&self.root, id)
    }
}

impl CacheBackend for FileBackend {
    fn recover(&self, keep: &dyn Fn(SampleId, u64) -> bool) -> io::Result<Vec<Recovered>> {
        let mut found = Vec::new();
        for entry in fs::read_dir(self.root.join("samples"))? {
            let entry = entry?;
            let id = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<SampleId>().ok());
            let meta = entry.metadata().ok();
            // A file renamed in before a crash may have lost data the rename did not wait
            // for; the length recorded beside its checksum catches it coming back short.
            let recorded = xattr::get(entry.path(), CRC_XATTR)
                .ok()
                .flatten()
                .and_then(|v| Recorded::decode(&v));
            match (id, meta) {
                (Some(id), Some(meta))
                    if keep(id, meta.len())
                        && recorded.is_none_or(|r| r.len.is_none_or(|l| l == meta.len())) =>
                {
                    self.present.set(id);
                    found.push(Recovered {
                        id,
                        len: meta.len(),
                        mtime: meta.modified().ok(),
                    });
                }
                _ => {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
        Ok(found)
    }

    fn contains(&self, id: SampleId) -> bool {
        self.present.get(id)
    }

    fn size(&self, id: SampleId) -> Option<u64> {
        if !self.contains(id) {
            return None;
        }
        fs::metadata(self.path(id)).ok().map(|m| m.len())
    }

    fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        read_full_at(&File::open(self.path(id))?, offset, buf)
    }

    fn open(&self, id: SampleId) -> io::Result<Stored> {
        let file = File::open(self.path(id))?;
        let recorded_crc = file
            .get_xattr(CRC_XATTR)
            .ok()
            .flatten()
            .and_then(|v| Recorded::decode(&v))
            .map(|r| r.crc);
        Ok(Stored {
            reader: Box::new(file),
            recorded_crc,
        })
    }

    fn writer<'a>(&'a self, claim: &Claim<'_>) -> io::Result<Box<dyn SampleWriter + 'a>> {
        let id = claim.id();
        let tmp = self.root.join("tmp").join(id.to_string());
        let file = File::create(&tmp)?;
        Ok(Box::new(FileWriter {
            file: Some(file),
            tmp,
            dest: self.path(id),
            present: &self.present,
            id,
        }))
    }

    fn remove(&self, id: SampleId) -> io::Result<bool> {
        if !self.present.clear(id) {
            return Ok(false);
        }
        match fs::remove_file(self.path(id)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(true),
        }
    }

    fn clear(&self) -> io::Result<()> {
        let samples = self.root.join("samples");
        fs::remove_dir_all(&samples)?;
        fs::create_dir_all(&samples)?;
        for id in 0..self.present.len() {
            self.present.clear(id);
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        // One `syncfs`, not one fsync per file: the exchange makes a round's worth of
        // received samples durable at once.
        let dir = File::open(&self.root)?;
        nix::unistd::syncfs(&dir).map_err(io::Error::from)
    }

    fn file(&self, id: SampleId) -> Option<io::Result<File>> {
        Some(File::open(self.path(id)))
    }
}

/// A sample being written under `tmp/`; renamed into `samples/` on commit.
struct FileWriter<'a> {
    file: Option<File>,
    tmp: PathBuf,
    dest: PathBuf,
    present: &'a Bitset,
    id: SampleId,
}

impl Write for FileWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.as_mut().expect("open until commit").write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl SampleWriter for FileWriter<'_> {
    fn commit(mut self: Box<Self>, commit: Commit) -> io::Result<()> {
        let file = self.file.take().expect("committed once");
        set_crc(&file, commit.crc, commit.len)?;
        if let Some(mtime) = commit.mtime {
            // Best effort: the time is a courtesy to tools that compare times.
            let _ = file.set_modified(mtime);
        }
        drop(file);
        fs::rename(&self.tmp, &self.dest)?;
        self.present.set(self.id);
        Ok(())
    }
}

impl Drop for FileWriter<'_> {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// What a cache file's xattr records: the CRC-32C of its bytes (4 bytes, little-endian)
/// and their length (8 more; caches written before the length was added hold the CRC alone).
struct Recorded {
    crc: u32,
    len: Option<u64>,
}

impl Recorded {
    fn decode(v: &[u8]) -> Option<Recorded> {
        let crc = u32::from_le_bytes(v.get(..4)?.try_into().ok()?);
        let len = match v.len() {
            4 => None,
            12 => Some(u64::from_le_bytes(v[4..].try_into().ok()?)),
            _ => return None,
        };
        Some(Recorded { crc, len })
    }
}

/// Records `crc` and `len` on a cache file; a filesystem without user xattrs just does not
/// keep them.
fn set_crc(file: &File, crc: u32, len: u64) -> io::Result<()> {
    let mut value = crc.to_le_bytes().to_vec();
    value.extend_from_slice(&len.to_le_bytes());
    match file.set_xattr(CRC_XATTR, &value) {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
        other => other,
    }
}
