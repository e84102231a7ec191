//! A tree's index (`--format tree`): the folder tables of an ImageFolder manifest, with every
//! folder of the source as a "class" named by its relative path (`a`, `a/b`, `a/b/c`; the
//! root is class 0, named by the empty path), and each folder's sub-folders derived from
//! those names when the manifest is built or decoded.
//!
//! Reusing the class tables keeps everything below the view unchanged: a sample's id is its
//! position in (folder path, name) order, `relative_path` is still `<class>/<name>`, the
//! ImageFolder reader reads it, and `--rescan` carries samples over by folder and name.
//! Folders without samples are classes too, so every folder of the source is in every
//! epoch's view on every rank.
//!
//! The encoding is an ImageFolder manifest's followed by [`EXTRAS_MAGIC`] and the
//! [`Extras`]: an ImageFolder manifest's bytes (and the fingerprints of existing caches)
//! stay what they were, and a record index, whose first byte is a small enum tag, can never
//! start with the magic's 0xFF.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use serde::{Deserialize, Serialize};

use super::side::{Side, SideFile};
use super::{Folders, Index, Manifest, ManifestError};
use crate::dataset::names::is_safe_name;

/// What follows the folder tables of a manifest that is not a plain ImageFolder one.
const EXTRAS_MAGIC: &[u8] = b"\xffSFX1";

/// The parts of a manifest an ImageFolder manifest of earlier versions did not have.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Extras {
    /// The classes are the folders of a tree (see the module doc).
    pub tree: bool,
    /// `--replicate` as given, and the side files it chose (see `side`).
    pub replicate: Vec<String>,
    pub side: Vec<SideFile>,
}

/// Appends the magic and `extras` to an encoded manifest.
pub(super) fn encode_extras(mut bytes: Vec<u8>, extras: &Extras) -> Vec<u8> {
    bytes.extend_from_slice(EXTRAS_MAGIC);
    postcard::to_extend(extras, bytes).expect("extras serialization cannot fail")
}

/// The extras after the folder tables, if `rest` holds them (and not a record index).
pub(super) fn decode_extras(rest: &[u8]) -> Result<Option<Extras>, ManifestError> {
    let Some(body) = rest.strip_prefix(EXTRAS_MAGIC) else {
        return Ok(None);
    };
    postcard::from_bytes(body)
        .map(Some)
        .map_err(|e| ManifestError::Decode(e.to_string()))
}

/// The folder tables of a tree and each folder's sub-folders.
#[derive(Clone, Debug, PartialEq)]
pub struct Tree {
    pub(super) folders: Folders,
    /// `children[child_start[c]..child_start[c + 1]]` are folder `c`'s sub-folders, in
    /// name order.
    child_start: Vec<u32>,
    children: Vec<u32>,
}

impl Tree {
    /// The tree of `folders`, refusing tables a scan could not have made: the root first,
    /// folders sorted and unique, every folder's parent present, every name safe.
    pub(super) fn new(folders: Folders) -> Result<Tree, ManifestError> {
        folders.validate_tables()?;
        let classes = &folders.classes;
        if classes.first().is_none_or(|root| !root.is_empty()) {
            return Err(ManifestError::Decode("a tree has no root folder".into()));
        }
        if classes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ManifestError::Decode("tree folders are not sorted".into()));
        }
        let mut parent = Vec::with_capacity(classes.len());
        for path in &classes[1..] {
            let (up, name) = split_last(path);
            if !is_safe_name(name) {
                return Err(ManifestError::UnsafeName(OsString::from_vec(path.clone())));
            }
            let p = classes
                .binary_search_by(|c| c.as_slice().cmp(up))
                .map_err(|_| ManifestError::Decode("a tree folder has no parent".into()))?;
            parent.push(p as u32);
        }
        folders.validate_names()?;
        // Sub-folders by parent: counting sort keeps each parent's in class (= name) order.
        let mut child_start = vec![0u32; classes.len() + 1];
        for &p in &parent {
            child_start[p as usize + 1] += 1;
        }
        for c in 1..child_start.len() {
            child_start[c] += child_start[c - 1];
        }
        let mut next = child_start.clone();
        let mut children = vec![0u32; parent.len()];
        for (i, &p) in parent.iter().enumerate() {
            children[next[p as usize] as usize] = i as u32 + 1;
            next[p as usize] += 1;
        }
        Ok(Tree {
            folders,
            child_start,
            children,
        })
    }
}

