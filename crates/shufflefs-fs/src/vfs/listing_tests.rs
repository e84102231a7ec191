//! Listings of trees, side files and equal shares through `ShuffleFs`, without the kernel:
//! every folder on every rank, side files everywhere, left-out samples nowhere, and a
//! listing read one entry at a time (each call resuming at the offset the last one gave)
//! equal to the listing read at once.

use std::ffi::OsStr;
use std::sync::Arc;

use super::inodes::Node;
use super::{Kind, ShuffleFs};
use crate::cache::{CacheDir, SampleStore};
use crate::dataset::SyntheticSource;
use crate::dataset::manifest::{Manifest, SideFile};
use crate::node::coordinator::{Coordinator, NoExchange};
use crate::node::status::StatusReport;
use crate::plan::equal::EqualShares;
use crate::plan::{Plan, PlanParams};

struct NoStatus;
impl StatusReport for NoStatus {
    fn render(&self) -> Vec<u8> {
        Vec::new()
    }
}

/// A tree of 23 samples (root, `a/b`, `c`, and an empty `d/e`) with side files at the top
/// and in `a/b`, seen by `rank` of 4, with or without equal shares.
fn view(rank: u32, equal: bool) -> (ShuffleFs, tempfile::TempDir) {
    let files = |n: u32, p: &str| {
        (0..n)
            .map(|i| (format!("{p}{i:02}").into_bytes(), 5))
            .collect()
    };
    let side = |p: &str| SideFile {
        path: p.as_bytes().to_vec(),
        size: 3,
    };
    let manifest = Manifest::tree_from_parts(vec![
        (Vec::new(), files(5, "top")),
        (b"a/b".to_vec(), files(10, "ab")),
        (b"c".to_vec(), files(8, "c")),
        (b"d/e".to_vec(), Vec::new()),
    ])
    .unwrap()
    .with_side(vec![], vec![side("meta.json"), side("a/b/labels.txt")])
    .unwrap();
    let manifest = Arc::new(manifest);
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(SyntheticSource {
        manifest: manifest.clone(),
    });
    let dir_cache = CacheDir::open(dir.path()).unwrap();
    let store = Arc::new(SampleStore::new(dir_cache, manifest.clone(), source).unwrap());
    let params = PlanParams {
        samples: manifest.len(),
        world: 4,
        fraction: 0.5,
        seed: 9,
    };
    let plan = Plan::new(params).unwrap();
    let initial = plan.initial();
    let epochs = Coordinator::start(plan.clone(), rank, initial, None, Arc::new(NoExchange));
    let mut fs = ShuffleFs::new(store, epochs, Arc::new(NoStatus));
    if equal {
        fs = fs.with_equal_shares(Arc::new(EqualShares::new(plan, rank)));
    }
    (fs, dir)
}

/// `ino`'s entries, read at once and read one entry per call; asserts both agree.
fn listing(fs: &ShuffleFs, ino: u64) -> Vec<(String, Node)> {
    let mut all = Vec::new();
    fs.readdir(ino, 0, |e, name, _| {
        all.push((name.to_string_lossy().into_owned(), e.node));
        false
    })
    .unwrap();
    let (mut one_by_one, mut offset) = (Vec::new(), 0);
    loop {
        let mut got = None;
        fs.readdir(ino, offset, |e, name, next| {
            got = Some((name.to_string_lossy().into_owned(), e.node, next));
            true
        })
        .unwrap();
        let Some((name, node, next)) = got else { break };
        one_by_one.push((name, node));
        offset = next;
    }
    assert_eq!(one_by_one, all, "resuming at each offset lists the same");
    all
}

/// Every file under `ino`, by path, walking sub-folders.
fn walk(fs: &ShuffleFs, ino: u64, prefix: &str, files: &mut Vec<String>, dirs: &mut Vec<String>) {
    for (name, node) in listing(fs, ino) {
        let path = format!("{prefix}{name}");
        let entry = fs.lookup(ino, OsStr::new(&name)).unwrap();
        assert_eq!(
            entry.node, node,
            "{path}: lookup finds what the listing showed"
        );
        if entry.kind == Kind::Dir {
            dirs.push(path.clone());
            walk(fs, node.ino(), &format!("{path}/"), files, dirs);
        } else {
            files.push(path);
        }
    }
}

#[test]
fn trees_side_files_and_equal_shares_list_and_look_up_alike() {
    for equal in [false, true] {
        let mut samples = Vec::new();
        for rank in 0..4 {
            let (fs, _dir) = view(rank, equal);
            let (mut files, mut dirs) = (Vec::new(), Vec::new());
            walk(&fs, Node::EpochDir(0).ino(), "", &mut files, &mut dirs);
            assert_eq!(
                dirs,
                ["a", "a/b", "c", "d", "d/e"],
                "rank {rank}: every folder"
            );
            assert!(files.contains(&"meta.json".to_string()), "{files:?}");
            assert!(files.contains(&"a/b/labels.txt".to_string()), "{files:?}");
            files.retain(|f| !f.ends_with("meta.json") && !f.ends_with("labels.txt"));
            if equal {
                assert_eq!(files.len(), 5, "rank {rank}: floor(23/4)");
            }
            samples.extend(files);
        }
        let n = samples.len();
        samples.sort();
        samples.dedup();
        assert_eq!(samples.len(), n, "no sample on two ranks");
        assert_eq!(n, if equal { 20 } else { 23 });
    }
}
