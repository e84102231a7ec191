//! Packed storage: samples as records appended to a few large segment files, for datasets
//! of millions of small records (362 B text lines, 4 KB TFRecords) where one file per
//! sample would cost a create, a rename and an inode each, and a directory of millions.
//!
//! ```text
//! CACHE/segments/00000001.seg   records appended one after the other (format.rs)
//! CACHE/segments/00000002.seg   ...
//! CACHE/segments/<id>.spill     a sample larger than `spill_bytes` being written
//! ```
//! # Writing
//! A writer buffers its sample in memory; its commit appends header + bytes to the *active*
//! segment's batch buffer under one lock and points the in-memory index (id -> segment,
//! offset, length: 16 bytes a sample) at it. The batch goes to the file in one `pwrite`
//! once it holds `batch_bytes` (or a reader, `sync` or a roll needs it), so a small record
//! costs a memcpy, not a syscall. An uncommitted writer only ever touched its own buffer:
//! dropping it leaves nothing. When the active segment would pass `segment_bytes` it is
//! sealed and a new one started. A sample over `spill_bytes` is not buffered: its writer
//! streams it into its own `<id>.spill` file (unique: one writer per sample, by claim), and
//! the commit renames that file in as a one-record segment, so memory stays bounded.
//!
//! Concurrency: appends, removes and compaction moves all take the `active` lock first, then
//! the index's write lock; readers take the index's read lock just long enough to copy an
//! entry and an `Arc` of its segment file, then `pread` without any lock. A reader of a
//! record still in the batch buffer flushes the batch first.
//!
//! # What a crash leaves
//! Each record carries its own header checksum and data checksum, and a sequence number
//! ordering all records (see `format.rs`). After a crash:
//! - a record committed and followed by a completed [`sync`](CacheBackend::sync) (which
//!   flushes the batch and fdatasyncs every segment written since, then the folder) is on
//!   disk whole and found again;
//! - a record committed but not synced is either found whole (header and data checksums
//!   pass) or not at all; a torn tail (a header failing its checksum, or a record running
//!   past the end of the file) is truncated away at start-up;
//! - a record whose header is whole but whose data fails its checksum is skipped, and the
//!   scan goes on after it;
//! - a removed sample stays removed once its tombstone is synced: the tombstone has a
//!   higher sequence number than every record of that id before it;
//! - an uncommitted writer leaves at most a `.spill` file, deleted at start-up;
//! - a process that exits cleanly (the backend dropped) first writes its batch out, so, as
//!   with a file per sample, only a crash of the machine loses what was not synced; a
//!   killed process loses at most the last batch (`batch_bytes`) of commits and removes.
//!
//! Start-up ([`CacheBackend::recover`]) reads every segment once, sequentially, checking both
//! checksums of every record (the cost of a sequential read of the cache), and keeps, for
//! each id, the record with the highest sequence number if it is data that `keep` accepts.
//! Disk space for the batch is reserved (`fallocate`, keeping the file's size) before a
//! commit is accepted, so a full disk fails that commit, and the store serves the sample
//! from the source, as it does when it cannot create a file. A write that fails anyway (an
//! I/O error, a filesystem without `fallocate`) drops the batch it was in: the samples
//! committed into that batch become absent, exactly as a crash before `sync` would leave
//! them, and are fetched again when needed; the committer that hit the failure gets the
//! error.
//!
//! # Compaction
//! Removing or replacing a sample leaves its bytes dead in their segment. When a sealed
//! segment's dead bytes pass `compact_dead_percent` of it, a background thread (owning
//! nothing but a handle, fed by commands: see `compact.rs`) copies its live records, with
//! their sequence numbers, into the active segment, makes the copies durable, and only then
//! deletes the old segment. A reader that looked a record up before it moved holds the old
//! segment's open file, which stays readable after the unlink, and its bytes were never
//! changed: it gets the right bytes. Tombstones are copied along only while an older segment
//! may still hold a record they cancel.
//!
//! # Not here
//! No file per sample, so no FUSE passthrough ([`CacheBackend::file`] is `None`) and no
//! hard-link adoption from a peer's cache ([`CacheBackend::adopt`] is `Ok(false)`).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime};

use super::backend::{
    Borrowed, CacheBackend, ChecksumMismatch, Claim, ClaimSet, Commit, Recovered, SampleWriter,
    Stored,
};
use super::bitset::IdSet;
pub(crate) use super::own::SEGMENTS;
use super::table::DENSE_UP_TO;
use crate::plan::SampleId;
use crate::sys::io::read_full_at;
use crate::sys::sync::Locked;
use crate::sys::sync::RwLocked;
use entries::Entries;
use format::{HEADER, Header, Kind};

