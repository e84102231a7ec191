//! The store's ways in for a sample, adoption from a same-host peer's cache above all: by
//! link and by copy, what either leaves, what is refused, and claims against fetches.

use super::*;
use crate::cache::{CacheLayout, Claim, FileBackend, Recovered, SampleWriter};
use crate::dataset::manifest::Manifest;
use crate::dataset::{Copied, SyntheticSource, synthetic_byte};
use std::fs;
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;

const SAMPLES: u64 = 64;

/// `SAMPLES` samples of known, distinct sizes (a few hundred bytes to ~40 KiB).
fn manifest_with(size: impl Fn(u64) -> u64) -> Arc<Manifest> {
    let samples = (0..SAMPLES)
        .map(|i| (format!("s{i:03}").into_bytes(), size(i)))
        .collect();
    Arc::new(Manifest::from_parts(vec![(b"c".to_vec(), samples)]).unwrap())
}

fn manifest() -> Arc<Manifest> {
    manifest_with(|i| 300 + i * 613)
}

fn bytes_of(id: SampleId, len: u64) -> Vec<u8> {
    (0..len).map(|o| synthetic_byte(id, o)).collect()
}

/// The time the test source gives sample `id`.
fn source_time(id: SampleId) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000 + id, 123_456_789)
}

/// Synthetic samples with [`source_time`]s.
struct Timed(SyntheticSource);

impl Dataset for Timed {
    fn copy_to(&self, id: SampleId, out: &mut dyn Write) -> io::Result<Copied> {
        let copied = self.0.copy_to(id, out)?;
        Ok(Copied {
            mtime: Some(source_time(id)),
            ..copied
        })
    }
    fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read_at(id, offset, buf)
    }
    fn describe(&self, id: SampleId) -> String {
        self.0.describe(id)
    }
}

fn synthetic(manifest: &Arc<Manifest>) -> Arc<dyn Dataset> {
    Arc::new(Timed(SyntheticSource {
        manifest: manifest.clone(),
    }))
}

/// A rank's store over the file backend in `root`.
fn store_in(root: &Path, manifest: &Arc<Manifest>) -> SampleStore {
    SampleStore::new(
        CacheDir::open(root).unwrap(),
        manifest.clone(),
        synthetic(manifest),
    )
    .unwrap()
}

/// A rank's store over the backend of `layout` in `root`.
fn store_with_layout(root: &Path, manifest: &Arc<Manifest>, layout: CacheLayout) -> SampleStore {
    let dir = CacheDir::open(root).unwrap();
    let backend = dir.backend(layout, manifest.len()).unwrap();
    SampleStore::with_backend(dir, backend, manifest.clone(), synthetic(manifest)).unwrap()
}

const LAYOUTS: [CacheLayout; 2] = [CacheLayout::Files, CacheLayout::Packed];

/// A rank's store whose backend cannot link (the trait's default `adopt`).
fn store_without_links(root: &Path, manifest: &Arc<Manifest>) -> SampleStore {
    let dir = CacheDir::open(root).unwrap();
    let backend = NoLinks(dir.file_backend(manifest.len()).unwrap());
    SampleStore::with_backend(
        dir,
        Box::new(backend),
        manifest.clone(),
        synthetic(manifest),
    )
    .unwrap()
}

/// A peer holding `ids`, fetched from the source; returns its store and cache folder.
fn peer_holding(parent: &Path, ids: &[SampleId]) -> (SampleStore, PathBuf) {
    let root = parent.join("peer");
    let peer = store_in(&root, &manifest());
    for &id in ids {
        peer.ensure(id).unwrap();
    }
    (peer, root)
}

fn names_in(dir: PathBuf) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn stat(root: &Path, id: SampleId) -> fs::Metadata {
    fs::metadata(FileBackend::path_in(root, id)).unwrap()
}

/// Asserts that sample `id` of `len` bytes in `store` (at `root`) is in every respect
/// a cached sample with `peer`'s checksum and time.
fn assert_cached_like(store: &SampleStore, root: &Path, id: SampleId, len: u64, peer: Commit) {
    let want = bytes_of(id, len);
    assert!(store.contains(id));
    assert_eq!(store.size(id), Some(len));
    assert_eq!(store.mtime(id), peer.mtime);
    assert_eq!(store.read(id).unwrap(), want);
    let mut stored = store.open_checked(id).unwrap();
    assert_eq!(stored.recorded_crc, Some(crc32c::crc32c(&want)));
    let mut got = Vec::new();
    stored.reader.read_to_end(&mut got).unwrap();
    assert_eq!(got, want);
    // A packed store has no file per sample: the checks above are all there is to it.
    let Some(file) = store.file(id) else {
        assert!(!root.join("samples").exists());
        return;
    };
    let mut file = file.unwrap();
    got.clear();
    file.read_to_end(&mut got).unwrap();
    assert_eq!(got, want);
    assert_eq!(stat(root, id).modified().ok(), peer.mtime);
    assert_eq!(FileBackend::recorded_in(root, id).unwrap(), peer);
    assert!(names_in(root.join("tmp")).is_empty());
}

