//! The view's behaviour without the kernel: `ShuffleFs` driven directly.

use std::ffi::OsStr;
use std::sync::Arc;

use shufflefs::cache::{CacheDir, SampleStore};
use shufflefs::dataset::manifest::Manifest;
use shufflefs::dataset::{SyntheticSource, synthetic_byte};
use shufflefs::node::coordinator::{Coordinator, NoExchange};
use shufflefs::node::status::StatusReport;
use shufflefs::plan::{Plan, PlanParams};
use shufflefs::vfs::error::FsError;
use shufflefs::vfs::inodes::{Node, ROOT};
use shufflefs::vfs::{Kind, OpenFiles, Opened, ShuffleFs, Wait};

struct FixedStatus;
impl StatusReport for FixedStatus {
    fn render(&self) -> Vec<u8> {
        b"{\"ok\":true}\n".to_vec()
    }
}

struct World {
    fs: ShuffleFs,
    epochs: Coordinator,
    store: Arc<SampleStore>,
    _dir: tempfile::TempDir,
}

/// Rank `rank` of a 2-rank world over 3 classes (the last one empty).
fn world(rank: u32, fraction: f64) -> World {
    let manifest = Arc::new(
        Manifest::from_parts(vec![
            (
                b"ant".to_vec(),
                (0..6)
                    .map(|i| (format!("a{i}.png").into_bytes(), 100 + i))
                    .collect(),
            ),
            (
                b"bee".to_vec(),
                (0..5)
                    .map(|i| (format!("b {i}.png").into_bytes(), 7 * i))
                    .collect(),
            ),
            (b"empty".to_vec(), vec![]),
        ])
        .unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(SyntheticSource {
        manifest: manifest.clone(),
    });
    let store = Arc::new(
        SampleStore::new(
            CacheDir::open(dir.path()).unwrap(),
            manifest.clone(),
            source,
        )
        .unwrap(),
    );
    let plan = Plan::new(PlanParams {
        samples: manifest.len(),
        world: 2,
        fraction,
        seed: 3,
    })
    .unwrap();
    let initial = plan.initial();
    let epochs = Coordinator::start(plan, rank, initial, None, Arc::new(NoExchange));
    let fs = ShuffleFs::new(store.clone(), epochs.clone(), Arc::new(FixedStatus));
    World {
        fs,
        epochs,
        store,
        _dir: dir,
    }
}

fn names(fs: &ShuffleFs, ino: u64) -> Vec<String> {
    let mut out = Vec::new();
    fs.readdir(ino, 0, |_, name, _| {
        out.push(name.to_string_lossy().into_owned());
        false
    })
    .unwrap();
    out
}

#[test]
fn root_lists_control_current_and_the_current_epoch() {
    let w = world(0, 0.5);
    assert_eq!(names(&w.fs, ROOT), vec![".shufflefs", "current", "epoch-0"]);
    assert_eq!(
        names(&w.fs, Node::CtlDir.ino()),
        vec!["status", "epoch", "metrics"]
    );
    assert_eq!(w.fs.readlink(Node::Current.ino()).unwrap(), b"epoch-0");
}

#[test]
fn every_class_is_listed_and_files_are_this_ranks_share() {
    let (a, b) = (world(0, 0.5), world(1, 0.5));
    let e0 = a.fs.lookup(ROOT, OsStr::new("epoch-0")).unwrap();
    assert_eq!(e0.kind, Kind::Dir);
    assert_eq!(names(&a.fs, e0.node.ino()), vec!["ant", "bee", "empty"]);
    let mut all = Vec::new();
    for w in [&a, &b] {
        for class in ["ant", "bee", "empty"] {
            let c = w.fs.lookup(e0.node.ino(), OsStr::new(class)).unwrap();
            for n in names(&w.fs, c.node.ino()) {
                let f = w.fs.lookup(c.node.ino(), OsStr::new(&n)).unwrap();
                assert_eq!(f.kind, Kind::File);
                all.push(format!("{class}/{n}"));
            }
        }
    }
    all.sort();
    assert_eq!(
        all.len(),
        11,
        "the two ranks' listings partition the dataset: {all:?}"
    );
    all.dedup();
    assert_eq!(all.len(), 11);
}

#[test]
fn resumed_listing_uses_offsets() {
    let w = world(0, 0.0);
    let class = Node::ClassDir(0, 0).ino();
    let full = names(&w.fs, class);
    let mut tail = Vec::new();
    w.fs.readdir(class, 1, |_, name, _| {
        tail.push(name.to_string_lossy().into_owned());
        false
    })
    .unwrap();
    assert_eq!(tail, full[1..].to_vec());
}

#[test]
fn open_fetches_from_the_source_and_bytes_match() {
    let w = world(0, 0.5);
    let share = w.epochs.current().share(0).to_vec();
    for id in share {
        assert!(!w.store.contains(id));
        let Opened::Sample(file) = w.fs.open(Node::Sample(id).ino(), false).unwrap() else {
            panic!("not a sample")
        };
        let bytes = std::io::Read::bytes(file)
            .map(Result::unwrap)
            .collect::<Vec<u8>>();
        assert_eq!(Some(bytes.len() as u64), w.store.manifest().size(id));
        assert!(
            bytes
                .iter()
                .enumerate()
                .all(|(o, &b)| b == synthetic_byte(id, o as u64))
        );
        assert!(w.store.contains(id), "opened samples are cached");
    }
}

#[test]
fn other_ranks_samples_and_other_epochs_are_not_found() {
    let w = world(0, 0.5);
    let other = w.epochs.current().share(1)[0];
    assert!(matches!(
        w.fs.getattr(Node::Sample(other).ino()),
        Err(FsError::NotFound)
    ));
    // Not this rank's, and an id past the dataset: answered at once, never fetched.
    for id in [other, u64::from(u32::MAX), u64::MAX >> 3] {
        assert!(!w.fs.may_wait(Node::Sample(id)), "sample {id}");
        assert!(matches!(
            w.fs.getattr(Node::Sample(id).ino()),
            Err(FsError::NotFound)
        ));
    }
    assert!(matches!(
        w.fs.lookup(ROOT, OsStr::new("epoch-2")),
        Err(FsError::NotFound)
    ));
    assert!(matches!(
        w.fs.lookup(ROOT, OsStr::new("epoch-00")),
        Err(FsError::NotFound)
    ));
    assert!(matches!(
        w.fs.lookup(Node::EpochDir(0).ino(), OsStr::new("nope")),
        Err(FsError::NotFound)
    ));
}

#[test]
fn looking_up_the_next_epoch_advances_and_the_old_one_is_gone() {
    let w = world(0, 0.5);
    w.fs.lookup(ROOT, OsStr::new("epoch-1")).unwrap();
    assert_eq!(w.epochs.epoch(), 1);
    assert!(matches!(
        w.fs.lookup(ROOT, OsStr::new("epoch-0")),
        Err(FsError::NotFound)
    ));
    assert!(matches!(
        w.fs.getattr(Node::EpochDir(0).ino()),
        Err(FsError::NotFound)
    ));
    assert_eq!(w.fs.readlink(Node::Current.ino()).unwrap(), b"epoch-1");
    assert_eq!(names(&w.fs, ROOT), vec![".shufflefs", "current", "epoch-1"]);
}

#[test]
fn epoch_control_file() {
    let w = world(0, 0.5);
    let Opened::Snapshot(b) = w.fs.open(Node::EpochCtl.ino(), false).unwrap() else {
        panic!()
    };
    assert_eq!(b, b"0\n");
    assert_eq!(w.fs.write_epoch(b"1\n").unwrap(), 2);
    assert_eq!(
        w.fs.write_epoch(b"1").unwrap(),
        1,
        "rewriting the current epoch is a no-op"
    );
    for junk in [&b"0"[..], b"-1", b"x", b"3", b"", b"1.0"] {
        let err = w.fs.write_epoch(junk).unwrap_err();
        assert_eq!(err.errno(), libc::EINVAL, "{junk:?}");
    }
    assert_eq!(w.epochs.epoch(), 1, "refused writes change nothing");
    assert!(
        w.fs.setattr(Node::EpochCtl.ino(), true).is_ok(),
        "`echo N >` truncates first"
    );
}

#[test]
fn views_are_read_only() {
    let w = world(0, 0.5);
    let id = w.epochs.current().share(0)[0];
    for node in [
        Node::Root,
        Node::EpochDir(0),
        Node::ClassDir(0, 0),
        Node::Sample(id),
        Node::Status,
    ] {
        assert_eq!(
            w.fs.setattr(node.ino(), true).unwrap_err().errno(),
            libc::EROFS,
            "{node:?}"
        );
        assert_eq!(
            w.fs.access(node.ino(), true).unwrap_err().errno(),
            libc::EROFS,
            "{node:?}"
        );
        w.fs.access(node.ino(), false).unwrap();
    }
    assert_eq!(
        w.fs.open(Node::Sample(id).ino(), true)
            .err()
            .unwrap()
            .errno(),
        libc::EROFS
    );
    assert_eq!(
        w.fs.open(Node::Status.ino(), true).err().unwrap().errno(),
        libc::EROFS
    );
    let Opened::Snapshot(s) = w.fs.open(Node::Status.ino(), false).unwrap() else {
        panic!()
    };
    assert_eq!(s, b"{\"ok\":true}\n");
}

/// The handle table over a second `ShuffleFs` of the same world (as the binding holds it).
fn open_files(w: &World, opens: bool) -> OpenFiles {
    let fs = ShuffleFs::new(w.store.clone(), w.epochs.clone(), Arc::new(FixedStatus));
    OpenFiles::new(Arc::new(fs), opens)
}

#[test]
fn handles_read_samples_and_snapshots_until_released() {
    let w = world(0, 0.5);
    let files = open_files(&w, true);
    let manifest = w.store.manifest();
    let current = w.epochs.current();
    let id = *current
        .share(0)
        .iter()
        .find(|&&id| manifest.size(id) > Some(0))
        .unwrap();
    let size = manifest.size(id).unwrap();
    let sample = files.open(Node::Sample(id).ino(), false).unwrap().unwrap();
    assert!(
        sample.cache_file.is_some(),
        "a cached sample may pass through"
    );
    assert!(sample.keep_cache);
    for (offset, len) in [(0, 1), (3, 50), (size - 1, 10), (size, 10), (size + 7, 1)] {
        let got = files.read(sample.fh, offset, len).unwrap();
        let want: Vec<u8> = (offset..(offset + u64::from(len)).min(size))
            .map(|o| synthetic_byte(id, o))
            .collect();
        assert_eq!(got, want, "{len} bytes at {offset}");
    }
    let status = files.open(Node::Status.ino(), false).unwrap().unwrap();
    assert!(status.cache_file.is_none() && !status.keep_cache);
    assert_ne!(status.fh, sample.fh);
    let mut whole = files.read(status.fh, 0, 3).unwrap();
    whole.extend(files.read(status.fh, 3, 100).unwrap());
    assert_eq!(whole, b"{\"ok\":true}\n", "chunked reads of one snapshot");
    assert_eq!(files.len(), 2);
    files.release(sample.fh);
    assert_eq!(files.len(), 1);
    let err = files.read(sample.fh, 0, 1).unwrap_err();
    assert_eq!(err.errno(), libc::EBADF, "a released handle");
    files.release(status.fh);
    assert!(files.is_empty());
}

#[test]
fn only_a_control_handle_takes_writes() {
    let w = world(0, 0.5);
    let files = open_files(&w, true);
    let id = w.epochs.current().share(0)[0];
    let sample = files.open(Node::Sample(id).ino(), false).unwrap().unwrap();
    assert_eq!(
        files.write(sample.fh, b"1").unwrap_err().errno(),
        libc::EROFS
    );
    assert_eq!(files.write(999, b"1").unwrap_err().errno(), libc::EROFS);
    let control = files.open(Node::EpochCtl.ino(), true).unwrap().unwrap();
    assert_eq!(
        files.read(control.fh, 0, 10).unwrap_err().errno(),
        libc::EBADF
    );
    assert_eq!(files.write(control.fh, b"1\n").unwrap(), 2);
    assert_eq!(w.epochs.epoch(), 1);
    assert_eq!(
        files.write(control.fh, b"junk").unwrap_err().errno(),
        libc::EINVAL
    );
    let reading = files.open(Node::EpochCtl.ino(), false).unwrap().unwrap();
    assert_eq!(files.read(reading.fh, 0, 10).unwrap(), b"1\n");
}

#[test]
fn without_opens_requests_come_by_inode() {
    let w = world(0, 0.5);
    let files = open_files(&w, false);
    let id = w.epochs.current().share(0)[0];
    let ino = Node::Sample(id).ino();
    assert!(
        files.open(ino, false).unwrap().is_none(),
        "nothing to hand out"
    );
    assert_eq!(files.open(ino, true).unwrap_err().errno(), libc::EROFS);
    let got = files.read_unopened(ino, 2, 5).unwrap();
    let want: Vec<u8> = (2..7).map(|o| synthetic_byte(id, o)).collect();
    assert_eq!(got, want);
    // The epoch file's attributes carry its content's size and a new mtime each time.
    let first = files.getattr(Node::EpochCtl.ino()).unwrap();
    let second = files.getattr(Node::EpochCtl.ino()).unwrap();
    assert_eq!(first.size, 2);
    assert!(first.mtime.is_some() && second.mtime > first.mtime);
    assert_eq!(
        files.read_unopened(Node::EpochCtl.ino(), 0, 10).unwrap(),
        b"0\n"
    );
    assert_eq!(
        files.write_unopened(ino, b"1").unwrap_err().errno(),
        libc::EROFS
    );
    assert_eq!(files.write_unopened(Node::EpochCtl.ino(), b"1").unwrap(), 1);
    assert_eq!(w.epochs.epoch(), 1);
    // A mount with opens leaves the epoch file's attributes alone.
    assert_eq!(
        open_files(&w, true)
            .getattr(Node::EpochCtl.ino())
            .unwrap()
            .mtime,
        None
    );
}

#[test]
fn wait_says_what_a_request_may_wait_on() {
    let w = world(0, 0.5);
    let id = w.epochs.current().share(0)[0];
    assert_eq!(w.fs.wait(Node::Sample(id)), Wait::Source, "not cached yet");
    w.fs.open(Node::Sample(id).ino(), false).unwrap();
    assert_eq!(w.fs.wait(Node::Sample(id)), Wait::No, "cached");
    assert_eq!(w.fs.wait(Node::EpochDir(1)), Wait::Advance);
    assert_eq!(w.fs.wait(Node::EpochDir(0)), Wait::No);
    assert_eq!(w.fs.wait_ino(Node::EpochDir(1).ino()), Wait::Advance);
    assert_eq!(
        w.fs.wait_ino(12345),
        Wait::No,
        "an unknown inode answers at once"
    );
}
