//! The ranges against a store double that lists as S3 does (UTF-8 byte order, pages, a
//! continuation token, `start-after`, `delimiter=/` rolling keys up into folders): every
//! key exactly once, whatever the folder names, page size and number of folders.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicUsize;

use super::*;

/// Keys in a sorted set, pages of `page` items, requests counted; listing fails once
/// `fail_after` requests were made. `moto`: a level listed after a key leaves out the
/// folder that key is in (its prefix sorts before the key), as moto's server does.
/// `careless`: a store that ignores `start-after` and `delimiter`. A key holding U+FFFD
/// stands for one that was not UTF-8.
struct Store {
    prefix: String,
    keys: Vec<String>,
    page: usize,
    requests: AtomicUsize,
    fail_after: usize,
    moto: bool,
    careless: bool,
}

impl Store {
    fn new(prefix: &str, keys: &[String], page: usize) -> Store {
        let keys: BTreeSet<String> = keys.iter().cloned().collect();
        Store {
            prefix: prefix.to_string(),
            keys: keys.into_iter().collect(),
            page,
            requests: AtomicUsize::new(0),
            fail_after: usize::MAX,
            moto: false,
            careless: false,
        }
    }
}

impl Lists for Store {
    fn prefix(&self) -> String {
        self.prefix.clone()
    }

    fn list_with(
        &self,
        ask: Ask,
        each: &mut dyn FnMut(Listed) -> ControlFlow<()>,
    ) -> Result<Pages, StoreError> {
        let page = ask.max_keys.map_or(self.page, |m| m.min(self.page));
        let mut at = match ask.start_after.filter(|_| !self.careless) {
            Some(after) => self.keys.partition_point(|k| k.as_str() <= after),
            None => 0,
        };
        let folders = ask.folders && !self.careless;
        let mut pages = 0;
        loop {
            if self.requests.fetch_add(1, Ordering::Relaxed) >= self.fail_after {
                return Err(StoreError::Malformed("the double fails".into()));
            }
            pages += 1;
            let mut items = Vec::new();
            while items.len() < page && at < self.keys.len() {
                let key = &self.keys[at];
                at += 1;
                let Some(rel) = key.strip_prefix(&self.prefix) else {
                    continue;
                };
                match rel.find('/').filter(|_| folders) {
                    Some(slash) => {
                        let folder = format!("{}{}", self.prefix, &rel[..=slash]);
                        while self.keys.get(at).is_some_and(|k| k.starts_with(&folder)) {
                            at += 1;
                        }
                        let before = ask.start_after.is_some_and(|a| folder.as_str() <= a);
                        if !(self.moto && before) {
                            let utf8 = !folder.contains('\u{FFFD}');
                            items.push(Listed::Folder(folder, utf8));
                        }
                    }
                    None => items.push(Listed::Object(object(key))),
                }
            }
            let more =
                (self.keys[at.min(self.keys.len())..].iter()).any(|k| k.starts_with(&self.prefix));
            for item in items {
                if each(item).is_break() {
                    return Ok(Pages { pages, more: true });
                }
            }
            if !more || ask.max_keys.is_some() {
                return Ok(Pages { pages, more });
            }
        }
    }
}

fn object(key: &str) -> Object {
    Object {
        key: key.to_string(),
        size: 1,
        etag: None,
        utf8: !key.contains('\u{FFFD}'),
    }
}

/// Every key `list_all` handed over, in order, and the requests it made.
fn listed(store: &Store) -> (Vec<String>, usize) {
    let got = Mutex::new(Vec::new());
    let sink = |batch: Vec<Object>| {
        got.lock().unwrap().extend(batch.into_iter().map(|o| o.key));
    };
    let requests = list_all(store, &sink).unwrap();
    let mut got = got.into_inner().unwrap();
    got.sort();
    (got, requests)
}

fn under(prefix: &str, keys: &[String]) -> Vec<String> {
    let set: BTreeSet<&String> = keys.iter().filter(|k| k.starts_with(prefix)).collect();
    set.into_iter().cloned().collect()
}

