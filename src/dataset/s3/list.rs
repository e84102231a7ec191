//! Rank 0's one listing of the prefix into a [`Manifest`]: `ListObjectsV2` pages of 1,000
//! keys (paginated by `object_store`), each key split into its folders and name as a file
//! path under the prefix would be. Sizes come with the listing, so every sample's size is
//! known from the start (a folder scan leaves them unknown until first read).
//!
//! ImageFolder: `PREFIX/CLASS/NAME` is a sample; keys directly under the prefix or deeper
//! than one folder are skipped and listed, as a folder scan skips what ImageFolder would
//! not see. Tree: every key is a sample under its folders. Keys ending in '/' (the empty
//! "folder" objects some tools write) are not samples; a key with an empty, '.', '..' or
//! over-long component cannot be a file name and is skipped.

use std::collections::BTreeMap;

use futures::TryStreamExt;

use super::client::{Client, chain};
use crate::dataset::Format;
use crate::dataset::manifest::{ClassListing, Manifest, ManifestError};
use crate::dataset::names::{Skipped, is_safe_name};

/// Folders (by path under the prefix) and their `(name, size)` samples.
type Listing = BTreeMap<Vec<u8>, Vec<(Vec<u8>, u64)>>;

/// Lists every object under the prefix and builds `format`'s index of them.
pub(crate) fn build_index(client: &Client, format: Format) -> Result<Manifest, ManifestError> {
    let url = &client.url;
    let prefix =
        (!url.prefix.is_empty()).then(|| object_store::path::Path::from(url.prefix.as_str()));
    let objects = client
        .run(async {
            use object_store::ObjectStore;
            let mut out = Vec::new();
            let mut stream = client.store.list(prefix.as_ref());
            while let Some(meta) = stream.try_next().await? {
                out.push((meta.location.to_string(), meta.size));
            }
            Ok::<_, object_store::Error>(out)
        })
        .map_err(|e| {
            ManifestError::Store(format!("--source {url}: listing failed: {}", chain(&e)))
        })?;
    let (folders, mut skipped) = split(&url.prefix, objects, format);
    if folders.values().all(|s| s.is_empty()) {
        return Err(ManifestError::Store(format!(
            "--source {url} holds no objects a {} source can serve{}",
            format_name(format),
            match skipped.first() {
                Some(s) => format!(" (e.g. {}: {})", s.path, s.reason),
                None => String::new(),
            }
        )));
    }
    skipped.sort_by(|a, b| a.path.cmp(&b.path));
    let parts: Vec<ClassListing> = folders.into_iter().collect();
    let mut manifest = match format {
        Format::Tree => Manifest::tree_from_parts(parts)?,
        _ => Manifest::from_parts(parts)?,
    };
    manifest.skipped = skipped;
    Ok(manifest)
}

fn format_name(format: Format) -> &'static str {
    match format {
        Format::Tree => "--format tree",
        _ => "ImageFolder (PREFIX/CLASS/NAME)",
    }
}

/// The listed `(key, size)` objects as folders of samples, and those skipped.
fn split(prefix: &str, objects: Vec<(String, u64)>, format: Format) -> (Listing, Vec<Skipped>) {
    let mut folders = Listing::new();
    let mut skipped = Vec::new();
    let strip = if prefix.is_empty() {
        0
    } else {
        prefix.len() + 1
    };
    for (key, size) in objects {
        let under =
            prefix.is_empty() || key.strip_prefix(prefix).is_some_and(|r| r.starts_with('/'));
        let Some(relative) = key.get(strip..).filter(|_| under) else {
            continue;
        };
        if relative.is_empty() || relative.ends_with('/') {
            continue;
        }
        let mut skip = |reason: &str| {
            skipped.push(Skipped {
                path: key.clone(),
                reason: reason.to_string(),
            })
        };
        let parts: Vec<&str> = relative.split('/').collect();
        if !parts.iter().all(|p| is_safe_name(p.as_bytes())) {
            skip("a key component is empty, '.', '..' or over 255 bytes: not a file name");
            continue;
        }
        let (name, dirs) = parts.split_last().expect("split gives one part at least");
        if format != Format::Tree {
            match dirs.len() {
                0 => skip("directly under the prefix, in no class folder"),
                1 => {}
                _ => skip("deeper than PREFIX/CLASS/NAME; add --format tree to serve it"),
            }
            if dirs.len() != 1 {
                continue;
            }
        }
        let folder = dirs.join("/").into_bytes();
        folders
            .entry(folder)
            .or_default()
            .push((name.as_bytes().to_vec(), size));
    }
    (folders, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(prefix: &str, keys: &[&str], format: Format) -> (Vec<String>, Vec<String>) {
        let objects = keys.iter().map(|k| (k.to_string(), 1)).collect();
        let (folders, skipped) = split(prefix, objects, format);
        let kept = folders
            .iter()
            .flat_map(|(f, s)| {
                s.iter().map(move |(n, _)| {
                    format!(
                        "{}|{}",
                        String::from_utf8_lossy(f),
                        String::from_utf8_lossy(n)
                    )
                })
            })
            .collect();
        (kept, skipped.into_iter().map(|s| s.path).collect())
    }

    #[test]
    fn imagefolder_keeps_class_and_name_only() {
        let keys = [
            "p/a/1.jpg",
            "p/top.txt",
            "p/a/deep/2.jpg",
            "p/b/",
            "p/b/3.jpg",
            "p/../x",
        ];
        let (kept, skipped) = listed("p", &keys, Format::Imagefolder);
        assert_eq!(kept, ["a|1.jpg", "b|3.jpg"]);
        assert_eq!(skipped, ["p/top.txt", "p/a/deep/2.jpg", "p/../x"]);
    }

    #[test]
    fn tree_keeps_every_depth_and_an_empty_prefix_is_the_bucket() {
        let keys = ["top.txt", "a/1", "a/deep/2"];
        let (kept, skipped) = listed("", &keys, Format::Tree);
        assert_eq!(kept, ["|top.txt", "a|1", "a/deep|2"]);
        assert!(skipped.is_empty());
    }
}
