//! A sample being written: buffered in memory and appended to the active segment on commit,
//! or, past `spill_bytes`, streamed into a spill file of its own that the commit renames in
//! as a one-record segment (see the module docs of `packed`).

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::sync::Arc;

use super::format::{HEADER, Header, Kind};
use super::{Entry, Inner, SegFile, SegInfo, seg_name, to_nanos};
use crate::cache::backend::{Commit, SampleWriter};
use crate::plan::SampleId;
use crate::sys::sync::Locked;

/// A sample being written: in memory, or past `spill_bytes` in its own spill file.
pub(super) struct PackedWriter<'a> {
    inner: &'a Inner,
    id: SampleId,
    buf: Vec<u8>,
    spill: Option<Spill>,
}

struct Spill {
    file: File,
    path: PathBuf,
    /// Data bytes written (after the header's room).
    len: u64,
}

impl<'a> PackedWriter<'a> {
    pub(super) fn new(inner: &'a Inner, id: SampleId) -> PackedWriter<'a> {
        PackedWriter {
            inner,
            id,
            buf: Vec::new(),
            spill: None,
        }
    }
}

impl Write for PackedWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if let Some(spill) = &mut self.spill {
            spill.file.write_all_at(data, HEADER as u64 + spill.len)?;
            spill.len += data.len() as u64;
            return Ok(data.len());
        }
        self.buf.extend_from_slice(data);
        if self.buf.len() > self.inner.cfg.spill_bytes {
            let path = self.inner.dir.join(format!("{}.spill", self.id));
            // Readable too: it becomes a segment that readers `pread`.
            let file = super::super::private::file_options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)?;
            let mut spill = Spill { file, path, len: 0 };
            let written = spill.file.write_all_at(&self.buf, HEADER as u64);
            spill.len = self.buf.len() as u64;
            self.spill = Some(spill); // removed on drop even if the write failed
            written?;
            self.buf = Vec::new();
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl SampleWriter for PackedWriter<'_> {
    fn commit(mut self: Box<Self>, commit: Commit) -> io::Result<()> {
        let inner = self.inner;
        let len = self.spill.as_ref().map_or(self.buf.len() as u64, |s| s.len);
        if len != commit.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "sample {}: {len} bytes written, commit says {}",
                    self.id, commit.len
                ),
            ));
        }
        let mut a = inner.active.locked();
        let h = Header {
            kind: Kind::Data,
            id: self.id,
            crc: commit.crc,
            len,
            seq: a.next_seq,
            mtime: to_nanos(commit.mtime),
        };
        a.next_seq += 1;
        let Some(spill) = self.spill.take() else {
            return inner.append(&mut a, &h, &self.buf, true);
        };
        // Its own one-record segment, renamed in.
        let num = a.next_seg;
        let named = spill
            .file
            .write_all_at(&h.encode(), 0)
            .and_then(|()| fs::rename(&spill.path, inner.dir.join(seg_name(num))));
        if let Err(e) = named {
            let _ = fs::remove_file(&spill.path);
            return Err(e);
        }
        a.next_seg += 1;
        a.dir_dirty = true;
        let rec = h.record_len();
        let seg = Arc::new(SegFile::new(num, spill.file, rec, rec));
        a.dirty.insert(num, seg.clone());
        let mut st = inner.write();
        let mut info = SegInfo::new(seg);
        info.bytes = h.record_len();
        info.min_seq = h.seq;
        st.segments.insert(num, info);
        let old = st.index.set(
            self.id,
            Entry {
                seg: num,
                off: 0,
                len,
            },
        );
        inner.mark(self.id, true);
        let worth = st.mark_dead(old, &inner.cfg, a.seg.num);
        drop(st);
        if worth {
            inner.nudge_if_worthwhile();
        }
        Ok(())
    }
}

impl Drop for PackedWriter<'_> {
    fn drop(&mut self) {
        if let Some(spill) = self.spill.take() {
            let _ = fs::remove_file(&spill.path);
        }
    }
}
