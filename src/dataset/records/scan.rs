//! Rank 0's one sequential pass over a record source: the offset table (LIRS's location
//! generator), with bad records reported and left out.
//!
//! Each file is mapped and walked once, front to back (`MADV_SEQUENTIAL`, so the kernel
//! reads ahead as `cat` would). Fixed-size sources are not read at all. A problem with one
//! record (truncated, a bad TFRecord CRC, a tar member without its pair, a record over
//! 2 GiB) or one file (empty, unreadable) becomes a [`Skipped`] entry naming the file and
//! byte offset; the pass resynchronises where the framing allows (TFRecord: the next offset
//! whose length CRC holds; tar: the next valid header block) so nothing else is lost.
//! The tar walk lives in `tar.rs`.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use super::tar::{TarSamples, tar_samples};
use super::{
    Framing, Grouping, MAX_RECORD, PAGE, RecordFile, RecordIndex, RecordParams, Table, fixed_groups,
};
use crate::dataset::names::Skipped;

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
    #[error("source has over 4294967295 records; shufflefs supports at most that many")]
    TooMany,
}

/// The source's files in name order, with their lengths. Hidden files are ignored and
/// sub-folders reported, as neither holds records of this source.
pub fn list_files(
    source: &Path,
    skipped: &mut Vec<Skipped>,
) -> Result<Vec<(String, u64)>, RecordError> {
    let io_err = |e: io::Error| RecordError::Io {
        path: source.to_path_buf(),
        source: e,
    };
    let meta = std::fs::metadata(source).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => RecordError::Missing(source.to_path_buf()),
        _ => RecordError::Io {
            path: source.to_path_buf(),
            source: e,
        },
    })?;
    if meta.is_file() {
        return Ok(vec![(String::new(), meta.len())]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(source).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        let name = entry.file_name();
        let path = entry.path();
        let Some(name) = name.to_str().map(str::to_owned) else {
            skipped.push(Skipped {
                path: path.display().to_string(),
                reason: "file name is not UTF-8; rename it".into(),
            });
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => files.push((name, m.len())),
            Ok(_) => skipped.push(Skipped {
                path: path.display().to_string(),
                reason: "not a regular file; a record source is a flat folder of shard files"
                    .into(),
            }),
            Err(e) => skipped.push(Skipped {
                path: path.display().to_string(),
                reason: format!("cannot read it: {e}"),
            }),
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(RecordError::NoFiles(source.to_path_buf()));
    }
    Ok(files)
}

/// Builds the index of `source` (rank 0's one pass), with what was left out.
pub fn build_index(
    source: &Path,
    params: &RecordParams,
) -> Result<(RecordIndex, Vec<Skipped>), RecordError> {
    let mut skipped = Vec::new();
    let files = list_files(source, &mut skipped)?;
    let ext = part_ext(source, &files, params.framing);
    let mut index = match params.framing {
        Framing::Fixed => fixed_index(source, params, &files, &mut skipped)?,
        _ => scanned_index(source, params, &files, &mut skipped)?,
    };
    if index.records == 0 {
        return Err(RecordError::NoRecords(source.to_path_buf()));
    }
    index.ext = ext;
    Ok((index, skipped))
}

pub(super) fn path_of(source: &Path, name: &str) -> PathBuf {
    if name.is_empty() {
        source.to_path_buf()
    } else {
        source.join(name)
    }
}

/// The first file's extension if it is a plain one (`csv`, `svm`, `tar`), else the framing's.
fn part_ext(source: &Path, files: &[(String, u64)], framing: Framing) -> String {
    let first = path_of(source, &files[0].0);
    first
        .extension()
        .and_then(|e| e.to_str())
        .filter(|e| !e.is_empty() && e.len() <= 16 && e.bytes().all(|b| b.is_ascii_alphanumeric()))
        .unwrap_or(framing.default_ext())
        .to_string()
}

/// Fixed-size records: arithmetic on the file sizes, no byte read.
fn fixed_index(
    source: &Path,
    params: &RecordParams,
    files: &[(String, u64)],
    skipped: &mut Vec<Skipped>,
) -> Result<RecordIndex, RecordError> {
    let size = params.record_size;
    let (mut records, mut groups) = (0u64, 0u64);
    let mut out = Vec::new();
    for (name, len) in files {
        let path = path_of(source, name).display().to_string();
        let (n, rest) = (len / size, len % size);
        if *len == 0 {
            skipped.push(empty_file(path));
            continue;
        }
        if rest != 0 {
            skipped.push(Skipped {
                path: path.clone(),
                reason: format!(
                    "truncated record at byte offset {}: {rest} bytes, --record-size is {size}; left out",
                    n * size
                ),
            });
        }
        if n == 0 {
            continue;
        }
        out.push(RecordFile {
            name: name.clone(),
            len: *len,
            first_record: records as u32,
            first_group: groups as u32,
            no_final_newline: false,
        });
        records += n;
        groups += fixed_groups(params, n);
        if records > u64::from(u32::MAX) {
            return Err(RecordError::TooMany);
        }
    }
    Ok(RecordIndex {
        params: params.clone(),
        files: out,
        table: Table::Fixed,
        records: records as u32,
        groups: groups as u32,
        header: Vec::new(),
        ext: String::new(),
    })
}

fn empty_file(path: String) -> Skipped {
    Skipped {
        path,
        reason: "empty file (byte offset 0): no records".into(),
    }
}

/// Collects the offset table, grouping records by the page they start in.
pub(super) struct TableBuilder {
    grouping: Grouping,
    starts: Vec<u64>,
    lens: Vec<u32>,
    group_first: Vec<u32>,
    /// The last record pushed: its page and end, in the current file.
    last: Option<(u64, u64)>,
    files: Vec<RecordFile>,
    file: Option<RecordFile>,
}

impl TableBuilder {
    fn new(grouping: Grouping) -> TableBuilder {
        TableBuilder {
            grouping,
            starts: Vec::new(),
            lens: Vec::new(),
            group_first: Vec::new(),
            last: None,
            files: Vec::new(),
            file: None,
        }
    }

    pub(super) fn begin_file(&mut self, name: &str, len: u64) {
        self.last = None;
        self.file = Some(RecordFile {
            name: name.to_string(),
            len,
            first_record: self.starts.len() as u32,
            first_group: self.group_first.len() as u32,
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

    /// A record of `len` (at most [`MAX_RECORD`]) bytes at `start` of the current file.
    pub(super) fn push(&mut self, start: u64, len: u64) -> Result<(), RecordError> {
        let r = u32::try_from(self.starts.len()).map_err(|_| RecordError::TooMany)?;
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

    fn finish(mut self, params: &RecordParams, header: Vec<u8>) -> RecordIndex {
        let (records, groups) = (self.starts.len() as u32, self.group_first.len() as u32);
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
        // The budget of the module docs: 8 + 4 bytes a record, 4 a group of several.
        debug_assert!(index.table_bytes() <= 16 * records as usize);
        index
    }
}

/// A file mapped for the pass. Empty files are not mapped (and have no records).
fn map(path: &Path) -> io::Result<memmap2::Mmap> {
    let file = File::open(path)?;
    // SAFETY: the map is read only and lives for one pass over a source file, which the
    // source's contract says is not modified while shufflefs reads it (as for any reader);
    // a file truncated meanwhile would end the daemon with SIGBUS rather than corrupt data.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    let _ = map.advise(memmap2::Advice::Sequential);
    Ok(map)
}

/// Keeps the kernel reading ahead of the pass: `MADV_SEQUENTIAL` alone lets the scan fault on
/// pages whose read it started only then, so on a cold file the scan would wait on the disk
/// and the disk on the scan. Asking for the next windows (`MADV_WILLNEED`) overlaps the two,
/// as `cat`'s reads and the kernel's readahead do.
pub(super) struct Ahead<'a> {
    map: &'a memmap2::Mmap,
    /// Everything before this offset has been asked for.
    asked: usize,
}

impl Ahead<'_> {
    const WINDOW: usize = 8 << 20;
    const DEPTH: usize = 4 * Self::WINDOW;

    fn new(map: &memmap2::Mmap) -> Ahead<'_> {
        let mut a = Ahead { map, asked: 0 };
        a.at(0);
        a
    }

    /// The pass reached `pos`: ask for what lies up to `DEPTH` beyond it.
    pub(super) fn at(&mut self, pos: usize) {
        let want = pos.saturating_add(Self::DEPTH).min(self.map.len());
        while self.asked < want {
            let len = Self::WINDOW.min(self.map.len() - self.asked);
            let _ = self
                .map
                .advise_range(memmap2::Advice::WillNeed, self.asked, len);
            self.asked += len;
        }
    }
}

/// Lines, TFRecord and tar: one pass per file into the offset table.
fn scanned_index(
    source: &Path,
    params: &RecordParams,
    files: &[(String, u64)],
    skipped: &mut Vec<Skipped>,
) -> Result<RecordIndex, RecordError> {
    let mut b = TableBuilder::new(params.grouping);
    let mut header: Option<(Vec<u8>, String)> = None;
    let mut tar = TarSamples::default();
    for (f, (name, len)) in files.iter().enumerate() {
        let path = path_of(source, name);
        let shown = path.display().to_string();
        let mut skip = |offset: u64, reason: String| {
            skipped.push(Skipped {
                path: shown.clone(),
                reason: format!("byte offset {offset}: {reason}"),
            })
        };
        if *len == 0 {
            skipped.push(empty_file(shown.clone()));
            continue;
        }
        let data = match map(&path) {
            Ok(m) => m,
            Err(e) => {
                skip(
                    0,
                    format!("cannot read the file: {e}; its records are left out"),
                );
                continue;
            }
        };
        let mut ahead = Ahead::new(&data);
        let data = &data[..];
        match params.framing {
            Framing::Lines => {
                b.begin_file(name, data.len() as u64);
                let mut from = 0;
                if params.header_line {
                    let end = memchr::memchr(b'\n', data).map_or(data.len(), |i| i + 1);
                    let mut line = data[..end].to_vec();
                    if line.last() != Some(&b'\n') {
                        line.push(b'\n');
                    }
                    match &header {
                        None => header = Some((line, shown.clone())),
                        Some((first, from_file)) if *first != line => tracing::warn!(
                            file = %shown,
                            first = %from_file,
                            "header line differs from the first file's; parts repeat the first file's"
                        ),
                        Some(_) => {}
                    }
                    from = end;
                }
                let open_end = lines(data, from, &mut b, &mut skip, &mut ahead)?;
                b.end_file(open_end);
            }
            Framing::Tfrecord => {
                b.begin_file(name, data.len() as u64);
                tfrecords(data, &mut b, &mut skip, &mut ahead)?;
                b.end_file(false);
            }
            Framing::Tar => tar_samples(data, f as u32, &mut tar, &mut skip, &mut ahead),
            Framing::Fixed => unreachable!("fixed-size sources are not scanned"),
        }
    }
    if params.framing == Framing::Tar {
        tar.into_table(source, files, &mut b, skipped)?;
    }
    Ok(b.finish(params, header.map(|h| h.0).unwrap_or_default()))
}

/// Lines from `from` on; returns whether the last one lacks its `\n`.
fn lines(
    data: &[u8],
    from: usize,
    b: &mut TableBuilder,
    skip: &mut impl FnMut(u64, String),
    ahead: &mut Ahead,
) -> Result<bool, RecordError> {
    let mut start = from;
    let mut record = |b: &mut TableBuilder, start: usize, end: usize| {
        let len = (end - start) as u64;
        if len > MAX_RECORD {
            skip(start as u64, over_limit(len));
            Ok(())
        } else {
            b.push(start as u64, len)
        }
    };
    // Window by window, so the read-ahead stays ahead of the scan.
    let mut at = from;
    while at < data.len() {
        ahead.at(at);
        let stop = (at + Ahead::WINDOW).min(data.len());
        for nl in memchr::memchr_iter(b'\n', &data[at..stop]) {
            let end = at + nl + 1;
            record(b, start, end)?;
            start = end;
        }
        at = stop;
    }
    let open = start < data.len();
    if open {
        record(b, start, data.len())?;
    }
    Ok(open)
}

pub(super) fn over_limit(len: u64) -> String {
    format!("record of {len} bytes is over the 2 GiB limit; left out")
}

/// TFRecord's masked CRC-32C.
pub fn masked_crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
        .rotate_right(15)
        .wrapping_add(0xa282_ead8)
}

fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}

