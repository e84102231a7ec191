//! Side files (`--replicate GLOB`): files of the source that are not samples but are shown
//! whole in every epoch on every rank (COCO's `annotations/*.json`, a `classes.txt`).
//!
//! The manifest keeps them apart from the samples: they have no sample id, so the plan, the
//! exchange and the cache of samples never see them. Each is named by its path relative to
//! the source and shown at that path in `epoch-N/`, so it lies in a folder the view has: the
//! epoch folder itself, an ImageFolder class folder, or any folder of a tree. Its size is
//! known (rank 0 reads it with the listing: side files are few). A side file is a file the
//! scan found, so its path can be no sample's or folder's; a manifest from a cache or a
//! peer is checked for that all the same.

use std::ffi::OsStr;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;

use serde::{Deserialize, Serialize};

use super::{Manifest, ManifestError};
use crate::dataset::names::is_safe_name;

/// One side file: its path under the source (`/`-separated) and its size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SideFile {
    pub path: Vec<u8>,
    pub size: u64,
}

/// The side files of a manifest and the globs that chose them.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Side {
    /// `--replicate` as given, in order: a cached manifest is reused only for the same.
    pub globs: Vec<String>,
    /// Sorted by (folder, name).
    files: Vec<SideFile>,
    /// The folder each file lies in: `None` for the epoch folder of an ImageFolder view,
    /// else the class (a tree's root is class 0).
    folder: Vec<Option<u32>>,
}

impl SideFile {
    /// The file's name in its folder.
    pub fn name(&self) -> &[u8] {
        self.path.rsplit(|&b| b == b'/').next().unwrap_or_default()
    }

    fn parent(&self) -> &[u8] {
        match self.path.iter().rposition(|&b| b == b'/') {
            Some(i) => &self.path[..i],
            None => &[],
        }
    }
}

impl Side {
    /// The side files `files` of `manifest`, refusing one whose path is unsafe, lies in a
    /// folder the view does not show, or is also a sample's or a folder's.
    pub(super) fn new(
        globs: Vec<String>,
        files: Vec<SideFile>,
        manifest: &Manifest,
    ) -> Result<Side, ManifestError> {
        let mut placed = Vec::with_capacity(files.len());
        for f in files {
            let unsafe_path = || ManifestError::UnsafeName(OsStr::from_bytes(&f.path).into());
            if f.path.split(|&b| b == b'/').any(|c| !is_safe_name(c)) {
                return Err(unsafe_path());
            }
            let folder = folder_of(manifest, f.parent())
                .ok_or_else(|| ManifestError::SideOutside(OsStr::from_bytes(&f.path).into()))?;
            let name = OsStr::from_bytes(f.name());
            let class = folder.unwrap_or(0);
            let sample = folder.is_some() && manifest.find(class, name).is_some();
            let dir = match folder {
                None => manifest.class_by_name(name).is_some(),
                Some(c) => manifest.child_dir(c, name).is_some(),
            };
            if sample || dir {
                return Err(ManifestError::SideCollides(
                    OsStr::from_bytes(&f.path).into(),
                ));
            }
            placed.push((folder, f));
        }
        placed.sort_by(|a, b| (a.0, a.1.name()).cmp(&(b.0, b.1.name())));
        if placed.windows(2).any(|w| w[0].1.path == w[1].1.path) {
            return Err(ManifestError::Decode("a side file is listed twice".into()));
        }
        let (folder, files) = placed.into_iter().unzip();
        Ok(Side {
            globs,
            files,
            folder,
        })
    }

    pub(crate) fn files(&self) -> &[SideFile] {
        &self.files
    }

    /// The side files in `folder` (see [`Side::folder`]), as indices.
    pub(crate) fn in_folder(&self, folder: Option<u32>) -> Range<u32> {
        let start = self.folder.partition_point(|&f| f < folder);
        let end = self.folder.partition_point(|&f| f <= folder);
        start as u32..end as u32
    }

