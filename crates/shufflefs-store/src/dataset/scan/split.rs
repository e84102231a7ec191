//! The listing split across ranks: each rank lists a part of the source's folders, and the
//! parts are combined by all-gathers into exactly the manifest one rank's scan gives (the
//! same bytes: same order, ids and fingerprint), on every rank.
//!
//! Which rank lists what is a rule every rank knows without asking: folder `i` of a list
//! every rank holds goes to rank `i mod M`.
//! - `--format tree`: one depth at a time, as [`super::scan_tree_with`] walks it. The
//!   folders of a depth are dealt round-robin; each rank lists its own (by a few threads)
//!   and the sub-folder names are all-gathered, which makes the next depth's list, the same
//!   on every rank. So a tree with one huge top-level folder is still spread over every
//!   rank from the depth where it branches; one collective per depth.
//! - ImageFolder: rank 0 lists the root (the class folders), every rank learns them, and
//!   the classes are dealt round-robin. A class folder is one directory stream, listed by
//!   one rank: a dataset of one huge class is listed by one rank, as before.
//!
//! Each rank's folders (names, sizes where known, owners under `--allow-other`, skipped
//! entries) are then all-gathered once, and every rank assembles the manifest with the same
//! code as the single scan (`tree_manifest`, `finish_classes`). The combined manifest is
//! still the whole dataset's on every rank: what is split is the listing (the `getdents64`
//! and `stat` calls, the cold reads of folder blocks), not the memory.
//!
//! Errors: every all-gather carries each rank's outcome, so a rank whose part failed stops
//! every rank at the same collective, with its message (naming the path) under its rank
//! ([`SplitError::Failed`], the same list on every rank); no rank is left waiting.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::tree::{DirScan, join, open_root, scan_level, tree_manifest};
use super::{ClassScan, finish_classes, list_classes, list_each, scan_class};
use crate::dataset::manifest::{Manifest, ManifestError};
use crate::dataset::names::{Skipped, is_safe_name};
use crate::dataset::owners::{Owner, OwnersBuilder};

/// What the split listing asks of the ranks: this rank, their number, and an all-gather
/// (every rank's bytes, in rank order, on every rank). The daemon passes its `Comm`.
pub trait Gather {
    fn rank(&self) -> u32;
    fn ranks(&self) -> u32;
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, String>;
    /// Rank 0's `data` (ignored elsewhere) on every rank.
    fn broadcast(&mut self, data: Vec<u8>) -> Result<Vec<u8>, String>;
}

/// Why a split listing stopped: the same on every rank.
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    /// The ranks whose part failed, each with its message (naming the path); ranks that
    /// failed with the same message as the rank before them are left out, so a source
    /// missing on every rank is said once.
    #[error("{}", describe(.0))]
    Failed(Vec<(u32, String)>),
    #[error("talking to the other ranks while listing the source: {0}")]
    Comm(String),
}

