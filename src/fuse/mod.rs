//! The fuser binding: translate kernel requests into `ShuffleFs` calls and reply.
//!
//! No logic lives here beyond the handle table and the choice of read path. Errors are
//! answered in one place, `fail`, which logs at a level fitting the error and maps it to an
//! errno via `FsError::errno`.
//!
//! Read path (`ReadPath`, chosen at mount):
//! - passthrough: a cached sample is opened with kernel FUSE passthrough when the kernel
//!   offers it (Linux 6.9+), so reads go straight to the cache file and never enter the
//!   daemon. One `BackingId` is shared by all opens of an inode, as the kernel requires.
//!   Every open and close still costs a round trip to the daemon.
//! - page-cache: the first OPEN is answered ENOSYS, after which the kernel opens files
//!   without asking and keeps their pages (`FOPEN_KEEP_CACHE` is its default then). The
//!   first read of a page comes here; the daemon reads the cache file and tells the kernel
//!   to drop the cache file's copy of those pages, so the data sits in memory once. Safe
//!   because views never change. Control files then work without handles: the epoch file
//!   is rendered when the kernel asks for its attributes (TTL zero, `FUSE_AUTO_INVAL_DATA`,
//!   a new mtime each time so stale pages are dropped), and `.shufflefs/status` becomes a
//!   link to a whole document written into the cache folder (`ShuffleFs::status_file`), since
//!   pages of two renderings of a multi-page file could otherwise mix in the kernel's cache.
//! - daemon (and passthrough where the kernel lacks it): opens come here and reads are
//!   served from the cache file, with `FOPEN_KEEP_CACHE`.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::cli::ReadPath;
use crate::vfs::error::FsError;
use crate::vfs::inodes::Node;
use crate::vfs::{Entry, Kind, Opened, ShuffleFs};

/// Published views never change: let the kernel keep them for a day.
const VIEW_TTL: Duration = Duration::from_secs(24 * 3600);

enum Handle {
    Sample {
        file: Arc<File>,
        _backing: Option<Arc<BackingId>>,
    },
    Snapshot(Vec<u8>),
    EpochControl,
}

/// The adapter's state, shared with the threads that answer requests which may wait.
pub struct Adapter {
    fs: Arc<ShuffleFs>,
    handles: Mutex<HashMap<u64, Handle>>,
    backing_by_ino: Mutex<HashMap<u64, Weak<BackingId>>>,
    next_fh: AtomicU64,
    passthrough: AtomicBool,
    read_path: ReadPath,
    /// Page-cache mode: bumped at every rendering of the epoch file, reported as its mtime.
    renders: AtomicU64,
    uid: u32,
    gid: u32,
    time: SystemTime,
}

/// Most threads wait on the source or on an exchange for long stretches: a few more than
/// a parallel filesystem needs to stay busy. Started on demand, gone when idle.
const WAITING_THREADS: usize = 16;

/// What fuser drives: an [`Adapter`] plus the threads for requests that may wait.
///
/// The request threads are few (about one per core, `--fuse-threads`): on a busy node every
/// idle request thread costs a wake-up and a context switch per request, which is most of
/// what a FUSE round trip costs (fewer threads made warm small-file reads ~30% faster on 2
/// cores). So no request thread may wait on the source (a sample not cached yet) or on the
/// exchange (an advance): those requests go to `waiting` and are answered from there.
pub struct FuseAdapter {
    inner: Arc<Adapter>,
    waiting: Option<tokio::runtime::Runtime>,
}

impl std::ops::Deref for FuseAdapter {
    type Target = Adapter;

    fn deref(&self) -> &Adapter {
        &self.inner
    }
}

impl Drop for FuseAdapter {
    fn drop(&mut self) {
        // Don't wait for a fetch or an advance nobody can be answered for any more.
        if let Some(rt) = self.waiting.take() {
            rt.shutdown_background();
        }
    }
}

impl FuseAdapter {
    pub fn new(fs: Arc<ShuffleFs>, read_path: ReadPath) -> std::io::Result<FuseAdapter> {
        let waiting = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(WAITING_THREADS)
            .thread_name("shufflefs-wait")
            .build()?;
        Ok(FuseAdapter {
            inner: Arc::new(Adapter::new(fs, read_path)),
            waiting: Some(waiting),
        })
    }

