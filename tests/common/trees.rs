//! Trees of files for `--format tree` tests: writing one whose bytes are a function of the
//! path, and walking views of it (every folder, every file read) to check partitions.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::mpi_job::MpiJob;

/// What a view (or the source) holds: its folders and its files' bytes, by relative path.
#[derive(Default)]
pub struct Walk {
    pub dirs: BTreeSet<String>,
    pub files: BTreeMap<String, Vec<u8>>,
}

/// Walks `root` recursively, reading every file.
pub fn walk(root: &Path) -> Walk {
    let mut out = Walk::default();
    let mut todo = vec![String::new()];
    while let Some(rel) = todo.pop() {
        let listed = std::fs::read_dir(root.join(&rel));
        let listed = listed.unwrap_or_else(|e| panic!("{}: {e}", root.join(&rel).display()));
        for entry in listed {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if entry.file_type().unwrap().is_dir() {
                out.dirs.insert(path.clone());
                todo.push(path);
            } else {
                out.files.insert(path, std::fs::read(entry.path()).unwrap());
            }
        }
    }
    out
}

/// Each rank's view of `epoch` (looked up on every rank at once: that advances to it).
pub fn views(job: &MpiJob, epoch: u64) -> Vec<Walk> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (job.mounts.iter())
            .map(|m| s.spawn(move || walk(&m.join(format!("epoch-{epoch}")))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Epochs 0..`epochs` of `job` partition `source`'s files with their bytes, but the `side`
/// files, which every rank shows whole; and every rank shows every folder. Returns each
/// epoch's share sizes (side files not counted).
pub fn assert_epochs_partition(
    job: &MpiJob,
    source: &Path,
    epochs: u64,
    side: &[&str],
) -> Vec<Vec<usize>> {
    let mut src = walk(source);
    let side: BTreeMap<String, Vec<u8>> = side
        .iter()
        .map(|s| {
            (
                s.to_string(),
                src.files.remove(*s).expect("a side file of the source"),
            )
        })
        .collect();
    let mut sizes = Vec::new();
    for epoch in 0..epochs {
        let mut seen = BTreeMap::new();
        let mut views = views(job, epoch);
        for (rank, view) in views.iter_mut().enumerate() {
            assert_eq!(view.dirs, src.dirs, "rank {rank}, epoch {epoch}: folders");
            for (path, bytes) in &side {
                let shown = view.files.remove(path);
                assert!(
                    shown.as_ref() == Some(bytes),
                    "rank {rank}, epoch {epoch}: side file {path}"
                );
            }
            for (path, bytes) in &view.files {
                assert!(
                    src.files.get(path) == Some(bytes),
                    "rank {rank}, epoch {epoch}: {path} differs from the source"
                );
                if let Some(other) = seen.insert(path.clone(), rank) {
                    panic!("epoch {epoch}: {path} on ranks {other} and {rank}");
                }
            }
        }
        let all: BTreeSet<_> = src.files.keys().cloned().collect();
        let listed: BTreeSet<_> = seen.keys().cloned().collect();
        assert_eq!(
            listed, all,
            "epoch {epoch}: the views are not the whole source"
        );
        sizes.push(views.iter().map(|v| v.files.len()).collect());
    }
    sizes
}

fn bytes_of(path: &str, len: usize) -> Vec<u8> {
    let salt = path
        .bytes()
        .fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    (0..len).map(|o| (o as u8).wrapping_add(salt)).collect()
}

/// Writes `files` (relative path, length) and `empty` folders under `dir/src`.
pub fn write_tree(dir: &Path, files: &[(String, usize)], empty: &[&str]) {
    for (path, len) in files {
        let p = dir.join("src").join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes_of(path, *len)).unwrap();
    }
    for d in empty {
        std::fs::create_dir_all(dir.join("src").join(d)).unwrap();
    }
}
