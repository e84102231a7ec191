//! Rank 0's one listing of the prefix into a [`Manifest`]: `ListObjectsV2` pages of 1,000
//! keys ([`listing`](super::listing)), past the first page in ranges of folders listed at
//! once ([`ranges`](super::ranges)), each key split into its folders and name as a file
//! path under the prefix would be; the keys may come in any order (the manifest sorts). Sizes come with the listing, so every sample's size is
//! known from the start (a folder scan leaves them unknown until first read).
//!
//! ImageFolder: `PREFIX/CLASS/NAME` is a sample; keys directly under the prefix or deeper
//! than one folder are skipped and listed, as a folder scan skips what ImageFolder would
//! not see. Tree: every key is a sample under its folders. Folder markers (keys ending in
//! '/', zero-byte keys named as a folder of other keys) are not samples; a key that cannot
//! be a file path (see [`keys`](super::keys)) is skipped and named, never failing the mount.
//! Memory: per object its name, size and ETag (in an arena), plus each folder once.

use std::collections::BTreeSet;
use std::sync::Mutex;

use super::client::Client;
use super::folders::{Folder, Listing, into_manifest};
use super::keys::{Unusable, is_marker, unusable};
use super::listing::Object;
use super::ranges::list_all;
use crate::dataset::Format;
use crate::dataset::manifest::{Manifest, ManifestError};
use crate::dataset::names::Skipped;
use crate::sys::sync::Locked;

/// Lists every object under the prefix and builds `format`'s index of them. Each page's
/// keys are sorted into folders as they arrive: no second copy of the whole listing.
pub(crate) fn build_index(client: &Client, format: Format) -> Result<Manifest, ManifestError> {
    let url = &client.url;
    let split = Mutex::new(Split::new(&url.prefix, format));
    let sink = |batch: Vec<Object>| {
        let mut split = split.locked();
        batch.into_iter().for_each(|o| split.add(o));
    };
    let started = std::time::Instant::now();
    let requests = list_all(client, &sink)
        .map_err(|e| ManifestError::Store(format!("--source {url}: listing failed: {e}")))?;
    tracing::info!(
        requests,
        seconds = started.elapsed().as_secs_f64(),
        "prefix listed"
    );
    let split = split.into_inner().unwrap_or_else(|p| p.into_inner());
    let (folders, mut skipped, etags) = split.finish(&url.to_string());
    skipped.sort_by(|a, b| a.path.cmp(&b.path));
    if folders.values().all(Folder::is_empty) {
        return Err(ManifestError::Store(format!(
            "--source {url} holds no objects that {} can serve{}",
            format_name(format),
            match skipped.first() {
                Some(s) => format!(" (e.g. {}: {})", s.path, s.reason),
                None => String::new(),
            }
        )));
    }
    let (mut manifest, etags) = into_manifest(folders, format == Format::Tree, etags)?;
    manifest.skipped = skipped;
    if let Some(etags) = etags.filter(|e| e.len() == manifest.len() as usize) {
        manifest.set_etags(etags);
    }
    manifest.shrink_to_fit();
    Ok(manifest)
}

fn format_name(format: Format) -> &'static str {
    match format {
        Format::Tree => "a --format tree source",
        _ => "an ImageFolder source (PREFIX/CLASS/NAME)",
    }
}

/// Listed objects sorted into folders of samples, and those skipped.
struct Split<'a> {
    prefix: &'a str,
    format: Format,
    folders: Listing,
    skipped: Vec<Skipped>,
    unusable: Unusable,
    /// Every folder some usable key is in (paths under the prefix, all ancestors).
    dirs: BTreeSet<Vec<u8>>,
    /// Zero-byte keys (relative) and their ETags: samples unless also a folder, which is
    /// known only once every key is listed.
    empty: Vec<(String, String)>,
    /// Every object listed came with an ETag.
    etags: bool,
}

