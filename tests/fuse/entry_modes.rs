//! under `--allow-other` a view never lets a user read or list what the source
//! would not let them. Each class folder (each folder of a tree), sample and side file
//! shows its own owner and mode, which the kernel checks; links out of the source are not
//! served (skipped, and listed in the status's `skipped`).
//!
//! Checked with a second local user (`sfs-other`, in a group `sfs-share`): a private
//! folder, a private file in a public folder, a public file in a private folder,
//! group-readable files and folders, and file and folder links to a root-only folder.
//! On the code before (the source root's mode on everything, every link followed) the
//! other user read all of them. Needs root; skips without it (see `permissions`).

use std::fs::{self, Permissions};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::*;
use crate::permissions::{as_other, assert_refused, other_user};

const GROUP: &str = "sfs-share";

/// The group `sfs-share`, with the second user in it (made if missing): its gid.
fn share_group() -> u32 {
    let gid = || -> Option<u32> {
        let out = Command::new("getent")
            .args(["group", GROUP])
            .output()
            .ok()?;
        let line = String::from_utf8_lossy(&out.stdout).to_string();
        line.split(':').nth(2)?.trim().parse().ok()
    };
    if gid().is_none() {
        let out = Command::new("groupadd").args(["--system", GROUP]).output();
        assert!(
            out.is_ok_and(|o| o.status.success()) || gid().is_some(),
            "groupadd {GROUP}"
        );
    }
    let out = Command::new("usermod")
        .args(["-a", "-G", GROUP, "sfs-other"])
        .output()
        .expect("run usermod");
    assert!(out.status.success(), "usermod: {out:?}");
    gid().expect("the group's gid")
}

/// A scratch tree the second user may enter: `src/` (the source, 0755), a root-only
/// `secret/` (0700) beside it, and room for the cache and the mount point.
struct Scratch {
    _tmp: tempfile::TempDir,
    base: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        let tmp = tempfile::Builder::new()
            .prefix("shufflefs-test-")
            .tempdir()
            .unwrap();
        let base = fs::canonicalize(tmp.path()).unwrap();
        chmod(&base, 0o755);
        fs::create_dir_all(base.join("src")).unwrap();
        chmod(&base.join("src"), 0o755);
        fs::create_dir_all(base.join("secret/dir")).unwrap();
        fs::write(base.join("secret/key"), b"root only").unwrap();
        fs::write(base.join("secret/dir/key"), b"root only too").unwrap();
        chmod(&base.join("secret/key"), 0o600);
        chmod(&base.join("secret"), 0o700);
        fs::create_dir(base.join("mnt")).unwrap();
        Scratch { _tmp: tmp, base }
    }

    fn src(&self) -> PathBuf {
        self.base.join("src")
    }

    /// Writes `rel` under the source with `mode`, making its folders (0755).
    fn file(&self, rel: &str, mode: u32) {
        let p = self.src().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, rel.as_bytes()).unwrap();
        chmod(&p, mode);
    }

    fn mount(&self, extra: &[&str]) -> Daemon {
        let mut args = vec!["--seed", "3", "--allow-other"];
        args.extend_from_slice(extra);
        let cache = self.base.join("cache");
        Daemon::mount(&self.src(), &cache, &self.base.join("mnt"), &args)
    }
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, Permissions::from_mode(mode)).unwrap();
}

#[track_caller]
fn assert_reads(out: &Output, what: &str, expected: &[u8]) {
    assert!(
        out.status.success(),
        "{what} should be readable: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, expected, "{what}");
}

#[track_caller]
fn assert_missing(out: &Output, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what} should not be in the view");
    assert!(err.contains("No such file"), "{what}: {err}");
}

/// The `skipped` entries of the status, as (path, reason).
fn skipped(mnt: &Path) -> Vec<(String, String)> {
    let s = wait_staging_done(mnt);
    let list = s["skipped"].as_array().expect("skipped is a list");
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    list.iter()
        .map(|e| (text(&e["path"]), text(&e["reason"])))
        .collect()
}

