//! Bad input to `--format tree` and `--replicate` with one real mount: a folder the daemon
//! cannot list (refused, naming the folder, no mount left behind, even when the test runs as
//! root), symlink loops (skipped and named in the status, the rest served), and a side-file
//! glob that matches a file the scan would otherwise take as a sample (the file is taken out
//! of the samples and shown whole: a side file, never also a sample); a glob naming a folder
//! is refused with the glob that takes its files.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::time::Duration;

use crate::common::trees::{walk, write_tree};
use crate::common::*;

/// `shufflefs mount --foreground? ARGS` run without the capabilities that let root list any
/// folder (so a 0o000 folder is unreadable to it as to any user); must be refused.
fn refused_without_dac(mnt: &Path, args: &[std::ffi::OsString], foreground: bool) -> String {
    let before = mount_count(mnt);
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args([
        "--bounding-set",
        "-dac_override,-dac_read_search",
        BIN,
        "mount",
    ]);
    if foreground {
        cmd.arg("--foreground");
    }
    let out = run_with_timeout(cmd.args(args), Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if mount_count(mnt) > before {
        force_unmount(mnt);
        panic!("a refused mount left a mount behind at {}", mnt.display());
    }
    assert!(!out.status.success(), "should be refused:\n{stderr}");
    stderr
}

#[test]
fn an_unreadable_folder_deep_in_a_tree_is_refused_naming_it() {
    if !require_fuse() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let files = [("a/b/x.flac".to_string(), 10), ("y.flac".to_string(), 10)];
    write_tree(tmp.path(), &files, &["a/b/c/locked"]);
    let src = tmp.path().join("src");
    let locked = src.join("a/b/c/locked");
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o000)).unwrap();
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let args = mount_args(&src, &tmp.path().join("cache"), &mnt, &["--format", "tree"]);
    let probe = std::process::Command::new("setpriv")
        .args(["--bounding-set", "-dac_override,-dac_read_search", "ls"])
        .arg(&locked)
        .output();
    if !probe.is_ok_and(|o| !o.status.success()) {
        eprintln!("skipped: setpriv cannot take away the right to list any folder here");
        fs::set_permissions(&locked, fs::Permissions::from_mode(0o755)).unwrap();
        return;
    }
    for foreground in [true, false] {
        let stderr = refused_without_dac(&mnt, &args, foreground);
        for needle in ["shufflefs: ", locked.to_str().unwrap(), "Permission denied"] {
            assert!(stderr.contains(needle), "should name {needle:?}:\n{stderr}");
        }
    }
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn symlink_loops_are_skipped_and_named_and_the_rest_is_served() {
    if !require_fuse() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let files = [("a/x.flac".to_string(), 10), ("b/y.flac".to_string(), 20)];
    write_tree(tmp.path(), &files, &[]);
    let src = tmp.path().join("src");
    let expected = walk(&src);
    symlink("..", src.join("a/up")).unwrap(); // a folder loop
    symlink("self.flac", src.join("b/self.flac")).unwrap(); // a link to itself
    symlink("pong.flac", src.join("b/ping.flac")).unwrap(); // two links to each other
    symlink("ping.flac", src.join("b/pong.flac")).unwrap();
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let d = Daemon::mount(&src, &tmp.path().join("cache"), &mnt, &["--format", "tree"]);
    let view = walk(&mnt.join("epoch-0"));
    assert_eq!(view.dirs, expected.dirs);
    assert_eq!(view.files, expected.files);
    let st = read_status(&mnt);
    let skipped = st["skipped"].as_array().expect("skipped is a list");
    let reason = |rel: &str| {
        let path = src.join(rel);
        let hit = skipped.iter().find(|e| e["path"] == path.to_str().unwrap());
        let hit = hit.unwrap_or_else(|| panic!("{rel} not in skipped:\n{st:#}"));
        hit["reason"].as_str().unwrap().to_string()
    };
    assert!(reason("a/up").contains("symlink to a folder"), "{st:#}");
    for rel in ["b/self.flac", "b/ping.flac", "b/pong.flac"] {
        let why = reason(rel);
        assert!(
            why.contains("Too many levels of symbolic links"),
            "{rel}: {why}"
        );
    }
    assert_eq!(skipped.len(), 4, "{st:#}");
    d.unmount();
}

/// `--replicate` naming files that the scan would also take as samples (a sample-shaped
/// `.npz` in the middle of the samples, and a whole folder of them by `**`): each such file is
/// a side file only: whole on the rank, in no share, not counted in `samples`.
#[test]
fn a_glob_matching_sample_files_takes_them_out_of_the_samples() {
    if !require_fuse() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let files: Vec<_> = (0..6)
        .map(|i| (format!("train/{i}.npz"), 100 + i))
        .chain((0..2).map(|i| (format!("norm/{i}.npz"), 50)))
        .collect();
    write_tree(tmp.path(), &files, &[]);
    let src = tmp.path().join("src");
    let expected = walk(&src);
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let extra = [
        "--format",
        "tree",
        "--replicate",
        "train/3.npz",
        "--replicate",
        "**/norm/*.npz",
    ];
    let d = Daemon::mount(&src, &tmp.path().join("cache"), &mnt, &extra);
    for epoch in 0..2 {
        let view = walk(&mnt.join(format!("epoch-{epoch}")));
        assert_eq!(view.files, expected.files, "epoch {epoch}");
    }
    let st = read_status(&mnt);
    assert_eq!(
        st["samples"], 5,
        "6 + 2 files, 3 of them side files: {st:#}"
    );
    assert_eq!(st["replicated"]["files"], 3, "{st:#}");
    assert_eq!(st["replicated"]["bytes"], 103 + 100, "{st:#}");
    d.unmount();
}

/// A glob naming a folder (`--replicate annotations`, where the files were meant) is refused
/// with the globs that take its files, and leaves no mount behind.
#[test]
fn a_replicate_glob_naming_a_folder_is_refused_with_the_glob_to_use() {
    if !require_fuse() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let files = [
        ("annotations/a.json".to_string(), 10),
        ("train/x.jpg".to_string(), 20),
    ];
    write_tree(tmp.path(), &files, &[]);
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let extra = ["--format", "tree", "--replicate", "annotations"];
    let args = mount_args(
        &tmp.path().join("src"),
        &tmp.path().join("cache"),
        &mnt,
        &extra,
    );
    for foreground in [true, false] {
        let r = mount_refused(&mnt, &args, foreground);
        r.assert_mentions("--replicate \"annotations\" names a folder");
        r.assert_mentions("'annotations/*'");
    }
}
