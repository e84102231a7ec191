//! The `fuser::Filesystem` methods: each converts its arguments, calls `vfs` (through the
//! adapter's helpers in the parent module, on the lane `vfs::Wait` names), and replies.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use super::FuseAdapter;
use crate::node::requests::Op;
use crate::sys::kernel::ReadPath;
use crate::sys::kernel::may_pass_through;
use crate::vfs::error::FsError;
use crate::vfs::{Kind, Wait};

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

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.requests.count(Op::Lookup);
        match self.fs().child(parent.0, name) {
            Err(err) => reply.error(self.fail("lookup", parent.0, &err)),
            // Looking up the next epoch advances: only the mounting user and root may.
            Ok(node)
                if self.fs().wait(node) == Wait::Advance && !self.fs().may_control(req.uid()) =>
            {
                reply.error(self.fail("lookup", parent.0, &FsError::NotPermitted))
            }
            Ok(node) => self.answer(req, self.fs().wait(node), move |a, cancel| {
                a.answer_lookup(parent, node, cancel, reply)
            }),
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.requests.count(Op::Getattr);
        self.answer(req, self.fs().wait_ino(ino.0), move |a, _| {
            a.answer_getattr(ino, reply)
        });
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
        self.requests.count(Op::Other);
        let size_only = size.is_some()
            && mode.is_none()
            && uid.is_none()
            && gid.is_none()
            && atime.is_none()
            && mtime.is_none();
        match self.fs().setattr(ino.0, size_only) {
            Ok(e) => reply.attr(&e.ttl(), &self.attr(&e)),
            Err(err) => reply.error(self.fail("setattr", ino.0, &err)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.requests.count(Op::Other);
        match self.fs().readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(err) => reply.error(self.fail("readlink", ino.0, &err)),
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
        self.requests.count(Op::Other);
        reply.error(self.fail("mknod", parent.0, &FsError::ReadOnly));
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
        self.requests.count(Op::Other);
        reply.error(self.fail("mkdir", parent.0, &FsError::ReadOnly));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        self.requests.count(Op::Other);
        reply.error(self.fail("unlink", parent.0, &FsError::ReadOnly));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        self.requests.count(Op::Other);
        reply.error(self.fail("rmdir", parent.0, &FsError::ReadOnly));
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        self.requests.count(Op::Other);
        reply.error(self.fail("symlink", parent.0, &FsError::ReadOnly));
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
        self.requests.count(Op::Other);
        reply.error(self.fail("rename", parent.0, &FsError::ReadOnly));
    }

    fn link(&self, _req: &Request, ino: INodeNo, _np: INodeNo, _nn: &OsStr, reply: ReplyEntry) {
        self.requests.count(Op::Other);
        reply.error(self.fail("link", ino.0, &FsError::ReadOnly));
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
        self.requests.count(Op::Other);
        reply.error(self.fail("create", parent.0, &FsError::ReadOnly));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.requests.count(Op::Open);
        self.answer(req, self.fs().wait_ino(ino.0), move |a, _| {
            a.answer_open(ino, flags, reply)
        });
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.requests.count(Op::Read);
        if self.files.opens() {
            // A record source's part may wait on the source; a cache file never does.
            return match self.files.read_wait(fh.0) {
                Wait::No => self.answer_data(ino, self.files.read(fh.0, offset, size), reply),
                wait => self.answer(req, wait, move |a, _| {
                    a.answer_data(ino, a.files.read(fh.0, offset, size), reply)
                }),
            };
        }
        // No opens on this mount: a read comes by inode, and may fetch the sample.
        self.answer(req, self.fs().read_wait_ino(ino.0), move |a, _| {
            a.answer_data(ino, a.files.read_unopened(ino.0, offset, size), reply)
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _wf: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.requests.count(Op::Write);
        // Only the epoch control file takes writes, and a write there advances: it waits,
        // and only the mounting user and root may.
        if !self.fs().may_control(req.uid()) {
            return reply.error(self.fail("write", ino.0, &FsError::NotPermitted));
        }
        let data = data.to_vec();
        self.answer(req, Wait::Advance, move |a, cancel| {
            a.answer_write(ino, (fh, offset), &data, cancel, reply)
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
        self.requests.count(Op::Other);
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
        self.requests.count(Op::Release);
        self.inner.release(fh);
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Op::Releasedir);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.requests.count(Op::Opendir);
        match self.fs().getattr(ino.0) {
            Ok(e) if e.kind == Kind::Dir => reply.opened(
                FileHandle(0),
                // An immutable folder's listing, once cached, serves every later opendir.
                if e.immutable {
                    FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                },
            ),
            Ok(_) => reply.error(self.fail("opendir", ino.0, &FsError::NotDir)),
            Err(err) => reply.error(self.fail("opendir", ino.0, &err)),
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
        self.requests.count(Op::Readdir);
        // Positions 0 and 1 are `.` and `..`; the logic's entries follow.
        let dots = [(ino.0, "."), (ino.0, "..")];
        for (i, (dino, name)) in dots.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*dino), i as u64 + 1, FileType::Directory, name) {
                return reply.ok();
            }
        }
        let result = self
            .fs()
            .readdir(ino.0, offset.saturating_sub(2), |e, name, next| {
                let kind = self.attr(&e).kind;
                reply.add(INodeNo(e.node.ino()), next + 2, kind, name)
            });
        match result {
            Ok(()) => reply.ok(),
            Err(err) => reply.error(self.fail("readdir", ino.0, &err)),
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
        self.requests.count(Op::Readdir);
        // `.` and `..` carry no attributes the kernel uses; list them with the dir's own.
        let me = match self.fs().getattr(ino.0) {
            Ok(e) => e,
            Err(err) => return reply.error(self.fail("readdirplus", ino.0, &err)),
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
            .fs()
            .readdir(ino.0, offset.saturating_sub(2), |e, name, next| {
                reply.add(
                    INodeNo(e.node.ino()),
                    next + 2,
                    name,
                    &e.ttl(),
                    &self.attr(&e),
                    Generation(0),
                )
            });
        match result {
            Ok(()) => reply.ok(),
            Err(err) => reply.error(self.fail("readdirplus", ino.0, &err)),
        }
    }

    /// The end of the session (see the module docs on unmounting).
    fn destroy(&mut self) {
        self.unmount_at_end();
    }

    /// What `df` shows: the cache folder's space (see `vfs::statfs`).
    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        self.requests.count(Op::Other);
        match self.fs().statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_available,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.fragment_size,
            ),
            Err(err) => reply.error(self.fail("statfs", ino.0, &err)),
        }
    }

    /// ENOTTY, quietly: `isatty()` asks on every open by Python. The round trip cannot be
    /// avoided (see the module docs).
    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.requests.count(Op::Other);
        reply.error(self.fail("ioctl", ino.0, &FsError::NoIoctl));
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.requests.count(Op::Other);
        match self.fs().access(ino.0, mask.contains(AccessFlags::W_OK)) {
            Ok(()) => reply.ok(),
            Err(err) => reply.error(self.fail("access", ino.0, &err)),
        }
    }
}
