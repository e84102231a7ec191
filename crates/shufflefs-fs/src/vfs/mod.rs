//! The filesystem's behaviour as plain Rust: names in, nodes and bytes out.
//!
//! Not tied to fuser: `fuse` translates kernel requests into these calls and their
//! `FsError`s into errnos, so everything here is testable without a mount. Beside the
//! names (this file) live the handle table (`handles`), what the kernel may cache and for
//! how long (`attr`), which requests may wait (`wait`) and what `df` shows (`statfs`).
//!
//! Only the current epoch exists. Looking up `epoch-(N+1)` advances to it (as writing N+1
//! to `.shufflefs/epoch` does) and `epoch-N` is gone afterwards. Every `epoch-N/` lists all
//! classes, even those this rank holds no sample of, so class indices agree everywhere.
//! A record source (`--format records`) has no classes: `epoch-N/` holds the epoch's part
//! files instead (`parts`), laid out once per epoch. A tree (`--format tree`) lists every
//! folder of the source at its own depth, on every rank, beside this rank's samples in it.
//! Side files (`--replicate`) are listed in their folders on every rank; under
//! `--equal-shares drop` the samples `plan::equal` leaves out are in no listing and no
//! lookup finds them (the share and the cache still hold them).

use std::borrow::Cow;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::cache::SampleStore;
use crate::dataset::owners::Owner;
use crate::node::coordinator::Coordinator;
use crate::node::status::StatusReport;
use crate::plan::equal::{EqualShares, visible_from};
use crate::plan::{EpochShares, SampleId, share_in_range};
use crate::sys::sync::Locked;
use crate::vfs::access::Access;
use crate::vfs::error::FsError;
use crate::vfs::inodes::{
    CTL_DIR_NAME, CURRENT_NAME, EPOCH_CTL_NAME, METRICS_NAME, Node, STATUS_NAME,
};

pub mod access;
pub(crate) mod attr;
pub mod error;
pub(crate) mod handles;
pub mod inodes;
#[cfg(test)]
mod listing_tests;
pub(crate) mod parts;
mod publish;
pub(crate) mod statfs;

use publish::PublishDir;
pub(crate) mod stream;
pub(crate) mod wait;

pub use attr::{Entry, Kind};
pub use handles::{OpenFile, OpenFiles};
pub use parts::PartLayout;
pub use wait::{Cancel, Cancelled, Wait};

/// Largest sample read whole into memory when the cache cannot hold it; a larger one is
/// streamed (`stream`). In the page-cache read path every read request re-reads the whole
/// sample, so this stays small.
pub(crate) const UNCACHED_MAX: u64 = 16 << 20;

/// Default `--part-size`.
pub const DEFAULT_PART_SIZE: u64 = 128 << 20;

/// The domain of the view order's seeded stream (see `plan::stream`).
const VIEW_ORDER_DOMAIN: u64 = 0x7061_7274; // "part"

/// What an `open` hands back.
pub enum Opened {
    /// A cached sample file, to pass through or to read from.
    Sample(File),
    /// Part `.1` of a record source's view, read group by group through the store.
    Part(Arc<PartLayout>, u32),
    /// Bytes frozen at open time (status, current epoch), so chunked reads agree.
    Snapshot(Vec<u8>),
    /// A sample the cache does not hold, too large for memory: read from the source.
    Stream(stream::SourceStream),
    /// The epoch control file opened for writing.
    EpochControl,
}

pub struct ShuffleFs {
    store: Arc<SampleStore>,
    epochs: Coordinator,
    status: Arc<dyn StatusReport>,
    /// Page-cache mode: `.shufflefs/status` is a link to `status_file` (see there), in
    /// this folder.
    status_link: Option<PublishDir>,
    /// Record sources: the current epoch's part layout, made on first use.
    parts: Mutex<Option<Arc<PartLayout>>>,
    part_size: u64,
    /// Owners and modes shown, and who may advance (see `access`).
    access: Access,
    /// `--equal-shares drop`: what the view leaves out of this rank's share.
    equal: Option<Arc<EqualShares>>,
}