fn describe(failures: &[(u32, String)]) -> String {
    (failures.iter())
        .map(|(r, m)| format!("rank {r}: {m}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What one rank learned of a verdict every rank reaches alike (no samples at all, say):
/// said once, under rank 0.
fn shared(e: ManifestError) -> SplitError {
    SplitError::Failed(vec![(0, e.to_string())])
}

/// How much of the source this rank listed itself (for the log, and the tests that check
/// the listing is split).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Listed {
    pub folders: u64,
    pub samples: u64,
}

/// One folder's listing as it travels: names back to back with their lengths, sizes plus
/// one (an unknown size, `u64::MAX`, is 0: one byte on the wire).
#[derive(Default, Serialize, Deserialize)]
struct Wire {
    names: Vec<u8>,
    lens: Vec<u16>,
    sizes: Vec<u64>,
    owners: Vec<Owner>,
    skipped: Vec<Skipped>,
}

impl Wire {
    fn of(scan: ClassScan) -> Wire {
        let mut at = 0;
        let lens = (scan.ends.iter())
            .map(|&end| {
                let len = (end - at) as u16;
                at = end;
                len
            })
            .collect();
        Wire {
            names: scan.names,
            lens,
            sizes: scan.sizes.iter().map(|s| s.wrapping_add(1)).collect(),
            owners: scan.owners,
            skipped: scan.skipped,
        }
    }

    /// The listing back, refused unless every name is one a folder may hold (as a manifest
    /// from a peer is: `Manifest::decode`).
    fn into_scan(self) -> Result<ClassScan, SplitError> {
        let mut end = 0u32;
        let mut ends = Vec::with_capacity(self.lens.len());
        for &len in &self.lens {
            let start = end as usize;
            end += u32::from(len);
            let name = self.names.get(start..end as usize);
            if !name.is_some_and(is_safe_name) {
                return Err(SplitError::Comm("a part holds a name no folder may".into()));
            }
            ends.push(end);
        }
        if end as usize != self.names.len() || self.sizes.len() != ends.len() {
            return Err(SplitError::Comm("a part's names and sizes disagree".into()));
        }
        Ok(ClassScan {
            names: self.names,
            ends,
            sizes: self.sizes.iter().map(|s| s.wrapping_sub(1)).collect(),
            skipped: self.skipped,
            owners: self.owners,
        })
    }
}

/// Collective: this rank's outcome to every rank; every rank's value in rank order, or
/// the failures of every rank that failed.
fn exchange<T: Serialize + DeserializeOwned>(
    g: &mut dyn Gather,
    mine: Result<T, String>,
) -> Result<Vec<T>, SplitError> {
    let bytes = postcard::to_allocvec(&mine).map_err(|e| SplitError::Comm(e.to_string()))?;
    drop(mine);
    let all = g.all_gather(&bytes).map_err(SplitError::Comm)?;
    drop(bytes);
    let mut parts = Vec::with_capacity(all.len());
    let mut failed: Vec<(u32, String)> = Vec::new();
    for (r, b) in all.into_iter().enumerate() {
        match postcard::from_bytes::<Result<T, String>>(&b) {
            Ok(Ok(t)) => parts.push(t),
            Ok(Err(m)) => failed.push((r as u32, m)),
            Err(e) => return Err(SplitError::Comm(format!("rank {r} sent a bad part: {e}"))),
        }
    }
    failed.dedup_by(|later, earlier| later.1 == earlier.1);
    match failed.is_empty() {
        true => Ok(parts),
        false => Err(SplitError::Failed(failed)),
    }
}

/// Collective: rank 0's `value` (ignored elsewhere), or its failure, on every rank.
fn from_root<T: Serialize + DeserializeOwned>(
    g: &mut dyn Gather,
    value: Result<T, String>,
) -> Result<T, SplitError> {
    let bytes = match g.rank() {
        0 => postcard::to_allocvec(&value).map_err(|e| SplitError::Comm(e.to_string()))?,
        _ => Vec::new(),
    };
    let got = g.broadcast(bytes).map_err(SplitError::Comm)?;
    match postcard::from_bytes::<Result<T, String>>(&got) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(m)) => Err(SplitError::Failed(vec![(0, m)])),
        Err(e) => Err(SplitError::Comm(format!("rank 0 sent a bad listing: {e}"))),
    }
}

/// Refuses folder names from a peer that no folder may hold.
fn safe(names: &[Vec<u8>]) -> Result<(), SplitError> {
    match names.iter().all(|n| is_safe_name(n)) {
        true => Ok(()),
        false => Err(SplitError::Comm("a part holds a name no folder may".into())),
    }
}

/// The items of `all` dealt to this rank: every `ranks`-th from `rank`.
fn mine<T: Clone>(all: &[T], g: &dyn Gather) -> Vec<T> {
    (all.iter().skip(g.rank() as usize))
        .step_by(g.ranks().max(1) as usize)
        .cloned()
        .collect()
}

