//! `shufflefs status` on a path that is no mount, or on a mount whose daemon died, names
//! what it found and the way out; `--watch` there ends with failure after a few looks
//! instead of printing the same error every second forever.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;

/// `shufflefs status ARGS MOUNT`, which must fail within `within`: its stderr.
#[track_caller]
fn fails(args: &[&str], mount: &Path, within: Duration) -> String {
    let started = Instant::now();
    let out = run_with_timeout(shufflefs().arg("status").args(args).arg(mount), within);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{args:?} {}: {stderr}",
        mount.display()
    );
    assert!(started.elapsed() < within, "{args:?} did not end: {stderr}");
    stderr
}

#[test]
fn status_of_no_mount_or_a_dead_one_says_so_and_watch_ends() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let folder = data.dir("plain");
    let e = fails(&[], &folder, Duration::from_secs(10));
    assert!(
        e.contains("is not a shufflefs mount (no .shufflefs/status); give the mount point"),
        "{e}"
    );
    let e = fails(&["--watch"], &data.path("nowhere"), Duration::from_secs(15));
    assert!(
        e.contains("does not exist") && e.contains("stopped watching"),
        "{e}"
    );

    let mnt = data.dir("mnt");
    let mut d = Daemon::mount(&data.root, &data.path("cache"), &mnt, &[]);
    d.signal(libc::SIGKILL);
    assert!(d.wait_exit(Duration::from_secs(10)).is_some());
    let e = fails(&[], &mnt, Duration::from_secs(10));
    let unmount = format!("fusermount3 -u {}", mnt.display());
    assert!(
        e.contains("dead shufflefs mount") && e.contains(&unmount),
        "{e}"
    );
    let e = fails(&["--watch", "--json"], &mnt, Duration::from_secs(15));
    assert_eq!(e.matches("dead shufflefs mount").count(), 3, "{e}");
    drop(d);
    force_unmount(&mnt);
}