/// The entry `name` of tree folder `c` in epoch `e`: a sub-folder, or a sample in it (which
/// `entry` finds only if this rank holds it).
fn tree_child(fs: &ShuffleFs, e: u64, c: u32, name: &OsStr) -> Result<Node, FsError> {
    let manifest = fs.store.manifest();
    if let Some(d) = manifest.child_dir(c, name) {
        return Ok(Node::ClassDir(e, d));
    }
    manifest
        .find(c, name)
        .map(Node::Sample)
        .ok_or(FsError::NotFound)
}

/// How [`ShuffleFs::fetch`] made a sample readable.
enum Fetched {
    /// It is in the cache.
    Cached,
    /// Its bytes, read from the source into memory.
    Bytes(Vec<u8>),
    /// Too large for memory: to be read from the source as asked; its size.
    Stream(u64),
}

/// The part of `bytes` from `offset` on copied into `out`; returns how much.
fn copy_window(bytes: &[u8], offset: u64, out: &mut [u8]) -> usize {
    let from = (offset as usize).min(bytes.len());
    let n = (bytes.len() - from).min(out.len());
    out[..n].copy_from_slice(&bytes[from..from + n]);
    n
}

/// Where `status_file` publishes the status document, under the cache folder.
pub(crate) const STATUS_FILE: &str = "status.json";
/// Where `status_file` publishes the metrics, under the cache folder.
pub(crate) const METRICS_FILE: &str = "metrics.prom";

impl ShuffleFs {
    pub fn new(
        store: Arc<SampleStore>,
        epochs: Coordinator,
        status: Arc<dyn StatusReport>,
    ) -> ShuffleFs {
        ShuffleFs {
            store,
            epochs,
            status,
            status_link: None,
            parts: Mutex::new(None),
            part_size: DEFAULT_PART_SIZE,
            access: Access::mounter(),
            equal: None,
        }
    }

    /// The filesystem logic over a started node.
    pub fn of(node: &crate::node::Node) -> ShuffleFs {
        ShuffleFs::new(
            node.store.clone(),
            node.coordinator.clone(),
            node.status.clone(),
        )
    }

    /// Shows the view with `access`'s owners and modes (the source's: `Access::of_source`).
    pub fn with_access(mut self, access: Access) -> ShuffleFs {
        self.access = access;
        self
    }

    /// Whether user `uid` may advance the epoch (write `.shufflefs/epoch`, look up the next
    /// `epoch-N`): the mounting user and root only.
    pub(crate) fn may_control(&self, uid: u32) -> bool {
        self.access.may_control(uid)
    }

    /// Shows every epoch with `equal`'s samples left out (`--equal-shares drop`).
    pub fn with_equal_shares(mut self, equal: Arc<EqualShares>) -> ShuffleFs {
        self.equal = Some(equal);
        self
    }

    /// What this rank's view leaves out of its share of `cur` (nothing without
    /// `--equal-shares`), sorted by id.
    fn left_out(&self, cur: &EpochShares) -> Arc<Vec<SampleId>> {
        match &self.equal {
            Some(equal) => equal.left_out(cur),
            None => Arc::default(),
        }
    }

    /// Sets the target size of a record source's part files (`--part-size`).
    pub fn with_part_size(mut self, bytes: u64) -> ShuffleFs {
        self.part_size = bytes.max(1);
        self
    }

