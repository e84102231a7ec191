//! Open files: the handle table, and reading and writing through a handle.
//!
//! The kernel names an open file by a number (`fh`) that the filesystem hands out at open.
//! What a handle stands for is decided at open and never changes: a cached sample file
//! (read at each request, so it may be served without copying it into memory), bytes frozen
//! at open (the status document, the epoch file, a sample the cache could not take), or the
//! epoch control file opened for writing. Freezing bytes at open is what makes chunked reads
//! of a changing control file agree with each other.
//!
//! A mount may also work without opens (`--read-path page-cache`, see `fuse`): the kernel
//! then opens files itself and every request comes by inode number alone. `read_unopened`,
//! `write_unopened` and the attributes of the epoch file (`getattr`, `lookup_node`) serve
//! that mode.
//!
//! Nothing here knows fuser, so a test can drive the view through handles as the kernel
//! would. Passthrough is the binding's business: it asks for the cache file behind a
//! handle ([`OpenFile::cache_file`]) and registers it with the kernel.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::sys::io::read_full_at;
use crate::sys::sync::Locked;
use crate::vfs::error::FsError;
use crate::vfs::inodes::Node;
use crate::vfs::{Cancel, Entry, Opened, ShuffleFs};

/// What the binding keeps with a handle for as long as it is open (passthrough's backing
/// registration), so one table holds everything an open file needs.
pub(crate) type Attached = Arc<dyn std::any::Any + Send + Sync>;

/// What a handle reads from.
enum Handle {
    /// The attachment is only held: dropping the handle releases it.
    Sample {
        file: Arc<File>,
        _attached: Option<Attached>,
    },
    Snapshot(Arc<[u8]>),
    /// A sample too large for memory that the cache does not hold: read from the source.
    Stream(Arc<crate::vfs::stream::SourceStream>),
    /// A record source's part: read group by group through the store.
    Part(Arc<crate::vfs::PartLayout>, u32),
    /// The epoch control file; `wrote` once it took its one write (one open, one advance).
    EpochControl {
        wrote: bool,
    },
}

/// A file just opened.
#[derive(Debug)]
pub struct OpenFile {
    /// The number the kernel names it by until it releases it.
    pub fh: u64,
    /// The cache file behind the handle, when it is one: the kernel may read it directly
    /// (passthrough) instead of asking for its bytes.
    pub cache_file: Option<Arc<File>>,
    /// Whether the kernel may keep the file's pages once it is closed: true for samples
    /// (they never change); false for bytes frozen at open, which each open must read anew.
    pub keep_cache: bool,
}

/// The handle table over a [`ShuffleFs`].
pub struct OpenFiles {
    fs: Arc<ShuffleFs>,
    /// False on a mount without opens (see the module docs).
    opens: bool,
    table: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    /// Without opens: bumped at every rendering of the epoch file, reported as its mtime.
    renders: AtomicU64,
}

impl OpenFiles {
    /// `opens`: whether the kernel opens files through us (false: `--read-path page-cache`).
    pub fn new(fs: Arc<ShuffleFs>, opens: bool) -> OpenFiles {
        OpenFiles {
            fs,
            opens,
            table: Mutex::default(),
            next_fh: AtomicU64::new(1),
            renders: AtomicU64::new(0),
        }
    }

    pub(crate) fn fs(&self) -> &Arc<ShuffleFs> {
        &self.fs
    }

