//! A listing's samples by folder, each folder's names, sizes and ETags back to back: a
//! bucket of 10^7 keys would otherwise hold a heap allocation per name (~90 B a key
//! before the manifest copies it). [`into_manifest`] then moves one folder at a time into
//! the manifest, sorted by name, so a key's bytes live in one of the two, never both.

use std::collections::BTreeMap;

use crate::dataset::manifest::{Etags, Manifest, ManifestError};

/// Folders by path under the prefix ("" for the prefix itself).
pub(super) type Listing = BTreeMap<Vec<u8>, Folder>;

/// One folder's samples in the order they were listed.
#[derive(Default)]
pub(super) struct Folder {
    names: Vec<u8>,
    /// Where each name ends in `names`.
    name_ends: Vec<u64>,
    sizes: Vec<u64>,
    /// In listing order (an empty one where the store gave none).
    etags: Etags,
}

impl Folder {
    pub(super) fn push(&mut self, name: &[u8], size: u64, etag: &str) {
        self.names.extend_from_slice(name);
        self.name_ends.push(self.names.len() as u64);
        self.sizes.push(size);
        self.etags.push(etag);
    }

    pub(super) fn len(&self) -> usize {
        self.sizes.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    pub(super) fn name(&self, i: usize) -> &[u8] {
        &self.names[span(&self.name_ends, i)]
    }

    fn etag(&self, i: usize) -> std::borrow::Cow<'_, str> {
        self.etags.get(i).unwrap_or_default()
    }

    /// Keeps the samples whose name `keep` says yes to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&[u8]) -> bool) {
        let mut kept = Folder::default();
        for i in 0..self.len() {
            if keep(self.name(i)) {
                kept.push(self.name(i), self.sizes[i], &self.etag(i));
            }
        }
        *self = kept;
    }
}

fn span(ends: &[u64], i: usize) -> std::ops::Range<usize> {
    let start = match i {
        0 => 0,
        _ => ends[i - 1] as usize,
    };
    start..ends[i] as usize
}

/// The manifest of `folders` (a tree's with the folders above each listed one, and the
/// root, added empty) and the ETags in sample order (folders, then names in byte order,
/// as the manifest numbers samples); `None` where some object came without one.
pub(super) fn into_manifest(
    mut folders: Listing,
    tree: bool,
    etags: bool,
) -> Result<(Manifest, Option<Etags>), ManifestError> {
    if tree {
        let mut above: Vec<Vec<u8>> = vec![Vec::new()];
        for path in folders.keys() {
            let mut up = path.as_slice();
            while let Some(slash) = up.iter().rposition(|&b| b == b'/') {
                up = &up[..slash];
                above.push(up.to_vec());
            }
        }
        for path in above {
            folders.entry(path).or_default();
        }
    }
    let mut m = Manifest::empty();
    let (mut names, mut tags, mut samples) = (0, 0, 0);
    for f in folders.values() {
        (names, tags, samples) = (
            names + f.names.len(),
            tags + f.etags.text_len(),
            samples + f.len(),
        );
    }
    m.reserve(names, samples);
    let mut in_order = etags.then(|| Etags::with_capacity(tags, samples));
    while let Some((path, folder)) = folders.pop_first() {
        let mut order: Vec<usize> = (0..folder.len()).collect();
        order.sort_unstable_by(|&a, &b| folder.name(a).cmp(folder.name(b)));
        let (mut names, mut ends) = (Vec::with_capacity(folder.names.len()), Vec::new());
        for &i in &order {
            names.extend_from_slice(folder.name(i));
            let end =
                u32::try_from(names.len()).map_err(|_| ManifestError::TooMany(m.len() as usize))?;
            ends.push(end);
            if let Some(all) = in_order.as_mut() {
                all.push(&folder.etag(i));
            }
        }
        let sizes: Vec<u64> = order.iter().map(|&i| folder.sizes[i]).collect();
        drop(folder);
        m.push_class(path, &names, &ends, &sizes)?;
    }
    if tree {
        m = m.into_tree()?;
    }
    if let Some(e) = in_order.as_mut() {
        e.shrink_to_fit();
    }
    Ok((m, in_order))
}