#[test]
fn adopting_on_one_filesystem_links_the_peers_file_and_looks_received() {
    let tmp = tempfile::tempdir().unwrap();
    let (_peer, peer_root) = peer_holding(tmp.path(), &[3, 9]);
    let recorded = FileBackend::recorded_in(&peer_root, 3).unwrap();
    let len = manifest().size(3).unwrap();
    assert_eq!(recorded.len, len);
    assert_eq!(recorded.crc, crc32c::crc32c(&bytes_of(3, len)));
    assert_eq!(recorded.mtime, Some(source_time(3)));

    let root = tmp.path().join("ours");
    let store = store_in(&root, &manifest());
    assert_eq!(
        store.adopt_from_peer(3, &peer_root).unwrap(),
        Adopted::Linked(len)
    );
    let (ours, theirs) = (stat(&root, 3), stat(&peer_root, 3));
    assert_eq!((ours.dev(), ours.ino()), (theirs.dev(), theirs.ino()));
    assert_eq!((ours.nlink(), theirs.nlink()), (2, 2));
    assert_cached_like(&store, &root, 3, len, recorded);
    let s = &store.stats;
    assert_eq!(s.files.load(Ordering::Relaxed), 1);
    assert_eq!(s.bytes.load(Ordering::Relaxed), len);
    assert_eq!(s.adopted_linked.load(Ordering::Relaxed), 1);
    assert_eq!(s.adopted_copied.load(Ordering::Relaxed), 0);
    assert_eq!(s.adopted_bytes.load(Ordering::Relaxed), len);
    assert_eq!(s.fetched_from_source.load(Ordering::Relaxed), 0);
    store.sync().unwrap();

    // A second adoption of a held sample takes nothing, not even a look at the peer.
    let gone = tmp.path().join("no-such-peer");
    assert_eq!(
        store.adopt_from_peer(3, &gone).unwrap(),
        Adopted::AlreadyHeld(len)
    );
    assert_eq!(s.adopted_linked.load(Ordering::Relaxed), 1);

    // A remount finds it complete, with its size and time.
    drop(store);
    let store = store_in(&root, &manifest());
    assert_cached_like(&store, &root, 3, len, recorded);
    assert_eq!(store.stats.files.load(Ordering::Relaxed), 1);
}

#[test]
fn the_peer_dropping_its_copy_leaves_ours_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let (peer, peer_root) = peer_holding(tmp.path(), &[5]);
    let recorded = FileBackend::recorded_in(&peer_root, 5).unwrap();
    let root = tmp.path().join("ours");
    let store = store_in(&root, &manifest());
    let len = store.adopt_from_peer(5, &peer_root).unwrap().bytes();
    peer.remove(5).unwrap();
    assert!(!FileBackend::path_in(&peer_root, 5).exists());
    assert_eq!(stat(&root, 5).nlink(), 1);
    assert_cached_like(&store, &root, 5, len, recorded);
    // The peer fetching it again writes a new file, ours untouched.
    peer.ensure(5).unwrap();
    assert_ne!(stat(&root, 5).ino(), stat(&peer_root, 5).ino());
    assert_cached_like(&store, &root, 5, len, recorded);
}

#[test]
fn our_remove_leaves_the_peers_copy_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let (peer, peer_root) = peer_holding(tmp.path(), &[6]);
    let recorded = FileBackend::recorded_in(&peer_root, 6).unwrap();
    let root = tmp.path().join("ours");
    let store = store_in(&root, &manifest());
    let len = store.adopt_from_peer(6, &peer_root).unwrap().bytes();
    store.remove(6).unwrap();
    assert!(!store.contains(6));
    assert_eq!(store.stats.files.load(Ordering::Relaxed), 0);
    assert_eq!(store.stats.bytes.load(Ordering::Relaxed), 0);
    assert_eq!(stat(&peer_root, 6).nlink(), 1);
    assert_cached_like(&peer, &peer_root, 6, len, recorded);
    // Our clearing the whole cache leaves it too.
    store.adopt_from_peer(6, &peer_root).unwrap();
    store.backend.clear().unwrap();
    assert_cached_like(&peer, &peer_root, 6, len, recorded);
}

#[test]
fn a_backend_that_cannot_link_copies_checked_with_the_peers_record() {
    // The file backend without links, and the packed one (which never links).
    for packed in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let (_peer, peer_root) = peer_holding(tmp.path(), &[7]);
        let root = tmp.path().join("ours");
        let store = match packed {
            false => store_without_links(&root, &manifest()),
            true => store_with_layout(&root, &manifest(), CacheLayout::Packed),
        };
        copies_checked_with_the_peers_record(store, &root, &peer_root, packed);
    }
}

fn copies_checked_with_the_peers_record(
    store: SampleStore,
    root: &Path,
    peer_root: &Path,
    packed: bool,
) {
    let recorded = FileBackend::recorded_in(peer_root, 7).unwrap();
    let len = manifest().size(7).unwrap();
    assert_eq!(
        store.adopt_from_peer(7, peer_root).unwrap(),
        Adopted::Copied(len)
    );
    if !packed {
        let (ours, theirs) = (stat(root, 7), stat(peer_root, 7));
        assert_ne!(ours.ino(), theirs.ino());
        assert_eq!((ours.nlink(), theirs.nlink()), (1, 1));
    }
    assert_cached_like(&store, root, 7, len, recorded);
    let s = &store.stats;
    assert_eq!(s.adopted_copied.load(Ordering::Relaxed), 1);
    assert_eq!(s.adopted_linked.load(Ordering::Relaxed), 0);
    assert_eq!(s.adopted_bytes.load(Ordering::Relaxed), len);
    assert_eq!(s.files.load(Ordering::Relaxed), 1);
    store.sync().unwrap();
    drop(store);
    let layout = [CacheLayout::Files, CacheLayout::Packed][usize::from(packed)];
    let store = store_with_layout(root, &manifest(), layout);
    assert_cached_like(&store, root, 7, len, recorded);
}