    /// Whether the kernel opens files through us.
    pub(crate) fn opens(&self) -> bool {
        self.opens
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Handle>> {
        self.table.locked()
    }

    /// Opens `ino` (for writing if `write`). `None` on a mount without opens: nothing to
    /// hand out, though a refused write is still refused.
    pub fn open(&self, ino: u64, write: bool) -> Result<Option<OpenFile>, FsError> {
        self.open_attached(ino, write, |_| None)
    }

    /// [`open`](Self::open), keeping with a cache file's handle what `attach` returns for
    /// it until the handle is released.
    pub(crate) fn open_attached(
        &self,
        ino: u64,
        write: bool,
        attach: impl FnOnce(&File) -> Option<Attached>,
    ) -> Result<Option<OpenFile>, FsError> {
        let opened = self.fs.open(ino, write);
        if !self.opens {
            return match opened {
                Err(err) if write => Err(err),
                _ => Ok(None),
            };
        }
        let (handle, cache_file, keep_cache) = match opened? {
            Opened::Sample(file) => {
                let file = Arc::new(file);
                let attached = attach(&file);
                (
                    Handle::Sample {
                        file: file.clone(),
                        _attached: attached,
                    },
                    Some(file),
                    true,
                )
            }
            Opened::Snapshot(bytes) => (Handle::Snapshot(bytes.into()), None, false),
            Opened::Stream(stream) => (Handle::Stream(Arc::new(stream)), None, false),
            // A part never changes: its inode is its epoch's own.
            Opened::Part(layout, p) => (Handle::Part(layout, p), None, true),
            Opened::EpochControl => (Handle::EpochControl { wrote: false }, None, false),
        };
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.table().insert(fh, handle);
        Ok(Some(OpenFile {
            fh,
            cache_file,
            keep_cache,
        }))
    }

    /// Up to `size` bytes at `offset` through handle `fh`, short only at the end.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        let file = match self.table().get(&fh) {
            Some(Handle::Snapshot(bytes)) => return Ok(window(bytes, offset, size).to_vec()),
            Some(Handle::Sample { file, .. }) => file.clone(),
            Some(Handle::Part(layout, p)) => {
                let (layout, p) = (layout.clone(), *p);
                return self.fs.read_part(&layout, p, offset, size);
            }
            Some(Handle::Stream(stream)) => {
                let stream = stream.clone();
                return Ok(stream.read(&self.fs.store, offset, size)?);
            }
            Some(Handle::EpochControl { .. }) | None => return Err(FsError::BadHandle),
        };
        // Read without holding the table: other opens and reads go on meanwhile.
        Ok(read_full(&file, offset, size)?)
    }

    /// Whether a read through handle `fh` may wait on the source (a part's groups may not be
    /// cached yet, a stream reads it), so the binding runs it where waiting is allowed.
    pub(crate) fn read_wait(&self, fh: u64) -> crate::vfs::Wait {
        match self.table().get(&fh) {
            Some(Handle::Part(..) | Handle::Stream(_)) => crate::vfs::Wait::Source,
            _ => crate::vfs::Wait::No,
        }
    }

    /// A write through handle `fh`: only the epoch control file takes one, and it advances.
    pub fn write(&self, fh: u64, data: &[u8]) -> Result<usize, FsError> {
        self.write_until(fh, data, &Cancel::never())
    }

    /// [`OpenFiles::write`], giving up the advance's wait when `cancel` is set.
    pub(crate) fn write_until(
        &self,
        fh: u64,
        data: &[u8],
        cancel: &Cancel,
    ) -> Result<usize, FsError> {
        match self.table().get_mut(&fh) {
            // `printf "4\n5\n6" > epoch` writes each line on its own: only the first counts.
            Some(Handle::EpochControl { wrote: true }) => return Err(second_write(data)),
            Some(Handle::EpochControl { wrote }) => *wrote = true,
            _ => return Err(FsError::ReadOnly),
        }
        self.fs.write_epoch_until(data, cancel)
    }

    /// Forgets handle `fh`; its file closes once no read uses it any more.
    pub fn release(&self, fh: u64) {
        self.table().remove(&fh);
    }

    /// How many handles are open.
    pub fn len(&self) -> usize {
        self.table().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A read without an open (mount without opens), by inode. The kernel keeps the pages it
    /// gets, so a cache file's copy of them is dropped: the data sits in memory once.
    pub fn read_unopened(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        match Node::from_ino(ino) {
            Some(Node::EpochCtl) => {
                let bytes = match self.fs.open(ino, false) {
                    Ok(Opened::Snapshot(bytes)) => bytes,
                    _ => Vec::new(),
                };
                Ok(window(&bytes, offset, size).to_vec())
            }
            Some(Node::Sample(_) | Node::Side(_)) => match self.fs.open(ino, false)? {
                Opened::Sample(file) => {
                    let data = read_full(&file, offset, size)?;
                    let _ = nix::fcntl::posix_fadvise(
                        file.as_fd(),
                        offset as i64,
                        data.len() as i64,
                        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
                    );
                    Ok(data)
                }
                Opened::Snapshot(bytes) => Ok(window(&bytes, offset, size).to_vec()),
                Opened::Stream(stream) => Ok(stream.read_once(&self.fs.store, offset, size)?),
                Opened::EpochControl | Opened::Part(..) => Err(FsError::BadHandle),
            },
            Some(Node::Part(e, p)) => {
                let layout = self.fs.layout(e)?;
                self.fs.read_part(&layout, p, offset, size)
            }
            _ => Err(FsError::BadHandle),
        }
    }

    /// A write without an open (mount without opens): the kernel checked write access at
    /// its open, which only the epoch control file grants.
    pub fn write_unopened(&self, ino: u64, data: &[u8]) -> Result<usize, FsError> {
        self.write_unopened_until(ino, 0, data, &Cancel::never())
    }

    /// [`OpenFiles::write_unopened`] at `offset`, giving up the advance's wait when `cancel`
    /// is set. Without a handle, a write past the start is the open's second one.
    pub(crate) fn write_unopened_until(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        cancel: &Cancel,
    ) -> Result<usize, FsError> {
        if Node::from_ino(ino) != Some(Node::EpochCtl) {
            return Err(FsError::ReadOnly);
        }
        if offset > 0 {
            return Err(second_write(data));
        }
        self.fs.write_epoch_until(data, cancel)
    }

    /// `ShuffleFs::getattr`, with the epoch file's attributes fresh (see `rendered`).
    pub fn getattr(&self, ino: u64) -> Result<Entry, FsError> {
        self.fs.getattr(ino).map(|e| self.rendered(e))
    }

    /// [`OpenFiles::lookup_node`], giving up an advance's wait when `cancel` is set.
    pub(crate) fn lookup_node_until(&self, node: Node, cancel: &Cancel) -> Result<Entry, FsError> {
        self.fs
            .lookup_node_until(node, cancel)
            .map(|e| self.rendered(e))
    }

    /// Without opens the epoch file is rendered when the kernel asks for its attributes: its
    /// size is that of its current content, and a new mtime each time makes the kernel drop
    /// the pages of an older rendering (TTL zero and `FUSE_AUTO_INVAL_DATA` make it ask).
    fn rendered(&self, e: Entry) -> Entry {
        if self.opens || e.node != Node::EpochCtl {
            return e;
        }
        match self.fs.open(e.node.ino(), false) {
            Ok(Opened::Snapshot(bytes)) => {
                let generation = self.renders.fetch_add(1, Ordering::Relaxed) + 1;
                Entry {
                    size: bytes.len() as u64,
                    mtime: Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(generation)),
                    ..e
                }
            }
            _ => e,
        }
    }
}