    /// Epoch `epoch`'s part layout, if this is a record source and `epoch` is current.
    pub(crate) fn layout(&self, epoch: u64) -> Result<Arc<PartLayout>, FsError> {
        let manifest = self.store.manifest();
        let index = manifest.records().ok_or(FsError::NotFound)?;
        let cur = self.epochs.current();
        // A part's inode holds the epoch in 29 bits (see `inodes`).
        if cur.epoch != epoch || epoch > inodes::MAX_EPOCH {
            return Err(FsError::NotFound);
        }
        let mut slot = self.parts.locked();
        if let Some(l) = slot.as_ref().filter(|l| l.epoch == epoch) {
            return Ok(l.clone());
        }
        let rank = self.epochs.rank();
        let left = self.left_out(&cur);
        let mut order: Vec<SampleId> = visible_from(cur.share(rank), &left, 0).collect();
        let seed = self.epochs.plan().params().seed;
        crate::plan::shuffle(
            &mut order,
            &mut crate::plan::stream(seed, VIEW_ORDER_DOMAIN, epoch, u64::from(rank)),
        );
        let layout = Arc::new(PartLayout::new(
            epoch,
            order,
            |g| (index.group_len(g), index.needs_newline(g)),
            self.part_size,
            index.header.clone(),
            index.trailer_len(),
            index.ext.clone(),
        ));
        *slot = Some(layout.clone());
        Ok(layout)
    }

