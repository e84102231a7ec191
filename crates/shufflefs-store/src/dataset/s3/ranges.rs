//! A listing of many pages cut into key ranges listed at once. S3 lists a prefix page by
//! page, each page naming the next (a continuation token): 10^7 keys are 10^4 requests one
//! after the other, minutes at S3's tens of ms a page. But keys come in UTF-8 byte order,
//! and every folder's keys are consecutive in that order, so once the folders under the
//! prefix are known, the keys split into ranges of whole folders that separate listings
//! cover exactly, each key once (`start-after` where the range begins, stopping at the next
//! range's first folder).
//!
//! How: the first page is listed as always, so a prefix of one page (under 1,000 keys)
//! still costs one request. After a truncated first page, the prefix's own level after that
//! page's last key is listed with `delimiter=/` (its direct objects, and its folders: one
//! page per 1,000 folders; the folder that key is in comes first, whether the store names
//! it there or not), the folders are cut into at most [`RANGES`] runs of
//! consecutive folders, and up to [`THREADS`] threads list the runs. What is found reaches
//! the caller's sink in batches, from those threads; the caller's index must not depend
//! on the order keys come in (the manifest sorts its folders and names), so a listing in
//! ranges gives the same index as one page after the other.
//!
//! Only the prefix's first level is cut: a prefix whose keys all sit in one folder (every
//! key under `train/`) is one range, listed page after page as before.

use std::ops::ControlFlow;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::client::Client;
use super::error::StoreError;
use super::listing::{Ask, Listed, Object, Pages};
use crate::sys::sync::Locked;

/// Runs of folders a listing is cut into at most: enough that threads finishing early
/// find more work when folders differ in size.
pub(crate) const RANGES: usize = 64;

/// Listings in flight at once, each one request at a time (listing requests do not count
/// against the client's bound on GETs in flight).
pub(crate) const THREADS: usize = 16;

/// Objects handed to the sink at a time (a page's worth).
const BATCH: usize = 1000;

/// What a ranged listing asks of the store: [`Client`], or a double in the tests.
pub(crate) trait Lists: Sync {
    /// The key prefix listed: `PREFIX/`, or "" for a whole bucket.
    fn prefix(&self) -> String;
    /// One listing under [`Lists::prefix`], as [`super::listing::list_with`].
    fn list_with(
        &self,
        ask: Ask,
        each: &mut dyn FnMut(Listed) -> ControlFlow<()>,
    ) -> Result<Pages, StoreError>;
}

impl Lists for Client {
    fn prefix(&self) -> String {
        match self.url.prefix.is_empty() {
            true => String::new(),
            false => format!("{}/", self.url.prefix),
        }
    }

    fn list_with(
        &self,
        ask: Ask,
        each: &mut dyn FnMut(Listed) -> ControlFlow<()>,
    ) -> Result<Pages, StoreError> {
        super::listing::list_with(self, ask, each)
    }
}

/// Keys from `start_after` on, those of the folders from `first` (a folder's key prefix,
/// ending in '/') up to `end` (the next range's first folder; none: to the end).
#[derive(Debug)]
struct Range {
    start_after: Option<String>,
    first: String,
    end: Option<String>,
}

/// Lists every object under the store's prefix, handing them to `sink` in batches (from
/// several threads at once, in no particular order); the number of requests made. The
/// first failure stops every range and is returned.
pub(crate) fn list_all(
    store: &dyn Lists,
    sink: &(dyn Fn(Vec<Object>) + Sync),
) -> Result<usize, StoreError> {
    let mut batch = Vec::new();
    let first = Ask {
        max_keys: Some(BATCH),
        ..Ask::default()
    };
    let head = store.list_with(first, &mut |item| {
        if let Listed::Object(o) = item {
            batch.push(o);
        }
        ControlFlow::Continue(())
    })?;
    if !head.more {
        sink(batch);
        return Ok(head.pages);
    }
    // A key that is not UTF-8 (only a store that is not S3 sends one) arrives changed
    // (U+FFFD), so it cannot say where to go on: list page after page instead.
    if batch.last().is_some_and(|o| !o.utf8) {
        drop(batch);
        return Ok(head.pages + one_after_another(store, sink)?);
    }
    let last = batch.last().map(|o| o.key.clone());
    sink(batch);
    let (mut folders, pages) = level(store, last.as_deref(), sink)?;
    // The folder the first page ended in: a store may leave it out of the level after
    // that key (moto does; its prefix sorts before the key), though it may hold more.
    let prefix = store.prefix();
    let ended_in = (last.as_deref())
        .and_then(|key| Some((key, key.get(prefix.len()..)?.find('/')?)))
        .map(|(key, slash)| key[..=prefix.len() + slash].to_string());
    folders.extend(ended_in.map(|f| (f, true)));
    let ranges = cut(folders, &prefix, last);
    Ok(head.pages + pages + list_ranges(store, &ranges, sink)?)
}

/// Objects on their way to the sink, handed over [`BATCH`] at a time.
struct Batches<'a> {
    objects: Vec<Object>,
    sink: &'a (dyn Fn(Vec<Object>) + Sync),
}

