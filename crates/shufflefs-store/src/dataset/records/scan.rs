//! Rank 0's one sequential pass over a record source: the offset table (LIRS's location
//! generator), with bad records reported and left out.
//!
//! Each file is mapped and walked once, front to back (`MADV_SEQUENTIAL`, so the kernel
//! reads ahead as `cat` would). Fixed-size sources are not read at all. A problem with one
//! record (truncated, a bad TFRecord CRC, a tar member without its pair, a record over
//! 2 GiB) or one file (empty, unreadable) becomes a `Skipped` entry naming the file and
//! byte offset, and every lost byte range says where it starts and ends; the pass
//! resynchronises where the framing allows (TFRecord: the next offset where a whole record
//! validates; tar: the next valid header block) so nothing else is lost. Every file is
//! walked on its own, so a truncated shard costs the next shard nothing.
//!
//! The walks live in `lines.rs`, `tfrecord.rs` and `tar.rs`; what they share (the table
//! builder, the read-ahead, the error) in `pass.rs`, which imports none of them.

use std::io;
use std::path::Path;

use super::lines::{header_line, lines};
pub use super::pass::RecordError;
use super::pass::{Ahead, TableBuilder, lost, map, path_of};
use super::tar::{TarSamples, tar_samples};
pub use super::tfrecord::masked_crc;
use super::tfrecord::tfrecords;
use super::{Framing, RecordFile, RecordIndex, RecordParams, Table, fixed_groups};
use crate::dataset::names::Skipped;

/// The source's files in name order, with their lengths. Hidden files are ignored and
/// sub-folders reported, as neither holds records of this source.
pub(crate) fn list_files(
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
    build_index_of(source, params, &files, skipped, &|name| {
        map(&path_of(source, name))
    })
}

/// A file's bytes for the pass, by its name under the source.
pub(crate) type Open<'a> = dyn Fn(&str) -> io::Result<memmap2::Mmap> + 'a;

/// Builds the index of the listed `files` (name, length) of `source` (named in messages),
/// each mapped by `open`: a folder's files, or a bucket's objects (fetched by `open`).
pub(crate) fn build_index_of(
    source: &Path,
    params: &RecordParams,
    files: &[(String, u64)],
    mut skipped: Vec<Skipped>,
    open: &Open<'_>,
) -> Result<(RecordIndex, Vec<Skipped>), RecordError> {
    if files.is_empty() {
        return Err(RecordError::NoFiles(source.to_path_buf()));
    }
    let ext = part_ext(source, files, params.framing);
    let mut index = match params.framing {
        Framing::Fixed => fixed_index(source, params, files, &mut skipped)?,
        _ => scanned_index(source, params, files, &mut skipped, open)?,
    };
    if index.records == 0 {
        return Err(RecordError::NoRecords(source.to_path_buf()));
    }
    index.ext = ext;
    Ok((index, skipped))
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
                    "truncated record at byte offset {}: {rest} bytes, --record-size is {size}; {}",
                    n * size,
                    lost(n * size, *len, *len)
                ),
            });
        }
        if n == 0 {
            continue;
        }
        out.push(RecordFile {
            name: name.clone(),
            len: *len,
            first_record: records,
            first_group: groups,
            no_final_newline: false,
        });
        records += n;
        groups += fixed_groups(params, n);
    }
    Ok(RecordIndex {
        params: params.clone(),
        files: out,
        table: Table::Fixed,
        records,
        groups,
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

/// Lines, TFRecord and tar: one pass per file into the offset table. Each file is walked
/// on its own: nothing of one file's walk (a truncated tail, a gap) reaches the next.
fn scanned_index(
    source: &Path,
    params: &RecordParams,
    files: &[(String, u64)],
    skipped: &mut Vec<Skipped>,
    open: &Open<'_>,
) -> Result<RecordIndex, RecordError> {
    let mut b = TableBuilder::new(params.grouping);
    let mut header: Option<(Vec<u8>, String)> = None;
    let mut tar = TarSamples::default();
    for (f, (name, len)) in files.iter().enumerate() {
        let shown = path_of(source, name).display().to_string();
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
        let data = match open(name) {
            Ok(m) => m,
            Err(e) => {
                let why = format!("cannot read the file: {e}; its records are left out");
                skip(0, why);
                continue;
            }
        };
        let mut ahead = Ahead::new(&data);
        let data = &data[..];
        match params.framing {
            Framing::Lines => {
                let from = match params.header_line {
                    true => match header_line(data) {
                        Ok((line, end)) => {
                            if let Some(why) = same_header(&mut header, line, &shown) {
                                skip(0, why);
                            }
                            end
                        }
                        Err(max) => {
                            let why = format!(
                                "the header line (--header-line) is over {max} bytes: is the framing right? {}",
                                lost(0, data.len() as u64, data.len() as u64)
                            );
                            skip(0, why);
                            continue;
                        }
                    },
                    false => 0,
                };
                b.begin_file(name, data.len() as u64);
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

/// Keeps the first file's header line. A file whose first line differs is named (in the
/// log and the skipped list): `--header-line` takes it as that file's header, so if the
/// file has none (a shard cut from a headed file), its first record is left out, and the
/// user is told rather than left to miss it.
fn same_header(
    header: &mut Option<(Vec<u8>, String)>,
    line: Vec<u8>,
    shown: &str,
) -> Option<String> {
    match header {
        None => *header = Some((line, shown.to_string())),
        Some((first, from_file)) if *first != line => {
            tracing::warn!(
                file = %shown,
                first = %from_file,
                "header line differs from the first file's; parts repeat the first file's"
            );
            return Some(format!(
                "the first line ({} bytes) differs from the header of {from_file}; with --header-line it is taken as this file's header and left out (if this file has no header line, that is its first record)",
                line.len()
            ));
        }
        Some(_) => {}
    }
    None
}
