//! The seam between what the cache holds and how it lays bytes on disk.
//!
//! [`SampleStore`](super::SampleStore) knows which samples this rank needs, their sizes,
//! where to fetch them from and what to count; a [`CacheBackend`] only stores and returns
//! bytes by sample id. Today's backend is one file per sample ([`FileBackend`](super::FileBackend));
//! a packed backend (append-only segment files with an index, for datasets of millions of
//! small records) implements the same trait, and nothing in `vfs`, `fuse` or `exchange`
//! changes: they reach bytes only through the store.
//!
//! # One writer per sample, by construction
//! A backend hands out a writer only against a [`Claim`] on the sample, and a claim exists
//! only while no other claim on the same id does ([`Claims::claim`] waits for the holder to
//! finish). A source fetch and a receive from a peer therefore cannot write one sample at
//! once, and a backend may use the id alone to name its temporary data.
//!
//! # Adopting a same-host peer's file
//! Two ranks on one host need not move a sample's bytes through MPI: the receiver takes the
//! sender's committed file ([`CacheBackend::adopt`]), by hard link where both caches share a
//! filesystem. Sharing one inode between two caches is safe because a committed sample is
//! immutable: no backend writes a committed file in place, sets its attributes again or
//! truncates it; a sample is only ever replaced by renaming a new file over its name, and
//! dropped by unlinking its name. Either cache replacing or dropping its copy therefore
//! touches only its own directory entry, and the other's name keeps the inode (bytes,
//! recorded checksum and length, modification time) as it was committed.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::{Condvar, Mutex};
use std::time::SystemTime;

use super::CacheLayout;
use crate::plan::SampleId;
use crate::sys::sync::Locked;

/// A complete sample a backend found at start-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recovered {
    pub id: SampleId,
    pub len: u64,
    /// The source's modification time, if the backend kept it.
    pub mtime: Option<SystemTime>,
}

/// What a committed sample carries besides its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Commit {
    /// CRC-32C of the bytes written.
    pub crc: u32,
    /// Bytes written.
    pub len: u64,
    /// The source file's modification time, where known.
    pub mtime: Option<SystemTime>,
}

/// Bytes of one sample being written. Dropping it without [`commit`](Self::commit) discards
/// what was written: nothing of it becomes visible.
pub trait SampleWriter: Write + Send {
    /// Makes the sample visible, whole, with `commit`'s checksum recorded beside it. A crash
    /// before this returns leaves nothing; a crash after leaves either nothing or the whole
    /// sample (durability comes from [`CacheBackend::sync`]).
    fn commit(self: Box<Self>, commit: Commit) -> io::Result<()>;
}

/// A readable stored sample, with the checksum recorded when it was committed (if kept).
pub struct Stored {
    pub reader: Box<dyn Read + Send>,
    pub recorded_crc: Option<u32>,
}

/// A stored sample's bytes, borrowed for the length of a call, with the checksum recorded
/// when it was committed (if kept).
pub struct Borrowed<'a> {
    pub bytes: &'a [u8],
    pub recorded_crc: Option<u32>,
}

/// A stored sample whose bytes no longer match the checksum recorded when it was committed
/// (a bit flipped on disk, a write into the cache folder). A backend's reads return it
/// inside their `io::Error` ([`into_io`](Self::into_io)); the store finds it there
/// ([`find`](Self::find)), drops the copy, counts it and fetches the sample again, so the
/// bad bytes never reach a reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "cached copy of sample {id} failed its checksum (found {found:08x}, recorded {recorded:08x})"
)]
pub struct ChecksumMismatch {
    pub id: SampleId,
    pub found: u32,
    pub recorded: u32,
}

impl ChecksumMismatch {
    pub(crate) fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, self)
    }

    /// The mismatch `e` carries, if it is one.
    pub(crate) fn find(e: &io::Error) -> Option<ChecksumMismatch> {
        e.get_ref()?.downcast_ref::<ChecksumMismatch>().copied()
    }
}