impl<'a> Batches<'a> {
    fn new(sink: &'a (dyn Fn(Vec<Object>) + Sync)) -> Batches<'a> {
        let objects = Vec::new();
        Batches { objects, sink }
    }

    fn push(&mut self, o: Object) {
        self.objects.push(o);
        if self.objects.len() >= BATCH {
            (self.sink)(std::mem::take(&mut self.objects));
        }
    }

    /// The last, partial batch to the sink.
    fn finish(self) {
        (self.sink)(self.objects);
    }
}

/// Every object under the prefix, page after page (as before ranges existed).
fn one_after_another(
    store: &dyn Lists,
    sink: &(dyn Fn(Vec<Object>) + Sync),
) -> Result<usize, StoreError> {
    let mut batch = Batches::new(sink);
    let done = store.list_with(Ask::default(), &mut |item| {
        if let Listed::Object(o) = item {
            batch.push(o);
        }
        ControlFlow::Continue(())
    })?;
    batch.finish();
    Ok(done.pages)
}

/// The prefix's own level after `after`: its objects to `sink`, and its folders (their
/// key prefixes, whether UTF-8) with the requests made. Objects inside a folder (a store
/// that ignores the delimiter sends them) are left to the ranges.
fn level(
    store: &dyn Lists,
    after: Option<&str>,
    sink: &(dyn Fn(Vec<Object>) + Sync),
) -> Result<(Vec<(String, bool)>, usize), StoreError> {
    let prefix = store.prefix();
    let (mut folders, mut batch, mut nested) = (Vec::new(), Batches::new(sink), false);
    let ask = Ask {
        start_after: after,
        folders: true,
        ..Ask::default()
    };
    let done = store.list_with(ask, &mut |item| {
        match item {
            // Keys up to `after` too: a store that ignores `start-after` starts over.
            Listed::Object(o) if after.is_some_and(|a| o.key.as_str() <= a) => {}
            Listed::Object(o) if !in_folder(&o.key, &prefix) => batch.push(o),
            Listed::Object(_) => nested = true,
            Listed::Folder(f, utf8) => folders.push((f, utf8)),
        }
        ControlFlow::Continue(())
    })?;
    batch.finish();
    if nested {
        // The store ignored the delimiter: no folder it named can bound a run (`cut`).
        folders.push((String::new(), false));
    }
    Ok((folders, done.pages))
}

/// Whether `key` lies in a folder under `prefix` (not directly in it).
fn in_folder(key: &str, prefix: &str) -> bool {
    key.get(prefix.len()..).is_some_and(|r| r.contains('/'))
}

/// `folders` as at most [`RANGES`] runs of consecutive folders, none starting before
/// `after` (the first page's last key: what came before it is listed). Folders a store
/// named oddly (not UTF-8, not `PREFIX/NAME/`) cannot bound a run: then one run lists
/// every folder after `after`, page after page.
fn cut(mut folders: Vec<(String, bool)>, prefix: &str, after: Option<String>) -> Vec<Range> {
    let plain = |(f, utf8): &(String, bool)| {
        let name = f.strip_prefix(prefix).and_then(|n| n.strip_suffix('/'));
        *utf8 && name.is_some_and(|n| !n.is_empty() && !n.contains('/'))
    };
    if !folders.iter().all(plain) {
        let first = prefix.to_string();
        return vec![Range {
            start_after: after,
            first,
            end: None,
        }];
    }
    let mut folders: Vec<String> = folders.drain(..).map(|(f, _)| f).collect();
    folders.sort_unstable();
    folders.dedup();
    let n = folders.len().min(RANGES);
    let bounds: Vec<usize> = (0..=n).map(|i| i * folders.len() / n.max(1)).collect();
    (bounds.windows(2))
        .map(|w| {
            let first = folders[w[0]].clone();
            // Just before the folder's first key: its prefix without the '/' (`plain`).
            let before = first.strip_suffix('/').unwrap_or(&first).to_string();
            let start_after = match &after {
                Some(a) if *a > before => a.clone(),
                _ => before,
            };
            Range {
                start_after: Some(start_after),
                first,
                end: folders.get(w[1]).cloned(),
            }
        })
        .collect()
}

/// Lists `ranges` on up to [`THREADS`] threads; the requests made, or the first failure.
fn list_ranges(
    store: &dyn Lists,
    ranges: &[Range],
    sink: &(dyn Fn(Vec<Object>) + Sync),
) -> Result<usize, StoreError> {
    let next = AtomicUsize::new(0);
    let pages = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let failed: Mutex<Option<StoreError>> = Mutex::new(None);
    let prefix = store.prefix();
    std::thread::scope(|s| {
        for _ in 0..THREADS.min(ranges.len()) {
            s.spawn(|| {
                while let Some(range) = ranges.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    match list_range(store, &prefix, range, sink, &stop) {
                        Ok(n) => _ = pages.fetch_add(n, Ordering::Relaxed),
                        Err(e) => {
                            stop.store(true, Ordering::Relaxed);
                            let mut first = failed.locked();
                            first.get_or_insert(e);
                            return;
                        }
                    }
                }
            });
        }
    });
    match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(pages.into_inner()),
    }
}

/// One range's keys in folders (objects directly under the prefix are the level
/// listing's) to `sink`; the requests made.
fn list_range(
    store: &dyn Lists,
    prefix: &str,
    range: &Range,
    sink: &(dyn Fn(Vec<Object>) + Sync),
    stop: &AtomicBool,
) -> Result<usize, StoreError> {
    let mut batch = Batches::new(sink);
    let ask = Ask {
        start_after: range.start_after.as_deref(),
        ..Ask::default()
    };
    let done = store.list_with(ask, &mut |item| {
        let Listed::Object(o) = item else {
            return ControlFlow::Continue(());
        };
        if range.end.as_ref().is_some_and(|end| o.key >= *end) || stop.load(Ordering::Relaxed) {
            return ControlFlow::Break(());
        }
        // Keys up to `start_after` too: a store that ignores it starts at the beginning.
        let after = range.start_after.as_ref().is_none_or(|a| o.key > *a);
        if after && o.key >= range.first && in_folder(&o.key, prefix) {
            batch.push(o);
        }
        ControlFlow::Continue(())
    })?;
    batch.finish();
    Ok(done.pages)
}

#[cfg(test)]
mod tests;
