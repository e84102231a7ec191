//! Start-up: rebuilding the index by reading every segment once (see the module docs for
//! what a crash can leave, and `format.rs` for the record layout).

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, OpenOptions};
use std::io::{self, BufReader, Read};
use std::sync::Arc;

use super::entries::Entries;
use super::format::{HEADER, Header, Kind};
use super::{Entry, Inner, SegFile, SegInfo, from_nanos, seg_name};
use crate::cache::backend::Recovered;
use crate::plan::SampleId;
use crate::sys::sync::Locked;

/// The number of a segment file name (`00000012.seg`), if it is one.
pub(super) fn segment_number(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".seg")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&n| n != 0)
}

/// What the scan learned of one segment.
struct Scanned {
    file: fs::File,
    bytes: u64,
    tombstones: u64,
    min_seq: u64,
}

/// The newest record of one sample seen so far in the scan.
#[derive(Clone, Copy, Default)]
struct Newest {
    seq: u64,
    /// Where it is (default if a tombstone).
    entry: Entry,
    /// Its source time.
    mtime: u64,
}

/// The newest record of each sample seen so far in the scan: only the samples the
/// segments hold, not an array over the dataset (what the cache holds follows the
/// rank's share; `entries`).
struct Latest {
    /// Ids below it are the dataset's; a record of another is dead.
    samples: u64,
    newest: HashMap<SampleId, Newest>,
    /// The highest sequence number of any record.
    max_seq: u64,
}

impl Latest {
    fn new(samples: u64) -> Latest {
        Latest {
            samples,
            newest: HashMap::new(),
            max_seq: 0,
        }
    }

    /// Takes in the record `h` at `off` of segment `num` if it is newer than what the scan
    /// saw of its sample; false for data that fails its checksum (`crc_ok`), which is skipped.
    fn see(&mut self, num: u32, off: u64, h: &Header, crc_ok: bool) -> bool {
        self.max_seq = self.max_seq.max(h.seq);
        if h.kind == Kind::Data && !crc_ok {
            return false;
        }
        if h.id >= self.samples {
            return true;
        }
        let seen = self.newest.entry(h.id).or_default();
        if h.seq <= seen.seq {
            return true;
        }
        *seen = match h.kind {
            Kind::Data => Newest {
                seq: h.seq,
                entry: Entry {
                    seg: num,
                    off: off as u32,
                    len: h.len,
                },
                mtime: h.mtime,
            },
            Kind::Tombstone => Newest {
                seq: h.seq,
                ..Newest::default()
            },
        };
        true
    }
}

pub(super) fn recover(
    inner: &Inner,
    keep: &dyn Fn(SampleId, u64) -> bool,
) -> io::Result<Vec<Recovered>> {
    let _compacting = inner.compacting.locked();
    let mut a = inner.active.locked();
    let (samples, mut index) = (inner.samples, inner.read().index.emptied());
    let mut nums: Vec<u32> = fs::read_dir(&inner.dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| segment_number(&e.file_name().to_string_lossy()))
        .filter(|&n| n != a.seg.num)
        .collect();
    nums.sort_unstable();

    let mut latest = Latest::new(samples);
    let mut scanned = BTreeMap::new();
    for num in nums {
        if let Some(s) = scan_segment(inner, num, &mut latest)? {
            scanned.insert(num, s);
        }
    }
    let (live, found) = kept(&latest.newest, &mut index, keep);
    let max_seq = latest.max_seq;
    drop(latest);

    let worth = install(inner, scanned, &live, index);
    a.next_seq = a.next_seq.max(max_seq + 1);
    drop(a);
    if worth {
        inner.nudge_if_worthwhile();
    }
    Ok(found)
}

