//! The cached samples of one rank: which are present, their sizes and source times once
//! known, fetching from the source on demand, writing a sample in through the backend, and
//! adopting one from a peer rank's cache folder on this host.
//!
//! A sample comes in by one of three ways, each under the sample's [`Claim`](super::Claim)
//! and each ending the same (size and time learned, counted once): a fetch from the source
//! ([`SampleStore::ensure`]), bytes received from a peer ([`SampleStore::insert_with`]), or
//! a same-host peer's committed file taken as it is ([`SampleStore::adopt_from_peer`]: a
//! hard link, else a copy checked against the peer's recorded checksum), so that two ranks
//! on one host exchange samples without their bytes crossing MPI.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::admission::{Admission, is_not_kept, not_kept};
use super::backend::{CacheBackend, Claim, Claims, Commit, Stored};
use super::files::FileBackend;
use super::{CacheDir, CacheError};
use crate::dataset::Dataset;
use crate::dataset::manifest::Manifest;
use crate::plan::SampleId;
use crate::sys::sync::Locked;

/// A source's error named by the sample's place (`PATH: error`), keeping the OS error that
/// [`source_errno`] finds again: staging tells a source that went away (EIO from sshfs, say)
/// from a bad sample by it.
#[derive(Debug)]
pub(crate) struct SourceError {
    what: String,
    error: io::Error,
}

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.error)
    }
}

impl std::error::Error for SourceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// The OS error code of `e`, or of the source error it wraps ([`SourceError`]).
pub fn source_errno(e: &io::Error) -> Option<i32> {
    (e.raw_os_error()).or_else(|| {
        let inner = e.get_ref()?.downcast_ref::<SourceError>()?;
        inner.error.raw_os_error()
    })
}

/// Counters shown in the status.
#[derive(Default)]
pub struct StoreStats {
    pub files: AtomicU64,
    pub bytes: AtomicU64,
    pub fetched_from_source: AtomicU64,
    /// Bytes of the samples counted in `fetched_from_source`: what the source was read for.
    pub fetched_bytes_from_source: AtomicU64,
    /// Samples and parts opened through the daemon (for the metrics).
    pub reads: AtomicU64,
    pub source_errors: AtomicU64,
    /// Cached, received or adopted samples whose bytes did not match their checksum.
    pub checksum_failures: AtomicU64,
    /// Samples taken from a same-host peer's cache by hard link (no byte read or written).
    pub adopted_linked: AtomicU64,
    /// Samples taken from a same-host peer's cache by copying its file.
    pub adopted_copied: AtomicU64,
    /// Bytes of the samples adopted either way.
    pub adopted_bytes: AtomicU64,
    /// The latest problems (source errors, checksum failures), newest last, for the status.
    problems: Mutex<std::collections::VecDeque<String>>,
}

impl StoreStats {
    const KEEP_PROBLEMS: usize = 16;

    pub fn report_problem(&self, what: String) {
        let mut p = self.problems.locked();
        if p.len() == Self::KEEP_PROBLEMS {
            p.pop_front();
        }
        p.push_back(what);
    }

    pub fn problems(&self) -> Vec<String> {
        let p = self.problems.locked();
        p.iter().cloned().collect()
    }
}

/// How `SampleStore::adopt_from_peer` came by a sample, with its length in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adopted {
    /// Hard-linked: the peer's file is now ours as well; no byte was read or written.
    Linked(u64),
    /// Copied from the peer's file (another filesystem, or a backend that cannot link),
    /// checked against the checksum the peer recorded.
    Copied(u64),
    /// Already cached here (a fetch from the source got it first): nothing was taken.
    AlreadyHeld(u64),
}

impl Adopted {
    /// The sample's length.
    pub fn bytes(self) -> u64 {
        match self {
            Adopted::Linked(n) | Adopted::Copied(n) | Adopted::AlreadyHeld(n) => n,
        }
    }
}

/// Where bytes being written come from, for what a failure says and the time committed.
#[derive(Clone, Copy)]
enum Origin<'a> {
    /// The source or a peer's stream: the sample's time is the one already learned.
    Stream,
    /// A same-host peer's cache file, with its modification time.
    PeerFile {
        path: &'a Path,
        mtime: Option<SystemTime>,
    },
}