    /// The side file called `name` in `folder`.
    pub(crate) fn find(&self, folder: Option<u32>, name: &OsStr) -> Option<u32> {
        let range = self.in_folder(folder);
        let files = &self.files[range.start as usize..range.end as usize];
        let i = files
            .binary_search_by(|f| f.name().cmp(name.as_bytes()))
            .ok()?;
        Some(range.start + i as u32)
    }
}

/// The folder of the view a file under `parent` lies in, if the view shows `parent`.
fn folder_of(manifest: &Manifest, parent: &[u8]) -> Option<Option<u32>> {
    let class = manifest.class_by_name(OsStr::from_bytes(parent));
    match (manifest.is_tree(), parent.is_empty()) {
        (true, _) => class.map(Some),
        (false, true) => Some(None),
        // An ImageFolder view shows class folders only, one level deep.
        (false, false) => class.map(Some),
    }
}

impl Manifest {
    /// The side files (`--replicate`), sorted by folder and name.
    pub fn side_files(&self) -> &[SideFile] {
        self.side.files()
    }

    /// The `--replicate` globs this manifest's side files were chosen by.
    pub fn side_globs(&self) -> &[String] {
        &self.side.globs
    }

    /// The view folder `epoch-N/` itself is, as side files name folders.
    pub fn epoch_folder(&self) -> Option<u32> {
        self.is_tree().then_some(0)
    }

    /// The side files in view folder `folder` (see [`Manifest::epoch_folder`]), as indices
    /// into [`Manifest::side_files`].
    pub fn side_in(&self, folder: Option<u32>) -> Range<u32> {
        self.side.in_folder(folder)
    }

    /// The side file called `name` in view folder `folder`.
    pub fn side_named(&self, folder: Option<u32>, name: &OsStr) -> Option<u32> {
        self.side.find(folder, name)
    }

    /// This manifest with `files` as its side files, chosen by `globs`.
    pub fn with_side(
        mut self,
        globs: Vec<String>,
        files: Vec<SideFile>,
    ) -> Result<Manifest, ManifestError> {
        self.side = Side::new(globs, files, &self)?;
        // Owners cover the side files too: whoever changes them sets the owners again.
        self.owners = None;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(path: &str) -> SideFile {
        SideFile {
            path: path.as_bytes().to_vec(),
            size: 3,
        }
    }

    #[test]
    fn side_files_lie_in_folders_of_the_view_and_collide_with_nothing() {
        let tree = Manifest::tree_from_parts(vec![
            (b"img".to_vec(), vec![(b"1.jpg".to_vec(), 1)]),
            (b"ann".to_vec(), vec![]),
        ])
        .unwrap();
        let m = tree
            .clone()
            .with_side(
                vec!["x".into()],
                vec![side("ann/b.json"), side("top.txt"), side("ann/a.json")],
            )
            .unwrap();
        assert_eq!(m.side.in_folder(Some(0)), 0..1);
        assert_eq!(m.side.in_folder(Some(1)), 1..3);
        assert_eq!(m.side.find(Some(1), OsStr::new("b.json")), Some(2));
        assert_eq!(m.side.find(Some(2), OsStr::new("b.json")), None);
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
        for (bad, what) in [
            ("img/1.jpg", "collides"),
            ("img", "collides"),
            ("nowhere/x", "no folder of the view"),
            ("ann/../x", "unsafe"),
        ] {
            let err = tree.clone().with_side(vec![], vec![side(bad)]).unwrap_err();
            assert!(err.to_string().contains(what), "{bad}: {err}");
        }
        let folders =
            Manifest::from_parts(vec![(b"c".to_vec(), vec![(b"s".to_vec(), 1)])]).unwrap();
        let m = folders
            .clone()
            .with_side(vec![], vec![side("c/n.txt"), side("classes.txt")])
            .unwrap();
        assert_eq!(m.side.in_folder(None), 0..1);
        assert_eq!(m.side.in_folder(Some(0)), 1..2);
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
        assert!(
            folders
                .with_side(vec![], vec![side("c/d/deep.txt")])
                .is_err()
        );
    }
}