#[test]
fn imagefolder_entries_keep_their_own_modes_and_links_stay_in_the_source() {
    if !require_fuse() {
        return;
    }
    let Some(other) = other_user() else { return };
    let share = share_group();
    let s = Scratch::new();
    s.file("public/open.jpg", 0o644);
    s.file("public/mine.jpg", 0o600);
    s.file("public/shared.jpg", 0o640);
    s.file("public/rootgroup.jpg", 0o640);
    s.file("private/inside.jpg", 0o644);
    s.file("team/t.jpg", 0o644);
    s.file("classes.txt", 0o600);
    let src = s.src();
    chmod(&src.join("private"), 0o700);
    chmod(&src.join("team"), 0o750);
    std::os::unix::fs::chown(src.join("public/shared.jpg"), None, Some(share)).unwrap();
    std::os::unix::fs::chown(src.join("team"), None, Some(share)).unwrap();
    // What a user who may write into the dataset plants: links to root-only things.
    symlink(s.base.join("secret/key"), src.join("public/leak.jpg")).unwrap();
    symlink(s.base.join("secret/dir"), src.join("leaked")).unwrap();
    // A link inside the source, around the private folder: no way around it.
    symlink("../private/inside.jpg", src.join("public/around.jpg")).unwrap();

    let d = s.mount(&["--replicate", "classes.txt"]);
    let mnt = s.base.join("mnt");
    let view = mnt.join("epoch-0");
    let cat = |user, rel: &str| as_other(user, "cat \"$1\"", &view.join(rel));
    let member = (other.0, share);

    // A public file in a public folder: readable, as before.
    assert_reads(
        &cat(other, "public/open.jpg"),
        "a public file",
        b"public/open.jpg",
    );
    // A private file in a public folder.
    assert_eq!(
        fs::metadata(view.join("public/mine.jpg")).unwrap().mode() & 0o777,
        0o400
    );
    assert_refused(
        &cat(other, "public/mine.jpg"),
        "a 0600 file in a 0755 folder",
    );
    assert_refused(
        &as_other(other, "cat \"$1\"", &mnt.join("current/public/mine.jpg")),
        "the same file through `current`",
    );
    // A private folder, and the public file in it.
    assert_eq!(
        fs::metadata(view.join("private")).unwrap().mode() & 0o777,
        0o500
    );
    assert_refused(
        &as_other(other, "ls \"$1\"", &view.join("private")),
        "listing a 0700 folder",
    );
    assert_refused(
        &cat(other, "private/inside.jpg"),
        "a 0644 file in a 0700 folder",
    );
    assert_refused(
        &cat(other, "public/around.jpg"),
        "a link around a 0700 folder",
    );
    // Group-readable: the group's members read, others do not.
    let shared = fs::metadata(view.join("public/shared.jpg")).unwrap();
    assert_eq!((shared.gid(), shared.mode() & 0o777), (share, 0o440));
    assert_reads(
        &cat(member, "public/shared.jpg"),
        "a 0640 file of the group",
        b"public/shared.jpg",
    );
    assert_refused(
        &cat(other, "public/shared.jpg"),
        "a 0640 file of another group",
    );
    assert_refused(
        &cat(member, "public/rootgroup.jpg"),
        "a 0640 file of root's group",
    );
    assert_reads(
        &cat(member, "team/t.jpg"),
        "a file in a 0750 folder of the group",
        b"team/t.jpg",
    );
    assert_refused(
        &cat(other, "team/t.jpg"),
        "a file in a 0750 folder of another group",
    );
    // A side file keeps its mode too.
    assert_refused(&cat(other, "classes.txt"), "a 0600 side file");
    assert_eq!(fs::read(view.join("classes.txt")).unwrap(), b"classes.txt");

    // Links out of the source are not served, and say so.
    assert_missing(
        &cat(other, "public/leak.jpg"),
        "a file link out of the source",
    );
    assert_missing(&cat(other, "leaked/key"), "a folder link out of the source");
    assert!(!view.join("leaked").exists(), "the folder link is no class");
    let listed = skipped(&mnt);
    for link in ["public/leak.jpg", "leaked"] {
        let path = src.join(link).display().to_string();
        let entry = listed.iter().find(|(p, _)| *p == path);
        let reason = &entry
            .unwrap_or_else(|| panic!("{path} not in {listed:?}"))
            .1;
        assert!(reason.contains("symlink out of the source"), "{reason}");
    }
    // The mounting user reads everything the source holds.
    assert_eq!(
        fs::read(view.join("public/mine.jpg")).unwrap(),
        b"public/mine.jpg"
    );
    assert_eq!(
        fs::read(view.join("public/around.jpg")).unwrap(),
        b"private/inside.jpg"
    );
    d.unmount().assert_clean();
}

