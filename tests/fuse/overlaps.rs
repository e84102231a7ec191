//! Source, cache folder and mount point must be three separate places: every
//! overlap (one inside another, equal, through a symlink) is refused before anything is
//! created, so the refusal leaves no folder, log or lock behind and the next correct mount
//! works.

use std::fs;
use std::path::Path;

use crate::common::*;

/// Every file and folder under `dir`, as paths relative to it.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if p.is_dir() && !p.is_symlink() {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Refused (foreground), naming `needles`, with nothing new under the scratch area and no
/// mount left. (The detached mode runs the same check before it opens its log: see
/// `config::check_overlaps`.)
#[track_caller]
fn refused_creating_nothing(
    data: &Dataset,
    source: &Path,
    cache: &Path,
    mnt: &Path,
    needles: &[&str],
) {
    let before = tree(&data.base);
    // Detached (the daemon's log would go into the cache folder) and in the foreground.
    for foreground in [false, true] {
        let r = mount_refused(mnt, &mount_args(source, cache, mnt, &[]), foreground);
        for n in needles {
            r.assert_mentions(n);
        }
        r.assert_mentions("none inside another");
        assert!(!is_mounted(mnt));
        assert_eq!(tree(&data.base), before, "a refused mount created nothing");
    }
}

#[test]
fn overlapping_source_cache_and_mount_point_are_refused() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let src = data.root.clone();
    let (mnt, good_cache) = (data.dir("m0"), data.path("cache"));
    let s = |p: &Path| p.display().to_string();

    let cachein = src.join("cachein");
    refused_creating_nothing(
        &data,
        &src,
        &cachein,
        &mnt,
        &[&s(&cachein), &s(&src), "is inside --source"],
    );
    refused_creating_nothing(&data, &src, &src, &mnt, &["is the same folder as --source"]);
    let inner_mnt = src.join(&data.classes[0]);
    refused_creating_nothing(
        &data,
        &src,
        &good_cache,
        &inner_mnt,
        &["the mount point", "is inside --source"],
    );
    let in_mnt = mnt.join("x");
    refused_creating_nothing(
        &data,
        &src,
        &in_mnt,
        &mnt,
        &[&s(&in_mnt), "is inside the mount point"],
    );
    refused_creating_nothing(&data, &src, &mnt, &mnt, &["is the same folder as --cache"]);
    refused_creating_nothing(
        &data,
        &src,
        &data.base,
        &mnt,
        &["--source", "is inside --cache"],
    );
    // Through a symlink to the source, to a cache folder that does not exist yet.
    let link = data.path("link");
    std::os::unix::fs::symlink(&src, &link).unwrap();
    let via_link = link.join("c/deeper");
    refused_creating_nothing(
        &data,
        &src,
        &via_link,
        &mnt,
        &[&s(&via_link), "is inside --source"],
    );
    assert!(!src.join("c").exists());

    // Nothing was left to block the correct mount.
    assert!(!good_cache.exists() && fs::read_dir(&mnt).unwrap().next().is_none());
    let daemon = Daemon::mount(&src, &good_cache, &mnt, &["--seed", "1"]);
    assert_eq!(listing(&mnt.join("epoch-0")), data.expected_listing());
    daemon.unmount().assert_clean();
}
