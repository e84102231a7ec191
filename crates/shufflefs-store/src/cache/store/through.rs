//! Reads that go to the source without the cache: a sample too large for memory streamed in
//! ranged reads, and the one way a failed read through is named and counted.
//!
//! A partial cache serves the samples it does not keep from the source. Up to
//! `vfs::UNCACHED_MAX` a reader gets the whole sample through memory; a larger one (an
//! unet3d `.npz` of 140 MB, audio, video) is read as the reader asks, window by window
//! (`vfs::stream`), so no sample is ever refused for its size and memory stays bounded.
//! A failure of either is the source's, and is reported as a failed fetch into the cache
//! is: named by the sample's place (`SourceError`), counted in `source_errors`, and kept in
//! the status's `problems` (they were an EIO blamed on the partial cache).

use std::io;
use std::sync::atomic::Ordering;

use super::{SampleStore, SourceError};
use crate::plan::SampleId;

impl SampleStore {
    /// Sample `id`'s length in the source: known (the index's, or learned), else asked of
    /// the source without reading it (learned then: a sample read through memory must not
    /// learn it first, or the bytes a lookup read are not kept for the open that follows);
    /// `None` where only reading it tells.
    pub fn source_len(&self, id: SampleId) -> io::Result<Option<u64>> {
        if let Some(size) = self.size(id) {
            return Ok(Some(size));
        }
        let len = self.source.stat_len(id)?;
        if let Some(len) = len {
            self.learn_size(id, len);
        }
        Ok(self.size(id).or(len))
    }

    /// Up to `buf.len()` bytes of sample `id` (of `size` bytes) at `offset`, read straight
    /// from the source; short only at the sample's end. Counted as source bytes (and the
    /// sample as fetched when read from its start); a failure, or a sample that ended
    /// before `size`, is reported as the source's ([`SampleStore::source_failed`]).
    pub fn read_source_at(
        &self,
        id: SampleId,
        size: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        let want = size.saturating_sub(offset).min(buf.len() as u64) as usize;
        let got = match self.source.read_at(id, offset, &mut buf[..want]) {
            Ok(n) if n < want => Err(io::Error::other(format!(
                "sample ends at byte {}, it was {size} bytes when first read; it changed since",
                offset + n as u64
            ))),
            other => other,
        }
        .map_err(|e| self.source_failed(id, e))?;
        if let Some(partial) = self.partial.get() {
            partial.read_from_source(got as u64);
        }
        let stats = &self.stats;
        if offset == 0 {
            stats.fetched_from_source.fetch_add(1, Ordering::Relaxed);
        }
        (stats.fetched_bytes_from_source).fetch_add(got as u64, Ordering::Relaxed);
        Ok(got)
    }

    /// `error`, the source's answer for sample `id`, named by the sample's place, counted
    /// in `source_errors` and kept among the status's problems: what every read of the
    /// source that fails a reader or staging returns.
    pub fn source_failed(&self, id: SampleId, error: io::Error) -> io::Error {
        self.stats.source_errors.fetch_add(1, Ordering::Relaxed);
        let what = self.source.describe(id);
        let e = io::Error::new(error.kind(), SourceError { what, error });
        self.stats.report_problem(e.to_string());
        e
    }
}