/// [`super::scan_tree_with`], listed by all ranks together (collective): the same manifest
/// on every rank, and how much of it this rank listed.
pub fn scan_tree_split(
    root: &Path,
    owners: bool,
    g: &mut dyn Gather,
) -> Result<(Manifest, Listed), SplitError> {
    let opened = open_root(root, owners).map_err(|e| e.to_string());
    let ranks = g.ranks().max(1) as usize;
    let mut level: Vec<Vec<u8>> = vec![Vec::new()];
    let mut listed: Vec<(Vec<u8>, DirScan)> = Vec::new();
    while !level.is_empty() {
        let paths = mine(&level, g);
        let scans = (opened.as_ref().map_err(Clone::clone)).and_then(|(dir, confine)| {
            scan_level(dir, root, &paths, confine.as_deref()).map_err(|e| e.to_string())
        });
        let subdirs = scans.map(|scans| {
            let subdirs: Vec<Vec<Vec<u8>>> = scans.iter().map(|s| s.subdirs.clone()).collect();
            listed.extend(paths.into_iter().zip(scans));
            subdirs
        });
        let all = exchange(g, subdirs)?;
        let mut next = Vec::new();
        for (i, path) in level.iter().enumerate() {
            let names = (all.get(i % ranks)).and_then(|r| r.get(i / ranks));
            let names = names.ok_or_else(|| SplitError::Comm("a part lacks a folder".into()))?;
            safe(names)?;
            next.extend(names.iter().map(|name| join(path, name)));
        }
        level = next;
    }
    let counts = Listed {
        folders: listed.len() as u64,
        samples: listed.iter().map(|(_, s)| s.files.sizes.len() as u64).sum(),
    };
    let part: Vec<(Vec<u8>, Wire, Option<Owner>)> = (listed.into_iter())
        .map(|(path, scan)| (path, Wire::of(scan.files), scan.owner))
        .collect();
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    for (path, wire, owner) in exchange(g, Ok(part))?.into_iter().flatten() {
        let mut scan = wire.into_scan()?;
        skipped.append(&mut scan.skipped);
        found.push((path, scan, owner));
    }
    let m = tree_manifest(root, found, skipped, owners).map_err(shared)?;
    Ok((m, counts))
}

/// [`super::scan_with`] (ImageFolder), listed by all ranks together (collective): the same
/// manifest on every rank, and how much of it this rank listed.
pub fn scan_split(
    root: &Path,
    owners: bool,
    g: &mut dyn Gather,
) -> Result<(Manifest, Listed), SplitError> {
    let opened = open_root(root, owners).map_err(|e| e.to_string());
    let confine = opened.as_ref().ok().and_then(|(_, c)| c.clone());
    // Rank 0 lists the root and tells the others; a rank that cannot open the source says
    // so with its part, below.
    let classes = match g.rank() {
        0 => (opened.as_ref().map_err(Clone::clone))
            .and_then(|_| list_classes(root, confine.as_deref()).map_err(|e| e.to_string())),
        _ => Err(String::new()),
    };
    let (classes, class_owners, root_skipped) = from_root(g, classes)?;
    safe(&classes)?;
    let names = mine(&classes, g);
    let scans = (opened.as_ref().map_err(Clone::clone)).and_then(|(dir, _)| {
        list_each(&names, |class| {
            scan_class(dir, root, class, confine.as_deref())
        })
        .map_err(|e| e.to_string())
    });
    let counts = Listed {
        folders: names.len() as u64,
        samples: scans
            .as_ref()
            .map_or(0, |s| s.iter().map(|c| c.sizes.len() as u64).sum()),
    };
    let part = scans.map(|s| s.into_iter().map(Wire::of).collect::<Vec<_>>());
    let mut parts: Vec<_> = exchange(g, part)?.into_iter().map(Vec::into_iter).collect();
    let mut manifest = Manifest::empty();
    let mut skipped = root_skipped;
    let mut owners = confine.map(|_| OwnersBuilder::new());
    let ranks = parts.len().max(1);
    for (c, class) in classes.into_iter().enumerate() {
        let wire = (parts.get_mut(c % ranks)).and_then(Iterator::next);
        let wire = wire.ok_or_else(|| SplitError::Comm("a part lacks a class".into()))?;
        let scan = wire.into_scan()?;
        if let (Some(owners), Some(&owner)) = (&mut owners, class_owners.get(c)) {
            owners.push_class(owner);
            owners.push_samples(&scan.owners);
        }
        (manifest.push_class(class, &scan.names, &scan.ends, &scan.sizes)).map_err(shared)?;
        skipped.extend(scan.skipped);
    }
    let m = finish_classes(root, manifest, skipped, owners).map_err(shared)?;
    Ok((m, counts))
}

#[cfg(test)]
mod tests;