#[test]
fn tree_folders_at_any_depth_keep_their_own_modes() {
    if !require_fuse() {
        return;
    }
    let Some(other) = other_user() else { return };
    let s = Scratch::new();
    s.file("a/open.npz", 0o644);
    s.file("a/mine.npz", 0o600);
    s.file("a/private/deeper/f.npz", 0o644);
    chmod(&s.src().join("a/private"), 0o700);
    symlink(s.base.join("secret/key"), s.src().join("a/leak.npz")).unwrap();

    let d = s.mount(&["--format", "tree"]);
    let mnt = s.base.join("mnt");
    let view = mnt.join("epoch-0");
    let cat = |rel: &str| as_other(other, "cat \"$1\"", &view.join(rel));
    assert_reads(&cat("a/open.npz"), "a public file", b"a/open.npz");
    assert_refused(&cat("a/mine.npz"), "a 0600 file");
    assert_refused(
        &cat("a/private/deeper/f.npz"),
        "a 0644 file under a 0700 folder",
    );
    assert_refused(
        &as_other(other, "ls \"$1\"", &view.join("a/private")),
        "listing a 0700 folder",
    );
    assert_missing(&cat("a/leak.npz"), "a file link out of the source");
    // The status names the link in the private folder's neighbour: the mounting user's
    // alone (it was 0444 before).
    let status = mnt.join(".shufflefs/status");
    assert_eq!(fs::metadata(&status).unwrap().mode() & 0o777, 0o400);
    assert_refused(
        &as_other(other, "cat \"$1\"", &status),
        "the status under --allow-other",
    );
    let listed = skipped(&mnt);
    assert!(
        (listed.iter()).any(|(p, r)| p.ends_with("a/leak.npz") && r.contains("out of the source")),
        "{listed:?}"
    );
    assert_eq!(
        fs::read(view.join("a/private/deeper/f.npz")).unwrap(),
        b"a/private/deeper/f.npz"
    );
    d.unmount().assert_clean();
}

/// A cache made without `--allow-other` (its index has no modes, and followed the link
/// out) mounted again with it: the source is scanned again, and the view is as above.
#[test]
fn a_cache_from_a_mount_without_allow_other_is_rescanned() {
    if !require_fuse() {
        return;
    }
    let Some(other) = other_user() else { return };
    let s = Scratch::new();
    s.file("c/open.jpg", 0o644);
    s.file("c/mine.jpg", 0o600);
    symlink(s.base.join("secret/key"), s.src().join("c/leak.jpg")).unwrap();
    let (cache, mnt) = (s.base.join("cache"), s.base.join("mnt"));
    let d = Daemon::mount(&s.src(), &cache, &mnt, &["--seed", "3"]);
    assert_eq!(
        fs::read(mnt.join("epoch-0/c/leak.jpg")).unwrap(),
        b"root only"
    );
    d.unmount().assert_clean();

    let d = s.mount(&[]);
    let cat = |rel: &str| as_other(other, "cat \"$1\"", &mnt.join("epoch-0").join(rel));
    assert_reads(&cat("c/open.jpg"), "a public file", b"c/open.jpg");
    assert_refused(&cat("c/mine.jpg"), "a 0600 file");
    assert_missing(&cat("c/leak.jpg"), "a file link out of the source");
    assert_eq!(read_status(&mnt)["source_scan"]["scanned_this_mount"], true);
    d.unmount().assert_clean();
}

