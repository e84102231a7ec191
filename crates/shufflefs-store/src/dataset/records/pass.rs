//! What every framing's walk of the index pass shares: the table it fills
//! ([`TableBuilder`]), the mapped file and its read-ahead ([`map`], [`Ahead`]), the error,
//! and how a lost byte range is worded.
//!
//! A leaf: it imports only the record types of the parent module, so the framing walks
//! (`lines.rs`, `tfrecord.rs`, `tar.rs`) and the pass that drives them (`scan.rs`) all
//! depend on it and never on each other, except `scan.rs` calling the walks.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use super::{Grouping, PAGE, RecordFile, RecordIndex, RecordParams, Table};
use crate::dataset::columns::Words;

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(
        "source {0} does not exist; pass a record file or a folder of shard files with --source"
    )]
    Missing(PathBuf),
    #[error("source {path}: {source}. Check that it exists and is readable by this user")]
    Io { path: PathBuf, source: io::Error },
    #[error("source folder {0} holds no record files; put the shard files directly in it")]
    NoFiles(PathBuf),
    #[error(
        "source {0} holds no usable records (see the skipped list in the log); check --framing and --record-size"
    )]
    NoRecords(PathBuf),
}

pub(super) fn path_of(source: &Path, name: &str) -> PathBuf {
    if name.is_empty() {
        source.to_path_buf()
    } else {
        source.join(name)
    }
}

/// Why the record at `from..to` is left out: it is over [`super::MAX_RECORD`].
pub(super) fn over_limit(from: u64, to: u64) -> String {
    format!(
        "record of {} bytes is over the 2 GiB limit; {}",
        to - from,
        left_out(from, to)
    )
}

/// The words for one lost record's byte range `from..to`.
pub(super) fn left_out(from: u64, to: u64) -> String {
    format!("bytes {from}..{to} ({} bytes) left out", to - from)
}

/// The words for a gap `from..to` of a file of `len` bytes: how many bytes, from where to
/// where, and whether the walk found a record after them.
pub(super) fn lost(from: u64, to: u64, len: u64) -> String {
    let after = if to < len {
        "resumed at the next valid record"
    } else {
        "to the end of the file"
    };
    format!("{}, {after}", left_out(from, to))
}

/// Collects the offset table, grouping records by the page they start in.
pub(super) struct TableBuilder {
    grouping: Grouping,
    starts: Words<u64>,
    lens: Words<u32>,
    group_first: Words<u64>,
    /// The last record pushed: its page and end, in the current file.
    last: Option<(u64, u64)>,
    files: Vec<RecordFile>,
    file: Option<RecordFile>,
}

impl TableBuilder {
    pub(super) fn new(grouping: Grouping) -> TableBuilder {
        TableBuilder {
            grouping,
            starts: Words::new(),
            lens: Words::new(),
            group_first: Words::new(),
            last: None,
            files: Vec::new(),
            file: None,
        }
    }

    /// Starts a file: nothing of the file before carries over (no group spans two files).
    pub(super) fn begin_file(&mut self, name: &str, len: u64) {
        self.last = None;
        self.file = Some(RecordFile {
            name: name.to_string(),
            len,
            first_record: self.starts.len() as u64,
            first_group: self.group_first.len() as u64,
            no_final_newline: false,
        });
    }

    /// Ends the file; it is listed only if it gave records.
    pub(super) fn end_file(&mut self, no_final_newline: bool) {
        if let Some(mut f) = self.file.take()
            && (f.first_record as usize) < self.starts.len()
        {
            f.no_final_newline = no_final_newline;
            self.files.push(f);
        }
    }

    /// A record of `len` (at most [`super::MAX_RECORD`]) bytes at `start` of the current
    /// file. A record that does not start where the last ended (a gap) starts a group.
    pub(super) fn push(&mut self, start: u64, len: u64) -> Result<(), RecordError> {
        let r = self.starts.len() as u64;
        let page = start / PAGE;
        let joins = self.grouping == Grouping::Pages
            && self.last.is_some_and(|(p, end)| p == page && end == start);
        if !joins {
            self.group_first.push(r);
        }
        self.last = Some((page, start + len));
        self.starts.push(start);
        self.lens.push(len as u32);
        Ok(())
    }

