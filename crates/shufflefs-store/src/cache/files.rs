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
//!
//! # Adopting a peer's file by hard link
//! Another rank's cache folder on this host has the same layout, so its sample `id` is
//! [`FileBackend::path_in`]`(peer_root, id)`. [`CacheBackend::adopt`] links that file to
//! `tmp/<id>`, checks that the linked inode is a regular file carrying the checksum, length
//! and time the caller examined (the peer may have replaced its file by rename meanwhile),
//! and renames it into `samples/` as a commit does. The record and the mtime live on the
//! inode, so the result is exactly what a commit leaves: `recover`, `open`, `file`, `size`
//! see no difference. It is safe because committed files are immutable (see `backend`):
//! neither cache ever writes the shared inode, and each one's unlink or rename-over touches
//! only its own name. Linking reads no bytes, so a linked sample is checked against its
//! checksum when it leaves this rank, like any cached one, not on the way in.
//!
//! # Checked before a reader gets it
//! A cache file can change behind the daemon's back (a bit flipped on disk, someone writing
//! into the cache folder), and passthrough lets the kernel read it without the daemon seeing
//! a byte. So before a file is handed out ([`CacheBackend::file`]) or read
//! ([`CacheBackend::read_at`]), its bytes are checked against the recorded checksum unless
//! they were checked since they last changed. "Changed" is the inode's ctime (with its
//! number): every write, truncate, xattr change, rename or link moves it, and nobody can set
//! it back. The ctime at the last check is kept in memory per sample, so a remount checks
//! each file at its first read (and the store scrubs the cache in the background); a file
//! this backend commits is checked by construction (its checksum was taken from the bytes
//! written) and stamped after its rename. A file without a record (a filesystem without user
//! xattrs) cannot be checked and is served as before.
//!
//! Durability: `link(2)` works only within one filesystem, so the peer's inode, its data
//! and our two new directory entries (`tmp/<id>`, then `samples/<id>`) all belong to the
//! filesystem of our cache folder, and the `syncfs` of [`CacheBackend::sync`] writes every
//! dirty page and inode of that filesystem, the peer's not yet synced data included.

use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use xattr::FileExt as _;

use super::backend::{
    CacheBackend, ChecksumMismatch, Claim, Commit, Recovered, SampleWriter, Stored,
};
use super::bitset::IdSet;
use crate::plan::SampleId;
use crate::sys::io::read_full_at;

/// Extended attribute holding a cached sample's CRC-32C (4 bytes, little-endian) and, since
/// it was added, its length (8 more bytes), checked at start-up.
const CRC_XATTR: &str = "user.shufflefs.crc32c";

pub struct FileBackend {
    root: PathBuf,
    present: IdSet,
    /// Per cached sample, the [`change_stamp`] of its file when its bytes last matched
    /// their record; none (0): not checked since the mount (see the module docs). Only the
    /// samples checked since the mount and still cached have one (no word per
    /// sample of the dataset).
    checked: super::table::Stamps,
}

impl FileBackend {
    /// The backend in cache folder `root` for a dataset of `samples` samples; creates its
    /// folders and empties `tmp/` (leftovers of a crash mid-write).
    #[cfg(test)]
    pub(crate) fn open(root: &Path, samples: u64) -> io::Result<FileBackend> {
        Self::open_for(root, samples, 1)
    }

    /// [`FileBackend::open`] for a job of `world` ranks (which shape its per-sample marks
    /// take: `super::table`).
    pub(crate) fn open_for(root: &Path, samples: u64, world: u32) -> io::Result<FileBackend> {
        for sub in ["samples", "tmp"] {
            super::private::create_dir(&root.join(sub))?;
        }
        // Only names a writer gives (an id): a file of anyone else's is left alone.
        super::own::remove_files(&root.join("tmp"), super::own::is_sample_name)?;
        Ok(FileBackend {
            root: root.to_path_buf(),
            present: IdSet::new(samples, world),
            checked: super::table::Stamps::new(samples, world),
        })
    }

    /// Where sample `id` lives in the cache folder `root` (tests inject faults there).
    pub fn path_in(root: &Path, id: SampleId) -> PathBuf {
        root.join("samples").join(id.to_string())
    }

    fn path(&self, id: SampleId) -> PathBuf {
        Self::path_in(&self.root, id)
    }