/// The cached samples of one rank, filled from the source on demand.
pub struct SampleStore {
    dir: CacheDir,
    manifest: Arc<Manifest>,
    source: Arc<dyn Dataset>,
    backend: Box<dyn CacheBackend>,
    /// What is learned of this rank's samples (`super::table`): a size where the manifest
    /// has none, learned when the sample is first written into the cache (fetched,
    /// received, or found there at start-up), never changing once known; and the source
    /// modification time, learned with its bytes (kept by the backend across remounts).
    /// Only for the samples of this rank's share ([`SampleStore::forget`]).
    learned: super::table::SampleTable,
    /// One writer per sample (see `backend`); a fetch waiting on a claim finds the sample
    /// present when it gets it, and copies nothing.
    claims: Claims,
    pub stats: StoreStats,
    /// Set when the share does not fit the cache: what may be written ([`Admission`]).
    partial: std::sync::OnceLock<Admission>,
    /// The unit the cache takes disk space in (`super::footprint`).
    block: u64,
    /// Bytes the cached samples take on disk, each rounded up to `block`.
    disk: AtomicU64,
}

impl SampleStore {
    /// The store over today's one-file-per-sample backend in `dir`.
    pub fn new(
        dir: CacheDir,
        manifest: Arc<Manifest>,
        source: Arc<dyn Dataset>,
    ) -> Result<SampleStore, CacheError> {
        let backend = dir.file_backend(manifest.len())?;
        SampleStore::with_backend(dir, Box::new(backend), manifest, source)
    }

    /// The store over `backend`, indexing what it already holds and dropping whatever is
    /// not a complete sample of this dataset.
    pub fn with_backend(
        dir: CacheDir,
        backend: Box<dyn CacheBackend>,
        manifest: Arc<Manifest>,
        source: Arc<dyn Dataset>,
    ) -> Result<SampleStore, CacheError> {
        Self::with_backend_for(dir, backend, manifest, source, 1)
    }

    /// [`SampleStore::with_backend`] for a job of `world` ranks: what it learns of samples
    /// takes the shape that costs least for shares of `N / world` (`super::table`).
    pub fn with_backend_for(
        dir: CacheDir,
        backend: Box<dyn CacheBackend>,
        manifest: Arc<Manifest>,
        source: Arc<dyn Dataset>,
        world: u32,
    ) -> Result<SampleStore, CacheError> {
        let store = SampleStore {
            learned: super::table::SampleTable::new(manifest.len(), world),
            claims: Claims::default(),
            stats: StoreStats::default(),
            partial: std::sync::OnceLock::new(),
            block: super::footprint::block_of(dir.root(), backend.layout()),
            disk: AtomicU64::new(0),
            backend,
            dir,
            manifest,
            source,
        };
        let keep = |id: SampleId, len: u64| {
            id < store.manifest.len() && store.size(id).is_none_or(|size| size == len)
        };
        let found = store.backend.recover(&keep).map_err(store.dir.io_err())?;
        for r in found {
            store.learn_size(r.id, r.len);
            store.learn_mtime(r.id, r.mtime);
            store.count_in(r.id);
        }
        Ok(store)
    }

    pub fn dir(&self) -> &CacheDir {
        &self.dir
    }

    pub fn manifest(&self) -> &Arc<Manifest> {
        &self.manifest
    }

    /// How the backend lays samples out on disk (`--cache-layout`).
    pub fn layout(&self) -> super::CacheLayout {
        self.backend.layout()
    }

    pub fn contains(&self, id: SampleId) -> bool {
        self.backend.contains(id)
    }

    /// Every cached sample, ascending (what the backend holds: O(that), not O(N)).
    pub fn held(&self) -> Vec<SampleId> {
        self.backend.held()
    }

    /// The size of sample `id`, if known yet (see `sizes`).
    pub fn size(&self, id: SampleId) -> Option<u64> {
        self.manifest.size(id).or_else(|| self.learned.size(id))
    }

