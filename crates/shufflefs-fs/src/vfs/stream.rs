//! An open sample read straight from the source, window by window: what a reader gets of a
//! sample the cache does not hold (a partial cache's, or one a full disk refused) when it
//! is too large to read whole into memory (`UNCACHED_MAX`).
//!
//! Each read request is served from the handle's window, the [`WINDOW`] bytes read last;
//! a request outside it reads the window at the request's offset (one ranged read of the
//! source), so a sequential reader costs one source read per window, and an open file holds
//! at most one window of memory whatever the sample's size. Before the fix such a sample
//! could never be read (EIO at every open, every epoch).

use std::io;
use std::sync::Mutex;

use crate::cache::SampleStore;
use crate::plan::SampleId;
use crate::sys::sync::Locked;

/// Bytes read from the source at once, and held per open file at most.
pub(crate) const WINDOW: usize = 4 << 20;

/// One open of a streamed sample.
pub struct SourceStream {
    id: SampleId,
    size: u64,
    /// The bytes last read and where they start.
    window: Mutex<(u64, Vec<u8>)>,
}

impl SourceStream {
    /// A stream of sample `id`, `size` bytes long (as the reader was told at its lookup).
    pub(crate) fn new(id: SampleId, size: u64) -> SourceStream {
        SourceStream {
            id,
            size,
            window: Mutex::new((0, Vec::new())),
        }
    }

    /// Up to `len` bytes at `offset`, short only at the sample's end.
    pub(crate) fn read(&self, store: &SampleStore, offset: u64, len: u32) -> io::Result<Vec<u8>> {
        let end = offset.saturating_add(u64::from(len)).min(self.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut window = self.window.locked();
        let (start, bytes) = &mut *window;
        let inside = offset >= *start && end <= *start + bytes.len() as u64;
        if !inside {
            // A request larger than the window is read as it is (the kernel's are not).
            let want = (end - offset).max(WINDOW as u64).min(self.size - offset);
            bytes.resize(want as usize, 0);
            let got = store.read_source_at(self.id, self.size, offset, bytes);
            *start = offset;
            bytes.truncate(*got.as_ref().unwrap_or(&0));
            got?;
        }
        let from = (offset - *start) as usize;
        Ok(bytes[from..from + (end - offset) as usize].to_vec())
    }

    /// Up to `len` bytes at `offset` read from the source with no window: a mount without
    /// opens (`--read-path page-cache`), whose kernel asks for pages by inode and keeps
    /// them itself, opens the sample anew for each request.
    pub(crate) fn read_once(
        &self,
        store: &SampleStore,
        offset: u64,
        len: u32,
    ) -> io::Result<Vec<u8>> {
        let want = self.size.saturating_sub(offset).min(u64::from(len));
        let mut buf = vec![0u8; want as usize];
        let got = store.read_source_at(self.id, self.size, offset, &mut buf)?;
        buf.truncate(got);
        Ok(buf)
    }
}