/// Folder names that sort around each other and around objects of the same stem
/// (`F-x/` and `F.y/` before `F/`, `F0/` after; objects `F`, `F0`, `F.a` between).
fn tricky(prefix: &str) -> Vec<String> {
    let mut keys = Vec::new();
    for folder in ["F", "F-x", "F.y", "F0", "a", "a b", "é", "z"] {
        for i in 0..5 {
            keys.push(format!("{prefix}{folder}/{i}"));
        }
        keys.push(format!("{prefix}{folder}/deep/er/{folder}"));
    }
    for object in ["F", "F0", "F.a", "0", "zz", "F/"] {
        keys.push(format!("{prefix}{object}"));
    }
    keys.extend(["other/x".to_string(), "p0/y".to_string(), "p/".to_string()]);
    keys
}

#[test]
fn every_key_is_listed_once_whatever_the_page_size() {
    for prefix in ["p/", ""] {
        let keys = tricky(prefix);
        let want = under(prefix, &keys);
        for (page, moto) in [1, 2, 3, 7, 1000]
            .into_iter()
            .flat_map(|p| [(p, false), (p, true)])
        {
            let mut store = Store::new(prefix, &keys, page);
            store.moto = moto;
            let (got, requests) = listed(&store);
            assert_eq!(got, want, "prefix {prefix:?}, pages of {page}, moto {moto}");
            assert_eq!(requests, store.requests.load(Ordering::Relaxed));
        }
    }
}

#[test]
fn many_folders_are_cut_into_runs_and_still_listed_once() {
    let keys: Vec<String> = (0..3000)
        .map(|i| format!("p/c{:03}/{i:05}", (i * 7) % 300))
        .chain((0..40).map(|i| format!("p/top{i}")))
        .collect();
    for (page, moto) in [(10, false), (250, false), (250, true)] {
        let mut store = Store::new("p/", &keys, page);
        store.moto = moto;
        let (got, requests) = listed(&store);
        assert_eq!(got, under("p/", &keys), "pages of {page}, moto {moto}");
        // Every range stops at the next one's first folder: at most one page more than
        // the keys need per range (plus the level's pages).
        let most = 3040 / page + 1 + (300 + 40) / page + 1 + RANGES * 2;
        assert!(requests <= most, "{requests} requests, pages of {page}");
    }
}

#[test]
fn a_store_ignoring_start_after_and_the_delimiter_gives_every_key_once() {
    let keys = tricky("p/");
    for page in [2, 7, 1000] {
        let mut store = Store::new("p/", &keys, page);
        store.careless = true;
        assert_eq!(listed(&store).0, under("p/", &keys), "pages of {page}");
    }
}

#[test]
fn keys_that_were_not_utf8_are_listed_page_after_page_once() {
    let mut keys = tricky("p/");
    // A folder named with a replaced byte, and (pages of 3) a first page ending in one.
    keys.extend(["p/b\u{FFFD}/1".to_string(), "p/b\u{FFFD}/2".to_string()]);
    for page in [1, 3, 7] {
        let store = Store::new("p/", &keys, page);
        assert_eq!(listed(&store).0, under("p/", &keys), "pages of {page}");
    }
    let first = ["p/0", "p/F", "p/F\u{FFFD}"].map(String::from);
    let keys: Vec<String> = first.into_iter().chain(tricky("p/")).collect();
    let store = Store::new("p/", &keys, 3);
    assert_eq!(listed(&store).0, under("p/", &keys));
}

#[test]
fn one_page_is_one_request_as_before() {
    let keys: Vec<String> = (0..10).map(|i| format!("p/c{}/{i}", i % 3)).collect();
    let store = Store::new("p/", &keys, 1000);
    let (got, requests) = listed(&store);
    assert_eq!((got.len(), requests), (10, 1));
}

#[test]
fn a_failed_range_fails_the_listing() {
    let keys: Vec<String> = (0..500).map(|i| format!("p/c{:02}/{i}", i % 50)).collect();
    let mut store = Store::new("p/", &keys, 5);
    store.fail_after = 20;
    let sink = |_: Vec<Object>| {};
    let e = list_all(&store, &sink).unwrap_err();
    assert!(e.to_string().contains("the double fails"), "{e}");
}
