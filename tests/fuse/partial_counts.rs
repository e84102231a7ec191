//! A partial cache's reads through from the source are source reads like any
//! other: `cache.fetched_bytes_from_source`, `shufflefs_source_bytes_total` and the
//! `epoch advanced` line's `source_bytes` count them, and agree with the partial cache's
//! own `partial.source_bytes_per_epoch`; and the mount's "mounted" line says the cache is
//! partial.

use std::fs;

use serde_json::Value;

use crate::common::*;

fn fetched(s: &Value) -> u64 {
    s["cache"]["fetched_bytes_from_source"].as_u64().unwrap()
}

/// The value of `name{rank="0"}` in the mount's metrics.
fn metric(mnt: &std::path::Path, name: &str) -> u64 {
    let text = fs::read_to_string(mnt.join(".shufflefs/metrics")).unwrap();
    let line = (text.lines())
        .find(|l| l.starts_with(&format!("{name}{{")))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// The `source_bytes` of the daemon's last `epoch advanced` line.
fn logged_source_bytes(log: &str) -> u64 {
    let line = (log.lines().rev())
        .find(|l| l.contains("epoch advanced"))
        .unwrap_or_else(|| panic!("no epoch advanced line in\n{log}"));
    let at = line.find("source_bytes=").expect("source_bytes") + "source_bytes=".len();
    let digits: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

#[test]
fn bytes_read_through_count_as_source_bytes() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let mnt = data.dir("mnt");
    let d = Daemon::mount(
        &data.root,
        &data.path("cache"),
        &mnt,
        &["--cache-size", "1K"],
    );
    // The terminal is told, not only the log.
    assert!(
        d.ready_line.contains("partial cache")
            && d.ready_line.contains("read from the source")
            && d.ready_line.contains("expected hit rate"),
        "{}",
        d.ready_line
    );
    let before = wait_staging_done(&mnt);
    let epoch = mnt.join(format!("epoch-{}", before["epoch"]));
    for s in &data.samples {
        let got = fs::read(epoch.join(s.rel())).unwrap();
        assert_eq!(got.len() as u64, s.size);
    }
    let read = read_status(&mnt);
    let moved = fetched(&read) - fetched(&before);
    let total: u64 = data.samples.iter().map(|s| s.size).sum();
    // All but what the 1K cache kept came through from the source.
    assert!(moved + 1024 >= total, "{moved} of {total} bytes:\n{read:#}");
    assert_eq!(metric(&mnt, "shufflefs_source_bytes_total"), fetched(&read));

    write_epoch(&mnt, (before["epoch"].as_u64().unwrap() + 1).to_string()).unwrap();
    let after = wait_staging_done(&mnt);
    let per_epoch = after["partial"]["source_bytes_per_epoch"].as_u64().unwrap();
    let logged = logged_source_bytes(&d.stderr());
    assert_eq!(per_epoch, moved, "{after:#}");
    assert_eq!(logged, per_epoch, "{}", d.stderr());
    d.unmount().assert_clean();
}