/// Storage of sample bytes by id. Implementations are shared between threads.
///
/// # Reads are checked
/// [`read_at`](Self::read_at) and [`file`](Self::file) hand out only bytes that matched
/// their recorded checksum since they last changed: a backend checks a sample's bytes the
/// first time they are read after a mount or after anything changed them, and answers
/// [`ChecksumMismatch`] when they do not match. [`open`](Self::open) and
/// [`read_each`](Self::read_each) return the recorded checksum instead, for callers that
/// check as they stream (the exchange's sender).
pub trait CacheBackend: Send + Sync {
    /// Indexes what storage already holds, dropping whatever is not a complete sample or
    /// fails `keep(id, len)` (an id past the dataset, a length the manifest contradicts).
    /// Called once, before any other method.
    fn recover(&self, keep: &dyn Fn(SampleId, u64) -> bool) -> io::Result<Vec<Recovered>>;
    /// Whether sample `id` is stored.
    fn contains(&self, id: SampleId) -> bool;
    /// Every stored sample, ascending: O(what is stored) for a job of many ranks (not a
    /// pass over the dataset's ids).
    fn held(&self) -> Vec<SampleId>;
    /// The stored length of sample `id`, if stored.
    fn size(&self, id: SampleId) -> Option<u64>;
    /// Reads up to `buf.len()` bytes of sample `id` at `offset`; short only at its end.
    /// Checked (see the trait's docs).
    fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
    /// Sample `id` as a stream, for sending it whole.
    fn open(&self, id: SampleId) -> io::Result<Stored>;
    /// Each of samples `ids` whole, in order, handed to `each` with its position in `ids`:
    /// what [`open`](Self::open) and reading to the end give, for less per sample where a
    /// backend can (the packed one looks the lot up at once and lends its mapped bytes).
    fn read_each(&self, ids: &[SampleId], each: &mut dyn FnMut(usize, io::Result<Borrowed<'_>>)) {
        let mut buf = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let read = self.open(id).and_then(|mut s| {
                buf.clear();
                s.reader.read_to_end(&mut buf)?;
                Ok(s.recorded_crc)
            });
            each(
                i,
                read.map(|recorded_crc| Borrowed {
                    bytes: &buf,
                    recorded_crc,
                }),
            );
        }
    }
    /// A writer for sample `claim.id()`; replaces a stored copy on commit.
    fn writer<'a>(&'a self, claim: &Claim<'_>) -> io::Result<Box<dyn SampleWriter + 'a>>;
    /// Writes and commits several whole samples, each `(id, bytes, commit)` with its id
    /// claimed in `claims`: what [`writer`](Self::writer), `write_all` and `commit` do for
    /// each, one result per sample in order. A backend may do it for less per sample (the
    /// packed one takes its append lock once for the lot).
    fn commit_batch(
        &self,
        claims: &ClaimSet<'_>,
        batch: &[(SampleId, &[u8], Commit)],
    ) -> Vec<io::Result<()>> {
        batch
            .iter()
            .map(|&(id, bytes, commit)| {
                let claim = claims.get(id)?;
                let mut w = self.writer(&claim)?;
                w.write_all(bytes)?;
                w.commit(commit)
            })
            .collect()
    }
    /// Stores sample `claim.id()` by taking the committed sample file `from` (another cache
    /// folder's, on this host) without copying its bytes, the file becoming indistinguishable
    /// from one this backend committed with `recorded` (checksum, length, time). Replaces a
    /// stored copy. `Ok(false)`: this backend cannot take it (packed storage, another
    /// filesystem, a file that does not carry `recorded`), nothing was stored, and the caller
    /// copies the bytes through [`writer`](Self::writer) instead. Durable after
    /// [`sync`](Self::sync), like a commit.
    fn adopt(&self, claim: &Claim<'_>, from: &Path, recorded: Commit) -> io::Result<bool> {
        let _ = (claim, from, recorded);
        Ok(false)
    }
    /// Drops sample `id`; returns whether it was stored. Readers that hold it open keep it.
    fn remove(&self, id: SampleId) -> io::Result<bool>;
    /// Bytes the storage takes on disk where that is more than the stored samples' sum
    /// (`None`: it is their sum). The packed layout keeps a removed sample's record until
    /// its segment is compacted, so a partial cache's size (`super::admission`) counts them.
    fn disk_bytes(&self) -> Option<u64> {
        None
    }
    /// Drops every stored sample.
    fn clear(&self) -> io::Result<()>;
    /// Makes every committed sample durable.
    fn sync(&self) -> io::Result<()>;
    /// A file holding exactly sample `id`'s bytes, for the kernel to read directly (FUSE
    /// passthrough). `None`: this backend has no such file (packed storage); readers then
    /// go through [`read_at`](Self::read_at). Checked (see the trait's docs).
    fn file(&self, id: SampleId) -> Option<io::Result<File>>;
    /// Checks sample `id`'s stored bytes against its recorded checksum, unless they were
    /// checked since they last changed: what a scrub after a remount runs over the cache.
    fn verify(&self, id: SampleId) -> io::Result<()>;
    /// The `--cache-layout` this backend stores (the status shows it).
    fn layout(&self) -> CacheLayout {
        CacheLayout::Files
    }
}