    fn tmp_path(&self, id: SampleId) -> PathBuf {
        self.root.join("tmp").join(id.to_string())
    }

    /// Sample `id`'s file, open, its bytes checked against their record unless they were
    /// since they last changed (see the module docs).
    fn checked_file(&self, id: SampleId) -> io::Result<File> {
        let file = File::open(self.path(id))?;
        let meta = file.metadata()?;
        let stamp = change_stamp(&meta);
        if self.checked.get(id) == stamp {
            return Ok(file);
        }
        if let Some(recorded) = record_of(&file)? {
            let found = crc_of(&file)?;
            if found != recorded.crc || recorded.len.is_some_and(|l| l != meta.len()) {
                return Err(ChecksumMismatch {
                    id,
                    found,
                    recorded: recorded.crc,
                }
                .into_io());
            }
        }
        self.checked.set(id, stamp);
        Ok(file)
    }

    /// Notes that sample `id`'s file at `path` holds the bytes its record was taken from.
    fn stamp_checked(&self, id: SampleId, path: &Path) {
        if let Ok(meta) = fs::metadata(path) {
            self.checked.set(id, change_stamp(&meta));
        }
    }

    /// The checksum, length and modification time recorded on sample `id`'s file in the
    /// cache folder `root` (a peer's, on this host). Errors name the file: missing, not a
    /// regular file, no record of both checksum and length, or a length its record
    /// contradicts; the caller then gets the sample elsewhere.
    #[cfg(test)]
    pub(crate) fn recorded_in(root: &Path, id: SampleId) -> io::Result<Commit> {
        Ok(Self::open_peer(root, id)?.recorded)
    }

    /// Opens sample `id`'s file in the cache folder `root` and reads its record; see
    /// [`recorded_in`](Self::recorded_in). The path comes from `root` and `id` alone.
    pub(super) fn open_peer(root: &Path, id: SampleId) -> io::Result<PeerFile> {
        let path = Self::path_in(root, id);
        let named = |e: io::Error| {
            io::Error::new(e.kind(), format!("peer cache file {}: {e}", path.display()))
        };
        let refused = |why: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("peer cache file {}: {why}", path.display()),
            )
        };
        // No symlinks (a link would be linked, not its target), and no blocking open of a
        // FIFO: a sample file is a regular file.
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(named)?;
        let meta = file.metadata().map_err(named)?;
        if !meta.is_file() {
            return Err(refused("not a regular file".into()));
        }
        let record = record_of(&file).map_err(named)?;
        let Some(Recorded {
            crc,
            len: Some(len),
        }) = record
        else {
            return Err(refused(format!(
                "no recorded checksum and length (no {CRC_XATTR} xattr, or one from an older shufflefs)"
            )));
        };
        if meta.len() != len {
            return Err(refused(format!(
                "{} bytes, its record says {len}; it was cut short or changed",
                meta.len()
            )));
        }
        Ok(PeerFile {
            file,
            path,
            recorded: Commit {
                crc,
                len,
                mtime: meta.modified().ok(),
            },
        })
    }
}

/// A committed sample file of another cache folder on this host, open, with its record
/// (checked against its length) and modification time.
pub(super) struct PeerFile {
    pub file: File,
    pub path: PathBuf,
    pub recorded: Commit,
}

/// Whether the file at `path` is a regular file carrying `recorded`: its checksum and
/// length in the xattr, that length, and that modification time.
fn carries(path: &Path, recorded: &Commit) -> bool {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return false;
    };
    let record = xattr::get(path, CRC_XATTR)
        .ok()
        .flatten()
        .and_then(|v| Recorded::decode(&v));
    meta.is_file()
        && meta.len() == recorded.len
        && meta.modified().ok() == recorded.mtime
        && record.is_some_and(|r| r.crc == recorded.crc && r.len == Some(recorded.len))
}