    pub(super) fn finish(mut self, params: &RecordParams, header: Vec<u8>) -> RecordIndex {
        let (records, groups) = (self.starts.len() as u64, self.group_first.len() as u64);
        self.starts.shrink_to_fit();
        self.lens.shrink_to_fit();
        let group_first = (groups != records).then(|| {
            self.group_first.shrink_to_fit();
            self.group_first
        });
        let index = RecordIndex {
            params: params.clone(),
            files: self.files,
            table: Table::Offsets {
                starts: self.starts,
                lens: self.lens,
                group_first,
            },
            records,
            groups,
            header,
            ext: String::new(),
        };
        // The budget of the module docs: 8 + 4 bytes a record, 8 a group of several.
        debug_assert!(index.table_bytes() <= 20 * records as usize);
        index
    }
}

/// A file mapped for the pass. Empty files are not mapped (and have no records).
pub(super) fn map(path: &Path) -> io::Result<memmap2::Mmap> {
    let file = File::open(path)?;
    // SAFETY: the map is read only and lives for one pass over a source file, which the
    // source's contract says is not modified while shufflefs reads it (as for any reader);
    // a file truncated meanwhile would end the daemon with SIGBUS rather than corrupt data.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    let _ = map.advise(memmap2::Advice::Sequential);
    Ok(map)
}

/// Keeps the kernel reading ahead of the pass, and the pass's memory bounded.
///
/// Ahead: `MADV_SEQUENTIAL` alone lets the scan fault on pages whose read it started only
/// then, so on a cold file the scan would wait on the disk and the disk on the scan. Asking
/// for the next windows (`MADV_WILLNEED`) overlaps the two, as `cat`'s reads and the
/// kernel's readahead do.
///
/// Behind: pages the scan has read stay mapped into the daemon (its resident memory) until
/// unmapped, so a 200 MB line or a 10 GB shard would be held whole. Windows the pass has
/// left are dropped from the map (`MADV_DONTNEED`): they stay in the page cache, and a
/// later look back (a resync, a record's CRC) faults them in again, so this is only ever
/// a cost, never a wrong byte.
pub(super) struct Ahead<'a> {
    map: &'a memmap2::Mmap,
    /// Everything before this offset has been asked for.
    asked: usize,
    /// Everything before this offset has been dropped from the map.
    dropped: usize,
}

impl Ahead<'_> {
    pub(super) const WINDOW: usize = 8 << 20;
    const DEPTH: usize = 4 * Self::WINDOW;

    pub(super) fn new(map: &memmap2::Mmap) -> Ahead<'_> {
        let mut a = Ahead {
            map,
            asked: 0,
            dropped: 0,
        };
        a.at(0);
        a
    }

    /// The pass reached `pos`: ask for what lies up to `DEPTH` beyond it (not for what it
    /// jumped over, such as a record left out), and drop what lies over a window behind it.
    pub(super) fn at(&mut self, pos: usize) {
        let want = pos.saturating_add(Self::DEPTH).min(self.map.len());
        self.asked = self.asked.max(pos.min(want));
        while self.asked < want {
            let len = Self::WINDOW.min(self.map.len() - self.asked);
            let _ = self
                .map
                .advise_range(memmap2::Advice::WillNeed, self.asked, len);
            self.asked += len;
        }
        let keep = pos.saturating_sub(Self::WINDOW).min(self.map.len());
        if keep >= self.dropped + Self::WINDOW {
            // SAFETY: the map is a read-only shared map of a file: MADV_DONTNEED only
            // unmaps its pages, and the next access reads the same bytes from the file.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    self.dropped,
                    keep - self.dropped,
                )
            };
            self.dropped = keep;
        }
    }

    /// crc32c of `data[range]`, window by window, so a large record's check streams too.
    pub(super) fn crc32c(&mut self, data: &[u8], range: std::ops::Range<usize>) -> u32 {
        let mut crc = 0;
        let mut at = range.start;
        while at < range.end {
            self.at(at);
            let stop = (at + Self::WINDOW).min(range.end);
            crc = crc32c::crc32c_append(crc, &data[at..stop]);
            at = stop;
        }
        crc
    }
}
