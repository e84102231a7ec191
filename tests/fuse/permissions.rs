//! Access control: the cache is private to the mounting user (folders 0700,
//! files 0600, whatever the umask and the source's modes); under `--allow-other` the view
//! shows the source's owners and modes (the root's on the view's root, each folder's and
//! file's own below it: `entry_modes`), which the kernel checks; only the mounting user
//! (and root) may advance the epoch.
//!
//! The checks with a second user need root (to mount for another user to look at, and to
//! run commands as `sfs-other`, created with `useradd` if missing): they skip when not
//! root, unless `SHUFFLEFS_REQUIRE_USERS=1` (set by `.ci/run`, which runs as root) makes
//! the skip a failure.

use std::fs::{self, Permissions};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::common::*;

const OTHER: &str = "sfs-other";

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .mode()
        & 0o7777
}

/// Every folder and file under `root`, `root` included.
fn walk(root: &Path) -> Vec<PathBuf> {
    let mut all = vec![root.to_path_buf()];
    let mut i = 0;
    while i < all.len() {
        if all[i].is_dir() && !all[i].is_symlink() {
            let mut inside: Vec<PathBuf> = fs::read_dir(&all[i])
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            all.append(&mut inside);
        }
        i += 1;
    }
    all
}

/// Asserts that the cache at `cache` is private: folders 0700, files without group or
/// other bits (0600; the status file 0400), and that it holds `min_files` files at least.
#[track_caller]
fn assert_private(cache: &Path, min_files: usize) {
    let mut files = 0;
    for p in walk(cache) {
        // A temporary file may be renamed away meanwhile.
        let Ok(meta) = fs::symlink_metadata(&p) else {
            continue;
        };
        let m = meta.mode() & 0o7777;
        if meta.is_dir() {
            assert_eq!(m, 0o700, "folder {}", p.display());
        } else {
            files += 1;
            assert_eq!(m & 0o077, 0, "file {} is {m:o}", p.display());
            let expected = if p.ends_with("status.json") {
                0o400
            } else {
                0o600
            };
            assert_eq!(m, expected, "file {}", p.display());
        }
    }
    assert!(files >= min_files, "{files} files in {}", cache.display());
}

#[test]
fn the_cache_is_private_on_both_layouts() {
    if !require_fuse() {
        return;
    }
    for layout in ["files", "packed"] {
        let data = standard_dataset();
        let cache = data.path("cache");
        let mnt = data.dir("mnt");
        let d = Daemon::mount(
            &data.root,
            &cache,
            &mnt,
            &["--seed", "3", "--cache-layout", layout],
        );
        wait_staging_done(&mnt);
        let _ = read_status(&mnt);
        // A sample read through the view (fetched if staging had not cached it).
        let s = data.sample("cat", "a.jpg");
        assert_eq!(
            fs::read(mnt.join("epoch-0").join(s.rel())).unwrap(),
            s.bytes()
        );
        // A file per sample, or a few segment files.
        assert_private(&cache, if layout == "files" { 20 } else { 5 });
        d.unmount().assert_clean();
        assert_private(&cache, 3);
    }
}

#[test]
fn an_older_cache_folder_is_made_private_when_remounted() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    Daemon::mount(&data.root, &cache, &mnt, &["--seed", "3"])
        .unmount()
        .assert_clean();
    // What a shufflefs before this change left: a 0755 cache root.
    fs::set_permissions(&cache, Permissions::from_mode(0o755)).unwrap();
    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "3"]);
    assert_eq!(mode(&cache), 0o700);
    d.unmount().assert_clean();
}

#[test]
fn a_detached_daemons_log_is_private() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    let out = run_with_timeout(
        shufflefs()
            .arg("mount")
            .args(mount_args(&data.root, &cache, &mnt, &["--seed", "3"])),
        MOUNT_TIMEOUT,
    );
    let mut guard = DetachedMount {
        mnt: mnt.clone(),
        pid: None,
    };
    assert!(
        out.status.success(),
        "detached mount failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    guard.pid = read_status(&mnt)["pid"].as_i64().map(|p| p as i32);
    wait_staging_done(&mnt);
    assert_eq!(mode(&cache.join("shufflefs.log")), 0o600);
    assert_private(&cache, 5);
    drop(guard);
}

/// The second user's uid and gid, creating the user if needed; `None` (skip) when not
/// root, or a panic where a `SHUFFLEFS_REQUIRE_*` says a skip is a failure.
pub(crate) fn other_user() -> Option<(u32, u32)> {
    let missing = (!is_root()).then(|| "creating and using one needs root".to_string());
    if !crate::common::skip::require("a second local user", "SHUFFLEFS_REQUIRE_USERS", missing) {
        return None;
    }
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").arg(flag).arg(OTHER).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    if id("-u").is_none() {
        let out = Command::new("useradd")
            .args(["--system", "--no-create-home", "--shell", "/bin/sh", OTHER])
            .output()
            .expect("run useradd");
        assert!(
            out.status.success() || id("-u").is_some(),
            "useradd {OTHER}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Some((id("-u").expect("uid"), id("-g").expect("gid")))
}

/// Runs `sh -c script` (with `$1` = `arg`) as the second user, without supplementary
/// groups (std drops them when root switches uid).
pub(crate) fn as_other(user: (u32, u32), script: &str, arg: &Path) -> Output {
    run_with_timeout(
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(arg)
            .uid(user.0)
            .gid(user.1)
            .current_dir("/"),
        Duration::from_secs(20),
    )
}

#[track_caller]
pub(crate) fn assert_refused(out: &Output, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what} should be refused");
    assert!(
        err.contains("Permission denied"),
        "{what}: expected EACCES, got: {err}"
    );
}