/// The samples being written right now; see the module docs.
#[derive(Default)]
pub(crate) struct Claims {
    held: Mutex<Held>,
    released: Condvar,
}

#[derive(Default)]
struct Held {
    ids: HashSet<SampleId>,
    /// Claimers waiting for a release. A release wakes them only if there are any: a
    /// wake-up is a system call, paid per sample written (a million times an exchange of
    /// small records) though a wait is rare.
    waiting: usize,
}

impl Claims {
    /// Claims sample `id` for writing, waiting while another writer holds it.
    pub(crate) fn claim(&self, id: SampleId) -> Claim<'_> {
        let mut held = self.held.locked();
        while held.ids.contains(&id) {
            held.waiting += 1;
            held = self.released.wait(held).unwrap_or_else(|e| e.into_inner());
            held.waiting -= 1;
        }
        held.ids.insert(id);
        Claim { id, claims: self }
    }

    /// Claims every sample of `ids` (distinct) at once, waiting while another writer holds
    /// any of them: one lock for the lot. All or none are taken, so two claimers of
    /// overlapping sets cannot each hold a part the other waits for.
    pub(crate) fn claim_all(&self, ids: &[SampleId]) -> ClaimSet<'_> {
        let mut held = self.held.locked();
        while ids.iter().any(|id| held.ids.contains(id)) {
            held.waiting += 1;
            held = self.released.wait(held).unwrap_or_else(|e| e.into_inner());
            held.waiting -= 1;
        }
        held.ids.extend(ids.iter().copied());
        ClaimSet {
            ids: ids.to_vec(),
            claims: self,
        }
    }
}

/// The right to write several samples ([`Claims::claim_all`]); released on drop.
pub struct ClaimSet<'a> {
    ids: Vec<SampleId>,
    claims: &'a Claims,
}

impl ClaimSet<'_> {
    pub(crate) fn contains(&self, id: SampleId) -> bool {
        self.ids.contains(&id)
    }

    /// The claim on `id` as a [`Claim`] borrowed from this set (dropping it releases
    /// nothing); an error if the set does not hold `id`.
    pub(crate) fn get(&self, id: SampleId) -> io::Result<std::mem::ManuallyDrop<Claim<'_>>> {
        if !self.contains(id) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("sample {id} is not claimed"),
            ));
        }
        Ok(std::mem::ManuallyDrop::new(Claim {
            id,
            claims: self.claims,
        }))
    }
}

impl Drop for ClaimSet<'_> {
    fn drop(&mut self) {
        let mut held = self.claims.held.locked();
        for id in &self.ids {
            held.ids.remove(id);
        }
        if held.waiting > 0 {
            self.claims.released.notify_all();
        }
    }
}

/// The right to write one sample; released on drop.
pub struct Claim<'a> {
    id: SampleId,
    claims: &'a Claims,
}

impl Claim<'_> {
    pub(crate) fn id(&self) -> SampleId {
        self.id
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut held = self.claims.held.locked();
        held.ids.remove(&self.id);
        if held.waiting > 0 {
            self.claims.released.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn a_second_claim_on_one_sample_waits_for_the_first() {
        let claims = Arc::new(Claims::default());
        let first = claims.claim(7);
        let other = claims.claim(8); // other ids never wait
        let got = Arc::new(AtomicBool::new(false));
        let (c, g) = (claims.clone(), got.clone());
        let waiter = std::thread::spawn(move || {
            let _second = c.claim(7);
            g.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !got.load(Ordering::SeqCst),
            "second writer ran beside the first"
        );
        drop(first);
        waiter.join().unwrap();
        assert!(got.load(Ordering::SeqCst));
        drop(other);
    }
}