    /// Runs `job` off the request threads, on `lane`.
    fn defer(&self, lane: Lane, job: impl FnOnce(&Adapter) + Send + 'static) {
        let inner = self.inner.clone();
        match (lane, &self.waiting) {
            (Lane::Source, Some(rt)) => drop(rt.spawn_blocking(move || job(&inner))),
            (Lane::Advance, _) => {
                // A failed spawn drops the reply, which fuser answers with EIO.
                if let Err(e) = std::thread::Builder::new()
                    .name("shufflefs-advance".into())
                    .spawn(move || job(&inner))
                {
                    tracing::error!(error = %e, "no thread for a request that advances the epoch");
                }
            }
            (Lane::Source, None) => job(&inner),
        }
    }
}

/// Where a request that may wait is answered. Fetches share a bounded pool, where a
/// DataLoader opening hundreds of samples not staged yet queues hundreds of them; a request
/// that advances the epoch (waiting on the exchange) gets a thread of its own instead of
/// waiting its turn behind them. It still waits for the samples the next share needs (an
/// advance makes sure this rank holds all of them). Advances are few (one per reader that
/// reaches the next epoch) and run one at a time.
#[derive(Clone, Copy)]
enum Lane {
    Source,
    Advance,
}

impl Adapter {
    fn new(fs: Arc<ShuffleFs>, read_path: ReadPath) -> Adapter {
        Adapter {
            fs,
            handles: Mutex::default(),
            backing_by_ino: Mutex::default(),
            next_fh: AtomicU64::new(1),
            passthrough: AtomicBool::new(false),
            read_path,
            renders: AtomicU64::new(0),
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            time: SystemTime::now(),
        }
    }

    fn attr(&self, e: &Entry) -> FileAttr {
        let (kind, nlink) = match e.kind {
            Kind::Dir => (FileType::Directory, 2),
            Kind::File => (FileType::RegularFile, 1),
            Kind::Symlink => (FileType::Symlink, 1),
        };
        FileAttr {
            ino: INodeNo(e.node.ino()),
            size: e.size,
            blocks: e.size.div_ceil(512),
            atime: self.time,
            mtime: self.time,
            ctime: self.time,
            crtime: self.time,
            kind,
            perm: e.perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        }
    }

    /// `attr`, except that in page-cache mode the epoch file's size is that of its current
    /// content, with a new mtime so the kernel drops what it cached before.
    fn attr_for(&self, e: &Entry) -> FileAttr {
        let mut attr = self.attr(e);
        if self.read_path == ReadPath::PageCache
            && e.node == Node::EpochCtl
            && let Ok(Opened::Snapshot(bytes)) = self.fs.open(e.node.ino(), false)
        {
            attr.size = bytes.len() as u64;
            let generation = self.renders.fetch_add(1, Ordering::Relaxed) + 1;
            attr.mtime = SystemTime::UNIX_EPOCH + Duration::from_nanos(generation);
            attr.ctime = attr.mtime;
        }
        attr
    }

    /// A read without an open (page-cache mode): served by inode.
    fn read_unopened(&self, ino: u64, offset: u64, size: u32, reply: ReplyData) {
        match Node::from_ino(ino) {
            Some(Node::EpochCtl) => {
                let bytes = match self.fs.open(ino, false) {
                    Ok(Opened::Snapshot(bytes)) => bytes,
                    _ => Vec::new(),
                };
                reply.data(window(&bytes, offset, size));
            }
            Some(Node::Sample(_)) => match self.fs.open(ino, false) {
                Ok(Opened::Sample(file)) => {
                    let result = read_full(&file, offset, size);
                    if let Ok(data) = &result {
                        // The kernel keeps these pages now; don't hold them twice.
                        let _ = nix::fcntl::posix_fadvise(
                            file.as_fd(),
                            offset as i64,
                            data.len() as i64,
                            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
                        );
                    }
                    match result {
                        Ok(data) => reply.data(&data),
                        Err(e) => reply.error(fail("read", ino, &FsError::Io(e))),
                    }
                }
                Ok(Opened::Snapshot(bytes)) => reply.data(window(&bytes, offset, size)),
                Ok(Opened::EpochControl) => reply.error(Errno::EBADF),
                Err(err) => reply.error(fail("read", ino, &err)),
            },
            _ => reply.error(Errno::EBADF),
        }
    }

