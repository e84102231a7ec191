//! What a cached sample of an old index is in a new one, after `--rescan` found the source
//! changed. Ids are positions in the index (class, then name), so a file added or removed
//! anywhere moves the ids after it: a cached sample is carried over by its name, not its id.

use std::path::Path;
use std::time::SystemTime;

use super::Manifest;
use super::manifest::Index;
use crate::plan::SampleId;

/// The id in `new` of sample `id` of `old`: same class and file name, same size where both
/// know it. None when it is gone, changed size, or either index is a record index (a record source's groups
/// are positions in its files: a changed file moves every group after the change).
pub fn same_sample(old: &Manifest, new: &Manifest, id: SampleId) -> Option<SampleId> {
    if !matches!(
        (old.index(), new.index()),
        (Index::Folders(_), Index::Folders(_)) | (Index::Tree(_), Index::Tree(_))
    ) {
        return None;
    }
    let class = new.class_by_name(old.class_name(old.class_of(id)))?;
    let found = new.find(class, old.name(id))?;
    // A scan may not know sizes (it stats lazily): then `still_valid` compares the file.
    match (old.size(id), new.size(found)) {
        (Some(a), Some(b)) if a != b => None,
        _ => Some(found),
    }
}

/// Whether `m`'s samples are files of the source, each checked on its own by
/// [`still_valid`] (a record index's samples are positions in its files).
pub fn per_file(m: &Manifest) -> bool {
    matches!(m.index(), Index::Folders(_) | Index::Tree(_))
}

/// Whether a cached copy of `new`'s sample `id` (of `len` bytes, modified at `mtime`: the
/// cache keeps the source file's time) is still the source file's bytes, as far as the
/// file's size and time tell; the source file is looked at, so a file rewritten in place
/// with the same size is caught by its time.
pub fn still_valid(
    new: &Manifest,
    source: &Path,
    id: SampleId,
    (len, mtime): (u64, Option<SystemTime>),
) -> bool {
    let Ok(meta) = std::fs::metadata(source.join(new.relative_path(id))) else {
        return false;
    };
    let same_time = match (mtime, meta.modified()) {
        (Some(cached), Ok(now)) => cached == now,
        // A cache on a file system without times: the size and name must do.
        (None, _) => true,
        (Some(_), Err(_)) => false,
    };
    meta.len() == len && new.size(id).is_none_or(|size| size == len) && same_time
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(classes: &[(&str, &[(&str, u64)])]) -> Manifest {
        let parts = classes
            .iter()
            .map(|(c, files)| {
                let files = files
                    .iter()
                    .map(|(n, s)| (n.as_bytes().to_vec(), *s))
                    .collect();
                (c.as_bytes().to_vec(), files)
            })
            .collect();
        Manifest::from_parts(parts).unwrap()
    }

    /// Samples keep their identity by class and name across an index change; removed,
    /// resized samples have none.
    #[test]
    fn samples_are_carried_by_name_and_size() {
        let old = manifest(&[
            ("a", &[("1", 10), ("2", 20), ("3", 30)]),
            ("b", &[("x", 5)]),
        ]);
        let new = manifest(&[
            ("a", &[("1", 10), ("3", 31)]),
            ("aa", &[("new", 7)]),
            ("b", &[("x", 5)]),
        ]);
        let carried: Vec<_> = (0..old.len())
            .map(|id| same_sample(&old, &new, id))
            .collect();
        assert_eq!(carried, vec![Some(0), None, None, Some(3)]);
    }
}
