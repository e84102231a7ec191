//! `--replicate GLOB`: choosing the side files of a source (see `manifest::side` for what
//! they are in the manifest, and `daemon::startup::side` for their one copy per host).
//!
//! A glob is matched against each file's path relative to the source, with `/` as the only
//! separator: `*`, `?` and `[...]` stay within one folder, `**` as a whole component crosses
//! folders (`glob::Pattern` with `require_literal_separator`, as a shell's `globstar`).
//! The choice is made on rank 0 after the listing, so it costs no extra pass over the
//! samples; only the files chosen are `stat`ed, for their sizes. A file a glob names is no
//! longer a sample; a glob that names nothing is an error naming it (a typo would otherwise
//! leave a file every rank needs missing from the view, or shown on one rank only).

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use glob::{MatchOptions, Pattern};

use super::manifest::{Manifest, ManifestError, SideFile, UNKNOWN_SIZE};

/// The `--replicate` globs, checked and compiled.
#[derive(Clone, Debug)]
pub(crate) struct Globs {
    given: Vec<String>,
    patterns: Vec<Pattern>,
}

const OPTIONS: MatchOptions = MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

impl Globs {
    /// Compiles `given`, refusing a glob that could not name a file under the source.
    pub(crate) fn parse(given: &[String]) -> Result<Globs, String> {
        let mut patterns = Vec::new();
        for g in given {
            let bad = |why: &str| format!("--replicate {g:?}: {why}");
            if g.is_empty() || g.starts_with('/') {
                return Err(bad(
                    "a glob is a path relative to --source, e.g. 'annotations/*.json'",
                ));
            }
            if g.split('/').any(|c| c == ".." || c == "." || c.is_empty()) {
                return Err(bad(
                    "'.', '..' and empty parts are not allowed; name files under --source",
                ));
            }
            patterns.push(Pattern::new(g).map_err(|e| bad(&e.to_string()))?);
        }
        Ok(Globs {
            given: given.to_vec(),
            patterns,
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The first glob that matches `path` (relative to the source); a name that is not
    /// UTF-8 is matched with its invalid bytes replaced.
    fn matching(&self, path: &[u8]) -> Option<usize> {
        let path = String::from_utf8_lossy(path);
        (self.patterns.iter()).position(|p| p.matches_with(&path, OPTIONS))
    }
}

/// `manifest` with the files `globs` match moved out of its samples into its side files:
/// samples at any depth, and, for an ImageFolder source, the loose files at its top (which
/// are no samples). Each side file is `stat`ed for its size.
pub(crate) fn split(
    manifest: Manifest,
    source: &Path,
    globs: &Globs,
) -> Result<Manifest, ManifestError> {
    if globs.is_empty() {
        return Ok(manifest);
    }
    let mut used = vec![false; globs.patterns.len()];
    let mut side = Vec::new();
    let mut take = |rel: &[u8]| -> Result<bool, ManifestError> {
        let Some(g) = globs.matching(rel) else {
            return Ok(false);
        };
        used[g] = true;
        let path = source.join(OsStr::from_bytes(rel));
        let meta = fs::metadata(&path).map_err(|source| ManifestError::SideIo { path, source })?;
        side.push(SideFile {
            path: rel.to_vec(),
            size: meta.len(),
        });
        Ok(true)
    };
    if !manifest.is_tree() {
        for name in top_files(source)? {
            take(&name)?;
        }
    }
    let mut kept = Manifest::empty();
    for c in 0..manifest.class_count() {
        let (mut names, mut ends, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
        for id in manifest.class_range(c) {
            if take(manifest.relative_path(id).as_os_str().as_bytes())? {
                continue;
            }
            names.extend_from_slice(manifest.name(id).as_bytes());
            ends.push(names.len() as u32);
            sizes.push(manifest.size(id).unwrap_or(UNKNOWN_SIZE));
        }
        let class = manifest.class_name(c).as_bytes().to_vec();
        kept.push_class(class, &names, &ends, &sizes)?;
    }
    if let Some(g) = used.iter().position(|u| !u) {
        let glob = globs.given[g].clone();
        // A glob naming a folder matches no file: say so, rather than only "no file" (one
        // stat, on the way to a refusal).
        if source.join(&glob).is_dir() {
            return Err(ManifestError::ReplicateFolder { glob });
        }
        return Err(ManifestError::ReplicateUnmatched {
            glob,
            source_dir: source.to_path_buf(),
        });
    }
    if kept.is_empty() {
        return Err(ManifestError::AllReplicated(source.to_path_buf()));
    }
    kept.skipped = manifest.skipped.clone();
    kept.shrink_to_fit();
    let kept = if manifest.is_tree() {
        kept.into_tree()?
    } else {
        kept
    };
    kept.with_side(globs.given.clone(), side)
}

/// The names of the regular files (or links to them) at the top of `source`.
fn top_files(source: &Path) -> Result<Vec<Vec<u8>>, ManifestError> {
    let io_err = |source_err| ManifestError::Io {
        path: source.to_path_buf(),
        source: source_err,
    };
    let mut out = Vec::new();
    for entry in fs::read_dir(source).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        let is_file = entry.file_type().is_ok_and(|t| t.is_file())
            || fs::metadata(entry.path()).is_ok_and(|m| m.is_file());
        if is_file {
            out.push(entry.file_name().as_bytes().to_vec());
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn globs(g: &[&str]) -> Globs {
        Globs::parse(&g.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn globs_stay_in_their_folder_unless_doubled() {
        let g = globs(&["annotations/*.json", "**/stats.npy", "classes.txt"]);
        assert_eq!(g.matching(b"annotations/train.json"), Some(0));
        assert_eq!(g.matching(b"annotations/old/train.json"), None);
        assert_eq!(g.matching(b"stats.npy"), Some(1));
        assert_eq!(g.matching(b"a/b/stats.npy"), Some(1));
        assert_eq!(g.matching(b"classes.txt"), Some(2));
        assert_eq!(g.matching(b"x/classes.txt"), None);
        for bad in ["", "/abs/*.json", "../up", "a//b", "./x", "[unclosed"] {
            let err = Globs::parse(&[bad.to_string()]).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn matched_files_leave_the_samples_and_unmatched_globs_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for d in ["train2017", "annotations"] {
            fs::create_dir(root.join(d)).unwrap();
        }
        fs::write(root.join("train2017/1.jpg"), b"one").unwrap();
        fs::write(root.join("train2017/2.jpg"), b"two").unwrap();
        fs::write(root.join("annotations/instances.json"), b"{}").unwrap();
        fs::write(root.join("classes.txt"), b"a\nb\n").unwrap();
        for tree in [false, true] {
            let m = match tree {
                true => crate::dataset::scan::scan_tree(root),
                false => crate::dataset::scan::scan(root),
            }
            .unwrap();
            let g = globs(&["annotations/*.json", "classes.txt"]);
            let m = split(m, root, &g).unwrap();
            assert_eq!(m.len(), 2);
            let side: Vec<_> = m
                .side_files()
                .iter()
                .map(|f| (f.path.clone(), f.size))
                .collect();
            assert!(
                side.contains(&(b"annotations/instances.json".to_vec(), 2)),
                "{side:?}"
            );
            assert!(side.contains(&(b"classes.txt".to_vec(), 4)), "{side:?}");
            assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
            let again = crate::dataset::scan::scan(root).unwrap();
            let err = split(again, root, &globs(&["annotations/*.jsn"])).unwrap_err();
            assert!(
                err.to_string()
                    .contains("\"annotations/*.jsn\" matches no file"),
                "{err}"
            );
        }
        // A folder named as if it were a file: refused with the glob that takes its files,
        // and that glob takes them.
        let tree = crate::dataset::scan::scan_tree(root).unwrap();
        let err = split(tree.clone(), root, &globs(&["annotations"])).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("\"annotations\" names a folder"), "{msg}");
        assert!(msg.contains("'annotations/**'"), "{msg}");
        let m = split(tree, root, &globs(&["annotations/**"])).unwrap();
        assert_eq!(m.side_files().len(), 1);
        let all = crate::dataset::scan::scan(root).unwrap();
        let err = split(all, root, &globs(&["train2017/*", "annotations/*"])).unwrap_err();
        assert!(matches!(err, ManifestError::AllReplicated(_)), "{err}");
    }
}