    fn ttl(e: &Entry) -> Duration {
        if e.immutable {
            VIEW_TTL
        } else {
            Duration::ZERO
        }
    }

    fn add_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fh, h);
        fh
    }

    /// Shares one `BackingId` among all opens of an inode.
    fn backing(&self, ino: u64, file: &File, reply: &ReplyOpen) -> std::io::Result<Arc<BackingId>> {
        let mut map = self
            .backing_by_ino
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(id) = map.get(&ino).and_then(Weak::upgrade) {
            return Ok(id);
        }
        map.retain(|_, w| w.strong_count() > 0);
        let id = Arc::new(reply.open_backing(file)?);
        map.insert(ino, Arc::downgrade(&id));
        Ok(id)
    }

    /// Where a request about `node` is answered if it may wait (see `ShuffleFs::may_wait`);
    /// `None`: on the request thread.
    fn lane(&self, node: Node) -> Option<Lane> {
        match node {
            _ if !self.fs.may_wait(node) => None,
            Node::EpochDir(_) => Some(Lane::Advance),
            _ => Some(Lane::Source),
        }
    }

    fn lane_of(&self, ino: INodeNo) -> Option<Lane> {
        Node::from_ino(ino.0).and_then(|n| self.lane(n))
    }

    fn answer_lookup(&self, parent: INodeNo, node: Node, reply: ReplyEntry) {
        match self.fs.lookup_node(node) {
            Ok(e) => reply.entry_with_ttls(
                &Self::ttl(&e),
                &Self::ttl(&e),
                &self.attr_for(&e),
                Generation(0),
            ),
            Err(err) => reply.error(fail("lookup", parent.0, &err)),
        }
    }

    fn answer_getattr(&self, ino: INodeNo, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(e) => reply.attr(&Self::ttl(&e), &self.attr_for(&e)),
            Err(err) => reply.error(fail("getattr", ino.0, &err)),
        }
    }

    fn answer_open(&self, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY);
        if self.read_path == ReadPath::PageCache {
            // ENOSYS switches opens off for the whole mount (see the module docs). Until then
            // a refused open is still answered as such.
            return match self.fs.open(ino.0, write) {
                Err(err) if write => reply.error(fail("open", ino.0, &err)),
                _ => reply.error(Errno::ENOSYS),
            };
        }
        let opened = match self.fs.open(ino.0, write) {
            Ok(o) => o,
            Err(err) => return reply.error(fail("open", ino.0, &err)),
        };
        match opened {
            Opened::Sample(file) => {
                let backing = if self.passthrough.load(Ordering::Relaxed) {
                    match self.backing(ino.0, &file, &reply) {
                        Ok(id) => Some(id),
                        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                            // The kernel lets only CAP_SYS_ADMIN register backing files: say
                            // so once and stop asking.
                            if self.passthrough.swap(false, Ordering::Relaxed) {
                                tracing::warn!(error = %e, "passthrough needs CAP_SYS_ADMIN (root); serving reads from the daemon");
                            }
                            None
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "passthrough refused; serving reads from the daemon");
                            None
                        }
                    }
                } else {
                    None
                };
                let fh = self.add_handle(Handle::Sample {
                    file: Arc::new(file),
                    _backing: backing.clone(),
                });
                match backing {
                    Some(id) => reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id),
                    None => reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE),
                }
            }
            Opened::Snapshot(bytes) => {
                let fh = self.add_handle(Handle::Snapshot(bytes));
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
            }
            Opened::EpochControl => {
                let fh = self.add_handle(Handle::EpochControl);
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
            }
        }
    }

    fn answer_write(&self, ino: INodeNo, fh: FileHandle, data: &[u8], reply: ReplyWrite) {
        let is_control = match self
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&fh.0)
        {
            Some(h) => matches!(h, Handle::EpochControl),
            // Page-cache mode: no handles; the kernel checked write access at open.
            None => {
                self.read_path == ReadPath::PageCache
                    && Node::from_ino(ino.0) == Some(Node::EpochCtl)
            }
        };
        if !is_control {
            return reply.error(fail("write", ino.0, &FsError::ReadOnly));
        }
        match self.fs.write_epoch(data) {
            Ok(n) => reply.written(n as u32),
            Err(err) => reply.error(fail("write", ino.0, &err)),
        }
    }
}

