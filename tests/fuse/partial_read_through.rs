//! A partial cache's reads through from the source: a sample the cache does not
//! keep is read from the source whatever its size (a large one streamed in ranged reads,
//! never whole in memory), and a read through that fails is reported as the full cache's
//! fetches are (`cache.problems`, `cache.source_errors`, the log naming the source's
//! answer, not the partial cache).

use std::fs;
use std::io::{Read, Seek, SeekFrom};

use crate::common::*;

/// Larger than the 16 MiB a reader used to get through memory at most.
const HUGE: u64 = (16 << 20) + 4099;

/// Failed before the fix: the open answered EIO ("too large to serve without the cache")
/// every epoch, though the mount says the rest is read from the source.
#[test]
fn a_large_sample_the_cache_does_not_keep_is_read_from_the_source() {
    if !require_fuse() {
        return;
    }
    let data = DatasetBuilder::new()
        .class("a", &[("huge.npz", HUGE), ("small.jpg", 3000)])
        .build();
    for read_path in ["daemon", "page-cache"] {
        let mnt = data.dir(&format!("mnt-{read_path}"));
        let cache = data.path(&format!("cache-{read_path}"));
        let args = ["--cache-size", "1K", "--read-path", read_path];
        let d = Daemon::mount(&data.root, &cache, &mnt, &args);
        let epoch = mnt.join("epoch-0");
        let huge = data.sample("a", "huge.npz");
        assert_eq!(fs::metadata(epoch.join(huge.rel())).unwrap().len(), HUGE);
        let got = fs::read(epoch.join(huge.rel()))
            .unwrap_or_else(|e| panic!("{read_path}: {e}\n{}", d.stderr()));
        assert!(got == huge.bytes(), "{read_path}: wrong bytes");
        // A read in the middle, and one across the end.
        let mut f = fs::File::open(epoch.join(huge.rel())).unwrap();
        for (at, len) in [(9 << 20, 70_000u64), (HUGE - 100, 4096)] {
            f.seek(SeekFrom::Start(at)).unwrap();
            let mut buf = Vec::new();
            (&mut f).take(len).read_to_end(&mut buf).unwrap();
            assert!(buf == huge.range(at, len), "{read_path}: bytes at {at}");
        }
        drop(f);
        let small = data.sample("a", "small.jpg");
        assert_eq!(fs::read(epoch.join(small.rel())).unwrap(), small.bytes());
        let s = read_status(&mnt);
        assert_eq!(s["cache"]["problems"], serde_json::json!([]), "{s:#}");
        assert_eq!(s["cache"]["source_errors"], 0, "{s:#}");
        assert!(
            s["cache"]["fetched_bytes_from_source"].as_u64().unwrap() >= HUGE,
            "{s:#}"
        );
        d.unmount().assert_clean();
    }
}

/// Failed before the fix: the read answered EIO with "not in this rank's partial cache"
/// in the log, `cache.problems` empty and `source_errors` 0.
#[test]
fn a_failed_read_through_names_the_source_like_a_failed_fetch() {
    if !require_fuse() {
        return;
    }
    let data = DatasetBuilder::new()
        .class("a", &[("gone.jpg", 3000), ("here.jpg", 5000)])
        .class("b", &[("huge.npz", HUGE)])
        .build();
    let mnt = data.dir("mnt");
    let d = Daemon::mount(
        &data.root,
        &data.path("cache"),
        &mnt,
        &["--cache-size", "1K"],
    );
    let epoch = mnt.join("epoch-0");
    // The large one is opened (its size known) before it goes: its reads fail then.
    let mut huge = fs::File::open(epoch.join("b/huge.npz")).unwrap();
    fs::remove_file(data.root.join("a/gone.jpg")).unwrap();
    fs::remove_file(data.root.join("b/huge.npz")).unwrap();
    assert_errno(
        fs::read(epoch.join("a/gone.jpg")),
        libc::EIO,
        "a deleted sample",
    );
    let mut buf = Vec::new();
    assert_errno(
        huge.read_to_end(&mut buf),
        libc::EIO,
        "a deleted large sample",
    );
    drop(huge);
    let s = read_status(&mnt);
    let problems = s["cache"]["problems"].to_string();
    assert!(
        problems.contains("a/gone.jpg") && problems.contains("b/huge.npz"),
        "{s:#}"
    );
    assert!(s["cache"]["source_errors"].as_u64().unwrap() >= 2, "{s:#}");
    let log = d.stderr();
    assert!(!log.contains("not in this rank's partial cache"), "{log}");
    assert!(log.contains("No such file or directory"), "{log}");
    let here = data.sample("a", "here.jpg");
    assert_eq!(fs::read(epoch.join(here.rel())).unwrap(), here.bytes());
    d.unmount().assert_clean();
}