mod compact;
mod entries;
mod format;
mod recover;
#[cfg(test)]
mod tests;
mod writer;

/// Sizes and thresholds; [`Default`] is what the daemon uses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PackedConfig {
    /// A segment is sealed when the next record would take it past this (at most 4 GiB:
    /// offsets are kept in 32 bits).
    pub segment_bytes: u64,
    /// Committed records are written to the file once this many bytes are waiting.
    pub batch_bytes: usize,
    /// A sample larger than this is written to its own segment instead of through memory.
    pub spill_bytes: usize,
    /// A sealed segment is compacted once more than this percentage of it is dead.
    pub compact_dead_percent: u64,
    /// Whether the background thread compacts when nudged (tests turn it off to decide
    /// when compaction runs, through [`PackedBackend::compact_now`]).
    pub auto_compact: bool,
}

impl Default for PackedConfig {
    fn default() -> PackedConfig {
        PackedConfig {
            segment_bytes: 128 << 20,
            batch_bytes: 256 << 10,
            spill_bytes: 4 << 20,
            compact_dead_percent: 50,
            auto_compact: true,
        }
    }
}

/// Append-only segment storage; see the module docs.
pub struct PackedBackend {
    inner: Arc<Inner>,
    compactor: compact::Compactor,
    /// Samples whose stored record matched its checksum since the mount: a record is
    /// checked whole at its first read (`read_at`, `verify`). Records are never written in
    /// place, so one check per mount holds until the sample is dropped.
    checked: IdSet,
}

struct Inner {
    /// `CACHE/segments`.
    dir: PathBuf,
    /// Samples in the dataset: ids are below it.
    samples: u64,
    cfg: PackedConfig,
    state: RwLock<State>,
    /// Which samples the index holds, kept with it (under its write lock) so that
    /// `contains`, asked for every sample sent or received, takes no lock: a bit per id in
    /// a job of few ranks. A larger one asks the index's map under its read lock instead,
    /// as a set beside it cost ~19 bytes a stored sample; `None` then.
    present: Option<IdSet>,
    active: Mutex<Active>,
    /// Whether a nudge is already on its way to the compactor.
    nudged: AtomicBool,
    nudge: Mutex<Option<std::sync::mpsc::Sender<compact::Cmd>>>,
    /// Held by whoever compacts (the thread, or a caller of `compact_now`).
    compacting: Mutex<()>,
    /// Held for a whole `sync`: a second one (the exchange's, beside compaction's) must
    /// not return while the first is still syncing segments it took off the dirty list,
    /// records of the second's among them.
    syncing: Mutex<()>,
}

/// Where a stored sample's record is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Entry {
    /// Segment number; 0: not stored.
    seg: u32,
    /// Offset of the record's header in the segment.
    off: u32,
    /// Data length.
    len: u64,
}

/// An open segment file. Immutable once sealed; shared with readers, who keep it open
/// (and readable) after compaction unlinks it.
struct SegFile {
    num: u32,
    file: File,
    /// Bytes written to the file so far; records below it can be read.
    written: AtomicU64,
    /// The file mapped (past its end, for the active segment, so the mapping covers what
    /// will be appended): a small record is read with a copy from memory rather than a
    /// `pread` each, which costs a system call per record sent. `None` if mapping failed.
    map: Option<memmap2::Mmap>,
}

impl SegFile {
    /// Segment `num` in `file`, with `written` bytes so far, mapped for `map_len` bytes.
    fn new(num: u32, file: File, written: u64, map_len: u64) -> SegFile {
        let map = (map_len > 0)
            .then(|| {
                // SAFETY: the mapping is only read, and only below `written`: bytes this
                // process wrote to the file and never changes or truncates afterwards (a
                // failed batch truncates only above `written`; recovery truncates before
                // mapping), so no read sees bytes change or pages vanish. Another process
                // writing or truncating the cache's segment files would break this; the
                // cache folder's lock keeps other shufflefs daemons out, and the folder is
                // the daemon's own, like its files under the file layout.
                unsafe { memmap2::MmapOptions::new().len(map_len as usize).map(&file) }
            })
            .and_then(Result::ok);
        SegFile {
            num,
            file,
            written: AtomicU64::new(written),
            map,
        }
    }

    /// Reads `buf.len()` bytes at `pos` (all below `written`), short only at the file's end.
    fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<usize> {
        let end = pos as usize + buf.len();
        match &self.map {
            Some(map) if end <= map.len() => {
                buf.copy_from_slice(&map[pos as usize..end]);
                Ok(buf.len())
            }
            _ => read_full_at(&self.file, pos, buf),
        }
    }
}

