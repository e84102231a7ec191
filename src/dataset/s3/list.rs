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
use crate::dataset::manifest::{ClassListing, Etags, Manifest, ManifestError};
use crate::dataset::names::{Skipped, is_safe_name};

/// Folders (by path under the prefix) and their `(name, size, ETag)` samples, the ETag
/// by its place in [`Split::etags`] ([`NO_ETAG`] when the store gave none).
type Listing = BTreeMap<Vec<u8>, Vec<(Vec<u8>, u64, u32)>>;

const NO_ETAG: u32 = u32::MAX;

/// Lists every object under the prefix and builds `format`'s index of them. Each page's
/// keys are sorted into folders as they arrive: no second copy of the whole listing.
pub(crate) fn build_index(client: &Client, format: Format) -> Result<Manifest, ManifestError> {
    let url = &client.url;
    let prefix = (!url.prefix.is_empty()).then(|| super::client::key_path(&url.prefix));
    let mut split = Split::new(&url.prefix, format);
    client
        .run(async {
            use object_store::ObjectStore;
            let mut stream = client.store.list(prefix.as_ref());
            while let Some(meta) = stream.try_next().await? {
                split.add(meta.location.as_ref(), meta.size, meta.e_tag);
            }
            Ok::<_, object_store::Error>(())
        })
        .map_err(|e| {
            ManifestError::Store(format!("--source {url}: listing failed: {}", chain(&e)))
        })?;
    let Split {
        folders,
        mut skipped,
        etags,
        ..
    } = split;
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
    let (parts, etags) = without_etags(folders, &etags);
    let mut manifest = match format {
        Format::Tree => Manifest::tree_from_parts(parts)?,
        _ => Manifest::from_parts(parts)?,
    };
    manifest.skipped = skipped;
    if let Some(etags) = etags.filter(|e| e.len() == manifest.len() as usize) {
        manifest.set_etags(etags);
    }
    manifest.shrink_to_fit();
    Ok(manifest)
}

/// The folders as a manifest's parts, and the ETags in sample order (folders, then names
/// in byte order, as the manifest numbers samples); `None` if an object had no ETag.
fn without_etags(folders: Listing, listed: &Etags) -> (Vec<ClassListing>, Option<Etags>) {
    let mut etags = Some(Etags::default());
    let parts = folders
        .into_iter()
        .map(|(folder, mut samples)| {
            samples.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            let samples = samples
                .into_iter()
                .map(|(name, size, etag)| {
                    match (etags.as_mut(), listed.get(etag as usize)) {
                        (Some(all), Some(etag)) => all.push(etag),
                        _ => etags = None,
                    }
                    (name, size)
                })
                .collect();
            (folder, samples)
        })
        .collect();
    (
        parts,
        etags.map(|mut e| {
            e.shrink_to_fit();
            e
        }),
    )
}

fn format_name(format: Format) -> &'static str {
    match format {
        Format::Tree => "--format tree",
        _ => "ImageFolder (PREFIX/CLASS/NAME)",
    }
}

/// Listed objects sorted into folders of samples, and those skipped.
struct Split<'a> {
    prefix: &'a str,
    format: Format,
    folders: Listing,
    skipped: Vec<Skipped>,
    /// The listed ETags, in listing order.
    etags: Etags,
}

impl<'a> Split<'a> {
    fn new(prefix: &'a str, format: Format) -> Split<'a> {
        Split {
            prefix,
            format,
            folders: Listing::new(),
            skipped: Vec::new(),
            etags: Etags::default(),
        }
    }

    /// Takes object `key` of `size` bytes as a sample, skips it with the reason, or
    /// ignores it (a folder marker, a key outside the prefix).
    fn add(&mut self, key: &str, size: u64, etag: Option<String>) {
        let etag = match etag {
            Some(e) => {
                self.etags.push(&e);
                (self.etags.len() - 1) as u32
            }
            None => NO_ETAG,
        };
        let prefix = self.prefix;
        let relative = match prefix.is_empty() {
            true => Some(key),
            false => key.strip_prefix(prefix).and_then(|r| r.strip_prefix('/')),
        };
        let Some(relative) = relative.filter(|r| !r.is_empty() && !r.ends_with('/')) else {
            return;
        };
        let parts: Vec<&str> = relative.split('/').collect();
        let (name, dirs) = parts.split_last().expect("split gives one part at least");
        let reason = if !parts.iter().all(|p| is_safe_name(p.as_bytes())) {
            Some("a key component is empty, '.', '..' or over 255 bytes: not a file name")
        } else if self.format == Format::Tree {
            None
        } else if dirs.is_empty() {
            Some("directly under the prefix, in no class folder")
        } else if dirs.len() > 1 {
            Some("deeper than PREFIX/CLASS/NAME; add --format tree to serve it")
        } else {
            None
        };
        if let Some(reason) = reason {
            self.skipped.push(Skipped {
                path: key.to_string(),
                reason: reason.to_string(),
            });
            return;
        }
        let folder = dirs.join("/").into_bytes();
        (self.folders.entry(folder).or_default()).push((name.as_bytes().to_vec(), size, etag));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(prefix: &str, keys: &[&str], format: Format) -> (Vec<String>, Vec<String>) {
        let mut split = Split::new(prefix, format);
        for k in keys {
            split.add(k, 1, None);
        }
        let Split {
            folders, skipped, ..
        } = split;
        let kept = folders
            .iter()
            .flat_map(|(f, s)| {
                s.iter().map(move |(n, _, _)| {
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

/// Rank 0's work on a listing of 1M keys after the requests (the sort into folders and the
/// manifest); `cargo test --lib s3::list -- --ignored --nocapture`.
#[cfg(test)]
#[test]
#[ignore]
fn a_million_keys_sort_into_a_manifest() {
    let started = std::time::Instant::now();
    let mut split = Split::new("datasets/imagenet/train", Format::Imagefolder);
    for i in 0..1_000_000u32 {
        let key = format!(
            "datasets/imagenet/train/n{:08}/n{:08}_{i}.JPEG",
            i % 1000,
            i % 1000
        );
        split.add(&key, 110_000, Some(format!("\"{i:032x}\"")));
    }
    let Split { folders, etags, .. } = split;
    let (parts, etags) = without_etags(folders, &etags);
    let mut manifest = Manifest::from_parts(parts).unwrap();
    manifest.set_etags(etags.unwrap());
    assert_eq!(manifest.len(), 1_000_000);
    eprintln!(
        "1M keys into a manifest: {:.2} s",
        started.elapsed().as_secs_f64()
    );
}
