//! The copy of the side files (`--replicate`) a rank's view reads: `CACHE/side/<path>`.
//!
//! One copy per host: the host's first rank copies the files from the source into its own
//! cache, and the other ranks of the host read that copy (ranks of one host run as one
//! user, as the shared-disk exchange already relies on); a rank that cannot read it (a
//! cache on a disk the others do not see) copies them into its own. A copy stays across
//! epochs and remounts: it is made again only where it is missing or its size or time
//! differs from the source file's (the copy keeps the source file's modification time).
//! Side files are never exchanged and have no sample id, so nothing else in the cache
//! knows them.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::private;
use crate::dataset::manifest::SideFile;

/// The folder of a cache holding its side files.
pub const SIDE_DIR: &str = "side";

/// Where this rank's side files are, for the view and the status (`replicated`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Replicated {
    /// The folder the view reads them from: `CACHE/side` of `copy_rank`.
    pub dir: PathBuf,
    /// The rank whose cache holds that copy (this host's first rank, or this rank).
    pub copy_rank: u32,
    pub files: u64,
    pub bytes: u64,
    /// Bytes this rank copied from the source at this mount (0 when the copy was there
    /// already, or another rank of the host made it).
    pub fetched_bytes: u64,
}

/// Makes `dir` hold every one of `files` as `source` has it; returns the bytes copied.
pub fn copy_missing(source: &Path, dir: &Path, files: &[SideFile]) -> Result<u64, String> {
    let mut copied = 0;
    for f in files {
        let rel = Path::new(std::ffi::OsStr::from_bytes(&f.path));
        let from = source.join(rel);
        let to = dir.join(rel);
        let meta = fs::metadata(&from).map_err(|e| {
            format!(
                "side file {}: {e}; check that it is readable, or pass --rescan if it was removed",
                from.display()
            )
        })?;
        if meta.len() != f.size {
            return Err(format!(
                "side file {} is {} bytes, {} when the index was made: the source changed; pass --rescan",
                from.display(),
                meta.len(),
                f.size
            ));
        }
        if is_current(&to, &meta) {
            continue;
        }
        copy_one(&from, &to, dir, &meta).map_err(|e| {
            format!(
                "copying side file {} into {}: {e}",
                from.display(),
                to.display()
            )
        })?;
        copied += f.size;
    }
    Ok(copied)
}

/// Whether `to` is a copy of a file of `meta`'s size and time.
fn is_current(to: &Path, meta: &fs::Metadata) -> bool {
    fs::metadata(to).is_ok_and(|m| {
        m.len() == meta.len()
            && m.modified().ok().is_some()
            && m.modified().ok() == meta.modified().ok()
    })
}

/// Copies `from` to `to` through a temporary file in `dir`, keeping its time.
fn copy_one(from: &Path, to: &Path, dir: &Path, meta: &fs::Metadata) -> io::Result<()> {
    private::create_dir(dir)?;
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent)?;
    }
    let tmp = dir.join(".copying.tmp");
    let mut out = private::create_file(&tmp)?;
    io::copy(&mut fs::File::open(from)?, &mut out)?;
    if let Ok(time) = meta.modified() {
        out.set_modified(time)?;
    }
    drop(out);
    fs::rename(&tmp, to)
}

/// Whether this rank can read the copy in `dir` of every one of `files`.
pub fn readable(dir: &Path, files: &[SideFile]) -> bool {
    files.iter().all(|f| {
        let path = dir.join(std::ffi::OsStr::from_bytes(&f.path));
        fs::File::open(&path)
            .and_then(|file| file.metadata())
            .is_ok_and(|m| m.len() == f.size)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_once_and_again_only_what_changed() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        fs::create_dir_all(src.join("ann")).unwrap();
        fs::write(src.join("ann/a.json"), b"{\"a\":1}").unwrap();
        fs::write(src.join("classes.txt"), b"x\n").unwrap();
        let files = vec![
            SideFile {
                path: b"ann/a.json".to_vec(),
                size: 7,
            },
            SideFile {
                path: b"classes.txt".to_vec(),
                size: 2,
            },
        ];
        let dir = tmp.path().join("cache/side");
        assert!(!readable(&dir, &files));
        assert_eq!(copy_missing(&src, &dir, &files).unwrap(), 9);
        assert!(readable(&dir, &files));
        assert_eq!(fs::read(dir.join("ann/a.json")).unwrap(), b"{\"a\":1}");
        assert_eq!(copy_missing(&src, &dir, &files).unwrap(), 0);
        // Same size, new time: copied again.
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(src.join("classes.txt"), b"y\n").unwrap();
        assert_eq!(copy_missing(&src, &dir, &files).unwrap(), 2);
        assert_eq!(fs::read(dir.join("classes.txt")).unwrap(), b"y\n");
        // Another size than the index says: the source changed since the scan.
        fs::write(src.join("classes.txt"), b"longer\n").unwrap();
        let err = copy_missing(&src, &dir, &files).unwrap_err();
        assert!(
            err.contains("classes.txt") && err.contains("--rescan"),
            "{err}"
        );
    }
}