#[test]
fn a_peer_on_another_filesystem_is_copied() {
    // The link fails with EXDEV: /dev/shm (tmpfs) against a folder on disk.
    let shm = Path::new("/dev/shm");
    let Ok(peer_parent) = tempfile::tempdir_in(shm) else {
        eprintln!("skipped: no /dev/shm");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    if fs::metadata(tmp.path()).unwrap().dev() == fs::metadata(shm).unwrap().dev() {
        eprintln!("skipped: the temporary folder is on /dev/shm's filesystem");
        return;
    }
    let (_peer, peer_root) = peer_holding(peer_parent.path(), &[8]);
    let Ok(recorded) = FileBackend::recorded_in(&peer_root, 8) else {
        eprintln!("skipped: /dev/shm keeps no user xattrs");
        return;
    };
    let root = tmp.path().join("ours");
    let store = store_in(&root, &manifest());
    let len = manifest().size(8).unwrap();
    assert_eq!(
        store.adopt_from_peer(8, &peer_root).unwrap(),
        Adopted::Copied(len)
    );
    assert_cached_like(&store, &root, 8, len, recorded);
    assert_eq!(store.stats.adopted_copied.load(Ordering::Relaxed), 1);
}

#[test]
fn a_corrupt_peer_file_is_refused_and_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let (_peer, peer_root) = peer_holding(tmp.path(), &[4]);
    let path = FileBackend::path_in(&peer_root, 4);
    let recorded = FileBackend::recorded_in(&peer_root, 4).unwrap();
    // Rot in place: same length, same record, one byte flipped.
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&[!synthetic_byte(4, 100)], 100).unwrap();
    drop(file);
    let corrupt = fs::read(&path).unwrap();

    let root = tmp.path().join("ours");
    let store = store_without_links(&root, &manifest());
    let e = store.adopt_from_peer(4, &peer_root).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    assert!(!store.contains(4));
    assert!(names_in(root.join("samples")).is_empty());
    assert!(names_in(root.join("tmp")).is_empty());
    let s = &store.stats;
    assert_eq!(s.checksum_failures.load(Ordering::Relaxed), 1);
    assert!(s.problems()[0].contains(&path.display().to_string()));
    assert_eq!(s.files.load(Ordering::Relaxed), 0);
    assert_eq!(s.adopted_copied.load(Ordering::Relaxed), 0);
    assert_eq!(s.adopted_bytes.load(Ordering::Relaxed), 0);
    assert_eq!(fs::read(&path).unwrap(), corrupt);
    let still = FileBackend::recorded_in(&peer_root, 4).unwrap();
    assert_eq!((still.crc, still.len), (recorded.crc, recorded.len));
    // The claim is free again: the source fills it.
    store.ensure(4).unwrap();
    assert_eq!(store.read(4).unwrap(), bytes_of(4, recorded.len));
}

#[test]
fn a_peer_file_cut_short_is_refused_on_either_path() {
    let tmp = tempfile::tempdir().unwrap();
    let (_peer, peer_root) = peer_holding(tmp.path(), &[2]);
    let path = FileBackend::path_in(&peer_root, 2);
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(10)
        .unwrap();
    for (name, store) in [
        ("ours", store_in(&tmp.path().join("ours"), &manifest())),
        (
            "copier",
            store_without_links(&tmp.path().join("copier"), &manifest()),
        ),
    ] {
        let e = store.adopt_from_peer(2, &peer_root).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{name}");
        let msg = e.to_string();
        assert!(
            msg.contains(&path.display().to_string()) && msg.contains("record"),
            "{msg}"
        );
        assert!(!store.contains(2));
        assert!(names_in(tmp.path().join(name).join("samples")).is_empty());
        assert!(names_in(tmp.path().join(name).join("tmp")).is_empty());
        assert_eq!(store.stats.files.load(Ordering::Relaxed), 0);
    }
    assert_eq!(fs::metadata(&path).unwrap().len(), 10);
}

#[test]
fn a_peer_file_of_another_size_than_known_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    // The peer's dataset had sample 1 at another size than ours lists.
    let peer_root = tmp.path().join("peer");
    let peer = store_in(&peer_root, &manifest_with(|_| 50));
    peer.ensure(1).unwrap();
    let root = tmp.path().join("ours");
    let store = store_in(&root, &manifest());
    let e = store.adopt_from_peer(1, &peer_root).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("when first listed"), "{e}");
    assert!(!store.contains(1));
    assert!(names_in(root.join("samples")).is_empty());
}

#[test]
fn a_missing_or_unrecorded_peer_file_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let peer_root = tmp.path().join("peer");
    let root = tmp.path().join("ours");
    let store = store_in(&root, &manifest());

    let missing = FileBackend::path_in(&peer_root, 11);
    let e = store.adopt_from_peer(11, &peer_root).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    assert!(
        e.to_string().contains(&missing.display().to_string()),
        "{e}"
    );
    assert!(FileBackend::recorded_in(&peer_root, 11).is_err());

    // A file with the right bytes but no record, then one with only a checksum (as
    // shufflefs wrote before lengths were recorded).
    fs::create_dir_all(peer_root.join("samples")).unwrap();
    let len = manifest().size(12).unwrap();
    let bytes = bytes_of(12, len);
    let path = FileBackend::path_in(&peer_root, 12);
    fs::write(&path, &bytes).unwrap();
    let legacy = crc32c::crc32c(&bytes).to_le_bytes();
    for record in [None, Some(&legacy[..])] {
        if let Some(v) = record
            && xattr::set(&path, "user.shufflefs.crc32c", v).is_err()
        {
            continue; // no user xattrs here
        }
        let e = store.adopt_from_peer(12, &peer_root).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        assert!(
            e.to_string().contains("no recorded checksum and length"),
            "{e}"
        );
        assert!(FileBackend::recorded_in(&peer_root, 12).is_err());
    }

    // A symlink to a good peer file is not a sample file.
    let (_good, good_root) = {
        let r = tmp.path().join("good");
        let s = store_in(&r, &manifest());
        s.ensure(13).unwrap();
        (s, r)
    };
    std::os::unix::fs::symlink(
        FileBackend::path_in(&good_root, 13),
        FileBackend::path_in(&peer_root, 13),
    )
    .unwrap();
    let e = store.adopt_from_peer(13, &peer_root).unwrap_err();
    assert!(e.to_string().contains("peer cache file"), "{e}");

    assert!(names_in(root.join("samples")).is_empty());
    assert!(names_in(root.join("tmp")).is_empty());
    assert_eq!(store.stats.files.load(Ordering::Relaxed), 0);
    assert_eq!(store.stats.adopted_bytes.load(Ordering::Relaxed), 0);
    // Nothing was held: the source fills them.
    store.ensure(11).unwrap();
    store.ensure(12).unwrap();
}