/// The part of `bytes` a read of `size` bytes at `offset` gets.
fn window(bytes: &[u8], offset: u64, size: u32) -> &[u8] {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let end = start.saturating_add(size as usize).min(bytes.len());
    &bytes[start..end]
}

/// Reads up to `size` bytes at `offset`, short only at the end of the file.
fn read_full(file: &File, offset: u64, size: u32) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; size as usize];
    let filled = read_full_at(file, offset, &mut buf)?;
    buf.truncate(filled);
    Ok(buf)
}

/// The refusal of a second write through one open of the control file: one write is one
/// epoch number, so a shell's line-by-line `printf "4\n5\n6"` cannot advance three times.
fn second_write(data: &[u8]) -> FsError {
    FsError::Invalid(format!(
        "{:?} came after another write to the same open of the epoch file; one open takes one epoch number: `echo N > .shufflefs/epoch` for each advance",
        String::from_utf8_lossy(data)
    ))
}

#[cfg(test)]
mod tests {
    use super::window;

    #[test]
    fn windows_stop_at_the_end() {
        let b = b"0123456789";
        assert_eq!(window(b, 0, 4), b"0123");
        assert_eq!(window(b, 8, 4), b"89");
        assert_eq!(window(b, 10, 4), b"");
        assert_eq!(window(b, u64::MAX, 4), b"");
        assert_eq!(window(b, 3, 0), b"");
    }
}
