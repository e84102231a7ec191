//! The fuser binding: translate kernel requests into `vfs` calls and reply.
//!
//! No logic lives here. What a node is, how long the kernel may cache it, which requests may
//! wait and on what (`vfs::Wait`), the handle table and reading through it (`vfs::OpenFiles`)
//! all live in `vfs`; this module converts arguments and results, runs requests that may wait
//! off the request threads, registers passthrough backing files (a fuser type), and replies.
//! Errors are answered in one place, `fail`, which logs at a level fitting the error and maps
//! it to an errno via `FsError::errno`.
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
//!
//! `ioctl` is answered ENOTTY at once and logged at debug level only: `isatty()` sends
//! TCGETS on every open by Python (a 2-rank DLIO run asked 111,000 times). The round trip
//! itself cannot be avoided. Linux sends FUSE_IOCTL for every `ioctl(2)` on a FUSE file
//! (`fuse_file_ioctl` -> `fuse_ioctl_common` -> `fuse_do_ioctl` in fs/fuse/ioctl.c) and
//! remembers no answer: `fuse_send_ioctl` turns ENOSYS into ENOTTY for that one call and
//! sets no `fc->no_ioctl` (unlike FLUSH or OPEN, where ENOSYS sets `fc->no_flush` /
//! `fc->no_open` for the whole mount), and no INIT flag or FOPEN flag opts out. Passthrough
//! does not cover ioctl either: the request still comes here.
//!
//! Unmounting: fuser's `Session` unmounts when it is dropped, at the end of `Session::run`
//! too, even when the mount is already gone because someone else unmounted it (`fusermount3
//! -u`, `shufflefs unmount`). Its check (`is_mounted` in fuser 0.18's src/mnt/mod.rs) takes
//! POLLERR on /dev/fuse for "still mounted", but POLLERR is what the kernel answers once an
//! unmount aborted the connection (`fuse_dev_poll` in fs/fuse/dev.c: `if (!fiq->connected)
//! mask = EPOLLERR`). So `umount(2)` of the bare folder fails with EINVAL, and
//! `UmountOnDrop::drop` (src/session.rs) logged "Failed to umount filesystem: Invalid
//! argument" at WARN after every clean unmount. Now [`mount`] hands the session's unmounter
//! to the adapter, and `destroy` (which fuser calls when the session ends, before that drop)
//! unmounts first: a mount still there (the session failed, or a refused start drops the
//! session) is unmounted as before, and EINVAL, a mount already gone, is noted at debug level
//! only. The drop then finds nothing left to unmount. Like fuser's drop, this unmounts by path.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use fuser::{
    BackingId, Config, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo,
    OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyEntry, ReplyOpen, ReplyWrite, Session,
    SessionUnmounter,
};

use crate::node::requests::Requests;
use crate::sys::kernel::ReadPath;
use crate::sys::sync::Locked;
use crate::vfs::error::FsError;
use crate::vfs::handles::Attached;
use crate::vfs::inodes::Node;
use crate::vfs::{Cancel, Cancelled, Entry, Kind, OpenFiles, ShuffleFs, Wait};

mod interrupt;
mod ops;
pub mod read_path;

use interrupt::Waiters;

/// Re-exported for the daemon's wiring (it sizes the request threads by it).
pub use crate::sys::kernel::may_pass_through;

/// The adapter's state, shared with the threads that answer requests which may wait.
pub struct Adapter {
    files: OpenFiles,
    /// Keeps each passthrough handle's backing file registered until it is released.
    backing_by_ino: Mutex<HashMap<u64, Weak<BackingId>>>,
    passthrough: AtomicBool,
    read_path: ReadPath,
    time: SystemTime,
    /// Requests answered, by kind (the status's `fuse_requests`).
    requests: Arc<Requests>,
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
/// exchange (an advance): `vfs::Wait` says which requests may, and they are answered from
/// `waiting` (fetches) or a thread of their own (advances, see `vfs::wait`).
pub struct FuseAdapter {
    inner: Arc<Adapter>,
    waiting: Option<tokio::runtime::Runtime>,
    /// The session's unmounter, once mounted (see the module docs).
    unmounter: Arc<Mutex<Option<SessionUnmounter>>>,
    /// Requests that may wait on an advance, answered when their caller is signalled or
    /// the mount goes away (see `interrupt`).
    waiters: Arc<Waiters>,
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
        self.waiters.stop();
    }
}

/// Mounts `adapter` at `mountpoint`: `fuser::Session::new`, plus handing the adapter the
/// session's unmounter so that the end of the session unmounts quietly (module docs).
pub fn mount(
    adapter: FuseAdapter,
    mountpoint: &Path,
    config: &Config,
) -> std::io::Result<Session<FuseAdapter>> {
    let (slot, waiters) = (adapter.unmounter.clone(), adapter.waiters.clone());
    let mut session = Session::new(adapter, mountpoint, config).map_err(explain_denied)?;
    *slot.locked() = Some(session.unmount_callable());
    waiters.mounted(crate::sys::mounts::fuse_device(mountpoint));
    Ok(session)
}