/// A source whose copies wait for the test's go, after saying they started.
struct Gated {
    inner: Arc<dyn Dataset>,
    started: Mutex<mpsc::Sender<SampleId>>,
    go: Mutex<mpsc::Receiver<()>>,
}

impl Dataset for Gated {
    fn copy_to(&self, id: SampleId, out: &mut dyn Write) -> io::Result<Copied> {
        let _ = self.started.lock().unwrap().send(id);
        let _ = self.go.lock().unwrap().recv();
        self.inner.copy_to(id, out)
    }
    fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read_at(id, offset, buf)
    }
    fn describe(&self, id: SampleId) -> String {
        self.inner.describe(id)
    }
}

#[test]
fn an_adoption_waits_for_a_fetch_of_the_same_sample_and_takes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (_peer, peer_root) = peer_holding(tmp.path(), &[20]);
    let root = tmp.path().join("ours");
    let m = manifest();
    let (started_tx, started) = mpsc::channel();
    let (go, go_rx) = mpsc::channel();
    let source = Gated {
        inner: synthetic(&m),
        started: Mutex::new(started_tx),
        go: Mutex::new(go_rx),
    };
    let store =
        SampleStore::new(CacheDir::open(&root).unwrap(), m.clone(), Arc::new(source)).unwrap();
    let adopted_done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let fetch = s.spawn(|| store.ensure(20));
        assert_eq!(started.recv().unwrap(), 20); // the fetch holds the claim
        let adopt = s.spawn(|| {
            let r = store.adopt_from_peer(20, &peer_root);
            adopted_done.store(true, Ordering::SeqCst);
            r
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !adopted_done.load(Ordering::SeqCst),
            "adopted beside a fetch"
        );
        go.send(()).unwrap();
        fetch.join().unwrap().unwrap();
        let len = m.size(20).unwrap();
        assert_eq!(adopt.join().unwrap().unwrap(), Adopted::AlreadyHeld(len));
    });
    assert_ne!(stat(&root, 20).ino(), stat(&peer_root, 20).ino());
    assert_eq!(stat(&peer_root, 20).nlink(), 1);
    let s = &store.stats;
    assert_eq!(s.fetched_from_source.load(Ordering::Relaxed), 1);
    assert_eq!(s.adopted_linked.load(Ordering::Relaxed), 0);
    assert_eq!(s.adopted_bytes.load(Ordering::Relaxed), 0);
    assert_eq!(s.files.load(Ordering::Relaxed), 1);
}

#[test]
fn a_fetch_waits_for_an_adoption_holding_the_claim() {
    let tmp = tempfile::tempdir().unwrap();
    let (_peer, peer_root) = peer_holding(tmp.path(), &[21]);
    let store = store_in(&tmp.path().join("ours"), &manifest());
    let claim = store.claims.claim(21); // as an adoption in progress holds it
    let fetched = AtomicBool::new(false);
    std::thread::scope(|s| {
        let fetch = s.spawn(|| {
            let r = store.ensure(21);
            fetched.store(true, Ordering::SeqCst);
            r
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !fetched.load(Ordering::SeqCst),
            "fetched beside an adoption"
        );
        // What `adopt_from_peer` does once it holds the claim.
        let peer = FileBackend::open_peer(&peer_root, 21).unwrap();
        assert!(
            store
                .backend
                .adopt(&claim, &peer.path, peer.recorded)
                .unwrap()
        );
        drop(claim);
        fetch.join().unwrap().unwrap();
    });
    assert_eq!(store.stats.fetched_from_source.load(Ordering::Relaxed), 0);
}

#[test]
fn adoptions_racing_fetches_bring_each_sample_in_once() {
    let tmp = tempfile::tempdir().unwrap();
    let all: Vec<SampleId> = (0..SAMPLES).collect();
    let (_peer, peer_root) = peer_holding(tmp.path(), &all);
    let root = tmp.path().join("ours");
    let store = store_in(&root, &manifest());
    std::thread::scope(|s| {
        s.spawn(|| {
            for &id in &all {
                store.ensure(id).unwrap();
            }
        });
        s.spawn(|| {
            for &id in all.iter().rev() {
                store.adopt_from_peer(id, &peer_root).unwrap();
            }
        });
    });
    let m = manifest();
    let total: u64 = all.iter().map(|&id| m.size(id).unwrap()).sum();
    let s = &store.stats;
    let fetched = s.fetched_from_source.load(Ordering::Relaxed);
    let linked = s.adopted_linked.load(Ordering::Relaxed);
    assert_eq!(fetched + linked, SAMPLES);
    assert_eq!(s.files.load(Ordering::Relaxed), SAMPLES);
    assert_eq!(s.bytes.load(Ordering::Relaxed), total);
    for &id in &all {
        assert_eq!(store.read(id).unwrap(), bytes_of(id, m.size(id).unwrap()));
    }
    assert!(names_in(root.join("tmp")).is_empty());
}

/// The file backend with the trait's default `adopt`: a backend that cannot link.
struct NoLinks(FileBackend);

impl CacheBackend for NoLinks {
    fn recover(&self, keep: &dyn Fn(SampleId, u64) -> bool) -> io::Result<Vec<Recovered>> {
        self.0.recover(keep)
    }
    fn contains(&self, id: SampleId) -> bool {
        self.0.contains(id)
    }
    fn held(&self) -> Vec<SampleId> {
        self.0.held()
    }
    fn size(&self, id: SampleId) -> Option<u64> {
        self.0.size(id)
    }
    fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read_at(id, offset, buf)
    }
    fn open(&self, id: SampleId) -> io::Result<Stored> {
        self.0.open(id)
    }
    fn writer<'a>(&'a self, claim: &Claim<'_>) -> io::Result<Box<dyn SampleWriter + 'a>> {
        self.0.writer(claim)
    }
    fn remove(&self, id: SampleId) -> io::Result<bool> {
        self.0.remove(id)
    }
    fn clear(&self) -> io::Result<()> {
        self.0.clear()
    }
    fn sync(&self) -> io::Result<()> {
        self.0.sync()
    }
    fn file(&self, id: SampleId) -> Option<io::Result<std::fs::File>> {
        self.0.file(id)
    }
    fn verify(&self, id: SampleId) -> io::Result<()> {
        self.0.verify(id)
    }
}