/// Whether reads can pass through with `read_path`: the kernel has FUSE passthrough from
/// Linux 6.9, and registers backing files only for a daemon with CAP_SYS_ADMIN (6.9 to at
/// least 6.18). Checked before mounting because the request thread count depends on it; the
/// handshake has the last word (a kernel built without passthrough says so there).
pub fn may_pass_through(read_path: ReadPath) -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    let effective = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
            u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
        })
        .unwrap_or(0);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    read_path == ReadPath::Passthrough
        && effective & (1 << CAP_SYS_ADMIN) != 0
        && kernel_at_least(&release, (6, 9))
}

/// Whether a kernel release string such as `6.18.0-1-amd64` is `min` or later.
fn kernel_at_least(release: &str, min: (u32, u32)) -> bool {
    let mut parts = release.trim().split(['.', '-']);
    let mut number = || parts.next().and_then(|p| p.parse::<u32>().ok());
    match (number(), number()) {
        (Some(major), Some(minor)) => (major, minor) >= min,
        _ => false,
    }
}

/// The part of `bytes` a read of `size` bytes at `offset` gets.
fn window(bytes: &[u8], offset: u64, size: u32) -> &[u8] {
    let start = (offset as usize).min(bytes.len());
    let end = start.saturating_add(size as usize).min(bytes.len());
    &bytes[start..end]
}

/// Reads up to `size` bytes at `offset`, short only at the end of the file.
fn read_full(file: &File, offset: u64, size: u32) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; size as usize];
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