    /// Reads part `p` of `layout` at `offset`: each group from the cache (fetched into it
    /// first if need be), or from the source if the cache cannot take it.
    pub(crate) fn read_part(
        &self,
        layout: &PartLayout,
        p: u32,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, FsError> {
        let mut buf = vec![0u8; size as usize];
        let mut held: Option<(SampleId, Vec<u8>)> = None;
        let n = layout.read(p, offset, &mut buf, |g, off, out| {
            if let Some((id, bytes)) = &held
                && *id == g
            {
                return Ok(copy_window(bytes, off, out));
            }
            match self.fetch(g).map_err(std::io::Error::other)? {
                Fetched::Cached => self.store.read_at(g, off, out),
                Fetched::Bytes(bytes) => {
                    let n = copy_window(&bytes, off, out);
                    held = Some((g, bytes));
                    Ok(n)
                }
                Fetched::Stream(size) => self.store.read_source_at(g, size, off, out),
            }
        })?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Shows `.shufflefs/status` as a link to `status_file` instead of a file.
    pub fn with_status_link(mut self) -> ShuffleFs {
        self.status_link = Some(PublishDir::new(self.store.dir().root()));
        self
    }

    fn status_file_path(&self) -> PathBuf {
        self.published_path(STATUS_FILE)
    }

    fn metrics_file_path(&self) -> PathBuf {
        self.published_path(METRICS_FILE)
    }

    /// Where the document `name` is published as a link target: absolute, since a relative
    /// one would be read from `.shufflefs/` inside the mount (a `--cache` given relative to
    /// the daemon's folder).
    fn published_path(&self, name: &str) -> PathBuf {
        let path = match &self.status_link {
            Some(dir) => dir.path.join(name),
            None => self.store.dir().root().join(name),
        };
        std::path::absolute(&path).unwrap_or(path)
    }

    /// Writes the status document to `CACHE/status.json` (a new file renamed over the old,
    /// so a reader always opens one whole document) and returns its path. Page-cache mode
    /// shows `.shufflefs/status` as a link to it: without opens the kernel could mix pages
    /// of two renderings in its cache.
    fn status_file(&self) -> Result<PathBuf, FsError> {
        self.publish(STATUS_FILE, &self.status.render())
    }

    /// Writes `bytes` to `CACHE/name` as `status_file` does, and returns its path (the
    /// metrics, under page-cache mode, are published the same way).
    fn publish(&self, name: &str, bytes: &[u8]) -> Result<PathBuf, FsError> {
        let path = self.published_path(name);
        // Read-only and private, as everything in the cache (see `cache::private`).
        let how = crate::sys::replace::Replace {
            mode: 0o400,
            durable: false,
        };
        crate::sys::replace::replace(&path, bytes, how)?;
        Ok(path)
    }

    /// A view node's entry: the source's owner and mode (its root's, or under
    /// `--allow-other` each folder's, sample's or side file's own: `owner`; see `access`).
    fn view_entry(&self, node: Node, kind: Kind, size: u64, owner: Option<Owner>) -> Entry {
        let (uid, gid, perm) = self.access.shown(owner, kind == Kind::Dir);
        Entry {
            node,
            kind,
            size,
            perm,
            uid,
            gid,
            immutable: true,
            mtime: None,
        }
    }

    fn entry(&self, node: Node) -> Result<Entry, FsError> {
        let a = &self.access;
        // The view is the source's; the control files the mounting user's.
        let view = |kind, size, owner| self.view_entry(node, kind, size, owner);
        let control = |kind, size, perm| Entry {
            uid: a.mounter_uid,
            gid: a.mounter_gid,
            perm,
            immutable: false,
            ..view(kind, size, None)
        };
        let current = self.epochs.epoch();
        let manifest = self.store.manifest();
        let owners = manifest.owners();
        Ok(match node {
            Node::Root => Entry {
                immutable: false,
                ..view(Kind::Dir, 0, None)
            },
            Node::CtlDir => control(Kind::Dir, 0, 0o555),
            // A link to the copy in the cache (see `with_status_link`), else a file the daemon answers.
            Node::Status | Node::Metrics if self.status_link.is_some() => {
                let target = match node {
                    Node::Status => self.status_file_path(),
                    _ => self.metrics_file_path(),
                };
                control(Kind::Symlink, target.as_os_str().len() as u64, 0o777)
            }
            // The status names source paths (`skipped`, problems, errors), some maybe in
            // folders others may not list: where the view shows each entry's own mode
            // (`--allow-other`), it is the mounting user's alone (root reads it anyway).
            Node::Status if a.per_entry => control(Kind::File, 0, 0o400),
            Node::Status | Node::Metrics => control(Kind::File, 0, 0o444),
            Node::EpochCtl => control(Kind::File, 0, 0o644),
            Node::Current => Entry {
                perm: 0o777,
                immutable: false,
                ..view(
                    Kind::Symlink,
                    inodes::epoch_dir_name(current).len() as u64,
                    None,
                )
            },
            Node::EpochDir(e) if e == current => view(Kind::Dir, 0, None),
            // A tree's root folder is the epoch folder itself, never a class folder.
            Node::ClassDir(e, c)
                if e == current && c < manifest.class_count() && (c > 0 || !manifest.is_tree()) =>
            {
                view(Kind::Dir, 0, owners.map(|o| o.class(c)))
            }
            Node::Part(e, p) if e == current => {
                let layout = self.layout(e)?;
                if p >= layout.parts() {
                    return Err(FsError::NotFound);
                }
                view(Kind::File, layout.size(p), None)
            }
            // A size not known yet is listed as 0 and not cacheable, so the kernel asks
            // again (LOOKUP or GETATTR, which resolve it) before anything uses it.
            // One read of the size: staging may learn it meanwhile, and a size-0 entry
            // marked cacheable would hide the sample for a whole TTL.
            Node::Sample(id) if self.holds(id) => {
                let size = self.store.size(id);
                Entry {
                    immutable: size.is_some(),
                    // The source file's time, once learned with its bytes.
                    mtime: self.store.mtime(id),
                    ..view(Kind::File, size.unwrap_or(0), owners.map(|o| o.sample(id)))
                }
            }
            Node::Side(i) if (i as usize) < manifest.side_files().len() => {
                let size = manifest.side_files()[i as usize].size;
                view(Kind::File, size, owners.map(|o| o.side(i)))
            }
            _ => return Err(FsError::NotFound),
        })
    }

    fn holds(&self, id: SampleId) -> bool {
        let cur = self.epochs.current();
        cur.share(self.epochs.rank()).binary_search(&id).is_ok()
            && self.left_out(&cur).binary_search(&id).is_err()
    }

    pub fn getattr(&self, ino: u64) -> Result<Entry, FsError> {
        self.resolved(self.entry(Node::from_ino(ino).ok_or(FsError::NotFound)?)?)
    }

    /// `e` with its size known: a sample nobody has read yet is fetched first (what opening
    /// it would do anyway), or, if the cache cannot take it, read from the source into
    /// memory. Listings skip this (see `entry`), so listing a folder never reads a sample.
    fn resolved(&self, e: Entry) -> Result<Entry, FsError> {
        let Node::Sample(id) = e.node else {
            return Ok(e);
        };
        if e.immutable {
            return Ok(e);
        }
        let size = match self.store.size(id) {
            Some(size) => size,
            None => match self.fetch(id)? {
                Fetched::Bytes(bytes) => bytes.len() as u64,
                Fetched::Stream(size) => size,
                Fetched::Cached => self.store.resolve_size(id)?,
            },
        };
        Ok(Entry {
            size,
            immutable: true,
            mtime: self.store.mtime(id).or(e.mtime),
            ..e
        })
    }

    /// Makes sample `id` readable: cached, or, if the cache could not take it (a partial
    /// cache's sample it does not keep, a full disk), read from the source (into memory,
    /// or streamed when larger than `UNCACHED_MAX`), rather than failing a read of the
    /// current epoch. A listed sample that cannot be fetched is an I/O error (EIO), never
    /// ENOENT, named as the source answered: the cache's error when the cache failed, the
    /// source's (counted and kept among the problems) when only the source was asked.
    fn fetch(&self, id: SampleId) -> Result<Fetched, FsError> {
        if let Some(partial) = self.store.partial() {
            partial.saw(id, self.store.contains(id));
        }
        let Err(cache_err) = self.store.ensure(id) else {
            return Ok(Fetched::Cached);
        };
        let through = match self.store.size(id) {
            Some(size) if size > UNCACHED_MAX => Ok(Fetched::Stream(size)),
            // A size not known yet is learned as the bytes come (a stat each time would
            // cost every read through a metadata request); one found too large is asked.
            _ => match self.store.read_uncached(id, UNCACHED_MAX) {
                Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
                    (self.store.source_len(id)).and_then(|len| len.map(Fetched::Stream).ok_or(e))
                }
                read => read.map(Fetched::Bytes),
            },
        };
        let not_kept = crate::cache::admission::is_not_kept(&cache_err);
        match through {
            Ok(fetched) if not_kept => Ok(fetched),
            Ok(fetched) => {
                tracing::warn!(sample = id, error = %cache_err, "serving a sample from the source without caching it");
                Ok(fetched)
            }
            // Only the source was asked: its answer, reported as a failed fetch's is.
            Err(e) if not_kept => Err(FsError::Io(self.store.source_failed(id, e))),
            // The fetch into the cache was reported already.
            Err(_) => Err(FsError::Io(std::io::Error::other(cache_err))),
        }
    }

    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Entry, FsError> {
        self.lookup_node(self.child(parent, name)?)
    }

    /// The node `name` names in `parent`, with no side effect: the next epoch's folder is
    /// named too, and `lookup_node` advances to it.
    pub(crate) fn child(&self, parent: u64, name: &OsStr) -> Result<Node, FsError> {
        let parent = Node::from_ino(parent).ok_or(FsError::NotFound)?;
        let current = self.epochs.epoch();
        let node = match parent {
            Node::Root if name == CTL_DIR_NAME => Node::CtlDir,
            Node::Root if name == CURRENT_NAME => Node::Current,
            Node::Root => {
                let e = inodes::parse_epoch_dir(name).ok_or(FsError::NotFound)?;
                if e != current && e != current + 1 {
                    return Err(FsError::NotFound);
                }
                Node::EpochDir(e)
            }
            Node::CtlDir if name == STATUS_NAME => Node::Status,
            Node::CtlDir if name == EPOCH_CTL_NAME => Node::EpochCtl,
            Node::CtlDir if name == METRICS_NAME => Node::Metrics,
            Node::EpochDir(e) if self.store.manifest().records().is_some() => {
                let layout = self.layout(e)?;
                let name = name.to_str().ok_or(FsError::NotFound)?;
                Node::Part(e, layout.parse_name(name).ok_or(FsError::NotFound)?)
            }
            Node::EpochDir(_) | Node::ClassDir(..) if self.side_child(parent, name).is_some() => {
                Node::Side(self.side_child(parent, name).expect("just found"))
            }
            Node::EpochDir(e) if self.store.manifest().is_tree() => tree_child(self, e, 0, name)?,
            Node::ClassDir(e, c) if self.store.manifest().is_tree() => {
                tree_child(self, e, c, name)?
            }
            Node::EpochDir(e) => Node::ClassDir(
                e,
                self.store
                    .manifest()
                    .class_by_name(name)
                    .ok_or(FsError::NotFound)?,
            ),
            Node::ClassDir(_, c) => Node::Sample(
                self.store
                    .manifest()
                    .find(c, name)
                    .ok_or(FsError::NotFound)?,
            ),
            n if !n.is_dir() => return Err(FsError::NotDir),
            _ => return Err(FsError::NotFound),
        };
        Ok(node)
    }

    /// Finishes looking up `node` (from `child`): the next epoch's folder advances to it,
    /// and a sample of unknown size is fetched to learn it.
    pub(crate) fn lookup_node(&self, node: Node) -> Result<Entry, FsError> {
        self.lookup_node_until(node, &Cancel::never())
    }

    /// [`ShuffleFs::lookup_node`]; an advance it waits on gives up when `cancel` is set
    /// (see `vfs::wait`).
    pub(crate) fn lookup_node_until(&self, node: Node, cancel: &Cancel) -> Result<Entry, FsError> {
        if let Node::EpochDir(e) = node
            && e > self.epochs.epoch()
        {
            // Looking at the next epoch is how a loader says it is done with this one.
            self.epochs.advance_to_until(e, cancel)?;
        }
        self.resolved(self.entry(node)?)
    }

    /// Lists `ino` from position `offset` on; `add(entry, name, next_offset)` returns true
    /// when the reply buffer is full. `.` and `..` are the adapter's business.
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        add: impl FnMut(Entry, &OsStr, u64) -> bool,
    ) -> Result<(), FsError> {
        let node = Node::from_ino(ino).ok_or(FsError::NotFound)?;
        let parent_entry = self.entry(node)?;
        if parent_entry.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let manifest = self.store.manifest();
        // Children as nodes only: skipping to `offset` costs no allocation per entry.
        let children: Box<dyn Iterator<Item = Node>> = match node {
            Node::Root => {
                let e = self.epochs.epoch();
                Box::new([Node::CtlDir, Node::Current, Node::EpochDir(e)].into_iter())
            }
            Node::CtlDir => Box::new([Node::Status, Node::EpochCtl, Node::Metrics].into_iter()),
            Node::EpochDir(e) if manifest.records().is_some() => {
                let parts = self.layout(e)?.parts();
                Box::new((0..parts).map(move |p| Node::Part(e, p)))
            }
            Node::EpochDir(e) if manifest.is_tree() => {
                let dirs = manifest.subdirs(0).iter().copied();
                return self.folder_readdir(e, dirs, Some(0), offset, add);
            }
            Node::ClassDir(e, c) if manifest.is_tree() => {
                let dirs = manifest.subdirs(c).iter().copied();
                return self.folder_readdir(e, dirs, Some(c), offset, add);
            }
            Node::EpochDir(e) => {
                let sides = manifest.side_in(None).map(Node::Side);
                Box::new(
                    (0..manifest.class_count())
                        .map(move |c| Node::ClassDir(e, c))
                        .chain(sides),
                )
            }
            Node::ClassDir(e, c) => {
                return self.folder_readdir(e, std::iter::empty(), Some(c), offset, add);
            }
            _ => return Err(FsError::NotDir),
        };
        self.add_entries(children.skip(offset as usize), offset, add)
    }

