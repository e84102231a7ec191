//! The split listing against the single scan it replaces: byte-equal manifests on every
//! rank for any number of ranks, a part per rank, and a failed part stopping every rank.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use super::*;
use std::sync::{Arc, Barrier, Mutex};

use crate::dataset::scan::{scan_tree_with, scan_with};

/// Ranks as threads: every collective puts this rank's bytes on a shared board, waits for
/// every rank, reads, and waits again before the board is written anew.
struct Ranks {
    rank: u32,
    board: Arc<(Mutex<Vec<Vec<u8>>>, Barrier)>,
}

impl Ranks {
    fn world(n: u32) -> Vec<Ranks> {
        let board = Arc::new((
            Mutex::new(vec![Vec::new(); n as usize]),
            Barrier::new(n as usize),
        ));
        (0..n)
            .map(|rank| Ranks {
                rank,
                board: board.clone(),
            })
            .collect()
    }

    fn round(&mut self, mine: &[u8]) -> Vec<Vec<u8>> {
        let (slots, barrier) = &*self.board;
        slots.lock().unwrap()[self.rank as usize] = mine.to_vec();
        barrier.wait();
        let all = slots.lock().unwrap().clone();
        barrier.wait();
        all
    }
}

impl Gather for Ranks {
    fn rank(&self) -> u32 {
        self.rank
    }
    fn ranks(&self) -> u32 {
        self.board.0.lock().unwrap().len() as u32
    }
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        Ok(self.round(mine))
    }
    fn broadcast(&mut self, data: Vec<u8>) -> Result<Vec<u8>, String> {
        Ok(self.round(&data).swap_remove(0))
    }
}

type Split = fn(&Path, bool, &mut dyn Gather) -> Result<(Manifest, Listed), SplitError>;

