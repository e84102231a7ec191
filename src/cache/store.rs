//! The cached samples of one rank: which are present, their sizes once known, fetching from
//! the source on demand, and writing a sample in (temp name, checksum, rename).

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use xattr::FileExt as _;

use super::{CRC_XATTR, CacheDir, CacheError};
use crate::dataset::manifest::{Manifest, UNKNOWN_SIZE};
use crate::dataset::source::SampleSource;
use crate::plan::SampleId;

/// A fixed-size set of sample ids, safe to update from many threads.
pub struct Bitset(Vec<AtomicU64>);

impl Bitset {
    pub fn new(len: u32) -> Bitset {
        Bitset((0..len.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }
    pub fn get(&self, i: u32) -> bool {
        self.0[(i / 64) as usize].load(Ordering::Acquire) & (1 << (i % 64)) != 0
    }
    /// Sets bit `i`; returns whether it was already set.
    pub fn set(&self, i: u32) -> bool {
        self.0[(i / 64) as usize].fetch_or(1 << (i % 64), Ordering::AcqRel) & (1 << (i % 64)) != 0
    }
    /// Clears bit `i`; returns whether it was set.
    pub fn clear(&self, i: u32) -> bool {
        self.0[(i / 64) as usize].fetch_and(!(1 << (i % 64)), Ordering::AcqRel) & (1 << (i % 64))
            != 0
    }
}

/// Counters shown in the status.
#[derive(Default)]
pub struct StoreStats {
    pub files: AtomicU64,
    pub bytes: AtomicU64,
    pub fetched_from_source: AtomicU64,
    pub source_errors: AtomicU64,
    /// Cached or received samples whose bytes did not match their checksum.
    pub checksum_failures: AtomicU64,
    /// The latest problems (source errors, checksum failures), newest last, for the status.
    problems: Mutex<std::collections::VecDeque<String>>,
}

impl StoreStats {
    const KEEP_PROBLEMS: usize = 16;

    pub fn report_problem(&self, what: String) {
        let mut p = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        if p.len() == Self::KEEP_PROBLEMS {
            p.pop_front();
        }
        p.push_back(what);
    }

    pub fn problems(&self) -> Vec<String> {
        let p = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        p.iter().cloned().collect()
    }
}

/// The cached samples of one rank, filled from the source on demand.
pub struct SampleStore {
    dir: CacheDir,
    manifest: Arc<Manifest>,
    source: Arc<dyn SampleSource>,
    present: Bitset,
    /// Each sample's size once known ([`UNKNOWN_SIZE`] before): from the manifest where it
    /// has one, else learned when the sample is first written into the cache (fetched,
    /// received, or found there at start-up). A sample never changes size once known.
    sizes: Vec<AtomicU64>,
    /// Serializes fetches of the same sample (striped by id) so two readers never copy it twice.
    stripes: Vec<Mutex<()>>,
    pub stats: StoreStats,
}

impl SampleStore {
    /// Indexes what `dir` already holds, dropping files that are not complete samples.
    pub fn new(
        dir: CacheDir,
        manifest: Arc<Manifest>,
        source: Arc<dyn SampleSource>,
    ) -> Result<SampleStore, CacheError> {
        let store = SampleStore {
            present: Bitset::new(manifest.len()),
            sizes: (0..manifest.len())
                .map(|id| AtomicU64::new(manifest.size(id).unwrap_or(UNKNOWN_SIZE)))
                .collect(),
            stripes: (0..256).map(|_| Mutex::new(())).collect(),
            stats: StoreStats::default(),
            dir,
            manifest,
            source,
        };
        let samples = store.dir.root.join("samples");
        for entry in fs::read_dir(&samples).map_err(store.dir.io_err())? {
            let entry = entry.map_err(store.dir.io_err())?;
            let id = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<SampleId>().ok());
            let len = entry.metadata().map(|m| m.len()).ok();
            // A file renamed in before a crash may have lost data the rename did not wait
            // for; the length recorded beside its checksum catches it coming back short.
            let recorded = xattr::get(entry.path(), CRC_XATTR)
                .ok()
                .flatten()
                .and_then(|v| Recorded::decode(&v));
            match (id, len) {
                (Some(id), Some(len))
                    if id < store.manifest.len()
                        && store.size(id).is_none_or(|size| size == len)
                        && recorded.is_none_or(|r| r.len.is_none_or(|l| l == len)) =>
                {
                    store.learn_size(id, len);
                    store.mark_present(id);
                }
                _ => {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
        Ok(store)
    }

    pub fn dir(&self) -> &CacheDir {
        &self.dir
    }

    pub fn manifest(&self) -> &Arc<Manifest> {
        &self.manifest
    }

    pub fn contains(&self, id: SampleId) -> bool {
        self.present.get(id)
    }

    pub fn path(&self, id: SampleId) -> PathBuf {
        self.dir.root.join("samples").join(id.to_string())
    }

    /// The size of sample `id`, if known yet (see `sizes`).
    pub fn size(&self, id: SampleId) -> Option<u64> {
        let size = self.sizes[id as usize].load(Ordering::Relaxed);
        (size != UNKNOWN_SIZE).then_some(size)
    }

    /// Records a size only if none is known: a known size never changes behind a caller's
    /// back (the callers check a new length against a known one first).
    fn learn_size(&self, id: SampleId, len: u64) {
        let _ = self.sizes[id as usize].compare_exchange(
            UNKNOWN_SIZE,
            len,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
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

    /// Call after `learn_size`.
    fn mark_present(&self, id: SampleId) {
        if !self.present.set(id) {
            self.stats.files.fetch_add(1, Ordering::Relaxed);
            self.stats
                .bytes
                .fetch_add(self.size(id).unwrap_or(0), Ordering::Relaxed);
        }
    }

    /// Makes sure sample `id` is cached, copying it from the source if needed.
    pub fn ensure(&self, id: SampleId) -> io::Result<()> {
        if self.contains(id) {
            return Ok(());
        }
        let _guard = self.stripes[id as usize % self.stripes.len()]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if self.contains(id) {
            return Ok(());
        }
        let result = self
            .insert_with(id, |out| self.source.copy_to(id, out).map(|_| None))
            .map(|_| ());
        match &result {
            Ok(()) => self
                .stats
                .fetched_from_source
                .fetch_add(1, Ordering::Relaxed),
            Err(_) => self.stats.source_errors.fetch_add(1, Ordering::Relaxed),
        };
        result.map_err(|e| {
            let e = io::Error::new(e.kind(), format!("{}: {e}", self.source.describe(id)));
            self.stats.report_problem(e.to_string());
            e
        })
    }

    /// Sample `id` read straight from the source into memory, bypassing the cache: what a
    /// reader gets when the cache cannot take the sample (its disk is full, say). Refused
    /// for samples over `max` bytes, which would cost too much memory.
    pub fn read_uncached(&self, id: SampleId, max: u64) -> io::Result<Vec<u8>> {
        let too_large = || {
            io::Error::other(format!(
                "{}: too large to serve without the cache (limit {max} bytes)",
                self.source.describe(id)
            ))
        };
        let want = self.size(id);
        if want.is_some_and(|w| w > max) {
            return Err(too_large());
        }
        let mut out = Capped {
            bytes: Vec::with_capacity(want.unwrap_or(0) as usize),
            max: max as usize,
        };
        self.source.copy_to(id, &mut out).map_err(|e| {
            if e.kind() == io::ErrorKind::FileTooLarge {
                too_large()
            } else {
                e
            }
        })?;
        let got = out.bytes.len() as u64;
        if want.is_some_and(|w| w != got) {
            return Err(io::Error::other(format!(
                "{}: sample is {got} bytes, it was {} when first read; it changed since",
                self.source.describe(id),
                want.unwrap_or(0)
            )));
        }
        self.learn_size(id, got);
        Ok(out.bytes)
    }

    /// Writes sample `id` through `fill` into `tmp/`, checks its length (and its checksum,
    /// if `fill` returns the one the bytes must have), records the checksum, then renames it
    /// in. Returns the checksum. A mismatch is an `InvalidData` error and is counted.
    pub fn insert_with(
        &self,
        id: SampleId,
        fill: impl FnOnce(&mut dyn Write) -> io::Result<Option<u32>>,
    ) -> io::Result<u32> {
        let tmp = self
            .dir
            .root
            .join("tmp")
            .join(format!("{id}.{}", std::process::id()));
        let mut file = File::create(&tmp)?;
        let mut out = CrcWriter {
            file: &mut file,
            crc: 0,
            len: 0,
        };
        let checked = fill(&mut out).and_then(|expected| {
            let (n, crc) = (out.len, out.crc);
            if let Some(want) = self.size(id).filter(|&w| w != n) {
                return Err(io::Error::other(format!(
                    "sample is {n} bytes, it was {want} when first listed or read; it changed since"
                )));
            }
            if let Some(expected) = expected.filter(|&e| e != crc) {
                self.checksum_failed(format!(
                    "received copy of {} failed its checksum; it will be fetched from the source",
                    self.source.describe(id)
                ));
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "checksum mismatch: bytes have {crc:08x}, sender recorded {expected:08x}"
                    ),
                ));
            }
            set_crc(&file, crc, n)?;
            Ok((crc, n))
        });
        let (crc, len) = match checked {
            Ok(checked) => checked,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        drop(file);
        fs::rename(&tmp, self.path(id))?;
        self.learn_size(id, len);
        self.mark_present(id);
        Ok(crc)
    }

    /// Opens sample `id` for reading (fetching it first if needed), with the checksum
    /// recorded when it was cached, if the filesystem kept one.
    pub fn open_checked(&self, id: SampleId) -> io::Result<(File, Option<u32>)> {
        self.ensure(id)?;
        let file = File::open(self.path(id))?;
        let crc = file
            .get_xattr(CRC_XATTR)
            .ok()
            .flatten()
            .and_then(|v| Recorded::decode(&v))
            .map(|r| r.crc);
        Ok((file, crc))
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
            self.sizes[id as usize].store(UNKNOWN_SIZE, Ordering::Relaxed);
        }
    }

    fn checksum_failed(&self, what: String) {
        self.stats.checksum_failures.fetch_add(1, Ordering::Relaxed);
        self.stats.report_problem(what);
    }

    /// Makes everything written to the cache so far durable (one `syncfs`, not one fsync
    /// per file): the exchange calls it before telling a sender it may drop what it sent.
    pub fn sync(&self) -> io::Result<()> {
        let dir = File::open(&self.dir.root)?;
        nix::unistd::syncfs(&dir).map_err(io::Error::from)
    }

    /// Drops sample `id` from the cache. Open file descriptors keep working.
    pub fn remove(&self, id: SampleId) -> io::Result<()> {
        if self.present.clear(id) {
            self.stats.files.fetch_sub(1, Ordering::Relaxed);
            self.stats
                .bytes
                .fetch_sub(self.size(id).unwrap_or(0), Ordering::Relaxed);
            match fs::remove_file(self.path(id)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
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

/// Passes writes to a file, keeping the CRC-32C and length of what went through.
struct CrcWriter<'a> {
    file: &'a mut File,
    crc: u32,
    len: u64,
}

impl Write for CrcWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}