/// The one place errors become errnos.
fn fail(op: &str, ino: u64, err: &FsError) -> Errno {
    if err.is_routine() {
        tracing::debug!(op, ino, error = %err);
    } else {
        tracing::warn!(op, ino, error = %err);
    }
    Errno::from_i32(err.errno())
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_PARALLEL_DIROPS);
        if self.read_path == ReadPath::PageCache {
            // Control files change: the kernel must ask for their attributes on every read.
            let _ = config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA);
        }
        if self.read_path == ReadPath::Passthrough && !may_pass_through(self.read_path) {
            tracing::warn!(
                "passthrough needs Linux 6.9 or later and CAP_SYS_ADMIN (root); serving reads from the daemon"
            );
        } else if self.read_path == ReadPath::Passthrough
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
        {
            // The cache may itself sit on an overlay (containers): allow one level below us.
            let ok = config.set_max_stack_depth(2).is_ok();
            self.passthrough.store(ok, Ordering::Relaxed);
        }
        tracing::info!(
            passthrough = self.passthrough.load(Ordering::Relaxed),
            read_path = ?self.read_path,
            "FUSE session initialised"
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.child(parent.0, name) {
            Err(err) => reply.error(fail("lookup", parent.0, &err)),
            Ok(node) => match self.lane(node) {
                Some(lane) => self.defer(lane, move |a| a.answer_lookup(parent, node, reply)),
                None => self.inner.answer_lookup(parent, node, reply),
            },
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.lane_of(ino) {
            Some(lane) => self.defer(lane, move |a| a.answer_getattr(ino, reply)),
            None => self.inner.answer_getattr(ino, reply),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let size_only = size.is_some()
            && mode.is_none()
            && uid.is_none()
            && gid.is_none()
            && atime.is_none()
            && mtime.is_none();
        match self.fs.setattr(ino.0, size_only) {
            Ok(e) => reply.attr(&Duration::ZERO, &self.attr(&e)),
            Err(err) => reply.error(fail("setattr", ino.0, &err)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(err) => reply.error(fail("readlink", ino.0, &err)),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(fail("mknod", parent.0, &FsError::ReadOnly));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(fail("mkdir", parent.0, &FsError::ReadOnly));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(fail("unlink", parent.0, &FsError::ReadOnly));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(fail("rmdir", parent.0, &FsError::ReadOnly));
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(fail("symlink", parent.0, &FsError::ReadOnly));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _np: INodeNo,
        _nn: &OsStr,
        _f: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(fail("rename", parent.0, &FsError::ReadOnly));
    }

    fn link(&self, _req: &Request, ino: INodeNo, _np: INodeNo, _nn: &OsStr, reply: ReplyEntry) {
        reply.error(fail("link", ino.0, &FsError::ReadOnly));
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(fail("create", parent.0, &FsError::ReadOnly));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.lane_of(ino) {
            Some(lane) => self.defer(lane, move |a| a.answer_open(ino, flags, reply)),
            None => self.inner.answer_open(ino, flags, reply),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        match handles.get(&fh.0) {
            Some(Handle::Snapshot(bytes)) => reply.data(window(bytes, offset, size)),
            Some(Handle::Sample { file, .. }) => {
                let file = file.clone();
                drop(handles);
                match read_full(&file, offset, size) {
                    Ok(data) => reply.data(&data),
                    Err(e) => reply.error(fail("read", ino.0, &FsError::Io(e))),
                }
            }
            Some(Handle::EpochControl) => reply.error(Errno::EBADF),
            None if self.read_path == ReadPath::PageCache => {
                drop(handles);
                match self.lane_of(ino) {
                    Some(lane) => {
                        self.defer(lane, move |a| a.read_unopened(ino.0, offset, size, reply))
                    }
                    None => self.read_unopened(ino.0, offset, size, reply),
                }
            }
            None => reply.error(Errno::EBADF),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _offset: u64,
        data: &[u8],
        _wf: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // Only the epoch control file takes writes, and a write there advances: it waits.
        let data = data.to_vec();
        self.defer(Lane::Advance, move |a| {
            a.answer_write(ino, fh, &data, reply)
        });
    }

    /// Nothing to flush in a read-only view. ENOSYS tells the kernel to stop sending FLUSH,
    /// which would otherwise cost a round trip on every close().
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.getattr(ino.0) {
            Ok(e) if e.kind == Kind::Dir => reply.opened(
                FileHandle(0),
                // An immutable folder's listing, once cached, serves every later opendir.
                if e.immutable {
                    FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                },
            ),
            Ok(_) => reply.error(fail("opendir", ino.0, &FsError::NotDir)),
            Err(err) => reply.error(fail("opendir", ino.0, &err)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Positions 0 and 1 are `.` and `..`; the logic's entries follow.
        let dots = [(ino.0, "."), (ino.0, "..")];
        for (i, (dino, name)) in dots.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*dino), i as u64 + 1, FileType::Directory, name) {
                return reply.ok();
            }
        }
        let result = self
            .fs
            .readdir(ino.0, offset.saturating_sub(2), |e, name, next| {
                let kind = self.attr(&e).kind;
                reply.add(INodeNo(e.node.ino()), next + 2, kind, name)
            });
        match result {
            Ok(()) => reply.ok(),
            Err(err) => reply.error(fail("readdir", ino.0, &err)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        // `.` and `..` carry no attributes the kernel uses; list them with the dir's own.
        let me = match self.fs.getattr(ino.0) {
            Ok(e) => e,
            Err(err) => return reply.error(fail("readdirplus", ino.0, &err)),
        };
        for (i, name) in [".", ".."].iter().enumerate().skip(offset as usize) {
            if reply.add(
                ino,
                i as u64 + 1,
                name,
                &Duration::ZERO,
                &self.attr(&me),
                Generation(0),
            ) {
                return reply.ok();
            }
        }
        let result = self
            .fs
            .readdir(ino.0, offset.saturating_sub(2), |e, name, next| {
                reply.add(
                    INodeNo(e.node.ino()),
                    next + 2,
                    name,
                    &Adapter::ttl(&e),
                    &self.attr(&e),
                    Generation(0),
                )
            });
        match result {
            Ok(()) => reply.ok(),
            Err(err) => reply.error(fail("readdirplus", ino.0, &err)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        match self.fs.access(ino.0, mask.contains(AccessFlags::W_OK)) {
            Ok(()) => reply.ok(),
            Err(err) => reply.error(fail("access", ino.0, &err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::kernel_at_least;

    #[test]
    fn kernel_release_comparison() {
        assert!(kernel_at_least("6.18.0-1-amd64\n", (6, 9)));
        assert!(kernel_at_least("6.9", (6, 9)));
        assert!(kernel_at_least("7.0.1", (6, 9)));
        assert!(!kernel_at_least("6.8.12-generic", (6, 9)));
        assert!(!kernel_at_least("5.15.0", (6, 9)));
        assert!(!kernel_at_least("", (6, 9)));
        assert!(!kernel_at_least("garbage", (6, 9)));
    }
}
