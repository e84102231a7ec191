//! What in a cache folder is shufflefs's own, and the only removals it makes there.
//!
//! A `--cache` folder is the user's folder before it is ours: a scratch folder may already
//! hold a `tmp/` or `samples/` of someone else's. So a folder is taken only when it is
//! empty, or already a shufflefs cache (it holds [`MARKER`], written first thing into every
//! new cache, or a `state.json`, which every cache made before the marker existed has);
//! anything else is refused naming what was found ([`foreign_entries`]). Even inside our
//! own folder nothing is removed by a pattern wider than the names shufflefs writes: a
//! sample file is named by its id alone, a segment `NNNNNNNN.seg`, a spill `<id>.spill`, a
//! saved share `slots/<epoch>.bin`, the state files by their fixed names. [`remove_owned`]
//! is the one way a whole folder goes away (a gone rank's cache after a resize, a layout
//! given up on `--reset-cache`): it removes our names and leaves the folder in place if
//! anything else is in it.

use std::fs;
use std::io;
use std::path::Path;

use crate::plan::SampleId;

/// The folder under the cache root holding the segments.
pub(crate) const SEGMENTS: &str = "segments";

/// The folder under the cache root holding this rank's saved shares (`slots.rs`).
pub const SLOTS: &str = "slots";

/// Written into every cache folder shufflefs creates: says the folder is ours.
pub(crate) const MARKER: &str = ".shufflefs-cache";

/// Files shufflefs keeps at a cache folder's top level (beside the sub-folders).
const TOP_FILES: &[&str] = &[
    MARKER,
    "LOCK",
    "state.json",
    "manifest.bin",
    "job-token",
    "coded.json",
    "shufflefs.log",
    "status.json",
    "metrics.prom",
];

/// What may be in a folder that is not (yet) a cache for it to be taken: the files a
/// daemon makes before it writes [`MARKER`] (its log, the lock).
const BEFORE_MARKER: &[&str] = &["LOCK", "shufflefs.log"];

/// Whether `name` is one shufflefs writes at a cache folder's top level, its temporaries
/// (`.state.json.aZ3x9Q.tmp`: see `sys::replace`; `.status.json.N.tmp` of older versions)
/// included.
fn is_top_file(name: &str) -> bool {
    TOP_FILES.contains(&name)
        || (TOP_FILES.iter()).any(|of| crate::sys::replace::is_temporary_of(name, of))
}

/// Whether `name` names a sample file (`samples/<id>`, `tmp/<id>`): an id, nothing else.
pub(crate) fn is_sample_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) && name.parse::<SampleId>().is_ok()
}

/// Whether `name` names a file of `segments/`: `NNNNNNNN.seg` or `<id>.spill`.
pub(crate) fn is_segment_name(name: &str) -> bool {
    name.strip_suffix(".seg")
        .or_else(|| name.strip_suffix(".spill"))
        .is_some_and(is_sample_name)
}

/// Whether `name` is a file of [`SLOTS`]: `<epoch>.bin`, or the temporary `sys::replace`
/// makes for one.
pub(crate) fn is_slots_name(name: &str) -> bool {
    if slots_epoch(name).is_some() {
        return true;
    }
    let Some(inner) = name.strip_prefix('.') else {
        return false;
    };
    let of = inner.split_once(".bin").map(|(e, _)| format!("{e}.bin"));
    of.is_some_and(|of| {
        slots_epoch(&of).is_some() && crate::sys::replace::is_temporary_of(name, &of)
    })
}

/// The epoch a saved share's file (`<epoch>.bin`) is named after.
pub(crate) fn slots_epoch(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".bin")?;
    let plain = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    plain.then(|| digits.parse().ok()).flatten()
}

/// The entries that stop `root` from being taken as a cache folder: none when it is
/// missing, empty, or a shufflefs cache already (see the module docs). Sorted.
pub(crate) fn foreign_entries(root: &Path) -> io::Result<Vec<String>> {
    let entries = match fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name == MARKER || name == "state.json" {
            return Ok(Vec::new());
        }
        if !BEFORE_MARKER.contains(&name.as_str()) {
            found.push(name);
        }
    }
    found.sort();
    Ok(found)
}

/// Removes, in `dir`, the regular files whose names `ours` accepts; returns the names of
/// what it left (other files, folders, links). A missing `dir` is empty.
pub(crate) fn remove_files(dir: &Path, ours: impl Fn(&str) -> bool) -> io::Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut left = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if is_file && ours(&name) {
            match fs::remove_file(entry.path()) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        } else {
            left.push(name);
        }
    }
    Ok(left)
}