/// The ways in and out of a store, on either layout: fetches, receives (checked and not),
/// reads, removes, and what a remount finds.
#[test]
fn a_store_works_alike_on_either_layout() {
    for layout in LAYOUTS {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ours");
        let m = manifest();
        let store = store_with_layout(&root, &m, layout);
        for id in 0..10 {
            store.ensure(id).unwrap();
        }
        let len = |id: SampleId| m.size(id).unwrap();
        // Received bytes with the right checksum, and with a wrong one (refused, counted).
        let good = bytes_of(11, len(11));
        let crc = crc32c::crc32c(&good);
        assert_eq!(
            store
                .insert_with(11, |out| out.write_all(&good).map(|()| Some(crc)))
                .unwrap(),
            crc
        );
        let e = store
            .insert_with(12, |out| {
                out.write_all(&bytes_of(12, len(12)))
                    .map(|()| Some(crc ^ 1))
            })
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{layout}");
        assert!(!store.contains(12), "{layout}");
        // A length other than the manifest's is refused and leaves nothing.
        assert!(
            store
                .insert_with(13, |out| out.write_all(b"short").map(|()| None))
                .is_err()
        );
        assert!(!store.contains(13));
        for id in (0..10).chain([11]) {
            assert_eq!(store.read(id).unwrap(), bytes_of(id, len(id)), "{layout}");
            let mut stored = store.open_checked(id).unwrap();
            let mut got = Vec::new();
            stored.reader.read_to_end(&mut got).unwrap();
            assert_eq!(got, bytes_of(id, len(id)));
            assert_eq!(stored.recorded_crc, Some(crc32c::crc32c(&got)), "{layout}");
        }
        assert_eq!(store.mtime(3), Some(source_time(3)));
        assert_eq!(store.file(3).is_some(), layout == CacheLayout::Files);
        store.remove(4).unwrap();
        store.remove(4).unwrap();
        let s = &store.stats;
        assert_eq!(s.files.load(Ordering::Relaxed), 10, "{layout}");
        assert_eq!(s.checksum_failures.load(Ordering::Relaxed), 1);
        store.sync().unwrap();
        drop(store);

        let store = store_with_layout(&root, &m, layout);
        assert_eq!(store.stats.files.load(Ordering::Relaxed), 10, "{layout}");
        assert!(!store.contains(4) && !store.contains(12));
        for id in [0, 3, 9, 11] {
            assert_eq!(store.read(id).unwrap(), bytes_of(id, len(id)));
        }
        // Fetched ones keep their source time (a received one had none to keep).
        for id in [0, 3, 9] {
            assert_eq!(store.mtime(id), Some(source_time(id)), "{layout} {id}");
        }
        // A dataset that now lists another size for a sample: the stale copy is dropped.
        drop(store);
        let other = manifest_with(|i| if i == 0 { 7 } else { 300 + i * 613 });
        let store = store_with_layout(&root, &other, layout);
        assert!(!store.contains(0) && store.contains(1), "{layout}");
    }
}

#[test]
fn concurrent_fetches_and_receives_bring_each_sample_in_once_on_either_layout() {
    for layout in LAYOUTS {
        let tmp = tempfile::tempdir().unwrap();
        let m = manifest();
        let store = store_with_layout(&tmp.path().join("ours"), &m, layout);
        std::thread::scope(|s| {
            s.spawn(|| (0..SAMPLES).for_each(|id| store.ensure(id).unwrap()));
            s.spawn(|| {
                for id in (0..SAMPLES).rev() {
                    let b = bytes_of(id, m.size(id).unwrap());
                    store
                        .insert_with(id, |out| out.write_all(&b).map(|()| None))
                        .unwrap();
                }
            });
            s.spawn(|| {
                for id in 0..SAMPLES {
                    if store.contains(id) {
                        assert_eq!(store.read(id).unwrap(), bytes_of(id, m.size(id).unwrap()));
                    }
                }
            });
        });
        assert_eq!(
            store.stats.files.load(Ordering::Relaxed),
            SAMPLES,
            "{layout}"
        );
        for id in 0..SAMPLES {
            assert_eq!(store.read(id).unwrap(), bytes_of(id, m.size(id).unwrap()));
        }
    }
}

