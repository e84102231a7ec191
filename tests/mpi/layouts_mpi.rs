//! Sources that are not ImageFolder-shaped (`--format tree`) under a real `mpirun -np 4`:
//! a flat folder of `.npz`-like files and a nested `speaker/chapter/*.flac`-like tree. Every
//! epoch's views partition the files with exact bytes, and every folder of the source (the
//! empty ones too) is in every rank's view.

use crate::common::mpi_job::MpiJob;
use crate::common::trees::{assert_epochs_partition, write_tree};
use crate::common::{require_fuse, require_mpi};

const RANKS: u32 = 4;
const SEED: u64 = 11;

#[test]
fn flat_folder_of_npz_files_is_partitioned_every_epoch() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let files: Vec<_> = (0..37)
        .map(|i| (format!("img_{i:03}.npz"), 3000 + i * 211))
        .collect();
    write_tree(tmp.path(), &files, &[]);
    let job = MpiJob::start(tmp.path(), RANKS, SEED, 0.5, &["--format", "tree"]);
    let sizes = assert_epochs_partition(&job, &tmp.path().join("src"), 3);
    for s in sizes {
        assert!(s.iter().all(|&n| n == 9 || n == 10), "{s:?}");
    }
    assert_eq!(job.status(0)["dataset"]["format"], "tree");
    job.unmount();
}

#[test]
fn nested_speaker_chapter_tree_keeps_every_folder_on_every_rank() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for spk in 0..5 {
        for ch in 0..(spk % 3 + 1) {
            for u in 0..(spk + ch + 1) {
                let path = format!("{spk}/{}/{spk}-{ch}-{u:04}.flac", 100 + ch);
                files.push((path, 500 + u * 37));
            }
        }
    }
    files.push(("README.TXT".to_string(), 100));
    write_tree(tmp.path(), &files, &["9/empty-chapter", "a/b/c/d/e/f"]);
    let job = MpiJob::start(tmp.path(), RANKS, SEED, 0.3, &["--format", "tree"]);
    assert_epochs_partition(&job, &tmp.path().join("src"), 3);
    job.unmount();
}