/// A dataset whose source root has `root_mode` and whose files have `file_mode`, in a
/// scratch folder the second user may enter (to reach the mount point).
fn dataset_with_modes(root_mode: u32, file_mode: u32) -> Dataset {
    let data = standard_dataset();
    fs::set_permissions(&data.base, Permissions::from_mode(0o755)).unwrap();
    for s in &data.samples {
        let p = data.root.join(s.rel());
        fs::set_permissions(p, Permissions::from_mode(file_mode)).unwrap();
    }
    fs::set_permissions(&data.root, Permissions::from_mode(root_mode)).unwrap();
    data
}

#[test]
fn a_private_dataset_stays_private_through_the_view_and_the_cache() {
    if !require_fuse() {
        return;
    }
    let Some(other) = other_user() else { return };
    let data = dataset_with_modes(0o700, 0o600);
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "3", "--allow-other"]);
    wait_staging_done(&mnt);
    let s = data.sample("cat", "a.jpg");
    let sample = mnt.join("epoch-0").join(s.rel());
    // The mounting user reads as before; the view shows the source's owner and mode.
    assert_eq!(fs::read(&sample).unwrap(), s.bytes());
    let meta = fs::metadata(&sample).unwrap();
    let src = fs::metadata(&data.root).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (src.uid(), src.gid()));
    assert_eq!(meta.mode() & 0o7777, 0o400);
    // Each folder shows its own mode (the class folder is 0755 on the source), behind the
    // 0700 root as on the source.
    assert_eq!(mode(&mnt.join("epoch-0")), 0o500);
    assert_eq!(mode(&mnt.join("epoch-0/cat")), 0o555);

    // The other user can neither read a sample nor list a folder through the view.
    assert_refused(&as_other(other, "cat \"$1\"", &sample), "reading a sample");
    assert_refused(
        &as_other(other, "ls \"$1\"", &mnt.join("epoch-0")),
        "listing an epoch",
    );
    // Nor in the cache, even knowing a sample file's name.
    let cached = walk(&cache.join("samples"))
        .into_iter()
        .find(|p| p.is_file())
        .expect("a cached sample");
    assert_refused(&as_other(other, "cat \"$1\"", &cached), "reading the cache");
    assert_private(&cache, 3);
    d.unmount().assert_clean();
}

#[test]
fn a_public_dataset_is_readable_but_only_the_mounting_user_advances() {
    if !require_fuse() {
        return;
    }
    let Some(other) = other_user() else { return };
    let data = dataset_with_modes(0o755, 0o644);
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "3", "--allow-other"]);
    let s = data.sample("dog house", "spaced name.png");
    let sample = mnt.join("epoch-0").join(s.rel());
    let read = as_other(other, "cat \"$1\"", &sample);
    assert!(
        read.status.success(),
        "the other user reads a public sample: {}",
        String::from_utf8_lossy(&read.stderr)
    );
    assert_eq!(read.stdout, s.bytes());
    assert_eq!(mode(&sample), 0o444);

    // Writing the epoch file is refused by the kernel (the file is the mounting user's,
    // 0644); looking up the next epoch reaches the daemon, which refuses it.
    let write = as_other(other, "echo 1 > \"$1\"", &mnt.join(".shufflefs/epoch"));
    assert_refused(&write, "the other user's write to .shufflefs/epoch");
    let lookup = as_other(other, "ls \"$1\"", &mnt.join("epoch-1"));
    assert_refused(&lookup, "the other user's lookup of epoch-1");
    assert_eq!(read_epoch(&mnt), 0, "nothing advanced");
    // The other user may still read the epoch number.
    let epoch = as_other(other, "cat \"$1\"", &mnt.join(".shufflefs/epoch"));
    assert_eq!(String::from_utf8_lossy(&epoch.stdout).trim(), "0");

    // The mounting user advances as before.
    write_epoch(&mnt, "1\n").expect("the mounting user advances");
    assert_eq!(read_epoch(&mnt), 1);
    d.unmount().assert_clean();
}

#[test]
fn a_public_dataset_in_a_private_folder_stays_private() {
    if !require_fuse() {
        return;
    }
    let Some(other) = other_user() else { return };
    // A 0755 dataset of 0644 files, in a 0700 folder (a home folder, say).
    let data = dataset_with_modes(0o755, 0o644);
    fs::set_permissions(&data.base, Permissions::from_mode(0o700)).unwrap();
    let outside = tempfile::Builder::new()
        .prefix("shufflefs-test-")
        .tempdir()
        .unwrap();
    fs::set_permissions(outside.path(), Permissions::from_mode(0o755)).unwrap();
    let mnt = outside.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let cache = data.path("cache");
    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "3", "--allow-other"]);
    let s = data.sample("cat", "a.jpg");
    let sample = mnt.join("epoch-0").join(s.rel());
    assert_eq!(fs::read(&sample).unwrap(), s.bytes());
    // The file shows its own 0644, and the view's root the dataset's reach: nobody else
    // may search the folder it sits in.
    assert_eq!(mode(&sample), 0o444);
    assert_eq!(mode(&mnt), 0o500);
    assert_refused(&as_other(other, "cat \"$1\"", &sample), "reading a sample");
    d.unmount().assert_clean();
}