/// A mount refused for permission says only "Permission denied": say what a non-root user
/// needs to mount with FUSE.
fn explain_denied(e: std::io::Error) -> std::io::Error {
    if e.kind() != std::io::ErrorKind::PermissionDenied {
        return e;
    }
    std::io::Error::new(
        e.kind(),
        format!(
            "{e}. Mounting with FUSE as a user needs read-write access to /dev/fuse (`ls -l /dev/fuse`; \
             often membership of the `fuse` group), a setuid fusermount3 on the PATH \
             (`ls -l $(command -v fusermount3)` shows `rws`), and for --allow-other \
             `user_allow_other` in /etc/fuse.conf; ask an administrator, or run as root"
        ),
    )
}

impl FuseAdapter {
    /// The adapter for `fs`, reading as `read_path` (resolved: `read_path::choose`; an
    /// unresolved `Auto` reads as passthrough), counting requests into `requests`.
    pub fn new(
        fs: Arc<ShuffleFs>,
        read_path: ReadPath,
        requests: Arc<Requests>,
    ) -> std::io::Result<FuseAdapter> {
        let waiting = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(WAITING_THREADS)
            .thread_name("shufflefs-wait")
            .build()?;
        Ok(FuseAdapter {
            inner: Arc::new(Adapter::new(fs, read_path, requests)),
            waiting: Some(waiting),
            unmounter: Arc::default(),
            waiters: Waiters::start()?,
        })
    }

    /// Runs `job` where a request that may wait as `wait` says is answered: at once on this
    /// request thread, in the pool for fetches, or on a thread of its own for an advance.
    /// An advance's job gets a token that its caller's signals and the mount's end set
    /// (`interrupt`); the others get one nobody sets.
    fn answer(
        &self,
        req: &fuser::Request,
        wait: Wait,
        job: impl FnOnce(&Adapter, &Cancel) + Send + 'static,
    ) {
        match (wait, &self.waiting) {
            (Wait::No, _) | (Wait::Source, None) => job(&self.inner, &Cancel::never()),
            (Wait::Source, Some(rt)) => {
                let inner = self.inner.clone();
                drop(rt.spawn_blocking(move || job(&inner, &Cancel::never())));
            }
            (Wait::Advance, _) => {
                let inner = self.inner.clone();
                let waiting = self.waiters.register(req.unique().0, req.pid());
                // A failed spawn drops the reply, which fuser answers with EIO.
                if let Err(e) = std::thread::Builder::new()
                    .name("shufflefs-advance".into())
                    .spawn(move || job(&inner, waiting.cancel()))
                {
                    tracing::error!(error = %e, "no thread for a request that advances the epoch");
                }
            }
        }
    }

    /// The end of the session: answer every waiting request, and unmount unless the mount
    /// is gone already (module docs).
    fn unmount_at_end(&mut self) {
        self.waiters.close(Cancelled::ShuttingDown);
        let unmounter = self.unmounter.locked().take();
        let Some(mut unmounter) = unmounter else {
            return;
        };
        match unmounter.unmount() {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::debug!("the mount was already gone when the session ended");
            }
            Err(e) => tracing::warn!(error = %e, "unmounting at the end of the session failed"),
        }
    }
}

impl Adapter {
    fn new(fs: Arc<ShuffleFs>, read_path: ReadPath, requests: Arc<Requests>) -> Adapter {
        let read_path = match read_path {
            ReadPath::Auto => ReadPath::Passthrough,
            path => path,
        };
        Adapter {
            requests,
            files: OpenFiles::new(fs, read_path != ReadPath::PageCache),
            backing_by_ino: Mutex::default(),
            passthrough: AtomicBool::new(false),
            read_path,
            time: SystemTime::now(),
        }
    }

    fn fs(&self) -> &ShuffleFs {
        self.files.fs()
    }

    /// `e` as the kernel's attributes, dated at mounting unless `e` says when it changed.
    fn attr(&self, e: &Entry) -> FileAttr {
        let kind = match e.kind {
            Kind::Dir => FileType::Directory,
            Kind::File => FileType::RegularFile,
            Kind::Symlink => FileType::Symlink,
        };
        let mtime = e.mtime.unwrap_or(self.time);
        FileAttr {
            ino: INodeNo(e.node.ino()),
            size: e.size,
            blocks: e.blocks(),
            atime: self.time,
            mtime,
            ctime: mtime,
            crtime: self.time,
            kind,
            perm: e.perm,
            nlink: e.nlink(),
            uid: e.uid,
            gid: e.gid,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        }
    }