    /// Lists folder `c` of epoch `e` (a class folder, or any folder of a tree) from position
    /// `offset` on: its sub-folders `dirs` (all of them, on every rank), its side files,
    /// then this rank's samples in it. Skipping to `offset` costs nothing per entry.
    fn folder_readdir(
        &self,
        e: u64,
        dirs: impl ExactSizeIterator<Item = u32>,
        c: Option<u32>,
        offset: u64,
        add: impl FnMut(Entry, &OsStr, u64) -> bool,
    ) -> Result<(), FsError> {
        let manifest = self.store.manifest();
        let cur = self.epochs.current();
        let class = c.unwrap_or(0);
        let ids = share_in_range(cur.share(self.epochs.rank()), manifest.class_range(class));
        let sides = manifest.side_in(c);
        let left = self.left_out(&cur);
        if let (0, Some(partial)) = (offset, self.store.partial()) {
            // The loader reads what it lists: a partial cache reads ahead what it streams.
            let listed = visible_from(ids, &left, 0).filter(|&i| !partial.wanted(i));
            self.store.read_ahead_listed(cur.epoch, listed.collect());
        }
        let (off, nd, ns) = (offset as usize, dirs.len(), sides.len());
        let dirs = dirs.skip(off).map(|d| Node::ClassDir(e, d));
        let sides = sides.skip(off.saturating_sub(nd)).map(Node::Side);
        let ids = visible_from(ids, &left, off.saturating_sub(nd + ns)).map(Node::Sample);
        self.add_entries(dirs.chain(sides).chain(ids), offset, add)
    }