    /// Sample `id`'s modification time in the source, if known yet.
    pub fn mtime(&self, id: SampleId) -> Option<SystemTime> {
        match self.learned.mtime(id) {
            0 => None,
            nanos => Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos)),
        }
    }

    /// Records a size only if none is known: a known size never changes behind a caller's
    /// back (the callers check a new length against a known one first).
    fn learn_size(&self, id: SampleId, len: u64) {
        if self.manifest.size(id).is_none() {
            self.learned.learn_size(id, len);
        }
    }

    /// Records a source modification time (a later copy's time wins: the source is what
    /// it is now).
    pub(crate) fn learn_mtime(&self, id: SampleId, mtime: Option<SystemTime>) {
        let nanos = mtime
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64);
        self.learn_mtime_nanos(id, nanos);
    }

    /// [`learn_mtime`](Self::learn_mtime) in nanoseconds since 1970; 0 (unknown) is ignored.
    /// Not kept for a record source: its views show parts, never a sample's own time, and
    /// a time per sample would cost a map entry per share sample (a record group's time is
    /// its shard file's anyway).
    pub fn learn_mtime_nanos(&self, id: SampleId, nanos: u64) {
        if self.manifest.records().is_none() {
            self.learned.learn_mtime(id, nanos);
        }
    }

    /// Sample `id`'s source time in nanoseconds since 1970, 0 if not known (what the
    /// exchange sends with its size).
    pub fn mtime_nanos(&self, id: SampleId) -> u64 {
        self.learned.mtime(id)
    }

    /// Sample `id` left this rank's share: what was learned of it goes (its cached copy
    /// is dropped by [`SampleStore::remove`]), so the store's memory follows the share.
    pub fn forget(&self, id: SampleId) {
        self.learned.forget(id);
    }

    /// Samples the store keeps something learned of (tests, benches).
    pub fn learned_samples(&self) -> usize {
        self.learned.len()
    }

    /// Sample `id`'s size, fetching the sample from the source first if it is not known.
    pub fn resolve_size(&self, id: SampleId) -> io::Result<u64> {
        if let Some(size) = self.size(id) {
            return Ok(size);
        }
        self.ensure(id)?;
        self.size(id)
            .ok_or_else(|| io::Error::other("sample size unknown after fetching it"))
    }

    /// Counts a sample that just became present (call after `learn_size`).
    fn count_in(&self, id: SampleId) {
        self.stats.files.fetch_add(1, Ordering::Relaxed);
        let len = self.size(id).unwrap_or(0);
        self.stats.bytes.fetch_add(len, Ordering::Relaxed);
        self.disk.fetch_add(self.on_disk(len), Ordering::Relaxed);
    }

    /// Staging is about to copy `ids` from the source (see [`Dataset::will_read`]).
    pub fn will_stage(&self, ids: &[SampleId]) {
        self.source.will_read(ids);
    }

    /// Makes this a partial cache: from now on only what `admission` admits is fetched
    /// into it (a second call changes nothing).
    pub fn set_partial(&self, admission: Admission) {
        let _ = self.partial.set(admission.in_blocks(self.block));
    }

    /// The partial cache's gate, if this is one.
    pub fn partial(&self) -> Option<&Admission> {
        self.partial.get()
    }

    /// Whether `id` may be fetched into the cache (always, unless this is a partial cache).
    pub fn admits(&self, id: SampleId) -> bool {
        self.partial
            .get()
            .is_none_or(|a| a.admits(id, self.size(id), self.held_bytes()))
    }

    /// For the exchange's receiver, before it writes `bytes` of samples (`id` the first):
    /// outside a partial cache `None`; in one, the room promised until it drops, or a
    /// [`not_kept`] error when the cache has no room for them (they are not written).
    pub fn room_for_received(
        &self,
        id: SampleId,
        bytes: u64,
    ) -> io::Result<Option<super::admission::Room<'_>>> {
        let Some(partial) = self.partial.get() else {
            return Ok(None);
        };
        (partial.reserve_received(id, bytes, self.held_bytes()))
            .map(Some)
            .ok_or_else(|| not_kept(id))
    }

    /// Bytes the cache takes on disk: its samples' whole blocks, or more where the backend
    /// keeps removed ones until it compacts (the packed layout).
    pub fn held_bytes(&self) -> u64 {
        let live = self.disk.load(Ordering::Relaxed);
        live.max(self.backend.disk_bytes().unwrap_or(0))
    }

    /// What a sample of `bytes` takes on this cache's disk (`super::footprint`): the sizes
    /// a partial cache is planned and gated with.
    pub fn on_disk(&self, bytes: u64) -> u64 {
        super::footprint::on_disk(bytes, self.block)
    }

    /// The unit this cache takes disk space in (`super::footprint`).
    pub fn block(&self) -> u64 {
        self.block
    }

    /// Makes sure sample `id` is cached, copying it from the source if needed. A partial
    /// cache refuses a sample it does not keep, or that would pass its size
    /// (`admission::is_not_kept`), counting nothing.
    pub fn ensure(&self, id: SampleId) -> io::Result<()> {
        if self.contains(id) {
            return Ok(());
        }
        // A partial cache promises the room first (given back as `room` drops).
        let room = match self.partial.get() {
            Some(p) => Some(
                (p.reserve(id, self.size(id), self.held_bytes())).ok_or_else(|| not_kept(id))?,
            ),
            None => None,
        };
        let claim = self.claims.claim(id);
        if self.contains(id) {
            return Ok(()); // whoever held the claim wrote it
        }
        let held = || self.held_bytes();
        let result = self.write_claimed(&claim, |out| {
            let mut within = room.as_ref().map(|r| r.writer(out, &held));
            let out: &mut dyn Write = match &mut within {
                Some(w) => w,
                None => out,
            };
            // Learned before the commit, which records it with the bytes.
            self.learn_mtime(id, self.source.copy_to(id, out)?.mtime);
            Ok(None)
        });
        match (&result, self.partial.get()) {
            (Ok(_), Some(partial)) => partial.read_from_source(self.size(id).unwrap_or(0)),
            // Past its room: no failure of the source (the reader gets it through memory).
            (Err(e), Some(_)) if is_not_kept(e) => return Err(not_kept(id)),
            _ => {}
        }
        if result.is_ok() {
            // Learned as it was written (see `write_claimed_from`).
            let len = self.size(id).unwrap_or(0);
            let stats = &self.stats;
            stats.fetched_from_source.fetch_add(1, Ordering::Relaxed);
            (stats.fetched_bytes_from_source).fetch_add(len, Ordering::Relaxed);
        }
        result.map(|_| ()).map_err(|e| self.source_failed(id, e))
    }

    /// A partial cache's `ids` of `epoch` were listed: those it does not keep are read
    /// ahead of the loader (`super::prefetch`) on a thread that holds the store only while
    /// it reads a sample.
    pub fn read_ahead_listed(self: &Arc<Self>, epoch: u64, ids: Vec<SampleId>) {
        let Some(partial) = self.partial.get() else {
            return;
        };
        if !partial.prefetch.listed(epoch, ids) {
            return;
        }
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("partial-prefetch".into())
            .spawn(move || read_ahead(&weak));
        if spawned.is_err() {
            partial.prefetch.not_started();
        }
    }

    /// Sample `id` read straight from the source into memory, bypassing the cache: what a
    /// reader gets when the cache cannot take the sample (its disk is full, say). Refused
    /// for samples over `max` bytes, which would cost too much memory.
    pub fn read_uncached(&self, id: SampleId, max: u64) -> io::Result<Vec<u8>> {
        self.read_through(id, max, true)
    }

    /// [`SampleStore::read_uncached`]; `taken`: bytes a lookup or the prefetch read already
    /// are taken (not by the prefetch itself, which would wait for itself).
    fn read_through(&self, id: SampleId, max: u64, taken: bool) -> io::Result<Vec<u8>> {
        let too_large = || {
            io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("too large to read through memory (limit {max} bytes)"),
            )
        };
        let want = self.size(id);
        if want.is_some_and(|w| w > max) {
            return Err(too_large());
        }
        if let Some(p) = self.partial.get().filter(|_| taken) {
            if let Some(bytes) = p.recall(id) {
                return Ok(bytes);
            }
            if let Some(bytes) = p.prefetch.take(id) {
                if want.is_none() {
                    // A lookup waited for it: the open that follows takes them too.
                    p.remember(id, &bytes);
                }
                return Ok(bytes);
            }
        }
        let mut out = Capped {
            bytes: Vec::with_capacity(want.unwrap_or(0) as usize),
            max: max as usize,
        };
        let copied = self.source.copy_to(id, &mut out).map_err(|e| {
            if e.kind() == io::ErrorKind::FileTooLarge {
                too_large()
            } else {
                e
            }
        })?;
        let got = out.bytes.len() as u64;
        if let Some(partial) = self.partial.get() {
            partial.read_from_source(got);
        }
        // Read through memory (or ahead of the loader), the source was read all the same:
        // the general counters (status, metrics, the epoch's log line) count it too.
        let stats = &self.stats;
        stats.fetched_from_source.fetch_add(1, Ordering::Relaxed);
        (stats.fetched_bytes_from_source).fetch_add(got, Ordering::Relaxed);
        if want.is_some_and(|w| w != got) {
            return Err(io::Error::other(format!(
                "sample is {got} bytes, it was {} when first read; it changed since",
                want.unwrap_or(0)
            )));
        }
        self.learn_size(id, got);
        self.learn_mtime(id, copied.mtime);
        if let (Some(partial), None) = (self.partial.get(), want) {
            // Read to learn its size (a lookup): the open that follows takes these bytes.
            partial.remember(id, &out.bytes);
        }
        Ok(out.bytes)
    }

    /// Writes sample `id` through `fill`, checks its length (and its checksum, if `fill`
    /// returns the one the bytes must have), then commits it with its checksum. Returns the
    /// checksum. A mismatch is an `InvalidData` error and is counted. Waits while another
    /// writer (a fetch, say) holds the sample.
    pub fn insert_with(
        &self,
        id: SampleId,
        fill: impl FnOnce(&mut dyn Write) -> io::Result<Option<u32>>,
    ) -> io::Result<u32> {
        let claim = self.claims.claim(id);
        self.write_claimed(&claim, fill)
    }

    fn write_claimed(
        &self,
        claim: &Claim<'_>,
        fill: impl FnOnce(&mut dyn Write) -> io::Result<Option<u32>>,
    ) -> io::Result<u32> {
        self.write_claimed_from(claim, Origin::Stream, fill)
    }

    fn write_claimed_from(
        &self,
        claim: &Claim<'_>,
        origin: Origin<'_>,
        fill: impl FnOnce(&mut dyn Write) -> io::Result<Option<u32>>,
    ) -> io::Result<u32> {
        let id = claim.id();
        let mut writer = self.backend.writer(claim)?;
        let was_present = self.contains(id);
        let mut out = CrcWriter {
            inner: &mut writer,
            crc: 0,
            len: 0,
        };
        let expected = fill(&mut out)?;
        let (crc, len) = (out.crc, out.len);
        self.check_written(id, crc, len, expected, origin)?;
        let mtime = match origin {
            Origin::Stream => self.mtime(id),
            Origin::PeerFile { mtime, .. } => mtime.or(self.mtime(id)),
        };
        // The size is learned before the commit makes the sample present: a reader that finds
        // it present (`ensure` answers at once) must find its size too (`resolve_size`). `len`
        // is checked above, so it is the sample's size even if the commit then fails.
        self.learn_size(id, len);
        writer.commit(Commit { crc, len, mtime })?;
        if let Origin::PeerFile { .. } = origin {
            self.learn_mtime(id, mtime);
        }
        if !was_present {
            self.count_in(id);
        }
        Ok(crc)
    }

    /// What every way in checks before a sample is committed: `len` is its known size, and
    /// `crc` (of the bytes written) is `expected` where given. A mismatch is an error
    /// (`InvalidData` for a checksum, counted unless it is the sender's unreadable mark).
    fn check_written(
        &self,
        id: SampleId,
        crc: u32,
        len: u64,
        expected: Option<u32>,
        origin: Origin<'_>,
    ) -> io::Result<()> {
        if let Some(want) = self.size(id).filter(|&w| w != len) {
            return Err(io::Error::other(format!(
                "sample is {len} bytes, it was {want} when first listed or read; it changed since"
            )));
        }
        if expected == Some(!crc) && matches!(origin, Origin::Stream) {
            // The sender's mark for "could not read it" (see `exchange::frames`): not a
            // corruption; the caller fetches the sample from the source.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the sender could not read this sample",
            ));
        }
        if let Some(expected) = expected.filter(|&e| e != crc) {
            let (problem, error) = match origin {
                Origin::Stream => (
                    format!(
                        "received copy of {} failed its checksum; it will be fetched from the source",
                        self.source.describe(id)
                    ),
                    format!(
                        "checksum mismatch: bytes have {crc:08x}, sender recorded {expected:08x}"
                    ),
                ),
                Origin::PeerFile { path, .. } => (
                    format!(
                        "copy of {} from peer cache file {} failed its checksum; it will be fetched from the source",
                        self.source.describe(id),
                        path.display()
                    ),
                    format!(
                        "checksum mismatch: peer cache file {} holds bytes with {crc:08x}, its record says {expected:08x}",
                        path.display()
                    ),
                ),
            };
            self.checksum_failed(problem);
            return Err(io::Error::new(io::ErrorKind::InvalidData, error));
        }
        Ok(())
    }

    /// [`insert_with`](Self::insert_with) for several whole samples at once, each
    /// `(id, bytes, checksum they must have)` with distinct ids: the same checks and results
    /// (one per sample, in order), for less per sample: the ids are claimed together and the
    /// backend commits the lot ([`CacheBackend::commit_batch`]; the packed one under one
    /// lock). What the exchange's receiver uses for runs of small samples in a frame.
    pub fn insert_batch(&self, batch: &[(SampleId, &[u8], u32)]) -> Vec<io::Result<u32>> {
        let ids: Vec<SampleId> = batch.iter().map(|b| b.0).collect();
        let claims = self.claims.claim_all(&ids);
        let mut results: Vec<io::Result<u32>> = Vec::with_capacity(batch.len());
        let mut commits = Vec::with_capacity(batch.len());
        let mut was_present = Vec::with_capacity(batch.len());
        for &(id, bytes, expected) in batch {
            let (crc, len) = (crc32c::crc32c(bytes), bytes.len() as u64);
            let checked = if id >= self.manifest.len() {
                Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("sample {id} is past the dataset"),
                ))
            } else {
                self.check_written(id, crc, len, Some(expected), Origin::Stream)
            };
            if checked.is_ok() {
                let mtime = self.mtime(id);
                commits.push((id, bytes, Commit { crc, len, mtime }));
                was_present.push(self.contains(id));
            }
            results.push(checked.map(|()| crc));
        }
        let committed = self.backend.commit_batch(&claims, &commits);
        let mut committed = committed.into_iter().zip(was_present).zip(&commits);
        for result in results.iter_mut().filter(|r| r.is_ok()) {
            let ((done, was_present), &(id, _, commit)) =
                committed.next().expect("one result per commit");
            match done {
                Ok(()) => {
                    self.learn_size(id, commit.len);
                    if !was_present {
                        self.count_in(id);
                    }
                }
                Err(e) => *result = Err(e),
            }
        }
        results
    }

    /// Takes sample `id` from the cache folder `peer_root` of another rank on this host (its
    /// file [`FileBackend::path_in`]`(peer_root, id)` and the checksum and length recorded
    /// on it), so that its bytes need not cross MPI: by hard link where the backend can
    /// (both caches on one filesystem, see `files.rs`), else by copying the file through the
    /// backend's writer, checked against the recorded checksum. Either way the sample then
    /// is exactly as if received: size, time (the peer file's), counters, checksum recorded,
    /// and durable after the next [`sync`](Self::sync).
    ///
    /// Errors, after which the caller gets the sample elsewhere (the source): the peer file
    /// is missing, not a regular file, has no record of checksum and length, or a length that
    /// contradicts its record or this sample's known size (`InvalidData`, naming the file);
    /// a copy whose bytes fail the recorded checksum is `InvalidData` and counted as a
    /// checksum failure. On any error nothing is stored, and the peer's file is never
    /// changed. Waits while another writer (a fetch, say) holds the sample; if that leaves
    /// it cached, takes nothing and answers [`Adopted::AlreadyHeld`].
    pub fn adopt_from_peer(&self, id: SampleId, peer_root: &Path) -> io::Result<Adopted> {
        let held = || Adopted::AlreadyHeld(self.size(id).unwrap_or(0));
        if self.contains(id) {
            return Ok(held());
        }
        let claim = self.claims.claim(id);
        if self.contains(id) {
            return Ok(held()); // whoever held the claim wrote it
        }
        let peer = FileBackend::open_peer(peer_root, id)?;
        let recorded = peer.recorded;
        // A partial cache takes it only within its size.
        let _room = self.room_for_received(id, recorded.len)?;
        if let Some(want) = self.size(id).filter(|&w| w != recorded.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "peer cache file {} is {} bytes, {} was {want} when first listed or read",
                    peer.path.display(),
                    recorded.len,
                    self.source.describe(id)
                ),
            ));
        }
        let adopted = if self.backend.adopt(&claim, &peer.path, recorded)? {
            self.learn_size(id, recorded.len);
            self.learn_mtime(id, recorded.mtime);
            self.count_in(id);
            self.stats.adopted_linked.fetch_add(1, Ordering::Relaxed);
            Adopted::Linked(recorded.len)
        } else {
            let origin = Origin::PeerFile {
                path: &peer.path,
                mtime: recorded.mtime,
            };
            self.write_claimed_from(&claim, origin, |out| {
                let copied = copy_all(&peer.file, out)?;
                if copied != recorded.len {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "peer cache file {} gave {copied} bytes, its record says {}",
                            peer.path.display(),
                            recorded.len
                        ),
                    ));
                }
                Ok(Some(recorded.crc))
            })?;
            self.stats.adopted_copied.fetch_add(1, Ordering::Relaxed);
            Adopted::Copied(recorded.len)
        };
        self.stats
            .adopted_bytes
            .fetch_add(recorded.len, Ordering::Relaxed);
        Ok(adopted)
    }

    /// Takes sample `id` from `other`, another cache folder on this host that no daemon
    /// writes (a gone rank's, see `node::regrow`): by [`adopt_from_peer`](Self::adopt_from_peer)
    /// when it keeps one file per sample, else by copying its record, checked against the
    /// checksum `other` recorded (a packed cache has no file to hand over).
    pub fn adopt_from_store(&self, id: SampleId, other: &SampleStore) -> io::Result<Adopted> {
        if other.layout() == super::CacheLayout::Files {
            return self.adopt_from_peer(id, other.dir().root());
        }
        if self.contains(id) {
            return Ok(Adopted::AlreadyHeld(self.size(id).unwrap_or(0)));
        }
        let claim = self.claims.claim(id);
        if self.contains(id) {
            return Ok(Adopted::AlreadyHeld(self.size(id).unwrap_or(0)));
        }
        // A partial cache takes it only within its size.
        let _room = self.room_for_received(id, other.size(id).unwrap_or(0))?;
        let mut stored = other.backend.open(id)?;
        self.write_claimed_from(&claim, Origin::Stream, |out| {
            io::copy(&mut stored.reader, out)?;
            Ok(stored.recorded_crc)
        })?;
        let len = self.size(id).unwrap_or(0);
        self.stats.adopted_copied.fetch_add(1, Ordering::Relaxed);
        self.stats.adopted_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(Adopted::Copied(len))
    }

    /// Opens sample `id` for reading whole (fetching it first if needed), with the checksum
    /// recorded when it was cached, if the backend kept one.
    pub fn open_checked(&self, id: SampleId) -> io::Result<Stored> {
        self.ensure(id)?;
        self.backend.open(id)
    }

    /// [`open_checked`](Self::open_checked) for each of `ids`, whole, handed to `each` in
    /// order with its position in `ids` (through [`CacheBackend::read_each`]): what the
    /// exchange's sender uses for runs of small samples.
    pub fn read_each(
        &self,
        ids: &[SampleId],
        each: &mut dyn FnMut(usize, io::Result<super::Borrowed<'_>>),
    ) {
        let mut failed: Vec<Option<io::Error>> =
            ids.iter().map(|&id| self.ensure(id).err()).collect();
        self.backend
            .read_each(ids, &mut |i, read| match failed[i].take() {
                Some(e) => each(i, Err(e)),
                None => each(i, read),
            });
    }

    /// Reads up to `buf.len()` bytes of cached sample `id` at `offset`; a cached copy that
    /// fails its checksum is never read (see [`checked`](Self::checked)).
    pub fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.checked(id, || self.backend.read_at(id, offset, buf))
    }

    /// Runs `read` (a checked read of the backend, see [`CacheBackend`]) on sample `id`;
    /// when its cached copy failed its checksum, the copy is dropped and counted, the sample
    /// fetched again from the source, and `read` runs once more.
    fn checked<T>(&self, id: SampleId, mut read: impl FnMut() -> io::Result<T>) -> io::Result<T> {
        let e = match read() {
            Err(e) => e,
            done => return done,
        };
        if super::ChecksumMismatch::find(&e).is_none() {
            return Err(e);
        }
        self.drop_if_corrupt(id);
        self.ensure(id)?;
        read()
    }

    /// Drops sample `id`'s cached copy if it still fails its checksum; returns whether it
    /// did. Under the sample's claim, so a reader and the scrub that both found one bad
    /// copy drop and count it once, and neither drops the good copy that replaced it.
    fn drop_if_corrupt(&self, id: SampleId) -> bool {
        let _claim = self.claims.claim(id);
        let Err(e) = self.backend.verify(id) else {
            return false;
        };
        let Some(bad) = super::ChecksumMismatch::find(&e) else {
            return false;
        };
        self.discard_corrupt(id, bad.found, bad.recorded);
        true
    }

    /// Checks every cached sample against its recorded checksum (those not checked since
    /// they last changed; see [`CacheBackend::verify`]), dropping and counting the ones that
    /// fail: what runs in the background after a remount, so a copy that rotted while the
    /// daemon was away is found before a reader asks for it. Stops early once `go_on`
    /// says so; returns how many samples failed.
    pub fn scrub(&self, go_on: &dyn Fn() -> bool) -> u64 {
        let mut failed = 0;
        for id in 0..self.manifest.len() {
            if !go_on() {
                break;
            }
            if !self.contains(id) {
                continue;
            }
            let Err(e) = self.backend.verify(id) else {
                continue;
            };
            if super::ChecksumMismatch::find(&e).is_some() && self.drop_if_corrupt(id) {
                failed += 1;
            }
        }
        failed
    }

    /// The whole of cached sample `id`.
    pub fn read(&self, id: SampleId) -> io::Result<Vec<u8>> {
        let mut bytes = vec![0u8; self.size(id).unwrap_or(0) as usize];
        let n = self.read_at(id, 0, &mut bytes)?;
        bytes.truncate(n);
        Ok(bytes)
    }

    /// A file holding cached sample `id`'s bytes, for the kernel to read directly; `None`
    /// if the backend keeps none (see `CacheBackend::file`).
    pub fn file(&self, id: SampleId) -> Option<io::Result<std::fs::File>> {
        let mut first = Some(self.backend.file(id)?);
        Some(self.checked(id, || {
            match first.take() {
                Some(file) => file,
                None => self
                    .backend
                    .file(id)
                    .unwrap_or_else(|| Err(io::ErrorKind::NotFound.into())),
            }
        }))
    }

    /// Drops a cached sample whose bytes no longer match their checksum; it is fetched
    /// again from the source when next needed.
    pub fn discard_corrupt(&self, id: SampleId, found: u32, recorded: u32) {
        tracing::warn!(
            sample = id,
            found = format!("{found:08x}"),
            recorded = format!("{recorded:08x}"),
            "cached sample failed its checksum; dropped, it will be fetched again from the source"
        );
        self.checksum_failed(format!(
            "cached copy of {} failed its checksum (found {found:08x}, recorded {recorded:08x}); dropped",
            self.source.describe(id)
        ));
        let _ = self.remove(id);
        // The size may have been learned from this very copy (a cache file torn by a crash):
        // forget it, so the refetch from the source is not refused as "changed since".
        if self.manifest.size(id).is_none() {
            self.learned.unlearn_size(id);
        }
    }

    fn checksum_failed(&self, what: String) {
        self.stats.checksum_failures.fetch_add(1, Ordering::Relaxed);
        self.stats.report_problem(what);
    }

    /// Makes everything written to the cache so far durable: the exchange calls it before
    /// telling a sender it may drop what it sent. Adopted samples included: a hard link's
    /// directory entries and the inode it names are on the cache's own filesystem (see
    /// `files.rs`).
    pub fn sync(&self) -> io::Result<()> {
        self.backend.sync()
    }

    /// Drops sample `id` from the cache. Readers that hold it open keep it.
    pub fn remove(&self, id: SampleId) -> io::Result<()> {
        if self.backend.remove(id)? {
            self.stats.files.fetch_sub(1, Ordering::Relaxed);
            let len = self.size(id).unwrap_or(0);
            self.stats.bytes.fetch_sub(len, Ordering::Relaxed);
            self.disk.fetch_sub(self.on_disk(len), Ordering::Relaxed);
        }
        Ok(())
    }
}

