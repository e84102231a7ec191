//! A source changed between mounts: a plain remount reuses the cache's index
//! and says in the status that the view may be stale; `--rescan` scans again, drops what
//! the source lost, shows what it gained, and keeps (does not refetch) what is unchanged.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;

use crate::common::*;

#[test]
fn rescan_sees_a_changed_source_and_keeps_what_is_still_valid() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let (cache, mnt) = (data.path("cache"), data.dir("mnt"));
    let first = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "1"]);
    let s = wait_staging_done(&mnt);
    assert_eq!(s["source_scan"]["scanned_this_mount"], true, "{s:#}");
    assert_eq!(s["source_scan"]["stale_possible"], false);
    assert!(s["source_scan"]["scanned_at"].as_u64().unwrap() > 0);
    first.unmount().assert_clean();

    // The source changes: one file goes, a class of two files comes.
    let gone = &data.samples[0];
    fs::remove_file(data.root.join(gone.rel())).unwrap();
    let new_class = data.root.join("zz-new");
    fs::create_dir(&new_class).unwrap();
    let new_files = [
        ("n1.bin", b"new sample one".to_vec()),
        ("n2.bin", vec![7u8; 3000]),
    ];
    for (name, bytes) in &new_files {
        fs::write(new_class.join(name), bytes).unwrap();
    }
    let mut expected: BTreeMap<String, BTreeSet<String>> = data.expected_listing();
    expected.get_mut(&gone.class).unwrap().remove(&gone.name);
    let names = new_files.iter().map(|(n, _)| n.to_string()).collect();
    expected.insert("zz-new".into(), names);

    // Without --rescan: the old view, and the status says it may be stale.
    let stale = Daemon::mount(&data.root, &cache, &mnt, &[]);
    let s = read_status(&mnt);
    assert_eq!(s["source_scan"]["scanned_this_mount"], false, "{s:#}");
    assert_eq!(s["source_scan"]["stale_possible"], true);
    assert_eq!(listing(&mnt.join("epoch-0")), data.expected_listing());
    stale.unmount().assert_clean();

    // With --rescan: the new view; only the new samples come from the source.
    let fresh = Daemon::mount(&data.root, &cache, &mnt, &["--rescan"]);
    let s = wait_staging_done(&mnt);
    let scan = &s["source_scan"];
    assert_eq!(scan["scanned_this_mount"], true, "{s:#}");
    assert_eq!(scan["stale_possible"], false);
    assert_eq!(scan["dropped"], 1, "{s:#}");
    assert_eq!(scan["kept"], data.samples.len() as u64 - 1, "{s:#}");
    assert_eq!(s["seed"], 1, "the seed is kept");
    assert_eq!(listing(&mnt.join("epoch-0")), expected);
    for smp in data.samples.iter().skip(1) {
        let got = fs::read(mnt.join("epoch-0").join(smp.rel())).unwrap();
        assert!(got == smp.bytes(), "{} differs", smp.rel().display());
    }
    for (name, bytes) in &new_files {
        let got = fs::read(mnt.join("epoch-0/zz-new").join(name)).unwrap();
        assert_eq!(&got, bytes, "{name}");
    }
    let s = read_status(&mnt);
    assert_eq!(
        s["cache"]["fetched_from_source"],
        new_files.len() as u64,
        "{s:#}"
    );
    assert_eq!(s["cache"]["files"], data.samples.len() as u64 + 1);
    fresh.unmount().assert_clean();

    // The rescanned cache is the cache now: a plain remount reuses it.
    let again = Daemon::mount(&data.root, &cache, &mnt, &[]);
    assert_eq!(listing(&mnt.join("epoch-0")), expected);
    again.unmount().assert_clean();
}