struct SegInfo {
    file: Arc<SegFile>,
    /// Bytes of records in it.
    bytes: u64,
    /// Bytes of data records that are no longer the current copy of their sample.
    dead: u64,
    /// The lowest sequence number of a data record in it (`u64::MAX`: none).
    min_seq: u64,
}

struct State {
    index: Entries,
    segments: BTreeMap<u32, SegInfo>,
}

struct Active {
    seg: Arc<SegFile>,
    /// Logical length: written bytes plus `buf`.
    len: u64,
    /// Bytes of the segment's file with disk space reserved (see `reserve`).
    reserved: u64,
    /// Records committed but not yet written to the file.
    buf: Vec<u8>,
    /// The data records in `buf`, as (id, offset): unindexed if writing `buf` fails.
    pending: Vec<(SampleId, u32)>,
    next_seg: u32,
    next_seq: u64,
    /// Segments written since the last `sync`.
    dirty: BTreeMap<u32, Arc<SegFile>>,
    /// Names created or removed in the folder since the last `sync`.
    dir_dirty: bool,
}

fn seg_name(num: u32) -> String {
    format!("{num:08}.seg")
}

fn to_nanos(t: Option<SystemTime>) -> u64 {
    t.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
}

fn from_nanos(n: u64) -> Option<SystemTime> {
    (n != 0).then(|| SystemTime::UNIX_EPOCH + Duration::from_nanos(n))
}

fn create_segment(dir: &Path, num: u32, cfg: &PackedConfig) -> io::Result<Arc<SegFile>> {
    let file = super::private::file_options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(dir.join(seg_name(num)))?;
    // Room for the largest record that can start before `segment_bytes`.
    let map_len = cfg.segment_bytes + (HEADER + cfg.spill_bytes) as u64;
    Ok(Arc::new(SegFile::new(num, file, 0, map_len)))
}

impl PackedBackend {
    /// The packed backend in cache folder `root` for a dataset of `samples` samples in a
    /// job of `world` ranks (which shape its index takes: `entries`).
    pub(crate) fn open(root: &Path, samples: u64, world: u32) -> io::Result<PackedBackend> {
        PackedBackend::open_with(root, (samples, world), PackedConfig::default())
    }

    /// As [`open`](Self::open), with other sizes (tests use tiny segments).
    pub(crate) fn open_with(
        root: &Path,
        (samples, world): (u64, u32),
        cfg: PackedConfig,
    ) -> io::Result<PackedBackend> {
        assert!(
            cfg.segment_bytes <= u64::from(u32::MAX),
            "offsets are 32-bit"
        );
        let dir = root.join(SEGMENTS);
        super::private::create_dir(&dir)?;
        let mut last = 0;
        for entry in fs::read_dir(&dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".spill") && super::own::is_segment_name(&name) {
                // A writer that never committed.
                let _ = fs::remove_file(dir.join(&*name));
            } else if let Some(num) = recover::segment_number(&name) {
                last = last.max(num);
            }
        }
        let seg = create_segment(&dir, last + 1, &cfg)?;
        let mut segments = BTreeMap::new();
        segments.insert(seg.num, SegInfo::new(seg.clone()));
        let (tx, rx) = std::sync::mpsc::channel();
        let inner = Arc::new(Inner {
            dir,
            samples,
            cfg,
            state: RwLock::new(State {
                index: Entries::new(samples, world),
                segments,
            }),
            present: (world <= DENSE_UP_TO).then(|| IdSet::new(samples, world)),
            active: Mutex::new(Active {
                seg,
                len: 0,
                reserved: 0,
                buf: Vec::with_capacity(cfg.batch_bytes + HEADER),
                pending: Vec::new(),
                next_seg: last + 2,
                next_seq: 1,
                dirty: BTreeMap::new(),
                dir_dirty: true,
            }),
            nudged: AtomicBool::new(false),
            nudge: Mutex::new(Some(tx.clone())),
            compacting: Mutex::new(()),
            syncing: Mutex::new(()),
        });
        let compactor = compact::Compactor::start(inner.clone(), tx, rx)?;
        Ok(PackedBackend {
            inner,
            compactor,
            checked: IdSet::new(samples, world),
        })
    }

    /// Compacts every segment over the threshold now, on the calling thread; returns how
    /// many were compacted.
    #[cfg(test)]
    pub(crate) fn compact_now(&self) -> io::Result<usize> {
        self.inner.compact_candidates()
    }

    /// Segment files in the folder now, and the dead bytes in them (for tests and status).
    #[cfg(test)]
    pub(crate) fn segments(&self) -> (usize, u64) {
        let st = self.inner.read();
        (
            st.segments.len(),
            st.segments.values().map(|s| s.dead).sum(),
        )
    }
}