/// Removes a sub-folder of a cache (`samples`, `tmp`, `segments`): our files in it, then the
/// folder if that emptied it. Returns what was left, as paths relative to the cache.
pub(crate) fn remove_sub(root: &Path, sub: &str) -> io::Result<Vec<String>> {
    let ours: fn(&str) -> bool = match sub {
        SEGMENTS => is_segment_name,
        SLOTS => is_slots_name,
        _ => is_sample_name,
    };
    let dir = root.join(sub);
    // A link (or a file) where our folder would be is not ours to walk into.
    if fs::symlink_metadata(&dir).is_ok_and(|m| !m.is_dir()) {
        return Ok(vec![sub.to_string()]);
    }
    let left = remove_files(&dir, ours)?;
    if left.is_empty() {
        match fs::remove_dir(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(left.into_iter().map(|n| format!("{sub}/{n}")).collect())
}

/// Removes a whole cache folder of ours, as far as it is ours: our files in its
/// sub-folders and at its top, then each folder that this emptied, and `root` itself when
/// `folder` (it was made by us). Returns what it left (relative paths); the folder stays
/// when that is not empty.
pub fn remove_owned(root: &Path, folder: bool) -> io::Result<Vec<String>> {
    let mut left = Vec::new();
    let subs = ["samples", "tmp", SEGMENTS, SLOTS];
    for sub in subs {
        left.extend(remove_sub(root, sub)?);
    }
    let top = remove_files(root, is_top_file)?;
    left.extend(top.into_iter().filter(|n| !subs.contains(&n.as_str())));
    if left.is_empty() && folder {
        fs::remove_dir(root)?;
    }
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_names_are_ours() {
        assert!(is_sample_name("0") && is_sample_name("4294967296"));
        for name in [
            "",
            "7a",
            "-1",
            "18446744073709551616",
            "job-output.txt",
            "7.jpg",
        ] {
            assert!(!is_sample_name(name), "{name}");
        }
        assert!(is_segment_name("00000001.seg") && is_segment_name("12.spill"));
        assert!(!is_segment_name("notes.seg") && !is_segment_name(".seg"));
        assert!(is_top_file(".state.json.tmp") && is_top_file(".status.json.17.tmp"));
        assert!(is_top_file("metrics.prom") && is_top_file(".metrics.prom.3.tmp"));
        assert!(is_top_file(".state.json.aZ3x9Q.tmp") && !is_top_file(".notes.aZ3x9Q.tmp"));
        assert!(!is_top_file("state.json.bak") && !is_top_file(".bashrc"));
    }

    #[test]
    fn a_folder_with_files_of_its_own_is_foreign_until_it_is_a_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("scratch");
        assert!(foreign_entries(&root).unwrap().is_empty(), "missing");
        fs::create_dir_all(root.join("tmp")).unwrap();
        fs::create_dir_all(root.join("samples")).unwrap();
        fs::write(root.join("LOCK"), "").unwrap();
        assert_eq!(foreign_entries(&root).unwrap(), ["samples", "tmp"]);
        fs::write(root.join(MARKER), "").unwrap();
        assert!(foreign_entries(&root).unwrap().is_empty());
    }

    #[test]
    fn removing_a_cache_leaves_what_is_not_ours() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cache");
        for dir in ["samples", "tmp", "segments", "slots"] {
            fs::create_dir_all(root.join(dir)).unwrap();
        }
        for file in [
            "samples/7",
            "tmp/8",
            "segments/00000001.seg",
            "slots/3.bin",
            "state.json",
            MARKER,
        ] {
            fs::write(root.join(file), "ours").unwrap();
        }
        fs::write(root.join("samples/notes.txt"), "precious").unwrap();
        fs::write(root.join("job-output.txt"), "precious").unwrap();
        let left = remove_owned(&root, true).unwrap();
        assert_eq!(left, ["samples/notes.txt", "job-output.txt"]);
        assert_eq!(
            fs::read(root.join("samples/notes.txt")).unwrap(),
            b"precious"
        );
        assert!(!root.join("samples/7").exists() && !root.join("tmp").exists());
        fs::remove_file(root.join("samples/notes.txt")).unwrap();
        fs::remove_file(root.join("job-output.txt")).unwrap();
        assert!(remove_owned(&root, true).unwrap().is_empty());
        assert!(!root.exists());
    }

    #[test]
    fn a_users_folder_and_what_links_point_to_are_left() {
        let tmp = tempfile::tempdir().unwrap();
        let (root, elsewhere) = (tmp.path().join("cache"), tmp.path().join("elsewhere"));
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&elsewhere).unwrap();
        fs::write(elsewhere.join("7"), "not ours").unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("samples")).unwrap();
        fs::write(root.join("state.json"), "ours").unwrap();
        assert_eq!(remove_owned(&root, false).unwrap(), ["samples"]);
        assert_eq!(fs::read(elsewhere.join("7")).unwrap(), b"not ours");
        fs::remove_file(root.join("samples")).unwrap();
        // The user's (empty) folder given as the cache stays; what was written in it goes.
        assert!(remove_owned(&root, false).unwrap().is_empty());
        assert!(root.exists() && !root.join("state.json").exists());
    }
}