/// Whether a TFRecord header (length and its CRC) starts at `p` and its record fits.
fn tf_header_at(data: &[u8], p: usize) -> bool {
    p + 12 <= data.len()
        && masked_crc(&data[p..p + 8]) == le_u32(&data[p + 8..])
        && le_u64(&data[p..])
            .checked_add(16)
            .is_some_and(|total| total <= (data.len() - p) as u64)
}

fn tfrecords(
    data: &[u8],
    b: &mut TableBuilder,
    skip: &mut impl FnMut(u64, String),
    ahead: &mut Ahead,
) -> Result<(), RecordError> {
    let n = data.len();
    let mut pos = 0usize;
    while pos < n {
        ahead.at(pos);
        if n - pos < 12 {
            skip(
                pos as u64,
                format!(
                    "truncated record: {} bytes left, a record header needs 12; left out",
                    n - pos
                ),
            );
            break;
        }
        let len = le_u64(&data[pos..]);
        if masked_crc(&data[pos..pos + 8]) != le_u32(&data[pos + 8..]) {
            let next = (pos + 1..n).find(|&p| tf_header_at(data, p)).unwrap_or(n);
            skip(
                pos as u64,
                format!(
                    "bad length CRC; the {} bytes up to offset {next} (the next valid record header) are left out",
                    next - pos
                ),
            );
            pos = next;
            continue;
        }
        let total = len.saturating_add(16);
        if total > (n - pos) as u64 {
            skip(
                pos as u64,
                format!(
                    "truncated record: its header says {len} data bytes, the file ends {} bytes after the header; left out",
                    n - pos - 12
                ),
            );
            break;
        }
        let total = total as usize;
        if total as u64 > MAX_RECORD {
            skip(pos as u64, over_limit(total as u64));
        } else if masked_crc(&data[pos + 12..pos + total - 4]) != le_u32(&data[pos + total - 4..]) {
            skip(pos as u64, "bad data CRC; record left out".into());
        } else {
            b.push(pos as u64, total as u64)?;
        }
        pos += total;
    }
    Ok(())
}