impl Drop for PackedBackend {
    /// Stops the compactor and writes the batch buffer out (not synced), so a clean exit
    /// leaves what a file per sample would: every commit and remove in the files, durable
    /// or not as the last `sync` left them.
    fn drop(&mut self) {
        self.inner.nudge.locked().take();
        self.compactor.stop();
        let mut a = self.inner.active.locked();
        if let Err(e) = self.inner.flush(&mut a) {
            tracing::warn!(error = %e, "writing the packed cache's last batch failed");
        }
    }
}

impl SegInfo {
    fn new(file: Arc<SegFile>) -> SegInfo {
        SegInfo {
            file,
            bytes: 0,
            dead: 0,
            min_seq: u64::MAX,
        }
    }
}

impl Inner {
    /// Keeps `present` (where there is one) with the index: `id` stored or not. Called
    /// under the index's write lock.
    fn mark(&self, id: SampleId, stored: bool) {
        match (&self.present, stored) {
            (Some(present), true) => drop(present.set(id)),
            (Some(present), false) => drop(present.clear(id)),
            (None, _) => {}
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read_locked()
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write_locked()
    }

    /// The entry of stored sample `id` and its segment file.
    fn locate(&self, id: SampleId) -> io::Result<(Entry, Arc<SegFile>)> {
        let st = self.read();
        match st.index.get(id) {
            e if e.seg != 0 => Ok((e, st.segments[&e.seg].file.clone())),
            _ => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("sample {id} is not in the packed cache"),
            )),
        }
    }

    /// The header of sample `id`'s record at `e` in `seg` (written), checked to be that
    /// record's.
    fn header(&self, seg: &SegFile, e: Entry, id: SampleId) -> io::Result<Header> {
        let start = u64::from(e.off);
        let mut header = [0u8; HEADER];
        if seg.read_at(start, &mut header)? < HEADER {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let h = Header::decode(&header)?;
        if h.kind != Kind::Data || h.id != id || h.len != e.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "segment {} at {start} holds another record than sample {id}",
                    seg_name(seg.num)
                ),
            ));
        }
        Ok(h)
    }

    /// Makes sure bytes up to `end` of `seg` are in the file (flushing the batch if needed).
    fn ensure_written(&self, seg: &SegFile, end: u64) -> io::Result<()> {
        if seg.written.load(Ordering::Acquire) >= end {
            return Ok(());
        }
        let mut a = self.active.locked();
        if a.seg.num == seg.num {
            self.flush(&mut a)?;
        }
        if seg.written.load(Ordering::Acquire) < end {
            return Err(io::Error::other(
                "the record was lost to a failed write; it will be fetched again",
            ));
        }
        Ok(())
    }

    /// Writes the batch buffer to the active segment. On failure, the records in it are
    /// dropped from the index (see the module docs) and the file cut back.
    fn flush(&self, a: &mut Active) -> io::Result<()> {
        if a.buf.is_empty() {
            return Ok(());
        }
        let at = a.seg.written.load(Ordering::Acquire);
        match a.seg.file.write_all_at(&a.buf, at) {
            Ok(()) => {
                a.seg
                    .written
                    .store(at + a.buf.len() as u64, Ordering::Release);
                a.buf.clear();
                a.pending.clear();
                a.dirty.insert(a.seg.num, a.seg.clone());
                Ok(())
            }
            Err(e) => {
                let num = a.seg.num;
                let mut st = self.write();
                let lost = a.pending.len();
                for (id, off) in a.pending.drain(..) {
                    let entry = st.index.get(id);
                    if entry.seg == num && entry.off == off {
                        st.index.set(id, Entry::default());
                        self.mark(id, false);
                    }
                }
                if let Some(info) = st.segments.get_mut(&num) {
                    info.bytes = at;
                    info.dead = info.dead.min(at);
                }
                drop(st);
                let _ = a.seg.file.set_len(at);
                a.buf.clear();
                a.len = at;
                tracing::warn!(error = %e, samples = lost, "writing to the packed cache failed; the samples of this batch are dropped and will be fetched again");
                Err(e)
            }
        }
    }

    /// Room for a record of `rec` bytes in the active segment: seals it and starts the
    /// next one when the record would take it past `segment_bytes`. Returns the offset.
    fn place(&self, a: &mut Active, rec: u64) -> io::Result<u32> {
        if a.len > 0 && a.len + rec > self.cfg.segment_bytes {
            self.flush(a)?;
            let seg = create_segment(&self.dir, a.next_seg, &self.cfg)?;
            a.next_seg += 1;
            a.dir_dirty = true;
            self.write()
                .segments
                .insert(seg.num, SegInfo::new(seg.clone()));
            a.seg = seg;
            a.len = 0;
            a.reserved = 0;
            // The sealed one may already be worth compacting.
            self.nudge_if_worthwhile();
        }
        Ok(a.len as u32)
    }

    /// Appends `h` (with data `data` for a data record) to the active segment and, unless it
    /// is a tombstone being carried by compaction (`index` false), makes the index say what
    /// it says: where the id's bytes now are, or that it is removed. Caller holds `active`.
    fn append(&self, a: &mut Active, h: &Header, data: &[u8], index: bool) -> io::Result<()> {
        let rec = h.record_len();
        let off = self.place(a, rec)?;
        self.reserve(a, u64::from(off) + rec)?;
        a.buf.extend_from_slice(&h.encode());
        a.buf.extend_from_slice(data);
        a.len += rec;
        let num = a.seg.num;
        let mut st = self.write();
        let info = st.segments.get_mut(&num).expect("active segment listed");
        info.bytes += rec;
        let entry = match h.kind {
            Kind::Data => {
                info.min_seq = info.min_seq.min(h.seq);
                a.pending.push((h.id, off));
                Entry {
                    seg: num,
                    off,
                    len: h.len,
                }
            }
            Kind::Tombstone => Entry::default(),
        };
        let worth = index && {
            let old = st.index.set(h.id, entry);
            self.mark(h.id, h.kind == Kind::Data);
            st.mark_dead(old, &self.cfg, num)
        };
        drop(st);
        if worth {
            self.nudge_if_worthwhile();
        }
        if a.buf.len() >= self.cfg.batch_bytes {
            self.flush(a)?;
        }
        Ok(())
    }

    /// [`append`](Self::append) for several data records (`h.kind` is data, `data` at most
    /// `spill_bytes`), indexing them under one hold of the index's write lock rather than
    /// one per record: each is indexed before any flush or roll that could drop it, so a
    /// failed write unindexes it as it would one appended alone. One result per record:
    /// an error means that record is not stored (the others are as if appended one by one).
    fn append_data(&self, a: &mut Active, recs: &[(Header, &[u8])]) -> Vec<io::Result<()>> {
        let mut results = Vec::with_capacity(recs.len());
        let mut staged: Vec<(u32, &Header)> = Vec::with_capacity(recs.len());
        for (h, data) in recs {
            let rec = h.record_len();
            if a.len > 0 && a.len + rec > self.cfg.segment_bytes {
                self.index_staged(a, &mut staged);
            }
            let placed = self
                .place(a, rec)
                .and_then(|off| self.reserve(a, u64::from(off) + rec).map(|()| off));
            let off = match placed {
                Ok(off) => off,
                Err(e) => {
                    results.push(Err(e));
                    continue;
                }
            };
            a.buf.extend_from_slice(&h.encode());
            a.buf.extend_from_slice(data);
            a.len += rec;
            a.pending.push((h.id, off));
            staged.push((off, h));
            if a.buf.len() >= self.cfg.batch_bytes {
                self.index_staged(a, &mut staged);
                results.push(self.flush(a));
            } else {
                results.push(Ok(()));
            }
        }
        self.index_staged(a, &mut staged);
        results
    }

    /// Points the index at `staged` records (offset, header), all in the active segment's
    /// batch buffer.
    fn index_staged(&self, a: &Active, staged: &mut Vec<(u32, &Header)>) {
        if staged.is_empty() {
            return;
        }
        let num = a.seg.num;
        let mut worth = false;
        let mut st = self.write();
        for (off, h) in staged.drain(..) {
            let info = st.segments.get_mut(&num).expect("active segment listed");
            info.bytes += h.record_len();
            info.min_seq = info.min_seq.min(h.seq);
            let entry = Entry {
                seg: num,
                off,
                len: h.len,
            };
            let old = st.index.set(h.id, entry);
            self.mark(h.id, true);
            worth |= st.mark_dead(old, &self.cfg, num);
        }
        drop(st);
        if worth {
            self.nudge_if_worthwhile();
        }
    }

    /// Reserves disk space in the active segment's file up to `end` (in steps of
    /// `RESERVE_STEP`, else exactly), so that a full disk fails the commit that needs the
    /// space, when the store can still serve the sample from the source, rather than the
    /// later write of a batch that other commits already count on. A filesystem without
    /// `fallocate` reserves nothing: its write errors come at `flush` (see the module docs).
    fn reserve(&self, a: &mut Active, end: u64) -> io::Result<()> {
        /// Reserved at once: one `fallocate` per this many bytes appended.
        const RESERVE_STEP: u64 = 1 << 20;
        if end <= a.reserved {
            return Ok(());
        }
        let keep_size = nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
        let mut result = Err(nix::errno::Errno::ENOSPC);
        // A step only where the disk has ample room: a step that fails takes the disk's
        // last bytes for a moment (tmpfs allocates, then gives back), and another cache on
        // that disk (a rank beside this one) meets a full disk meanwhile.
        let step = end.div_ceil(RESERVE_STEP) * RESERVE_STEP;
        let free = nix::sys::statvfs::fstatvfs(&a.seg.file)
            .map_or(0, |s| s.blocks_available() * s.fragment_size().max(1));
        let step = match free > 4 * (step - a.reserved) {
            true => step,
            false => end,
        };
        for to in [step, end] {
            let len = (to - a.reserved) as libc::off_t;
            result = nix::fcntl::fallocate(&a.seg.file, keep_size, a.reserved as libc::off_t, len);
            if result.is_ok() {
                a.reserved = to;
                return Ok(());
            }
        }
        match result {
            Err(nix::errno::Errno::EOPNOTSUPP) => {
                a.reserved = u64::MAX;
                Ok(())
            }
            _ => Err(io::Error::from(result.expect_err("not reserved"))),
        }
    }

    fn nudge_if_worthwhile(&self) {
        if self.cfg.auto_compact
            && !self.nudged.swap(true, Ordering::AcqRel)
            && let Some(tx) = self.nudge.locked().as_ref()
        {
            let _ = tx.send(compact::Cmd::Nudge);
        }
    }

    fn sync(&self) -> io::Result<()> {
        let _syncing = self.syncing.locked();
        let (dirty, dir_dirty) = {
            let mut a = self.active.locked();
            self.flush(&mut a)?;
            (
                std::mem::take(&mut a.dirty),
                std::mem::replace(&mut a.dir_dirty, false),
            )
        };
        let result = dirty
            .values()
            .try_for_each(|seg| seg.file.sync_data())
            .and_then(|()| match dir_dirty {
                true => File::open(&self.dir)?.sync_all(),
                false => Ok(()),
            });
        if result.is_err() {
            let mut a = self.active.locked();
            a.dirty.extend(dirty);
            a.dir_dirty |= dir_dirty;
        }
        result
    }
}