impl<'a> Split<'a> {
    fn new(prefix: &'a str, format: Format) -> Split<'a> {
        Split {
            prefix,
            format,
            folders: Listing::new(),
            skipped: Vec::new(),
            unusable: Unusable::default(),
            dirs: BTreeSet::new(),
            empty: Vec::new(),
            etags: true,
        }
    }

    /// Takes a listed object as a sample, skips it with the reason, holds it until the end
    /// (zero bytes), or ignores it (a folder marker, a key outside the prefix).
    fn add(&mut self, object: Object) {
        let Object {
            key,
            size,
            etag,
            utf8,
        } = object;
        let prefix = self.prefix;
        let relative = match prefix.is_empty() {
            true => Some(key.as_str()),
            false => key.strip_prefix(prefix).and_then(|r| r.strip_prefix('/')),
        };
        let Some(relative) = relative.filter(|r| !r.is_empty()) else {
            return;
        };
        if is_marker(relative) {
            return;
        }
        if !utf8 {
            let why = "bytes that are not UTF-8 (S3 keys are UTF-8; this store sent others)";
            self.unusable.add(&key, why);
            return;
        }
        if let Some(why) = unusable(relative) {
            self.unusable.add(&key, why);
            return;
        }
        self.etags &= etag.is_some();
        let etag = etag.unwrap_or_default();
        let mut up = relative;
        while let Some((dir, _)) = up.rsplit_once('/') {
            if self.dirs.contains(dir.as_bytes()) {
                break;
            }
            self.dirs.insert(dir.as_bytes().to_vec());
            up = dir;
        }
        match size {
            0 => self.empty.push((relative.to_string(), etag)),
            _ => self.place(relative, size, &etag),
        }
    }

    /// Puts usable `relative` into its folder, or skips it if `format` does not serve it.
    fn place(&mut self, relative: &str, size: u64, etag: &str) {
        let parts: Vec<&str> = relative.split('/').collect();
        let (name, dirs) = parts.split_last().expect("split gives one part at least");
        let reason = if self.format == Format::Tree {
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
                path: self.key(relative),
                reason: reason.to_string(),
            });
            return;
        }
        let folder = dirs.join("/").into_bytes();
        (self.folders.entry(folder).or_default()).push(name.as_bytes(), size, etag);
    }

    fn key(&self, relative: &str) -> String {
        match self.prefix.is_empty() {
            true => relative.to_string(),
            false => format!("{}/{relative}", self.prefix),
        }
    }

    /// The folders, the skipped keys and the ETags once every key is listed: zero-byte
    /// keys that name a folder are markers, other keys that name a folder are skipped (a
    /// path cannot be a file and a folder).
    fn finish(mut self, source: &str) -> (Listing, Vec<Skipped>, bool) {
        for (relative, etag) in std::mem::take(&mut self.empty) {
            if !self.dirs.contains(relative.as_bytes()) {
                self.place(&relative, 0, &etag);
            }
        }
        let Split {
            mut folders,
            mut skipped,
            unusable,
            dirs,
            prefix,
            format,
            etags,
            ..
        } = self;
        let tree = format == Format::Tree;
        for (folder, samples) in folders.iter_mut().filter(|_| tree) {
            samples.retain(|name| {
                let mut path = folder.clone();
                if !path.is_empty() {
                    path.push(b'/');
                }
                path.extend_from_slice(name);
                let clash = dirs.contains(&path);
                if clash {
                    let path = String::from_utf8_lossy(&path);
                    skipped.push(Skipped {
                        path: match prefix.is_empty() {
                            true => path.into_owned(),
                            false => format!("{prefix}/{path}"),
                        },
                        reason: "other keys are under it as a folder; a path cannot be a file and a folder".into(),
                    });
                }
                !clash
            });
        }
        skipped.extend(unusable.into_skipped(source));
        (folders, skipped, etags)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::dataset::manifest::{ClassListing, Etags};

    fn object(key: &str, size: u64) -> Object {
        Object {
            key: key.to_string(),
            size,
            etag: None,
            utf8: !key.contains('\u{FFFD}'),
        }
    }

    /// The kept samples as `folder|name` and the skipped keys, of `keys` (`key:size`, 1
    /// byte when no size is given).
    fn listed(prefix: &str, keys: &[&str], format: Format) -> (Vec<String>, Vec<String>) {
        let mut split = Split::new(prefix, format);
        for k in keys {
            let (key, size) = match k.rsplit_once(':') {
                Some((key, size)) => (key, size.parse().unwrap()),
                None => (*k, 1),
            };
            split.add(object(key, size));
        }
        let (folders, skipped, _) = split.finish("s3://b/p");
        let kept = folders
            .iter()
            .flat_map(|(f, s)| {
                (0..s.len()).map(move |i| {
                    format!(
                        "{}|{}",
                        String::from_utf8_lossy(f),
                        String::from_utf8_lossy(s.name(i))
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

    #[test]
    fn keys_that_cannot_be_paths_are_skipped_and_named_never_failing() {
        // `\u{FFFD}` here: a key whose bytes were not UTF-8 (`object`).
        let keys = [
            "p/a//x",
            "p/../y",
            "p/cls/t\tab",
            "p/cls/ok.jpg",
            "p/./z",
            "p/cls/\u{FFFD}",
        ];
        let (kept, skipped) = listed("p", &keys, Format::Tree);
        assert_eq!(kept, ["cls|ok.jpg"]);
        // Named smallest key first, whatever order they were listed in.
        let want = [
            "p/../y",
            "p/./z",
            "p/a//x",
            "p/cls/t\\u{9}ab",
            "p/cls/\u{FFFD}",
        ];
        assert_eq!(skipped, want);
    }

    #[test]
    fn folder_markers_are_not_samples_nor_skipped() {
        // Any size ending in '/'; zero bytes named as a folder of other keys.
        let keys = [
            "p/cls/:0",
            "p/cls:0",
            "p/cls/1.jpg",
            "p/other/:7",
            "p/other/2.jpg",
            "p/empty/zero.jpg:0",
            "p/deep/x:0",
            "p/deep/x/y.jpg",
        ];
        let (kept, skipped) = listed("p", &keys, Format::Imagefolder);
        assert_eq!(kept, ["cls|1.jpg", "empty|zero.jpg", "other|2.jpg"]);
        assert_eq!(skipped, ["p/deep/x/y.jpg"]);
        let (kept, skipped) = listed("p", &keys, Format::Tree);
        assert_eq!(
            kept,
            ["cls|1.jpg", "deep/x|y.jpg", "empty|zero.jpg", "other|2.jpg"]
        );
        assert!(skipped.is_empty(), "{skipped:?}");
    }

    #[test]
    fn a_tree_key_that_is_also_a_folder_is_skipped() {
        let keys = ["p/a:5", "p/a/b", "p/c"];
        let (kept, skipped) = listed("p", &keys, Format::Tree);
        assert_eq!(kept, ["|c", "a|b"]);
        assert_eq!(skipped, ["p/a"]);
    }

    /// Keys listed in any order (ranges finish when they do) give the manifest that the
    /// sorted folders give, ETags in sample order, for both formats.
    #[test]
    fn any_listing_order_gives_the_manifest_of_the_sorted_folders() {
        let keys: Vec<(String, u64)> = (0..600u64)
            .map(|i| {
                let deep = ["", "/s1", "/s1/t"][(i % 3) as usize];
                (format!("p/d{}{deep}/n{:03}", i % 7, (i * 37) % 600), i + 1)
            })
            .collect();
        for format in [Format::Tree, Format::Imagefolder] {
            let mut expected: BTreeMap<Vec<u8>, Vec<(Vec<u8>, u64)>> = BTreeMap::new();
            for (key, size) in &keys {
                let rel = key.strip_prefix("p/").unwrap();
                let (folder, name) = rel.rsplit_once('/').unwrap();
                if format == Format::Tree || !folder.contains('/') {
                    let entry = expected.entry(folder.as_bytes().to_vec()).or_default();
                    entry.push((name.as_bytes().to_vec(), *size));
                }
            }
            let mut etags = Etags::default();
            for (folder, samples) in expected.iter_mut() {
                samples.sort();
                for (name, _) in samples.iter() {
                    let name = String::from_utf8_lossy(name);
                    etags.push(&format!("\"{}/{name}\"", String::from_utf8_lossy(folder)));
                }
            }
            let parts: Vec<ClassListing> = expected.into_iter().collect();
            let mut want = match format {
                Format::Tree => Manifest::tree_from_parts(parts).unwrap(),
                _ => Manifest::from_parts(parts).unwrap(),
            };
            want.set_etags(etags);
            for order in [1usize, 7, 599] {
                let mut split = Split::new("p", format);
                for i in 0..keys.len() {
                    let (key, size) = &keys[(i * order) % keys.len()];
                    let rel = key.strip_prefix("p/").unwrap();
                    split.add(Object {
                        key: key.clone(),
                        size: *size,
                        etag: Some(format!("\"{rel}\"")),
                        utf8: true,
                    });
                }
                let (folders, _, all) = split.finish("s3://b/p");
                let (mut got, etags) = into_manifest(folders, format == Format::Tree, all).unwrap();
                got.set_etags(etags.unwrap());
                assert!(got.encode() == want.encode(), "{format:?}, order {order}");
            }
        }
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
        split.add(Object {
            key,
            size: 110_000,
            etag: Some(format!("\"{i:032x}\"")),
            utf8: true,
        });
    }
    let (folders, _, etags) = split.finish("s3://b/p");
    let (mut manifest, etags) = into_manifest(folders, false, etags).unwrap();
    manifest.set_etags(etags.unwrap());
    assert_eq!(manifest.len(), 1_000_000);
    eprintln!(
        "1M keys into a manifest: {:.2} s",
        started.elapsed().as_secs_f64()
    );
}