/// Runs `split` on `world` ranks (threads), rank r listing `root(r)`.
fn run(
    world: u32,
    root: impl Fn(u32) -> PathBuf,
    owners: bool,
    split: Split,
) -> Vec<Result<(Manifest, Listed), SplitError>> {
    let handles: Vec<_> = (Ranks::world(world).into_iter())
        .map(|mut ranks| {
            let root = root(ranks.rank);
            std::thread::spawn(move || split(&root, owners, &mut ranks))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Every rank's manifest is byte-equal to the single scan's, and the ranks listed disjoint
/// parts that add up to the whole (with more than one rank, no rank listed everything:
/// what rank 0's scan alone did before).
fn check_equal(root: &Path, owners: bool, split: Split, single: &Manifest) {
    let want = single.encode();
    for world in [1, 2, 3, 7] {
        let got = run(world, |_| root.to_path_buf(), owners, split);
        let mut folders = 0;
        for (r, got) in got.into_iter().enumerate() {
            let (m, listed) = got.unwrap_or_else(|e| panic!("rank {r} of {world}: {e}"));
            assert!(m.encode() == want, "rank {r} of {world}, owners {owners}");
            assert_eq!(m.fingerprint(), single.fingerprint());
            if world > 1 {
                assert!(listed.folders < u64::from(single.class_count()), "rank {r}");
            }
            folders += listed.folders;
        }
        assert_eq!(folders, u64::from(single.class_count()), "{world} ranks");
    }
}

/// A tree with every kind of entry: links to files in and out of the source, a dangling
/// link, a link to a folder, a fifo, empty and deep folders, a wide folder, modes.
fn tricky_tree(tmp: &Path) -> PathBuf {
    let root = tmp.join("src");
    let outside = tmp.join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("secret"), b"s").unwrap();
    for d in [
        "spk1/ch1",
        "spk1/ch2",
        "spk2/ch9/empty",
        "a/b/c/d/e/f",
        "wide",
    ] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    for i in 0..40 {
        fs::write(root.join(format!("wide/{i}.bin")), b"w").unwrap();
        fs::create_dir_all(root.join(format!("wide/sub{i}"))).unwrap();
        fs::write(root.join(format!("wide/sub{i}/x")), b"x").unwrap();
    }
    fs::write(root.join("spk1/ch1/1.flac"), b"one").unwrap();
    fs::write(root.join("spk1/ch1/0.flac"), b"zero").unwrap();
    fs::write(root.join("spk1/ch2/2.flac"), b"2").unwrap();
    fs::write(root.join("a/b/c/d/e/f/deep.npz"), b"deep").unwrap();
    fs::write(root.join("top.npz"), b"top").unwrap();
    symlink(root.join("top.npz"), root.join("spk2/link.npz")).unwrap();
    symlink(outside.join("secret"), root.join("spk2/leak")).unwrap();
    symlink("..", root.join("spk2/loop")).unwrap();
    symlink(tmp.join("gone"), root.join("spk2/dangling")).unwrap();
    nix::unistd::mkfifo(&root.join("a/fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let chmod = |p: &str, m| fs::set_permissions(root.join(p), fs::Permissions::from_mode(m));
    chmod("spk1", 0o700).unwrap();
    chmod("spk1/ch1/0.flac", 0o600).unwrap();
    root
}

#[test]
fn a_tree_listed_by_several_ranks_is_the_single_scans_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tricky_tree(tmp.path());
    for owners in [false, true] {
        let single = scan_tree_with(&root, owners).unwrap();
        assert!(!single.skipped.is_empty() && single.class_count() > 40);
        check_equal(&root, owners, scan_tree_split, &single);
    }
}

#[test]
fn an_imagefolder_listed_by_several_ranks_is_the_single_scans_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("src");
    let outside = tmp.path().join("outside");
    fs::create_dir_all(outside.join("linked-class")).unwrap();
    fs::write(outside.join("real.bin"), b"12345").unwrap();
    fs::write(outside.join("linked-class/x"), b"xx").unwrap();
    for c in 0..20 {
        fs::create_dir_all(root.join(format!("c{c:02}"))).unwrap();
        for i in 0..c {
            fs::write(root.join(format!("c{c:02}/{i}.png")), b"p").unwrap();
        }
    }
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::create_dir_all(root.join("c03/nested")).unwrap();
    symlink(outside.join("real.bin"), root.join("c04/link.png")).unwrap();
    symlink(tmp.path().join("gone"), root.join("c05/dangling.png")).unwrap();
    symlink(outside.join("linked-class"), root.join("linked-out")).unwrap();
    symlink("c02", root.join("linked-in")).unwrap();
    fs::write(root.join("README"), b"not a class").unwrap();
    fs::set_permissions(root.join("c06"), fs::Permissions::from_mode(0o700)).unwrap();
    for owners in [false, true] {
        let single = scan_with(&root, owners).unwrap();
        assert!(!single.skipped.is_empty());
        check_equal(&root, owners, scan_split, &single);
    }
}

/// One rank that cannot list its part (here: the source is missing on its host) stops
/// every rank with its message, naming the path, under its rank.
#[test]
fn a_part_that_fails_stops_every_rank_naming_the_path() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tricky_tree(tmp.path());
    let missing = tmp.path().join("not-mounted-here");
    for split in [scan_tree_split as Split, scan_split] {
        let path = |r| match r {
            1 => missing.clone(),
            _ => root.clone(),
        };
        for got in run(3, path, false, split) {
            let err = got.expect_err("refused").to_string();
            assert!(err.starts_with("rank 1: "), "{err}");
            assert!(err.contains(&*missing.to_string_lossy()), "{err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }
    // Missing everywhere: said once.
    for got in run(3, |_| missing.clone(), false, scan_tree_split) {
        let err = got.expect_err("refused").to_string();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("rank 0: "), "{err}");
    }
    // A verdict on the whole: no samples at any depth, said once by rank 0.
    let empty = tmp.path().join("empty");
    fs::create_dir_all(empty.join("x/y")).unwrap();
    for got in run(2, |_| empty.clone(), false, scan_tree_split) {
        let err = got.expect_err("refused").to_string();
        assert!(err.starts_with("rank 0: "), "{err}");
        assert!(err.contains("no sample files at any depth"), "{err}");
    }
}
