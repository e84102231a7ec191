//! Reading groups of records from the source files: one positioned read per group, and in
//! [`Dataset::read_batch`] one read per run of neighbouring groups of a file.
//!
//! Source files stay open for the daemon's life (a record source has few, large files; an
//! open per 4 KiB group would cost more than the read).

use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use super::{RecordIndex, Span};
use crate::dataset::manifest::Manifest;
use crate::dataset::{Copied, Dataset};
use crate::plan::SampleId;
use crate::sys::io::read_full_at;

/// Neighbouring groups of one file are read together when at most this far apart...
const COALESCE_GAP: u64 = 64 << 10;
/// ...and the run stays under this many bytes.
const COALESCE_MAX: u64 = 8 << 20;

pub struct RecordSource {
    source: PathBuf,
    manifest: Arc<Manifest>,
    files: Vec<OnceLock<File>>,
}

impl RecordSource {
    /// The reader of `manifest`'s records under `source`; `manifest` must carry an index.
    pub(crate) fn new(source: PathBuf, manifest: Arc<Manifest>) -> RecordSource {
        let files = manifest.records().map_or(0, |r| r.files.len());
        RecordSource {
            source,
            manifest,
            files: (0..files).map(|_| OnceLock::new()).collect(),
        }
    }

    fn index(&self) -> io::Result<&RecordIndex> {
        index_of(&self.manifest)
    }

    fn span(&self, id: SampleId) -> io::Result<Span> {
        span_of(&self.manifest, id)
    }

    fn file(&self, f: u32) -> io::Result<&File> {
        let slot = &self.files[f as usize];
        if let Some(file) = slot.get() {
            return Ok(file);
        }
        let file = File::open(self.index()?.path(&self.source, f))?;
        Ok(slot.get_or_init(|| file))
    }

    /// Reads `span` whole, failing if the file got shorter since the index was built.
    fn read_span(&self, span: Span) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; (span.end - span.start) as usize];
        let n = read_full_at(self.file(span.file)?, span.start, &mut buf)?;
        if n < buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "file ends at byte {} but the index has records up to {}; it changed since the index was built (remount with --reset-cache)",
                    span.start + n as u64,
                    span.end
                ),
            ));
        }
        Ok(buf)
    }
}

/// Sorts `spans` by file and offset and cuts them into runs read as one: neighbouring
/// groups of one file at most [`COALESCE_GAP`] apart, each run under [`COALESCE_MAX`]
/// bytes. Each run's byte range and the `spans` it covers.
pub(crate) fn coalesce(spans: &mut [(Span, SampleId)]) -> Vec<(Span, std::ops::Range<usize>)> {
    spans.sort_by_key(|(s, _)| (s.file, s.start));
    let mut runs = Vec::new();
    let mut i = 0;
    while i < spans.len() {
        // The run spans[i..j]: one file, small gaps, bounded size.
        let first = spans[i].0;
        let mut end = first.end;
        let mut j = i + 1;
        while j < spans.len() {
            let s = spans[j].0;
            if s.file != first.file
                || s.start > end + COALESCE_GAP
                || s.end.max(end) - first.start > COALESCE_MAX
            {
                break;
            }
            end = end.max(s.end);
            j += 1;
        }
        let run = Span {
            file: first.file,
            start: first.start,
            end,
        };
        runs.push((run, i..j));
        i = j;
    }
    runs
}

impl Dataset for RecordSource {
    fn copy_to(&self, id: SampleId, out: &mut dyn Write) -> io::Result<Copied> {
        let span = self.span(id)?;
        let file = self.file(span.file)?;
        let mtime = file.metadata().and_then(|m| m.modified()).ok();
        let mut buf = vec![0u8; (span.end - span.start).min(1 << 20) as usize];
        let mut at = span.start;
        while at < span.end {
            let want = ((span.end - at) as usize).min(buf.len());
            let n = read_full_at(file, at, &mut buf[..want])?;
            if n < want {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "file ends at byte {}, before the group's end at {}; it changed since the index was built",
                        at + n as u64,
                        span.end
                    ),
                ));
            }
            out.write_all(&buf[..n])?;
            at += n as u64;
        }
        Ok(Copied {
            len: span.end - span.start,
            mtime,
        })
    }

    fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let span = self.span(id)?;
        let len = span.end - span.start;
        let n = len.saturating_sub(offset).min(buf.len() as u64) as usize;
        read_full_at(self.file(span.file)?, span.start + offset, &mut buf[..n])
    }

    fn read_batch(&self, ids: &[SampleId], each: &mut dyn FnMut(SampleId, io::Result<Vec<u8>>)) {
        let mut spans = Vec::with_capacity(ids.len());
        for &id in ids {
            match self.span(id) {
                Ok(s) => spans.push((s, id)),
                Err(e) => each(id, Err(e)),
            }
        }
        for (run, members) in coalesce(&mut spans) {
            let members = &spans[members];
            match self.read_span(run) {
                Ok(bytes) => {
                    for &(s, id) in members {
                        let at = (s.start - run.start) as usize;
                        each(id, Ok(bytes[at..at + (s.end - s.start) as usize].to_vec()));
                    }
                }
                // One group's failure is its own: read the others one by one.
                Err(_) => {
                    for &(s, id) in members {
                        each(id, self.read_span(s));
                    }
                }
            }
        }
    }

    fn describe(&self, id: SampleId) -> String {
        match (self.index(), self.span(id)) {
            (Ok(index), Ok(s)) => {
                let rs = index.group_records(id);
                format!(
                    "{} bytes {}..{} (records {}..{})",
                    index.path(&self.source, s.file).display(),
                    s.start,
                    s.end,
                    rs.start,
                    rs.end
                )
            }
            _ => format!("{} group {id}", self.source.display()),
        }
    }
}

/// The record index `manifest` carries (every record source's manifest does).
pub(crate) fn index_of(manifest: &Manifest) -> io::Result<&RecordIndex> {
    manifest
        .records()
        .ok_or_else(|| io::Error::other("the manifest has no record index"))
}

/// Where group `id` lies in the record files of `manifest`.
pub(crate) fn span_of(manifest: &Manifest, id: SampleId) -> io::Result<Span> {
    let index = index_of(manifest)?;
    if id >= index.groups() {
        return Err(io::Error::other(format!("no group {id} in this source")));
    }
    Ok(index.span(id))
}