/// A sample's source file changed between mounts while its name and size stayed: the
/// remount must not show the cached bytes of the old file (review 1). Root's
/// 0600 file swapped by another user for theirs (0644, same size, its time set to the
/// old one to the nanosecond): on the code before, the remount kept the cached copy and
/// the other user read root's bytes through their own file's mode. A file root rewrites
/// in place with the same size is read anew too, under `--allow-other` and under
/// `--rescan` without it (on the code before, both kept the old bytes).
#[test]
fn a_file_changed_between_mounts_is_not_served_from_the_cache() {
    if !require_fuse() {
        return;
    }
    let Some(other) = other_user() else { return };
    let member = (other.0, share_group());
    let s = Scratch::new();
    s.file("shared/ok.jpg", 0o644);
    s.file("shared/root.jpg", 0o600);
    s.file("shared/edit.jpg", 0o644);
    let dir = s.src().join("shared");
    std::os::unix::fs::chown(&dir, None, Some(member.1)).unwrap();
    chmod(&dir, 0o2775);
    let mnt = s.base.join("mnt");
    let view = mnt.join("epoch-0/shared");
    let d = s.mount(&[]);
    wait_staging_done(&mnt);
    assert_eq!(fs::read(view.join("root.jpg")).unwrap(), b"shared/root.jpg");
    d.unmount().assert_clean();

    let swap = r#"cd "$1" && t=$(stat -c %y root.jpg) && rm -f root.jpg &&
        printf OTHER_USERS_FIL > root.jpg && chmod 644 root.jpg && touch -d "$t" root.jpg"#;
    let out = as_other(member, swap, &dir);
    assert!(out.status.success(), "swap: {out:?}");
    fs::write(dir.join("edit.jpg"), b"SHARED/EDIT.JPG").unwrap();
    let d = s.mount(&[]);
    let cat = |rel: &str| as_other(other, "cat \"$1\"", &view.join(rel));
    assert_reads(
        &cat("root.jpg"),
        "the other user's own file",
        b"OTHER_USERS_FIL",
    );
    assert_reads(
        &cat("edit.jpg"),
        "a file edited in place",
        b"SHARED/EDIT.JPG",
    );
    assert_reads(&cat("ok.jpg"), "an unchanged file", b"shared/ok.jpg");
    assert_eq!(read_status(&mnt)["source_scan"]["dropped"], 2);
    d.unmount().assert_clean();

    // Without --allow-other, --rescan checks the same way.
    fs::write(dir.join("edit.jpg"), b"shared/EDIT.jpg").unwrap();
    let cache = s.base.join("cache");
    let d = Daemon::mount(&s.src(), &cache, &mnt, &["--seed", "3", "--rescan"]);
    assert_eq!(fs::read(view.join("edit.jpg")).unwrap(), b"shared/EDIT.jpg");
    assert_eq!(fs::read(view.join("ok.jpg")).unwrap(), b"shared/ok.jpg");
    d.unmount().assert_clean();
}

/// A partial cache (`--cache-size` below the share) reads samples it does not keep from
/// the source; one refused there (swapped for a link out of the source since the scan) is
/// an I/O error whose reason is logged and shown in the status's problems, and it is
/// counted in `source_errors` (on the code before the log said only
/// that the sample was not in the partial cache, and nothing was counted).
#[test]
fn a_read_refused_beneath_the_source_is_a_counted_source_error() {
    if !require_fuse() {
        return;
    }
    let s = Scratch::new();
    let names: Vec<String> = (0..8).map(|i| format!("c/f{i}.bin")).collect();
    for name in &names {
        let p = s.src().join(name);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, vec![7u8; 100_000]).unwrap();
    }
    let d = s.mount(&["--cache-size", "150000"]);
    let mnt = s.base.join("mnt");
    wait_staging_done(&mnt);
    for name in &names {
        fs::remove_file(s.src().join(name)).unwrap();
        symlink(s.base.join("secret/key"), s.src().join(name)).unwrap();
    }
    let failed = (names.iter())
        .filter(|n| fs::read(mnt.join("epoch-0").join(n)).is_err())
        .count();
    assert!(
        failed >= 7,
        "{failed} of 8 refused (one sample fits the cache)"
    );
    let cache = &read_status(&mnt)["cache"];
    assert!(
        cache["source_errors"].as_u64() >= Some(failed as u64),
        "{cache}"
    );
    let problems = cache["problems"].to_string();
    assert!(problems.contains("link out of the source"), "{problems}");
    d.unmount().assert_clean();
}