/// A batch insert keeps every check of `insert_with`, sample by sample: good samples are
/// stored and counted, a checksum mismatch is refused and counted, the sender's unreadable
/// mark is refused and not counted, a wrong length and an id past the dataset are refused;
/// nothing refused becomes visible.
#[test]
fn a_batch_insert_checks_each_sample_like_insert_with() {
    for layout in LAYOUTS {
        let tmp = tempfile::tempdir().unwrap();
        let m = manifest();
        let store = store_with_layout(tmp.path(), &m, layout);
        let size = |id: SampleId| m.size(id).unwrap();
        let good: Vec<Vec<u8>> = (0..4).map(|id| bytes_of(id, size(id))).collect();
        let crc = |b: &[u8]| crc32c::crc32c(b);
        let short = bytes_of(5, size(5) - 1);
        let batch: Vec<(SampleId, &[u8], u32)> = vec![
            (0, &good[0], crc(&good[0])),
            (1, &good[1], crc(&good[1]) ^ 1), // corrupt
            (2, &good[2], !crc(&good[2])),    // the sender could not read it
            (3, &good[3], crc(&good[3])),
            (5, &short, crc(&short)), // not its listed size
            (SAMPLES, &good[0], crc(&good[0])),
        ];
        let results = store.insert_batch(&batch);
        assert_eq!(results.len(), batch.len());
        assert_eq!(results[0].as_ref().unwrap(), &crc(&good[0]), "{layout:?}");
        assert_eq!(
            results[1].as_ref().unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        assert_eq!(
            results[2].as_ref().unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        assert_eq!(results[3].as_ref().unwrap(), &crc(&good[3]));
        assert!(results[4].is_err());
        assert!(results[5].is_err());
        for id in [0, 3] {
            assert!(store.contains(id));
            assert_eq!(store.read(id).unwrap(), good[id as usize], "{layout:?}");
        }
        for id in [1, 2, 5] {
            assert!(
                !store.contains(id),
                "{layout:?}: refused sample {id} is visible"
            );
        }
        assert_eq!(store.stats.files.load(Ordering::Relaxed), 2);
        assert_eq!(store.stats.checksum_failures.load(Ordering::Relaxed), 1);
        // Inserting a stored sample again replaces it and counts it once.
        let again = store.insert_batch(&[(0, &good[0], crc(&good[0]))]);
        assert!(again[0].is_ok());
        assert_eq!(store.stats.files.load(Ordering::Relaxed), 2);
    }
}

/// Two batches over the same ids, from two threads, each write every sample whole: the
/// claims keep one writer per sample.
#[test]
fn concurrent_batches_of_the_same_samples_each_store_them_whole() {
    for layout in LAYOUTS {
        let tmp = tempfile::tempdir().unwrap();
        let m = manifest();
        let store = store_with_layout(tmp.path(), &m, layout);
        let data: Vec<Vec<u8>> = (0..SAMPLES)
            .map(|id| bytes_of(id, m.size(id).unwrap()))
            .collect();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..5 {
                        let batch: Vec<(SampleId, &[u8], u32)> = (0..SAMPLES)
                            .map(|id| {
                                (
                                    id,
                                    &data[id as usize][..],
                                    crc32c::crc32c(&data[id as usize]),
                                )
                            })
                            .collect();
                        assert!(store.insert_batch(&batch).iter().all(Result::is_ok));
                    }
                });
            }
        });
        for id in 0..SAMPLES {
            assert_eq!(store.read(id).unwrap(), data[id as usize], "{layout:?}");
        }
        assert_eq!(store.stats.files.load(Ordering::Relaxed), SAMPLES);
    }
}

/// `read_each` gives what `open_checked` and reading to the end give, sample by sample:
/// bytes and recorded checksum, and a fetch from the source for what is not cached.
#[test]
fn read_each_gives_what_open_checked_gives() {
    for layout in LAYOUTS {
        let tmp = tempfile::tempdir().unwrap();
        let m = manifest();
        let store = store_with_layout(tmp.path(), &m, layout);
        for id in [0, 2, 5] {
            store.ensure(id).unwrap();
        }
        let ids = [5, 0, 1, 2, 9];
        let mut seen = Vec::new();
        store.read_each(&ids, &mut |k, read| {
            let read = read.unwrap();
            seen.push((k, read.bytes.to_vec(), read.recorded_crc));
        });
        assert_eq!(seen.len(), ids.len());
        for (k, bytes, recorded) in seen {
            let id = ids[k];
            let mut stored = store.open_checked(id).unwrap();
            let mut want = Vec::new();
            stored.reader.read_to_end(&mut want).unwrap();
            assert_eq!(bytes, want, "{layout:?} sample {id}");
            assert_eq!(bytes, bytes_of(id, m.size(id).unwrap()));
            assert_eq!(recorded, stored.recorded_crc);
        }
        // A removed sample is fetched from the source again, in its place.
        store.remove(0).unwrap();
        let mut results = Vec::new();
        store.read_each(&[2, 0], &mut |k, read| results.push((k, read.is_ok())));
        assert_eq!(
            results,
            vec![(0, true), (1, true)],
            "{layout:?}: 0 is fetched again"
        );
    }
}

