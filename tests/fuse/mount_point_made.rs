//! One rank: a missing mount point is created for the mount and removed after it (only the
//! folders the daemon made), a refused mount creates nothing, `--ready-file` holds the job's
//! record while the mount lives, and a daemon told to stop by SIGTERM while a reader holds a
//! sample file open leaves no mount behind (it detaches, and exits once the file closes).

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).expect("read the ready file")).expect("ready JSON")
}

fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

/// Waits up to 10 s for `pred`.
fn eventually(what: &str, pred: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pred() {
        assert!(Instant::now() < deadline, "{what} did not happen in 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_missing_mount_point_is_created_and_removed_with_the_ready_file() {
    if !require_fuse() {
        return;
    }
    let ds = standard_dataset();
    let mnt = ds.path("made/deep/mnt");
    let ready = ds.path("job.ready");
    fs::write(&ready, br#"{"world_size": 2, "epoch": 0, "ranks": []}"#).unwrap(); // a stale record
    let ready_arg = ready.to_str().unwrap();
    let d = Daemon::mount(
        &ds.root,
        &ds.path("cache"),
        &mnt,
        &["--ready-file", ready_arg],
    );
    assert!(is_mounted(&mnt), "mounted on the folder it made");
    let record = read_json(&ready);
    assert_eq!(record["world_size"], 1);
    assert_eq!(record["epoch"], 0);
    let rank = &record["ranks"][0];
    assert_eq!(rank["rank"], 0);
    assert_eq!(rank["host"], hostname().as_str());
    assert_eq!(rank["mountpoint"], mnt.to_str().unwrap());
    assert_eq!(rank["pid"], d.pid());
    d.unmount().assert_clean();
    assert!(!ready.exists(), "the ready file goes with the mount");
    assert!(
        !ds.path("made").exists(),
        "every folder the daemon made is removed"
    );
}

#[test]
fn an_existing_mount_point_stays_and_a_non_empty_one_is_refused() {
    if !require_fuse() {
        return;
    }
    let ds = standard_dataset();
    let mnt = ds.dir("mnt");
    let d = Daemon::mount(&ds.root, &ds.path("cache"), &mnt, &[]);
    d.unmount().assert_clean();
    assert!(mnt.is_dir(), "a mount point that existed is kept");
    fs::write(mnt.join("x"), b"x").unwrap();
    let args = mount_args(&ds.root, &ds.path("cache"), &mnt, &[]);
    mount_refused(&mnt, &args, true).assert_mentions("is not empty");
}

#[test]
fn a_refused_mount_creates_no_mount_point_and_no_ready_file() {
    if !require_fuse() {
        return;
    }
    let ds = standard_dataset();
    let mnt = ds.path("made/mnt");
    let ready = ds.path("job.ready");
    // A ready file left from before must not say ready for a start that is refused.
    fs::write(&ready, br#"{"world_size": 2, "epoch": 0, "ranks": []}"#).unwrap(); // a stale record
    let args = mount_args(
        &ds.path("no-such-source"),
        &ds.path("cache"),
        &mnt,
        &["--ready-file", ready.to_str().unwrap()],
    );
    mount_refused(&mnt, &args, true);
    assert!(!ds.path("made").exists(), "a refused mount made a folder");
    assert!(!ready.exists(), "the stale ready file is removed");
    // Detached too (the parent reports the refusal).
    mount_refused(&mnt, &args, false);
    assert!(
        !ds.path("made").exists(),
        "a refused detached mount made a folder"
    );
}

#[test]
fn a_detached_daemon_writes_the_ready_file() {
    if !require_fuse() {
        return;
    }
    let ds = standard_dataset();
    let mnt = ds.path("mnt");
    let ready = ds.path("job.ready");
    let args = mount_args(
        &ds.root,
        &ds.path("cache"),
        &mnt,
        &["--ready-file", ready.to_str().unwrap()],
    );
    let out = run_with_timeout(shufflefs().arg("mount").args(&args), MOUNT_TIMEOUT);
    let pid = read_json(&ready)["ranks"][0]["pid"]
        .as_i64()
        .map(|p| p as i32);
    let _guard = DetachedMount {
        mnt: mnt.clone(),
        pid,
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(is_mounted(&mnt));
    assert_eq!(
        read_json(&ready)["ranks"][0]["mountpoint"],
        mnt.to_str().unwrap()
    );
    let um = run_with_timeout(
        shufflefs().arg("unmount").arg(&mnt),
        Duration::from_secs(30),
    );
    assert!(
        um.status.success(),
        "{}",
        String::from_utf8_lossy(&um.stderr)
    );
    assert!(
        !ready.exists() && !mnt.exists(),
        "ready file and mount point gone"
    );
}

#[test]
fn sigterm_with_a_sample_file_open_leaves_no_mount() {
    if !require_fuse() {
        return;
    }
    let ds = standard_dataset();
    let mnt = ds.path("mnt");
    let ready = ds.path("job.ready");
    let ready_arg = ready.to_str().unwrap();
    let mut d = Daemon::mount(
        &ds.root,
        &ds.path("cache"),
        &mnt,
        &["--ready-file", ready_arg],
    );
    let sample = mnt.join("current/cat/large.bin");
    let mut file = fs::File::open(&sample).expect("open a sample");
    let mut head = [0u8; 10];
    std::io::Read::read_exact(&mut file, &mut head).unwrap();
    d.signal(libc::SIGTERM);
    // Detached at once: no mount in the table, no ready file, no folder it made.
    eventually("the detach", || !is_mounted(&mnt));
    eventually("the ready file's removal", || !ready.exists());
    eventually("the mount point's removal", || !mnt.exists());
    // The open file still reads; the daemon exits once it is closed.
    std::io::Read::read_exact(&mut file, &mut head).expect("an open file keeps reading");
    assert!(d.exited().is_none(), "the daemon waits for its reader");
    drop(file);
    let status = d
        .wait_exit(EXIT_TIMEOUT)
        .expect("the daemon exits once the file closed");
    assert!(status.success(), "{status}\n{}", d.stderr());
    assert!(!is_mounted(&mnt));
}