/// Reads segment `num` once, record by record, into `latest`; cuts a torn tail and removes
/// a segment with no valid record (`None`).
fn scan_segment(inner: &Inner, num: u32, latest: &mut Latest) -> io::Result<Option<Scanned>> {
    let path = inner.dir.join(seg_name(num));
    let file = OpenOptions::new().read(true).write(true).open(&path)?;
    let size = file.metadata()?.len();
    let (mut tombstones, mut min_seq) = (0, u64::MAX);
    let mut reader = BufReader::with_capacity(1 << 20, At::new(&file));
    let mut scratch = vec![0u8; 1 << 16];
    let mut off = 0u64;
    while off + HEADER as u64 <= size && off <= u64::from(u32::MAX) {
        let mut raw = [0u8; HEADER];
        reader.read_exact(&mut raw)?;
        let Ok(h) = Header::decode(&raw) else { break };
        if off + h.record_len() > size {
            break;
        }
        let mut crc = 0;
        let mut left = h.len;
        while left > 0 {
            let n = left.min(scratch.len() as u64) as usize;
            reader.read_exact(&mut scratch[..n])?;
            crc = crc32c::crc32c_append(crc, &scratch[..n]);
            left -= n as u64;
        }
        match h.kind {
            Kind::Data => min_seq = min_seq.min(h.seq),
            Kind::Tombstone => tombstones += h.record_len(),
        }
        if !latest.see(num, off, &h, crc == h.crc) {
            tracing::warn!(segment = %path.display(), offset = off, sample = h.id, "cached record fails its checksum; skipped");
        }
        off += h.record_len();
    }
    drop(reader);
    if off < size {
        tracing::warn!(segment = %path.display(), valid = off, size, "torn tail of a cache segment truncated");
        file.set_len(off)?;
    }
    if off == 0 {
        fs::remove_file(&path)?;
        return Ok(None);
    }
    Ok(Some(Scanned {
        file,
        bytes: off,
        tombstones,
        min_seq,
    }))
}

/// The records `keep` keeps, put in `index`: the live bytes per segment and what was found
/// (in id order).
fn kept(
    newest: &HashMap<SampleId, Newest>,
    index: &mut Entries,
    keep: &dyn Fn(SampleId, u64) -> bool,
) -> (BTreeMap<u32, u64>, Vec<Recovered>) {
    let mut live = BTreeMap::<u32, u64>::new();
    let mut found = Vec::new();
    for (&id, n) in newest {
        let e = n.entry;
        if e.seg == 0 || !keep(id, e.len) {
            continue;
        }
        *live.entry(e.seg).or_default() += HEADER as u64 + e.len;
        index.set(id, e);
        found.push(Recovered {
            id,
            len: e.len,
            mtime: from_nanos(n.mtime),
        });
    }
    found.sort_unstable_by_key(|r| r.id);
    (live, found)
}

/// Makes the scanned segments and the rebuilt index the store's; returns whether a
/// compaction is worth it.
fn install(
    inner: &Inner,
    scanned: BTreeMap<u32, Scanned>,
    live: &BTreeMap<u32, u64>,
    index: Entries,
) -> bool {
    let mut st = inner.write();
    let mut worth = false;
    for (num, s) in scanned {
        let live = live.get(&num).copied().unwrap_or(0);
        // Mapped only now: the scan may have cut the file.
        let info = SegInfo {
            file: Arc::new(SegFile::new(num, s.file, s.bytes, s.bytes)),
            bytes: s.bytes,
            dead: s.bytes - live - s.tombstones,
            min_seq: s.min_seq,
        };
        worth |= info.worth_compacting(&inner.cfg);
        st.segments.insert(num, info);
    }
    for (id, _) in index.stored() {
        inner.mark(id, true);
    }
    st.index = index;
    worth
}

/// Reads a file from a position with `pread`, leaving the file's own offset alone (the
/// segment file is shared with readers and writers that use positioned calls only).
pub(super) struct At<'a> {
    file: &'a fs::File,
    pos: u64,
}

impl<'a> At<'a> {
    pub(super) fn new(file: &'a fs::File) -> At<'a> {
        At { file, pos: 0 }
    }
}

impl io::Seek for At<'_> {
    fn seek(&mut self, to: io::SeekFrom) -> io::Result<u64> {
        let pos = match to {
            io::SeekFrom::Start(p) => Some(p),
            io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            io::SeekFrom::End(d) => self.file.metadata()?.len().checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        Ok(self.pos)
    }
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = std::os::unix::fs::FileExt::read_at(self.file, buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}