/// Flips one byte of sample `id`'s stored bytes in place, as bit rot or a stray write
/// would: its file under the files layout, its record's data in a segment under the packed
/// one.
fn corrupt_on_disk(root: &Path, id: SampleId, layout: CacheLayout) {
    let want = bytes_of(id, manifest().size(id).unwrap());
    let (path, at) = match layout {
        CacheLayout::Files => (FileBackend::path_in(root, id), 7),
        CacheLayout::Packed => fs::read_dir(root.join("segments"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find_map(|p| {
                let bytes = fs::read(&p).unwrap();
                let at = bytes.windows(want.len()).position(|w| w == want)?;
                Some((p, at as u64 + 7))
            })
            .expect("the sample's bytes are in a segment"),
    };
    let file = fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(&[want[7] ^ 0x5a], at).unwrap();
}

/// Corrupt cached bytes never reach a reader, on either layout: bytes changed under a
/// running store are caught at their next read (files: the file's change time tells;
/// packed: the first read since the mount checks each record), and bytes that rotted while
/// no daemon ran are caught by the scrub (files; the packed layout's recovery already
/// checks every record). Each is counted, dropped and fetched again from the source.
#[test]
fn corrupt_cached_bytes_are_caught_counted_and_fetched_again() {
    for layout in LAYOUTS {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ours");
        let m = manifest();
        let read = |store: &SampleStore, id| {
            store.ensure(id).unwrap(); // as a reader's open does
            assert_eq!(store.read(id).unwrap(), bytes_of(id, m.size(id).unwrap()));
        };
        let store = store_with_layout(&root, &m, layout);
        for id in 0..6 {
            store.ensure(id).unwrap();
        }
        store.sync().unwrap();
        corrupt_on_disk(&root, 1, layout);
        read(&store, 1);
        assert_eq!(store.stats.checksum_failures.load(Ordering::Relaxed), 1);
        assert_eq!(store.stats.fetched_from_source.load(Ordering::Relaxed), 7);
        store.sync().unwrap();
        drop(store);

        for id in [2, 4] {
            corrupt_on_disk(&root, id, layout);
        }
        let store = store_with_layout(&root, &m, layout);
        let scrubbed = store.scrub(&|| true);
        if layout == CacheLayout::Files {
            assert_eq!(scrubbed, 2);
            assert_eq!(store.stats.checksum_failures.load(Ordering::Relaxed), 2);
        }
        for id in 0..6 {
            read(&store, id);
        }
        assert!(!store.contains(6));
        assert_eq!(store.scrub(&|| true), 0, "{layout}: all good now");
    }
}

#[test]
fn fetches_count_the_bytes_read_from_the_source() {
    let tmp = tempfile::tempdir().unwrap();
    let m = manifest();
    let store = store_in(tmp.path(), &m);
    for id in [2, 3, 3] {
        store.ensure(id).unwrap();
    }
    let s = &store.stats;
    assert_eq!(s.fetched_from_source.load(Ordering::Relaxed), 2);
    let bytes = m.size(2).unwrap() + m.size(3).unwrap();
    assert_eq!(s.fetched_bytes_from_source.load(Ordering::Relaxed), bytes);
}

/// A partial cache fetches only kept samples within its size; a refused sample is no
/// source error and no problem, and can still be read from the source.
#[test]
fn a_partial_cache_fetches_only_what_it_keeps_within_its_size() {
    let tmp = tempfile::tempdir().unwrap();
    let m = manifest_with(|_| 1000);
    let store = store_in(tmp.path(), &m);
    // Room for two and a half samples as they take the disk (whole blocks).
    let room = store.on_disk(1000) * 5 / 2;
    let gate = crate::cache::admission::Admission::new(room, 1000, vec![1, 2, 3, 4]);
    store.set_partial(gate);
    store.ensure(1).unwrap();
    store.ensure(2).unwrap();
    let full = store.ensure(3).unwrap_err();
    let other = store.ensure(9).unwrap_err();
    for e in [&full, &other] {
        assert!(crate::cache::admission::is_not_kept(e), "{e}");
    }
    assert!(!store.contains(3) && !store.contains(9));
    assert_eq!(store.stats.bytes.load(Ordering::Relaxed), 2000);
    assert_eq!(store.stats.source_errors.load(Ordering::Relaxed), 0);
    assert!(store.stats.problems().is_empty());
    assert_eq!(store.read_uncached(9, 1 << 20).unwrap(), bytes_of(9, 1000));
}

/// A partial cache counts what its storage takes on disk: the packed layout keeps removed
/// samples' records until it compacts, so their room is not handed out again before; the
/// files layout frees it at once.
#[test]
fn a_partial_cache_counts_the_packed_layouts_removed_records() {
    let m = manifest_with(|_| 1000);
    for layout in LAYOUTS {
        let tmp = tempfile::tempdir().unwrap();
        let store = store_with_layout(tmp.path(), &m, layout);
        let kept = vec![1, 2, 3, 4, 5];
        // Room for three samples with the packed layout's record headers (the files
        // layout's in whole blocks).
        let room = 3 * store.on_disk(1000) + 300;
        let gate = crate::cache::admission::Admission::new(room, 1000, kept);
        store.set_partial(gate);
        for id in [1, 2, 3] {
            store.ensure(id).unwrap();
        }
        store.remove(1).unwrap();
        store.remove(2).unwrap();
        assert_eq!(store.stats.bytes.load(Ordering::Relaxed), 1000);
        let got = store.ensure(4);
        match layout {
            CacheLayout::Files => got.unwrap(),
            CacheLayout::Packed => {
                let e = got.unwrap_err();
                assert!(crate::cache::admission::is_not_kept(&e), "{e}");
                assert!(store.held_bytes() > 3000);
                assert_eq!(store.on_disk(1000), 1000, "packed counts its segments");
            }
        }
    }
}

/// What the exchange brings into a partial cache is written only within its size, whatever
/// the plan sent: a disk hand-off without room is refused as not kept (nothing stored), and
/// the receiver's room for a run of samples is refused as a whole; a full cache has no gate.
#[test]
fn a_partial_cache_receives_only_within_its_size() {
    let tmp = tempfile::tempdir().unwrap();
    let m = manifest();
    let (_peer, peer_root) = peer_holding(tmp.path(), &[0, 1, 2]);
    let store = store_in(&tmp.path().join("me"), &m);
    assert!(store.room_for_received(0, u64::MAX / 2).unwrap().is_none());
    let room = store.on_disk(m.size(0).unwrap()) + store.on_disk(m.size(1).unwrap());
    store.set_partial(crate::cache::admission::Admission::new(room, 1, vec![]));
    store.adopt_from_peer(0, &peer_root).unwrap();
    let promised = store.room_for_received(1, m.size(1).unwrap()).unwrap();
    assert!(
        store.room_for_received(2, 1).is_err(),
        "promised to sample 1"
    );
    drop(promised);
    store.adopt_from_peer(1, &peer_root).unwrap();
    let e = store.adopt_from_peer(2, &peer_root).unwrap_err();
    assert!(crate::cache::admission::is_not_kept(&e), "{e}");
    assert!(!store.contains(2));
    assert_eq!(store.held_bytes(), room);
}

/// A partial cache of one file per sample counts each sample in whole blocks of its disk,
/// as the disk does: room for four samples' bytes holds only the samples whose blocks fit
/// (two ranks sharing a disk filled it while counting bytes).
#[test]
fn a_partial_cache_counts_whole_blocks() {
    let tmp = tempfile::tempdir().unwrap();
    let m = manifest_with(|_| 1000);
    let store = store_with_layout(tmp.path(), &m, CacheLayout::Files);
    let block = store.block();
    assert!(block >= 512, "{block}");
    let gate = crate::cache::admission::Admission::new(2 * block, 1000, vec![1, 2, 3, 4]);
    store.set_partial(gate);
    store.ensure(1).unwrap();
    store.ensure(2).unwrap();
    let e = store.ensure(3).unwrap_err();
    assert!(crate::cache::admission::is_not_kept(&e), "{e}");
    assert_eq!(store.held_bytes(), 2 * block);
    assert_eq!(store.stats.bytes.load(Ordering::Relaxed), 2000);
    assert!(
        store.room_for_received(4, 1).is_err(),
        "a byte takes a block"
    );
    store.remove(1).unwrap();
    assert_eq!(store.held_bytes(), block);
}

/// A cache filled under a larger room and given a smaller one (a remount with a smaller
/// `--cache-size`) drops the samples its gate does not keep, those outside the share first,
/// until it is within its size; kept samples stay.
#[test]
fn a_cache_over_its_size_drops_unkept_samples_to_its_room() {
    let tmp = tempfile::tempdir().unwrap();
    let m = manifest_with(|_| 1000);
    let store = store_in(tmp.path(), &m);
    for id in 0..6 {
        store.ensure(id).unwrap();
    }
    let block = store.on_disk(1000);
    assert_eq!(
        crate::cache::trim::to_room(&store, &[]),
        0,
        "no partial cache"
    );
    let gate = crate::cache::admission::Admission::new(3 * block, 1000, vec![1, 4]);
    store.set_partial(gate);
    // The share is 0..=3: 5 goes first, then 0 and 2 (3 stays: the cache is within its size).
    assert_eq!(crate::cache::trim::to_room(&store, &[0, 1, 2, 3]), 3);
    assert_eq!(store.held_bytes(), 3 * block);
    let held: Vec<u64> = (0..6).filter(|&id| store.contains(id)).collect();
    assert_eq!(held, [1, 3, 4]);
    assert_eq!(crate::cache::trim::to_room(&store, &[0, 1, 2, 3]), 0);
}

/// A partial cache reads ahead the listed samples it does not keep, and a reader takes
/// those bytes instead of reading the source again: each is read from the source once.
#[test]
fn a_partial_cache_reads_listed_samples_ahead_once() {
    let tmp = tempfile::tempdir().unwrap();
    let m = manifest_with(|_| 1000);
    let store = Arc::new(store_in(tmp.path(), &m));
    store.set_partial(crate::cache::admission::Admission::new(1000, 1000, vec![1]));
    let partial = store.partial().unwrap();
    store.read_ahead_listed(0, vec![1, 5, 6]);
    let start = std::time::Instant::now();
    while partial.measured().1.source_bytes < 2000 {
        assert!(start.elapsed() < Duration::from_secs(10), "not read ahead");
        std::thread::sleep(Duration::from_millis(5));
    }
    for id in [5, 6] {
        partial.saw(id, false);
        assert_eq!(
            store.read_uncached(id, 1 << 20).unwrap(),
            bytes_of(id, 1000)
        );
    }
    std::thread::sleep(Duration::from_millis(50));
    // Sample 1 is kept (fetched into the cache when read), not read ahead.
    assert_eq!(partial.measured().1.source_bytes, 2000);
}

/// A record source's samples keep no source time of their own (its views show parts),
/// whatever their copies say; a folder source's do (`mtime` above).
#[test]
fn a_record_sources_samples_keep_no_time() {
    use crate::dataset::records::{Framing, Grouping, RecordParams, build_index};
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("a.txt"), b"one\ntwo\nthree\n").unwrap();
    let params = RecordParams {
        framing: Framing::Lines,
        record_size: 0,
        grouping: Grouping::Records,
        header_line: false,
    };
    let (index, _) = build_index(src.path(), &params).unwrap();
    let manifest = Arc::new(Manifest::from_records(index, Vec::new()));
    let tmp = tempfile::tempdir().unwrap();
    let store = store_in(tmp.path(), &manifest);
    store.learn_mtime_nanos(1, 1_700_000_000_000_000_000);
    assert_eq!(store.mtime_nanos(1), 0);
    assert_eq!(store.mtime(1), None);
}