impl State {
    /// Counts `old` (an index entry just replaced) as dead bytes; whether its segment, if
    /// sealed (not `active`), is now worth compacting.
    fn mark_dead(&mut self, old: Entry, cfg: &PackedConfig, active: u32) -> bool {
        if old.seg == 0 {
            return false;
        }
        let Some(info) = self.segments.get_mut(&old.seg) else {
            return false;
        };
        info.dead += HEADER as u64 + old.len;
        old.seg != active && info.worth_compacting(cfg)
    }
}

impl SegInfo {
    fn worth_compacting(&self, cfg: &PackedConfig) -> bool {
        self.dead > 0 && self.dead * 100 > self.bytes * cfg.compact_dead_percent
    }
}

impl CacheBackend for PackedBackend {
    fn recover(&self, keep: &dyn Fn(SampleId, u64) -> bool) -> io::Result<Vec<Recovered>> {
        recover::recover(&self.inner, keep)
    }

    fn contains(&self, id: SampleId) -> bool {
        id < self.inner.samples
            && match &self.inner.present {
                Some(present) => present.get(id),
                None => self.inner.read().index.get(id).seg != 0,
            }
    }

    fn held(&self) -> Vec<SampleId> {
        let mut held = match &self.inner.present {
            Some(present) => present.held(),
            None => {
                let mut ids: Vec<SampleId> =
                    self.inner.read().index.stored().map(|e| e.0).collect();
                ids.sort_unstable();
                ids
            }
        };
        held.retain(|&id| id < self.inner.samples);
        held
    }