/// `a/b/c` as (`a/b`, `c`); a top folder's parent is the root (`""`).
fn split_last(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

impl Manifest {
    /// This manifest of folders as a tree (its classes being folder paths, the root first).
    pub(crate) fn into_tree(self) -> Result<Manifest, ManifestError> {
        let folders = match self.index {
            Index::Folders(f) => f,
            other => {
                return Ok(Manifest {
                    index: other,
                    ..self
                });
            }
        };
        let tree = Manifest {
            index: Index::Tree(Box::new(Tree::new(folders)?)),
            skipped: self.skipped,
            side: Side::default(),
            etags: self.etags,
            owners: None,
        };
        let files = self.side.files().to_vec();
        let mut tree = tree.with_side(self.side.globs, files)?;
        // The same folders, samples and side files, in the same order.
        if let Some(owners) = self.owners {
            tree.set_owners(owners)?;
        }
        Ok(tree)
    }

    /// A tree manifest from `(folder path, [(sample name, size)])`: folders missing from the
    /// list (the root, a listed folder's parents) are added empty.
    pub fn tree_from_parts(mut dirs: Vec<super::ClassListing>) -> Result<Manifest, ManifestError> {
        let mut known: std::collections::BTreeSet<Vec<u8>> =
            dirs.iter().map(|d| d.0.clone()).collect();
        let mut missing = vec![Vec::new()];
        for (path, _) in &dirs {
            let mut up = split_last(path).0;
            while !up.is_empty() {
                missing.push(up.to_vec());
                up = split_last(up).0;
            }
        }
        for m in missing {
            if known.insert(m.clone()) {
                dirs.push((m, Vec::new()));
            }
        }
        Manifest::from_parts(dirs)?.into_tree()
    }

    /// Whether the source is a tree (`--format tree`).
    pub fn is_tree(&self) -> bool {
        matches!(self.index, Index::Tree(_))
    }

    /// The name folder `class` has in its parent: the last part of a tree folder's path, an
    /// ImageFolder class's whole name.
    pub fn dir_name(&self, class: u32) -> &OsStr {
        OsStr::from_bytes(split_last(self.class_name(class).as_bytes()).1)
    }

    /// The sub-folders of tree folder `class`, in name order (none outside a tree).
    pub fn subdirs(&self, class: u32) -> &[u32] {
        match &self.index {
            Index::Tree(t) => {
                let (a, b) = (
                    t.child_start[class as usize],
                    t.child_start[class as usize + 1],
                );
                &t.children[a as usize..b as usize]
            }
            _ => &[],
        }
    }

    /// The sub-folder `name` of tree folder `class`.
    pub fn child_dir(&self, class: u32, name: &OsStr) -> Option<u32> {
        if !self.is_tree() {
            return None;
        }
        let mut path = self.class_name(class).as_bytes().to_vec();
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(name.as_bytes());
        self.class_by_name(OsStr::from_bytes(&path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn listing(path: &str, names: &[&str]) -> super::super::ClassListing {
        let samples = names.iter().map(|n| (n.as_bytes().to_vec(), 1)).collect();
        (path.as_bytes().to_vec(), samples)
    }

    #[test]
    fn folders_nest_and_roundtrip() {
        let m = Manifest::tree_from_parts(vec![
            listing("a/b", &["x.flac", "w.flac"]),
            listing("", &["top.npz"]),
            listing("a-z", &[]),
            listing("c/d/e", &["deep"]),
        ])
        .unwrap();
        assert!(m.is_tree());
        let names: Vec<_> = (0..m.class_count()).map(|c| m.class_name(c)).collect();
        assert_eq!(names, ["", "a", "a-z", "a/b", "c", "c/d", "c/d/e"]);
        assert_eq!(m.subdirs(0), [1, 2, 4]);
        assert_eq!(m.subdirs(1), [3]);
        assert_eq!(m.subdirs(3), [] as [u32; 0]);
        assert_eq!(m.dir_name(6), "e");
        assert_eq!(m.child_dir(0, OsStr::new("a")), Some(1));
        assert_eq!(m.child_dir(5, OsStr::new("e")), Some(6));
        assert_eq!(m.child_dir(5, OsStr::new("x")), None);
        assert_eq!(m.relative_path(0), Path::new("top.npz"));
        assert_eq!(m.relative_path(1), Path::new("a/b/w.flac"));
        assert_eq!(m.relative_path(3), Path::new("c/d/e/deep"));
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn decoding_refuses_trees_a_scan_cannot_make() {
        let ok = Manifest::tree_from_parts(vec![listing("a", &["x"])]).unwrap();
        let Index::Tree(t) = &ok.index else {
            unreachable!()
        };
        let with = |edit: &dyn Fn(&mut Folders)| {
            let mut f = t.folders.clone();
            edit(&mut f);
            Tree::new(f)
        };
        assert!(with(&|f| f.classes[0] = b"r".to_vec()).is_err());
        assert!(with(&|f| f.classes[1] = b"a/../x".to_vec()).is_err());
        assert!(with(&|f| f.classes[1] = b"q/x".to_vec()).is_err());
        assert!(with(&|f| f.classes[1] = b"a//".to_vec()).is_err());
        assert!(with(&|f| f.classes[1] = Vec::new()).is_err());
        assert!(with(&|f| f.names.to_mut()[0] = b'/').is_err());
        assert!(with(&|_| ()).is_ok());
    }
}
