//! Looking at a mounted view: the status and epoch files, listings, and errno assertions.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::fs;
use std::io;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long to wait for the daemon's background work (staging) to reach a state.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(30);

/// Parses `MNT/.shufflefs/status`.
#[track_caller]
pub fn read_status(mnt: &Path) -> Value {
    let path = mnt.join(".shufflefs/status");
    let bytes = fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "status is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&bytes)
        )
    })
}

/// Polls the status until `pred` holds; panics with the last status after the timeout.
#[track_caller]
pub fn wait_for_status(mnt: &Path, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + STATUS_TIMEOUT;
    loop {
        let s = read_status(mnt);
        if pred(&s) {
            return s;
        }
        if Instant::now() > deadline {
            panic!("status never showed {what} within {STATUS_TIMEOUT:?}:\n{s:#}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the current epoch's share is fully staged into the cache.
#[track_caller]
pub fn wait_staging_done(mnt: &Path) -> Value {
    wait_for_status(mnt, "staging done", |s| {
        let st = &s["staging"];
        st["state"] == "done"
            && st["epoch"] == s["epoch"]
            && st["files_total"] == s["share_samples"]
            && st["files_done"] == st["files_total"]
    })
}

/// The names in a folder, sorted.
#[track_caller]
pub fn names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| {
            e.expect("read a folder entry")
                .file_name()
                .into_string()
                .expect("UTF-8 name")
        })
        .collect()
}

/// `class -> sample names` of an `epoch-N/` folder.
#[track_caller]
pub fn listing(epoch_dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    names(epoch_dir)
        .into_iter()
        .map(|c| {
            let files = names(&epoch_dir.join(&c));
            (c, files)
        })
        .collect()
}

/// Reads `MNT/.shufflefs/epoch`.
#[track_caller]
pub fn read_epoch(mnt: &Path) -> u64 {
    let s = fs::read_to_string(mnt.join(".shufflefs/epoch")).expect("read the epoch file");
    assert!(
        s.ends_with('\n'),
        "epoch file content {s:?} lacks a newline"
    );
    s.trim()
        .parse()
        .unwrap_or_else(|_| panic!("epoch file holds {s:?}"))
}

/// Runs the shell's `echo VALUE > MNT/.shufflefs/epoch`, the way users advance by hand.
pub fn shell_echo_epoch(mnt: &Path, value: &str) -> ExitStatus {
    Command::new("sh")
        .arg("-c")
        .arg("echo \"$1\" > \"$2\"")
        .arg("sh")
        .arg(value)
        .arg(mnt.join(".shufflefs/epoch"))
        .status()
        .expect("run sh")
}

/// Writes `value` to `MNT/.shufflefs/epoch` (open with truncation, as `echo N >` does).
pub fn write_epoch(mnt: &Path, value: impl AsRef<[u8]>) -> io::Result<()> {
    fs::write(mnt.join(".shufflefs/epoch"), value)
}

/// Asserts `r` failed with errno `errno`.
#[track_caller]
pub fn assert_errno<T: Debug>(r: io::Result<T>, errno: i32, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected errno {errno}, got success {v:?}"),
        Err(e) => assert_eq!(
            e.raw_os_error(),
            Some(errno),
            "{what}: expected errno {errno}, got {e:?}"
        ),
    }
}

/// Asserts `path` answers ENOENT within a second (an old epoch's kernel entries are
/// invalidated asynchronously after an advance).
#[track_caller]
pub fn assert_gone_soon(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while fs::symlink_metadata(path).is_ok() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(2));
    }
    assert_not_found(fs::symlink_metadata(path), what);
}

/// Asserts `r` failed with ENOENT.
#[track_caller]
pub fn assert_not_found<T: Debug>(r: io::Result<T>, what: &str) {
    assert_errno(r, libc::ENOENT, what);
}