/// The prefetch thread: reads the queued samples the cache will not hold and no reader has
/// opened yet this epoch (`super::prefetch`).
fn read_ahead(store: &std::sync::Weak<SampleStore>) {
    use super::prefetch::{LARGEST, Next};
    loop {
        let Some(s) = store.upgrade() else { return };
        let Some(partial) = s.partial() else { return };
        let size_of = |id| s.size(id).unwrap_or(0);
        let (epoch, id) = match partial.prefetch.next(&size_of) {
            Next::Read(epoch, id) => (epoch, id),
            Next::Wait => continue,
            Next::Done => return,
        };
        // Marked as being read first: a reader that saw it after waits for these bytes.
        // The guard marks it done even if the read panics, so no reader waits on it.
        let mut done = ReadAheadDone {
            prefetch: &partial.prefetch,
            epoch,
            id,
            bytes: None,
        };
        let skip = s.contains(id) || partial.wanted(id) || partial.seen(id);
        // A failure is left to the reader, who reads it again and reports it.
        if !skip {
            done.bytes = s.read_through(id, LARGEST, false).ok();
        }
    }
}

/// Hands a read-ahead sample's outcome to the prefetch state when dropped (also on a panic).
struct ReadAheadDone<'a> {
    prefetch: &'a super::prefetch::Prefetch,
    epoch: u64,
    id: SampleId,
    bytes: Option<Vec<u8>>,
}

impl Drop for ReadAheadDone<'_> {
    fn drop(&mut self) {
        (self.prefetch).ready(self.epoch, self.id, self.bytes.take());
    }
}

/// Copies `from` to its end into `out`; returns the bytes copied.
fn copy_all(mut from: &std::fs::File, out: &mut dyn Write) -> io::Result<u64> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => {
                out.write_all(&buf[..n])?;
                total += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Collects bytes in memory, refusing (`FileTooLarge`) to hold more than `max`.
struct Capped {
    bytes: Vec<u8>,
    max: usize,
}

impl Write for Capped {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.bytes.len() + buf.len() > self.max {
            return Err(io::ErrorKind::FileTooLarge.into());
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Passes writes on, keeping the CRC-32C and length of what went through.
struct CrcWriter<'a, W: Write + ?Sized> {
    inner: &'a mut W,
    crc: u32,
    len: u64,
}

impl<W: Write + ?Sized> Write for CrcWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests;
mod through;