impl CacheBackend for FileBackend {
    fn recover(&self, keep: &dyn Fn(SampleId, u64) -> bool) -> io::Result<Vec<Recovered>> {
        let mut found = Vec::new();
        for entry in fs::read_dir(self.root.join("samples"))? {
            let entry = entry?;
            let id = entry
                .file_name()
                .to_str()
                .filter(|n| super::own::is_sample_name(n))
                .and_then(|n| n.parse::<SampleId>().ok());
            let meta = entry.metadata().ok();
            // A file renamed in before a crash may have lost data the rename did not wait
            // for; the length recorded beside its checksum catches it coming back short.
            let recorded = xattr::get(entry.path(), CRC_XATTR)
                .ok()
                .flatten()
                .and_then(|v| Recorded::decode(&v));
            match (id, meta) {
                (Some(id), Some(meta))
                    if meta.is_file()
                        && keep(id, meta.len())
                        && recorded.is_none_or(|r| r.len.is_none_or(|l| l == meta.len())) =>
                {
                    self.present.set(id);
                    found.push(Recovered {
                        id,
                        len: meta.len(),
                        mtime: meta.modified().ok(),
                    });
                }
                // Named by us but not a whole sample: ours to drop.
                (Some(_), _) => {
                    let _ = fs::remove_file(entry.path());
                }
                // Not a name we give: someone else's, left alone.
                (None, _) => {}
            }
        }
        Ok(found)
    }

    fn contains(&self, id: SampleId) -> bool {
        self.present.get(id)
    }

    fn held(&self) -> Vec<SampleId> {
        self.present.held()
    }

    fn size(&self, id: SampleId) -> Option<u64> {
        if !self.contains(id) {
            return None;
        }
        fs::metadata(self.path(id)).ok().map(|m| m.len())
    }

    fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        read_full_at(&self.checked_file(id)?, offset, buf)
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
        let tmp = self.tmp_path(id);
        let file = super::private::create_file(&tmp)?;
        Ok(Box::new(FileWriter {
            file: Some(file),
            tmp,
            dest: self.path(id),
            backend: self,
            id,
        }))
    }

    /// Hard-links `from` in (see the module docs); `Ok(false)` when the link fails for any
    /// reason (`EXDEV`: another filesystem; `EPERM`: `fs.protected_hardlinks` and another
    /// owner) or the linked file does not carry `recorded`.
    fn adopt(&self, claim: &Claim<'_>, from: &Path, recorded: Commit) -> io::Result<bool> {
        let id = claim.id();
        let tmp = self.tmp_path(id);
        // The claim makes `tmp/<id>` ours; a name left by a failed clean-up would stop the link.
        let _ = fs::remove_file(&tmp);
        if fs::hard_link(from, &tmp).is_err() {
            return Ok(false);
        }
        if !carries(&tmp, &recorded) {
            let _ = fs::remove_file(&tmp);
            return Ok(false);
        }
        if let Err(e) = fs::rename(&tmp, self.path(id)) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        self.present.set(id);
        Ok(true)
    }

    fn remove(&self, id: SampleId) -> io::Result<bool> {
        if !self.present.clear(id) {
            return Ok(false);
        }
        self.checked.remove(id);
        match fs::remove_file(self.path(id)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(true),
        }
    }

    fn clear(&self) -> io::Result<()> {
        let samples = self.root.join("samples");
        super::own::remove_files(&samples, super::own::is_sample_name)?;
        self.present.clear_all();
        self.checked.clear();
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        // One `syncfs`, not one fsync per file: the exchange makes a round's worth of
        // received samples durable at once.
        let dir = File::open(&self.root)?;
        nix::unistd::syncfs(&dir).map_err(io::Error::from)
    }

    fn file(&self, id: SampleId) -> Option<io::Result<File>> {
        Some(self.checked_file(id))
    }

    fn verify(&self, id: SampleId) -> io::Result<()> {
        self.checked_file(id).map(drop)
    }
}

/// A sample being written under `tmp/`; renamed into `samples/` on commit.
struct FileWriter<'a> {
    file: Option<File>,
    tmp: PathBuf,
    dest: PathBuf,
    backend: &'a FileBackend,
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
        // The record was taken from the bytes just written: checked by construction.
        self.backend.stamp_checked(self.id, &self.dest);
        self.backend.present.set(self.id);
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