    fn size(&self, id: SampleId) -> Option<u64> {
        let e = self.inner.read().index.get(id);
        (e.seg != 0).then_some(e.len)
    }

    /// A read of the whole record is checked against its checksum every time (cheap beside
    /// the copy); a part of one is read once its record was checked since the mount.
    fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let (e, seg) = self.inner.locate(id)?;
        let whole = offset == 0 && buf.len() as u64 >= e.len;
        if !whole && !self.checked.get(id) {
            self.verify(id)?;
        }
        if offset >= e.len {
            return Ok(0);
        }
        let n = buf.len().min((e.len - offset) as usize);
        let pos = u64::from(e.off) + HEADER as u64 + offset;
        self.inner.ensure_written(&seg, pos + n as u64)?;
        let read = seg.read_at(pos, &mut buf[..n])?;
        if whole {
            let recorded = self.inner.header(&seg, e, id)?.crc;
            let found = crc32c::crc32c(&buf[..read]);
            if found != recorded {
                return Err(ChecksumMismatch {
                    id,
                    found,
                    recorded,
                }
                .into_io());
            }
        }
        Ok(read)
    }

    fn open(&self, id: SampleId) -> io::Result<Stored> {
        let (e, seg) = self.inner.locate(id)?;
        let start = u64::from(e.off);
        let end = start + HEADER as u64 + e.len;
        self.inner.ensure_written(&seg, end)?;
        let h = self.inner.header(&seg, e, id)?;
        // Reads straight from the segment (its mapping, for most): no copy in between.
        Ok(Stored {
            reader: Box::new(SegReader {
                seg,
                pos: start + HEADER as u64,
                end,
            }),
            recorded_crc: Some(h.crc),
        })
    }

    /// Looks every id up under one read lock of the index, then lends each record's bytes
    /// straight from its segment's mapping (after the checks [`open`](Self::open) makes);
    /// a record outside a mapping is read through `open`.
    fn read_each(&self, ids: &[SampleId], each: &mut dyn FnMut(usize, io::Result<Borrowed<'_>>)) {
        let mut segs: Vec<Arc<SegFile>> = Vec::new();
        let located: Vec<Option<(Entry, usize)>> = {
            let st = self.inner.read();
            ids.iter()
                .map(|&id| match st.index.get(id) {
                    e if e.seg != 0 => {
                        if segs.last().is_none_or(|s| s.num != e.seg) {
                            segs.push(st.segments[&e.seg].file.clone());
                        }
                        Some((e, segs.len() - 1))
                    }
                    _ => None,
                })
                .collect()
        };
        let mut scratch = Vec::new();
        for (i, (&id, found)) in ids.iter().zip(located).enumerate() {
            let Some((e, k)) = found else {
                each(
                    i,
                    Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("sample {id} is not in the packed cache"),
                    )),
                );
                continue;
            };
            let seg = &segs[k];
            let start = u64::from(e.off);
            let end = start + HEADER as u64 + e.len;
            let mapped = seg.map.as_ref().filter(|m| end as usize <= m.len());
            let Some(map) = mapped else {
                let read = self.open(id).and_then(|mut s| {
                    scratch.clear();
                    s.reader.read_to_end(&mut scratch)?;
                    Ok(s.recorded_crc)
                });
                each(
                    i,
                    read.map(|recorded_crc| Borrowed {
                        bytes: &scratch,
                        recorded_crc,
                    }),
                );
                continue;
            };
            let record = self.inner.ensure_written(seg, end).and_then(|()| {
                let header = &map[start as usize..start as usize + HEADER];
                let h = Header::decode(header.try_into().expect("HEADER bytes"))?;
                if h.kind != Kind::Data || h.id != id || h.len != e.len {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "segment {} at {start} holds another record than sample {id}",
                            seg_name(seg.num)
                        ),
                    ));
                }
                Ok(h.crc)
            });
            each(
                i,
                record.map(|crc| Borrowed {
                    bytes: &map[start as usize + HEADER..end as usize],
                    recorded_crc: Some(crc),
                }),
            );
        }
    }

    fn writer<'a>(&'a self, claim: &Claim<'_>) -> io::Result<Box<dyn SampleWriter + 'a>> {
        let id = claim.id();
        if id >= self.inner.samples {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("sample {id} is past the dataset"),
            ));
        }
        Ok(Box::new(writer::PackedWriter::new(&self.inner, id)))
    }

    /// Appends the lot under one hold of the `active` lock (each record as a commit through
    /// a writer appends it); a sample over `spill_bytes` goes through its writer.
    fn commit_batch(
        &self,
        claims: &ClaimSet<'_>,
        batch: &[(SampleId, &[u8], Commit)],
    ) -> Vec<io::Result<()>> {
        let inner = &self.inner;
        // Checked first; what passes is appended in runs between samples that spill.
        let mut results: Vec<Option<io::Result<()>>> = Vec::with_capacity(batch.len());
        let mut run: Vec<(usize, Header, &[u8])> = Vec::new();
        let mut a = inner.active.locked();
        for (i, &(id, bytes, commit)) in batch.iter().enumerate() {
            let refused = if !claims.contains(id) {
                Some(format!("sample {id} is not claimed"))
            } else if id >= inner.samples {
                Some(format!("sample {id} is past the dataset"))
            } else if bytes.len() as u64 != commit.len {
                Some(format!(
                    "sample {id}: {} bytes written, commit says {}",
                    bytes.len(),
                    commit.len
                ))
            } else {
                None
            };
            if let Some(why) = refused {
                results.push(Some(Err(io::Error::new(io::ErrorKind::InvalidInput, why))));
            } else if bytes.len() > inner.cfg.spill_bytes {
                Self::append_run(inner, &mut a, &mut run, &mut results);
                drop(a);
                results.push(Some(claims.get(id).and_then(|claim| {
                    let mut w = self.writer(&claim)?;
                    w.write_all(bytes)?;
                    w.commit(commit)
                })));
                a = inner.active.locked();
            } else {
                let h = Header {
                    kind: Kind::Data,
                    id,
                    crc: commit.crc,
                    len: commit.len,
                    seq: a.next_seq,
                    mtime: to_nanos(commit.mtime),
                };
                a.next_seq += 1;
                run.push((i, h, bytes));
                results.push(None);
            }
        }
        Self::append_run(inner, &mut a, &mut run, &mut results);
        results
            .into_iter()
            .map(|r| r.expect("every result filled"))
            .collect()
    }

    fn remove(&self, id: SampleId) -> io::Result<bool> {
        let inner = &self.inner;
        let mut a = inner.active.locked();
        if !self.contains(id) {
            return Ok(false);
        }
        let seq = a.next_seq;
        a.next_seq += 1;
        inner.append(&mut a, &Header::tombstone(id, seq), &[], true)?;
        self.checked.clear(id);
        Ok(true)
    }

    fn clear(&self) -> io::Result<()> {
        let inner = &self.inner;
        let _compacting = inner.compacting.locked();
        let mut a = inner.active.locked();
        let mut st = inner.write();
        for &num in st.segments.keys() {
            match fs::remove_file(inner.dir.join(seg_name(num))) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        st.segments.clear();
        st.index = st.index.emptied();
        if let Some(present) = &inner.present {
            present.clear_all();
        }
        self.checked.clear_all();
        let seg = create_segment(&inner.dir, a.next_seg, &inner.cfg)?;
        a.next_seg += 1;
        st.segments.insert(seg.num, SegInfo::new(seg.clone()));
        a.seg = seg;
        a.len = 0;
        a.reserved = 0;
        a.buf.clear();
        a.pending.clear();
        a.dirty.clear();
        a.dir_dirty = true;
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }

    fn file(&self, _id: SampleId) -> Option<io::Result<File>> {
        None
    }

    fn verify(&self, id: SampleId) -> io::Result<()> {
        let mut stored = self.open(id)?;
        let mut crc = 0u32;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stored.reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => crc = crc32c::crc32c_append(crc, &buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        match stored.recorded_crc {
            Some(recorded) if recorded != crc => Err(ChecksumMismatch {
                id,
                found: crc,
                recorded,
            }
            .into_io()),
            _ => {
                self.checked.set(id);
                Ok(())
            }
        }
    }

    fn layout(&self) -> super::CacheLayout {
        super::CacheLayout::Packed
    }

    /// Every segment's records, dead ones and tombstones included.
    fn disk_bytes(&self) -> Option<u64> {
        Some(self.inner.read().segments.values().map(|s| s.bytes).sum())
    }
}

impl PackedBackend {
    /// Appends `run`'s records, filling in their results.
    fn append_run(
        inner: &Inner,
        a: &mut Active,
        run: &mut Vec<(usize, Header, &[u8])>,
        results: &mut [Option<io::Result<()>>],
    ) {
        if run.is_empty() {
            return;
        }
        let recs: Vec<(Header, &[u8])> = run.iter().map(|&(_, h, d)| (h, d)).collect();
        let done = inner.append_data(a, &recs);
        for ((i, _, _), r) in run.drain(..).zip(done) {
            results[i] = Some(r);
        }
    }
}

/// Streams a record's data from its segment.
struct SegReader {
    seg: Arc<SegFile>,
    pos: u64,
    end: u64,
}

impl Read for SegReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min((self.end - self.pos) as usize);
        let got = self.seg.read_at(self.pos, &mut buf[..n])?;
        self.pos += got as u64;
        Ok(got)
    }
}
