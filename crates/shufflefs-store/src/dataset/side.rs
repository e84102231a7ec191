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

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use glob::{MatchOptions, Pattern};

use super::manifest::{Manifest, ManifestError, SideFile, UNKNOWN_SIZE};
use super::names::Skipped;
use super::owners::{self, Owner, OwnersBuilder};

/// The `--replicate` globs, checked and compiled.
#[derive(Clone, Debug)]
pub struct Globs {
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
    pub fn parse(given: &[String]) -> Result<Globs, String> {
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
/// are no samples). Each side file is `stat`ed for its size. A manifest with owners
/// (`--allow-other`) keeps them, the side files' too; a side file that is a link out of
/// the source is then skipped (see `dataset::owners`).
pub fn split(manifest: Manifest, source: &Path, globs: &Globs) -> Result<Manifest, ManifestError> {
    if globs.is_empty() {
        return Ok(manifest);
    }
    let confine = match manifest.owners() {
        Some(_) => Some(fs::canonicalize(source).map_err(|e| ManifestError::Io {
            path: source.to_path_buf(),
            source: e,
        })?),
        None => None,
    };
    let mut chosen = Chosen {
        globs,
        source,
        confine,
        used: vec![false; globs.patterns.len()],
        side: Vec::new(),
        owners: HashMap::new(),
        skipped: Vec::new(),
    };
    if !manifest.is_tree() {
        for name in top_files(source)? {
            chosen.take(&name)?;
        }
    }
    let mut kept = Manifest::empty();
    let mut owners = manifest.owners().map(|_| OwnersBuilder::new());
    for c in 0..manifest.class_count() {
        let (mut names, mut ends, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
        let mut kept_owners = Vec::new();
        for id in manifest.class_range(c) {
            if chosen.take(manifest.relative_path(id).as_os_str().as_bytes())? {
                continue;
            }
            names.extend_from_slice(manifest.name(id).as_bytes());
            ends.push(names.len() as u32);
            sizes.push(manifest.size(id).unwrap_or(UNKNOWN_SIZE));
            kept_owners.extend(manifest.owners().map(|o| o.sample(id)));
        }
        if let (Some(b), Some(o)) = (&mut owners, manifest.owners()) {
            b.push_class(o.class(c));
            b.push_samples(&kept_owners);
        }
        let class = manifest.class_name(c).as_bytes().to_vec();
        kept.push_class(class, &names, &ends, &sizes)?;
    }
    chosen.all_used()?;
    if kept.is_empty() {
        return Err(ManifestError::AllReplicated(source.to_path_buf()));
    }
    kept.skipped = manifest.skipped.clone();
    kept.skipped.append(&mut chosen.skipped);
    kept.skipped.sort_by(|a, b| a.path.cmp(&b.path));
    kept.shrink_to_fit();
    let kept = if manifest.is_tree() {
        kept.into_tree()?
    } else {
        kept
    };
    let mut kept = kept.with_side(globs.given.clone(), chosen.side)?;
    if let Some(b) = owners {
        let sides = (kept.side_files().iter()).map(|f| chosen.owners[&f.path]);
        let owners = b.finish().with_sides(sides.collect::<Vec<_>>());
        kept.set_owners(owners)?;
    }
    Ok(kept)
}

/// The side files chosen so far, and which globs chose any.
struct Chosen<'a> {
    globs: &'a Globs,
    source: &'a Path,
    /// The canonical source, when owners are kept (`--allow-other`).
    confine: Option<PathBuf>,
    used: Vec<bool>,
    side: Vec<SideFile>,
    owners: HashMap<Vec<u8>, Owner>,
    skipped: Vec<Skipped>,
}

impl Chosen<'_> {
    /// Takes the file at `rel` as a side file if a glob names it; whether one did.
    fn take(&mut self, rel: &[u8]) -> Result<bool, ManifestError> {
        let Some(g) = self.globs.matching(rel) else {
            return Ok(false);
        };
        self.used[g] = true;
        let path = self.source.join(OsStr::from_bytes(rel));
        let io = |source| ManifestError::SideIo {
            path: path.clone(),
            source,
        };
        if let Some(confine) = &self.confine {
            let is_link = fs::symlink_metadata(&path).map_err(io)?.is_symlink();
            match owners::of_path(confine, &path, is_link) {
                Ok(owner) => self.owners.insert(rel.to_vec(), owner),
                Err(reason) => {
                    let path = path.display().to_string();
                    self.skipped.push(Skipped { path, reason });
                    return Ok(true);
                }
            };
        }
        let meta = fs::metadata(&path).map_err(io)?;
        self.side.push(SideFile {
            path: rel.to_vec(),
            size: meta.len(),
        });
        Ok(true)
    }

    /// Refuses a glob that named no file.
    fn all_used(&self) -> Result<(), ManifestError> {
        let Some(g) = self.used.iter().position(|u| !u) else {
            return Ok(());
        };
        let glob = self.globs.given[g].clone();
        // A glob naming a folder matches no file: say so, rather than only "no file" (one
        // stat, on the way to a refusal).
        if self.source.join(&glob).is_dir() {
            return Err(ManifestError::ReplicateFolder { glob });
        }
        Err(ManifestError::ReplicateUnmatched {
            glob,
            source_dir: self.source.to_path_buf(),
        })
    }
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

    /// Under `--allow-other` side files keep their owners and modes, and a side file that
    /// links out of the source is skipped and listed.
    #[test]
    fn side_files_keep_owners_and_links_out_are_skipped() {
        use std::os::unix::fs::{PermissionsExt as _, symlink};
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("src");
        fs::create_dir_all(root.join("c")).unwrap();
        fs::write(root.join("c/1.jpg"), b"1").unwrap();
        fs::write(root.join("c/2.jpg"), b"2").unwrap();
        fs::write(root.join("c/stats.txt"), b"st").unwrap();
        fs::write(root.join("classes.txt"), b"c").unwrap();
        fs::write(tmp.path().join("secret"), b"s").unwrap();
        symlink(tmp.path().join("secret"), root.join("leak.txt")).unwrap();
        let chmod = |p: &Path, m| fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
        chmod(&root.join("classes.txt"), 0o600);
        chmod(&root.join("c/stats.txt"), 0o644);
        chmod(&root.join("c/2.jpg"), 0o640);
        let m = crate::dataset::scan::scan_with(&root, true).unwrap();
        let m = split(m, &root, &globs(&["*.txt", "c/*.txt"])).unwrap();
        let names: Vec<_> = m.side_files().iter().map(|f| f.path.clone()).collect();
        assert_eq!(names, [b"classes.txt".to_vec(), b"c/stats.txt".to_vec()]);
        let o = m.owners().expect("owners kept");
        assert_eq!(
            (o.side(0).file_perm(), o.side(1).file_perm()),
            (0o400, 0o444)
        );
        assert_eq!(
            (o.sample(0).file_perm(), o.sample(1).file_perm()),
            (0o444, 0o440)
        );
        assert_eq!(m.skipped.len(), 1);
        assert!(m.skipped[0].path.ends_with("leak.txt"));
        assert_eq!(m.skipped[0].reason, crate::dataset::owners::OUTSIDE);
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }
}