/// What `file`'s xattr records, if anything (`None` also on a filesystem without user
/// xattrs, or for a record this version cannot read).
fn record_of(file: &File) -> io::Result<Option<Recorded>> {
    match file.get_xattr(CRC_XATTR) {
        Ok(v) => Ok(v.and_then(|v| Recorded::decode(&v))),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The CRC-32C of `file`'s bytes, read from its start.
fn crc_of(file: &File) -> io::Result<u32> {
    let mut buf = vec![0u8; 256 * 1024];
    let (mut crc, mut pos) = (0u32, 0u64);
    loop {
        let n = read_full_at(file, pos, &mut buf)?;
        if n == 0 {
            return Ok(crc);
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        pos += n as u64;
    }
}

/// What identifies one state of a file's bytes: its inode and change time (ctime moves on
/// every write, truncate, attribute change, rename and link, and cannot be set back). Never
/// 0, which means "not checked".
fn change_stamp(meta: &Metadata) -> u64 {
    let nanos = (meta.ctime() as u64).wrapping_mul(1_000_000_007) ^ meta.ctime_nsec() as u64;
    (nanos ^ meta.ino().rotate_left(29)) | 1
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Claims;
    use std::time::{Duration, SystemTime};

    /// A cache folder holding sample `id` with `bytes`, committed as the writer does.
    fn holding(root: &Path, id: SampleId, bytes: &[u8], mtime: SystemTime) -> FileBackend {
        let backend = FileBackend::open(root, 16).unwrap();
        let claims = Claims::default();
        let mut w = backend.writer(&claims.claim(id)).unwrap();
        w.write_all(bytes).unwrap();
        w.commit(Commit {
            crc: crc32c::crc32c(bytes),
            len: bytes.len() as u64,
            mtime: Some(mtime),
        })
        .unwrap();
        backend
    }

    #[test]
    fn a_link_whose_file_does_not_carry_the_record_is_not_taken() {
        let tmp = tempfile::tempdir().unwrap();
        let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
        let _peer = holding(&tmp.path().join("peer"), 3, b"sample three", when);
        let from = FileBackend::path_in(&tmp.path().join("peer"), 3);
        let recorded = FileBackend::recorded_in(&tmp.path().join("peer"), 3).unwrap();
        assert_eq!(recorded.mtime, Some(when));
        let ours = FileBackend::open(&tmp.path().join("ours"), 16).unwrap();
        let claims = Claims::default();
        // As if the peer had replaced its file after the caller read the record.
        for other in [
            Commit {
                crc: recorded.crc ^ 1,
                ..recorded
            },
            Commit {
                len: recorded.len + 1,
                ..recorded
            },
            Commit {
                mtime: Some(when + Duration::from_secs(1)),
                ..recorded
            },
        ] {
            assert!(!ours.adopt(&claims.claim(3), &from, other).unwrap());
            assert!(!ours.contains(3));
            assert!(
                fs::read_dir(tmp.path().join("ours/tmp"))
                    .unwrap()
                    .next()
                    .is_none()
            );
            assert!(
                fs::read_dir(tmp.path().join("ours/samples"))
                    .unwrap()
                    .next()
                    .is_none()
            );
        }
        assert_eq!(fs::metadata(&from).unwrap().nlink(), 1);
        assert!(ours.adopt(&claims.claim(3), &from, recorded).unwrap());
        assert_eq!(ours.size(3), Some(recorded.len));
        assert_eq!(fs::metadata(&from).unwrap().nlink(), 2);
    }

    #[test]
    fn a_link_replaces_a_stale_temporary_name_and_a_stored_copy() {
        let tmp = tempfile::tempdir().unwrap();
        let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
        let _peer = holding(&tmp.path().join("peer"), 5, b"five", when);
        let recorded = FileBackend::recorded_in(&tmp.path().join("peer"), 5).unwrap();
        let ours = holding(&tmp.path().join("ours"), 5, b"five", SystemTime::now());
        fs::write(tmp.path().join("ours/tmp/5"), b"left over").unwrap();
        let claims = Claims::default();
        let from = FileBackend::path_in(&tmp.path().join("peer"), 5);
        assert!(ours.adopt(&claims.claim(5), &from, recorded).unwrap());
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();
        assert_eq!(ino(&from), ino(&ours.path(5)));
        assert!(!tmp.path().join("ours/tmp/5").exists());
        let found = ours.recover(&|_, _| true).unwrap();
        assert_eq!(
            found,
            vec![Recovered {
                id: 5,
                len: 4,
                mtime: Some(when)
            }]
        );
    }
}