    /// Shares one `BackingId` among all opens of an inode.
    fn backing(&self, ino: u64, file: &File, reply: &ReplyOpen) -> std::io::Result<Arc<BackingId>> {
        let mut map = self.backing_by_ino.locked();
        if let Some(id) = map.get(&ino).and_then(Weak::upgrade) {
            return Ok(id);
        }
        map.retain(|_, w| w.strong_count() > 0);
        let id = Arc::new(reply.open_backing(file)?);
        map.insert(ino, Arc::downgrade(&id));
        Ok(id)
    }

    /// A backing file for `file` if reads of it may pass through; warns (once, for missing
    /// privileges) and serves reads from the daemon otherwise.
    fn pass_through(&self, ino: u64, file: &File, reply: &ReplyOpen) -> Option<Arc<BackingId>> {
        if !self.passthrough.load(Ordering::Relaxed) {
            return None;
        }
        match self.backing(ino, file, reply) {
            Ok(id) => Some(id),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                // The kernel lets only CAP_SYS_ADMIN register backing files: say so once
                // and stop asking.
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
    }

    fn answer_lookup(&self, parent: INodeNo, node: Node, cancel: &Cancel, reply: ReplyEntry) {
        match self.files.lookup_node_until(node, cancel) {
            Ok(e) => reply.entry_with_ttls(&e.ttl(), &e.ttl(), &self.attr(&e), Generation(0)),
            Err(err) => reply.error(self.fail("lookup", parent.0, &err)),
        }
    }

    fn answer_getattr(&self, ino: INodeNo, reply: ReplyAttr) {
        match self.files.getattr(ino.0) {
            Ok(e) => reply.attr(&e.ttl(), &self.attr(&e)),
            Err(err) => reply.error(self.fail("getattr", ino.0, &err)),
        }
    }

    fn answer_open(&self, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY);
        // The backing registration lives with the handle (one table, one insert per open).
        let mut backing = None;
        let open = self.files.open_attached(ino.0, write, |file| {
            let id = self.pass_through(ino.0, file, &reply)?;
            backing = Some(id.clone());
            Some(id as Attached)
        });
        let open = match open {
            Ok(Some(open)) => open,
            // No opens on this mount: ENOSYS switches them off (see the module docs).
            Ok(None) => return reply.error(Errno::ENOSYS),
            Err(err) => return reply.error(self.fail("open", ino.0, &err)),
        };
        let fh = FileHandle(open.fh);
        match backing {
            Some(id) => reply.opened_passthrough(fh, FopenFlags::empty(), &id),
            None if open.keep_cache => reply.opened(fh, FopenFlags::FOPEN_KEEP_CACHE),
            None => reply.opened(fh, FopenFlags::FOPEN_DIRECT_IO),
        }
    }

    fn answer_data(&self, ino: INodeNo, data: Result<Vec<u8>, FsError>, reply: ReplyData) {
        match data {
            Ok(data) => reply.data(&data),
            Err(err) => reply.error(self.fail("read", ino.0, &err)),
        }
    }

    fn answer_write(
        &self,
        ino: INodeNo,
        (fh, offset): (FileHandle, u64),
        data: &[u8],
        cancel: &Cancel,
        reply: ReplyWrite,
    ) {
        let written = if self.files.opens() {
            self.files.write_until(fh.0, data, cancel)
        } else {
            self.files.write_unopened_until(ino.0, offset, data, cancel)
        };
        // The write returns once the kernel forgot the old epoch's names (`vfs::write_epoch`).
        match written {
            Ok(n) => reply.written(n as u32),
            Err(err) => reply.error(self.fail("write", ino.0, &err)),
        }
    }

    fn release(&self, fh: FileHandle) {
        self.files.release(fh.0);
    }
}

impl Adapter {
    /// The one place errors become errnos: logged, and counted by operation and errno (the
    /// status's `fuse_errors`).
    fn fail(&self, op: &'static str, ino: u64, err: &FsError) -> Errno {
        if err.is_routine() {
            tracing::debug!(op, ino, error = %err);
        } else {
            tracing::warn!(op, ino, error = %err);
        }
        self.requests.failed(op, err.errno());
        Errno::from_i32(err.errno())
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Error, ErrorKind};

    #[test]
    fn a_denied_mount_says_what_a_user_needs() {
        let text = super::explain_denied(Error::from(ErrorKind::PermissionDenied)).to_string();
        for needle in ["/dev/fuse", "fusermount3", "user_allow_other"] {
            assert!(text.contains(needle), "{text}");
        }
        let other = super::explain_denied(Error::from(ErrorKind::NotFound)).to_string();
        assert!(!other.contains("/dev/fuse"), "{other}");
    }
}