    /// The side file `name` in folder `parent` (an epoch folder or a class folder).
    fn side_child(&self, parent: Node, name: &OsStr) -> Option<u32> {
        let manifest = self.store.manifest();
        let folder = match parent {
            Node::EpochDir(_) => manifest.epoch_folder(),
            Node::ClassDir(_, c) => Some(c),
            _ => return None,
        };
        manifest.side_named(folder, name)
    }

    /// Hands `children` (the folder's entries from `offset` on) to `add` until it is full.
    fn add_entries(
        &self,
        children: impl Iterator<Item = Node>,
        offset: u64,
        mut add: impl FnMut(Entry, &OsStr, u64) -> bool,
    ) -> Result<(), FsError> {
        let manifest = self.store.manifest();
        for (i, child) in (offset..).zip(children) {
            let name: Cow<OsStr> = match child {
                Node::CtlDir => OsStr::new(CTL_DIR_NAME).into(),
                Node::Current => OsStr::new(CURRENT_NAME).into(),
                Node::EpochDir(e) => OsString::from(inodes::epoch_dir_name(e)).into(),
                Node::Status => OsStr::new(STATUS_NAME).into(),
                Node::EpochCtl => OsStr::new(EPOCH_CTL_NAME).into(),
                Node::Metrics => OsStr::new(METRICS_NAME).into(),
                Node::ClassDir(_, c) => manifest.dir_name(c).into(),
                Node::Sample(id) => manifest.name(id).into(),
                Node::Side(i) => OsStr::from_bytes(manifest.side_files()[i as usize].name()).into(),
                Node::Part(e, p) => OsString::from(self.layout(e)?.name(p)).into(),
                Node::Root => continue,
            };
            if add(self.entry(child)?, &name, i + 1) {
                break;
            }
        }
        Ok(())
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epochs.epoch()
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>, FsError> {
        match Node::from_ino(ino) {
            Some(Node::Current) => Ok(inodes::epoch_dir_name(self.epochs.epoch()).into_bytes()),
            Some(Node::Status) if self.status_link.is_some() => {
                Ok(self.status_file()?.into_os_string().into_encoded_bytes())
            }
            Some(Node::Metrics) if self.status_link.is_some() => {
                let path = self.publish(METRICS_FILE, &self.status.metrics())?;
                Ok(path.into_os_string().into_encoded_bytes())
            }
            Some(_) => Err(FsError::Invalid("not a symlink".into())),
            None => Err(FsError::NotFound),
        }
    }

    pub fn open(&self, ino: u64, write: bool) -> Result<Opened, FsError> {
        let entry = self.getattr(ino)?;
        match entry.node {
            Node::EpochCtl if write => Ok(Opened::EpochControl),
            Node::EpochCtl => Ok(Opened::Snapshot(
                format!("{}\n", self.epochs.epoch()).into_bytes(),
            )),
            _ if write => Err(FsError::ReadOnly),
            Node::Status => Ok(Opened::Snapshot(self.status.render())),
            Node::Metrics => Ok(Opened::Snapshot(self.status.metrics())),
            Node::Part(..) | Node::Side(_) | Node::Sample(_) => {
                self.store.stats.reads.fetch_add(1, Ordering::Relaxed);
                self.open_data(entry.node)
            }
            _ if entry.kind == Kind::Dir => Err(FsError::IsDir),
            _ => Err(FsError::Invalid("cannot open this node".into())),
        }
    }

    /// Opens a sample, a part or a side file.
    fn open_data(&self, node: Node) -> Result<Opened, FsError> {
        match node {
            Node::Part(e, p) => Ok(Opened::Part(self.layout(e)?, p)),
            Node::Side(i) => {
                let rel = OsStr::from_bytes(&self.store.manifest().side_files()[i as usize].path);
                let dir = self.store.dir().replicated().ok_or(FsError::NotFound)?;
                Ok(Opened::Sample(File::open(dir.dir.join(rel))?))
            }
            Node::Sample(id) => {
                let opened = match self.fetch(id)? {
                    // A backend without a file per sample is read through the store.
                    Fetched::Cached => match self.store.file(id) {
                        Some(file) => Opened::Sample(file?),
                        None => Opened::Snapshot(self.store.read(id)?),
                    },
                    Fetched::Bytes(bytes) => Opened::Snapshot(bytes),
                    Fetched::Stream(size) => Opened::Stream(stream::SourceStream::new(id, size)),
                };
                // A partial cache's leaver, read, makes room (`cache::early`): the open
                // file or the bytes read stay the reader's.
                if let Some(gone) = self.store.partial().and_then(|p| p.after_read(id)) {
                    let _ = self.store.remove(gone);
                }
                Ok(opened)
            }
            _ => Err(FsError::Invalid("cannot open this node".into())),
        }
    }

    /// A write to `.shufflefs/epoch`: the number to advance to.
    pub fn write_epoch(&self, data: &[u8]) -> Result<usize, FsError> {
        self.write_epoch_until(data, &Cancel::never())
    }

    /// [`ShuffleFs::write_epoch`]; the advance gives up when `cancel` is set (the writer
    /// was signalled, or the mount goes away: see `vfs::wait`).
    pub(crate) fn write_epoch_until(&self, data: &[u8], cancel: &Cancel) -> Result<usize, FsError> {
        let target = inodes::parse_epoch_value(data).ok_or_else(|| {
            FsError::Invalid(format!("{:?} is not an epoch number; write the next epoch, e.g. `echo N+1 > .shufflefs/epoch`", String::from_utf8_lossy(data)))
        })?;
        // The write returns once the kernel forgot the old epoch's names, so the writer
        // finds `epoch-N` gone.
        self.epochs.advance_and_forget_until(target, cancel)?;
        Ok(data.len())
    }

    /// `setattr`: only truncating the control file (as `echo N > epoch` does) is allowed.
    pub fn setattr(&self, ino: u64, size_only: bool) -> Result<Entry, FsError> {
        let entry = self.getattr(ino)?;
        match entry.node {
            Node::EpochCtl if size_only => Ok(entry),
            _ => Err(FsError::ReadOnly),
        }
    }

    /// `access(2)`: anything but writing is allowed to the mounting user.
    pub fn access(&self, ino: u64, write: bool) -> Result<(), FsError> {
        let entry = self.getattr(ino)?;
        if write && entry.node != Node::EpochCtl {
            return Err(FsError::ReadOnly);
        }
        Ok(())
    }
}
