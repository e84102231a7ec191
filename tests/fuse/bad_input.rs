//! Bad input: every refusal exits non-zero, names the offending thing on stderr and leaves
//! no mount behind; problems that are not fatal (a dangling link) are reported instead.

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::common::*;

/// A mount of `source` that must be refused (foreground and detached alike).
#[track_caller]
fn refused(data: &Dataset, source: &Path, mnt: &Path, extra: &[&str]) -> Vec<Refusal> {
    let args = mount_args(source, &data.path("cache"), mnt, extra);
    vec![
        mount_refused(mnt, &args, true),
        mount_refused(mnt, &args, false),
    ]
}

#[track_caller]
fn all_mention(refusals: &[Refusal], needles: &[&str]) {
    for r in refusals {
        for n in needles {
            r.assert_mentions(n);
        }
        assert!(
            r.stderr.contains("shufflefs: "),
            "errors start with \"shufflefs: \":\n{}",
            r.stderr
        );
    }
}

#[test]
fn missing_source() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let src = data.path("no such dataset");
    let r = refused(&data, &src, &data.dir("mnt"), &[]);
    all_mention(&r, &[src.to_str().unwrap(), "does not exist", "--source"]);
}

#[test]
fn source_that_is_a_file() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let src = data.path("dataset.tar");
    fs::write(&src, b"not a folder").unwrap();
    let r = refused(&data, &src, &data.dir("mnt"), &[]);
    all_mention(&r, &[src.to_str().unwrap(), "not a folder"]);
}

#[test]
fn source_without_class_folders() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let empty = data.dir("empty-src");
    let r = refused(&data, &empty, &data.dir("mnt"), &[]);
    all_mention(&r, &[empty.to_str().unwrap(), "no class folders"]);

    // Loose files at the top are not classes either.
    let flat = data.dir("flat-src");
    fs::write(flat.join("a.jpg"), b"x").unwrap();
    fs::write(flat.join("b.jpg"), b"y").unwrap();
    let r = refused(&data, &flat, &data.dir("mnt"), &[]);
    all_mention(&r, &[flat.to_str().unwrap(), "no class folders"]);
}

#[test]
fn source_with_classes_but_no_samples() {
    if !require_fuse() {
        return;
    }
    let data = DatasetBuilder::new()
        .empty_class("cat")
        .empty_class("dog")
        .dangling_link("dog", "gone.jpg")
        .nested_folder("cat", "deeper")
        .build();
    let r = refused(&data, &data.root, &data.dir("mnt"), &[]);
    all_mention(&r, &[data.root.to_str().unwrap(), "no sample files"]);
}

#[test]
fn fraction_outside_zero_to_one() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let mnt = data.dir("mnt");
    for q in ["1.5", "-0.1", "2", "nan", "inf", "abc", ""] {
        let arg = format!("--fraction={q}");
        let r = mount_refused(
            &mnt,
            &mount_args(&data.root, &data.path("cache"), &mnt, &[&arg]),
            true,
        );
        r.assert_mentions("--fraction");
        assert_eq!(
            r.status.code(),
            Some(2),
            "{arg}: a usage error\n{}",
            r.stderr
        );
        assert!(
            !data.path("cache").exists(),
            "{arg}: refused before touching the cache"
        );
    }
    // The ends of the range are fine.
    for q in ["0", "1"] {
        let d = Daemon::mount(
            &data.root,
            &data.path(&format!("cache-{q}")),
            &mnt,
            &["--fraction", q],
        );
        assert_eq!(read_status(&mnt)["fraction"], q.parse::<f64>().unwrap());
        d.unmount().assert_clean();
    }
}

/// A missing mount point is no longer refused (on a cluster only the daemon can
/// create it on its host): the daemon makes it and removes it again when it stops (see
/// `mount_point_made` for the rest).
#[test]
fn missing_mountpoint() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let mnt = data.path("no such mount point");
    let d = Daemon::mount(&data.root, &data.path("cache"), &mnt, &[]);
    assert!(is_mounted(&mnt));
    d.unmount().assert_clean();
    assert!(
        !mnt.exists(),
        "the mount point the daemon made was not removed"
    );
}

#[test]
fn mountpoint_that_is_a_file() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let mnt = data.path("a file");
    fs::write(&mnt, b"x").unwrap();
    let r = refused(&data, &data.root, &mnt, &[]);
    all_mention(&r, &[mnt.to_str().unwrap(), "not a folder"]);
}

#[test]
fn non_empty_mountpoint() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let mnt = data.dir("mnt");
    fs::write(mnt.join("precious.txt"), b"keep me").unwrap();
    let r = refused(&data, &data.root, &mnt, &[]);
    all_mention(&r, &[mnt.to_str().unwrap(), "not empty"]);
    assert_eq!(fs::read(mnt.join("precious.txt")).unwrap(), b"keep me");
}

#[test]
fn busy_mountpoint_is_refused_and_the_first_mount_keeps_serving() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let mnt = data.dir("busy mount ü");
    let first = Daemon::mount(&data.root, &data.path("cache-1"), &mnt, &["--seed", "1"]);
    assert_eq!(mount_count(&mnt), 1);
    for foreground in [true, false] {
        let args = mount_args(&data.root, &data.path("cache-2"), &mnt, &["--seed", "1"]);
        let r = mount_refused(&mnt, &args, foreground);
        r.assert_mentions("busy");
        r.assert_mentions(mnt.to_str().unwrap());
        assert_eq!(mount_count(&mnt), 1, "foreground={foreground}");
    }
    // The first daemon still answers, and it is still the first daemon.
    assert_eq!(read_status(&mnt)["pid"], first.pid());
    assert_eq!(listing(&mnt.join("epoch-0")), data.expected_listing());
    let a = data.sample("cat", "a.jpg");
    assert!(fs::read(mnt.join("current").join(a.rel())).unwrap() == a.bytes());
    first.unmount().assert_clean();
    assert!(!is_mounted(&mnt));
}

#[test]
fn cache_in_use_is_refused_and_the_first_mount_keeps_serving() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("shared cache");
    let mnt1 = data.dir("mnt-1");
    let mnt2 = data.dir("mnt-2");
    let first = Daemon::mount(&data.root, &cache, &mnt1, &["--seed", "1"]);
    wait_staging_done(&mnt1);
    for foreground in [true, false] {
        let args = mount_args(&data.root, &cache, &mnt2, &["--seed", "1"]);
        let r = mount_refused(&mnt2, &args, foreground);
        r.assert_mentions("in use");
        r.assert_mentions(cache.to_str().unwrap());
        r.assert_mentions(&format!("pid {}", first.pid()));
        assert!(!is_mounted(&mnt2));
    }
    // Same refusal with other settings: the lock is checked before anything is compared.
    let args = mount_args(&data.root, &cache, &mnt2, &["--seed", "2", "--reset-cache"]);
    mount_refused(&mnt2, &args, true).assert_mentions("in use");

    // The first daemon is untouched: same process, same epoch, all bytes, cache intact.
    let s = read_status(&mnt1);
    assert_eq!(s["pid"], first.pid());
    assert_eq!(s["seed"], 1);
    assert_eq!(s["cache"]["files"], data.samples.len());
    assert_eq!(listing(&mnt1.join("epoch-0")), data.expected_listing());
    for smp in &data.samples {
        let got = fs::read(mnt1.join("epoch-0").join(smp.rel())).unwrap();
        assert!(got == smp.bytes(), "{} differs", smp.rel().display());
    }
    write_epoch(&mnt1, "1").unwrap();
    assert_eq!(read_epoch(&mnt1), 1);
    first.unmount().assert_clean();

    // Once the first is gone the cache is free again.
    let second = Daemon::mount(&data.root, &cache, &mnt2, &["--seed", "1"]);
    assert_eq!(second.ready_epoch(), 1);
    second.unmount().assert_clean();
}

#[test]
fn cache_folder_that_cannot_be_created() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let blocker = data.path("a file");
    fs::write(&blocker, b"x").unwrap();
    let cache = blocker.join("cache");
    let mnt = data.dir("mnt");
    for foreground in [true, false] {
        let r = mount_refused(&mnt, &mount_args(&data.root, &cache, &mnt, &[]), foreground);
        r.assert_mentions("cache folder");
        r.assert_mentions(cache.to_str().unwrap());
    }
}

#[test]
fn dangling_link_and_nested_folder_are_reported_not_fatal() {
    if !require_fuse() {
        return;
    }
    let data = DatasetBuilder::new()
        .class("cat", &[("a.jpg", 100), ("b.jpg", 200)])
        .class("dog", &[("c.jpg", 300)])
        .dangling_link("cat", "gone.jpg")
        .nested_folder("dog", "puppies")
        .build();
    let mnt = data.dir("mnt");
    let d = Daemon::mount(&data.root, &data.path("cache"), &mnt, &[]);
    assert!(d.ready_line.contains("3 samples of 3"), "{}", d.ready_line);
    assert_eq!(listing(&mnt.join("epoch-0")), data.expected_listing());
    assert_not_found(
        fs::metadata(mnt.join("epoch-0/cat/gone.jpg")),
        "dangling link",
    );
    assert_not_found(
        fs::metadata(mnt.join("epoch-0/dog/puppies")),
        "nested folder",
    );
    let s = wait_staging_done(&mnt);
    assert_eq!(s["staging"]["errors"], 0);
    let skipped = s["skipped"].as_array().expect("skipped is a list");
    let find = |p: &Path| {
        skipped
            .iter()
            .find(|e| e["path"] == p.to_str().unwrap())
            .unwrap_or_else(|| panic!("{} not in skipped:\n{s:#}", p.display()))["reason"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(find(&data.dangling[0]).contains("dangling"));
    assert!(find(&data.nested[0]).contains("nested folder"));
    assert_eq!(skipped.len(), 2, "{s:#}");
    let stopped = d.unmount();
    stopped.assert_clean();
    assert!(
        stopped.stderr.contains("dangling symlink"),
        "the log names the skipped link:\n{}",
        stopped.stderr
    );
}

#[test]
fn remount_with_other_fraction_or_source_is_refused() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let other = DatasetBuilder::new().class("cat", &[("z.jpg", 10)]).build();
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    let d = Daemon::mount(
        &data.root,
        &cache,
        &mnt,
        &["--seed", "1", "--fraction", "0.3"],
    );
    write_epoch(&mnt, "1").unwrap();
    d.unmount().assert_clean();

    let r = mount_refused(
        &mnt,
        &mount_args(
            &data.root,
            &cache,
            &mnt,
            &["--seed", "1", "--fraction", "0.5"],
        ),
        true,
    );
    r.assert_mentions("--fraction");
    r.assert_mentions("--reset-cache");
    let r = mount_refused(
        &mnt,
        &mount_args(
            &other.root,
            &cache,
            &mnt,
            &["--seed", "1", "--fraction", "0.3"],
        ),
        true,
    );
    r.assert_mentions("--source");
    r.assert_mentions(other.root.to_str().unwrap());

    // The refusals did not spoil the cache: the old settings resume.
    let d = Daemon::mount(
        &data.root,
        &cache,
        &mnt,
        &["--seed", "1", "--fraction", "0.3"],
    );
    assert_eq!(d.ready_epoch(), 1);
    d.unmount().assert_clean();

    // --reset-cache takes the new source.
    let d = Daemon::mount(
        &other.root,
        &cache,
        &mnt,
        &["--seed", "1", "--fraction", "0.3", "--reset-cache"],
    );
    assert_eq!(d.ready_epoch(), 0);
    assert_eq!(listing(&mnt.join("epoch-0")), other.expected_listing());
    let z = other.sample("cat", "z.jpg");
    assert!(fs::read(mnt.join("epoch-0").join(z.rel())).unwrap() == z.bytes());
    d.unmount().assert_clean();
}

#[test]
fn unreadable_cache_state_is_refused_clearly() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "1"]);
    d.unmount().assert_clean();
    fs::write(cache.join("state.json"), b"{ not json").unwrap();
    let r = mount_refused(
        &mnt,
        &mount_args(&data.root, &cache, &mnt, &["--seed", "1"]),
        true,
    );
    r.assert_mentions(cache.to_str().unwrap());
    r.assert_mentions("state");
}

#[test]
fn reset_cache_recovers_an_unreadable_state() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "1"]);
    d.unmount().assert_clean();
    fs::write(cache.join("state.json"), b"{ not json").unwrap();
    let r = mount_refused(
        &mnt,
        &mount_args(&data.root, &cache, &mnt, &["--seed", "1"]),
        true,
    );
    r.assert_mentions("--reset-cache");
    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "1", "--reset-cache"]);
    assert_eq!(d.ready_epoch(), 0);
    assert_eq!(listing(&mnt.join("epoch-0")), data.expected_listing());
    d.unmount().assert_clean();
}

#[test]
fn unmount_of_a_folder_that_is_not_mounted() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let dir = data.dir("plain");
    let out = run_with_timeout(
        shufflefs().arg("unmount").arg(&dir),
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not mounted"), "{err}");
    assert!(err.contains(dir.to_str().unwrap()), "{err}");
}

#[test]
fn unmount_with_an_open_file_fails_and_the_view_keeps_working() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let mnt = data.dir("mnt");
    let d = Daemon::mount(&data.root, &data.path("cache"), &mnt, &[]);
    let held = fs::File::open(mnt.join("epoch-0/cat/a.jpg")).unwrap();
    let out = run_with_timeout(
        shufflefs()
            .arg("unmount")
            .arg("--timeout")
            .arg("5")
            .arg(&mnt),
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "unmount with a file open succeeded");
    assert!(err.contains("close"), "the error says what to do:\n{err}");
    assert!(is_mounted(&mnt));
    assert_eq!(read_status(&mnt)["pid"], d.pid());
    drop(held);
    assert_eq!(listing(&mnt.join("epoch-0")), data.expected_listing());
    d.unmount().assert_clean();
}

/// Source files that changed or vanished after the scan. The scan records no sizes, so a
/// file changed before its first read is simply served as it now is; one that vanished is
/// reported by staging (count, message naming the file) and its reads fail with EIO, while
/// everything else is served, in this epoch and the next.
#[test]
fn source_file_changed_or_vanished_after_the_scan_is_reported() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "3"]);
    wait_staging_done(&mnt);
    d.unmount().assert_clean();
    // The remount reuses the saved manifest (no rescan); with the cache files gone it must
    // copy everything again, and meets the changes.
    for f in fs::read_dir(cache.join("samples")).unwrap() {
        fs::remove_file(f.unwrap().path()).unwrap();
    }
    fs::write(data.root.join("cat/a.jpg"), b"now a different size").unwrap();
    fs::remove_file(data.root.join("cat/b.jpg")).unwrap();
    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "3"]);
    // Not `files_done + errors == files_total` alone: that holds at 0 == 0 before staging starts.
    let s = wait_for_status(&mnt, "staging to finish", |s| {
        let st = &s["staging"];
        matches!(st["state"].as_str(), Some("done" | "incomplete"))
            && st["files_done"].as_u64().unwrap() + st["errors"].as_u64().unwrap()
                == st["files_total"].as_u64().unwrap()
    });
    assert_eq!(s["staging"]["errors"], 1, "{s:#}");
    let problems = s["cache"]["problems"].to_string();
    assert!(problems.contains("b.jpg"), "{s:#}");
    let e0 = mnt.join("epoch-0");
    assert_eq!(
        fs::read(e0.join("cat/a.jpg")).unwrap(),
        b"now a different size"
    );
    assert_eq!(fs::metadata(e0.join("cat/a.jpg")).unwrap().len(), 20);
    for s in &data.samples {
        let path = e0.join(s.rel());
        if s.name == "b.jpg" {
            assert_errno(fs::read(&path), libc::EIO, &s.name);
        } else if s.name != "a.jpg" && fs::metadata(&path).is_ok() {
            assert!(
                fs::read(&path).unwrap() == s.bytes(),
                "{}",
                s.rel().display()
            );
        }
    }
    // The next epoch still holds the vanished sample: the advance reports it and goes on.
    fs::write(mnt.join(".shufflefs/epoch"), "1").expect("advance despite one missing sample");
    let e1 = mnt.join("epoch-1");
    assert_errno(
        fs::read(e1.join("cat/b.jpg")),
        libc::EIO,
        "b.jpg in epoch-1",
    );
    for s in data
        .samples
        .iter()
        .filter(|s| !["a.jpg", "b.jpg"].contains(&&*s.name))
    {
        assert!(
            fs::read(e1.join(s.rel())).unwrap() == s.bytes(),
            "{}",
            s.rel().display()
        );
    }
    d.unmount().assert_clean();
}

/// A cache written by another format version is refused, saying so, until `--reset-cache`.
#[test]
fn cache_of_another_format_version_is_refused_unless_reset() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "1"]);
    d.unmount().assert_clean();
    let state = fs::read_to_string(cache.join("state.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&state).unwrap();
    v["format"] = 999.into();
    fs::write(cache.join("state.json"), v.to_string()).unwrap();
    let r = mount_refused(
        &mnt,
        &mount_args(&data.root, &cache, &mnt, &["--seed", "1"]),
        true,
    );
    r.assert_mentions("format version");
    r.assert_mentions("--reset-cache");
    assert_eq!(
        fs::read_to_string(cache.join("state.json")).unwrap(),
        v.to_string(),
        "a refused mount changed the cache"
    );
    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "1", "--reset-cache"]);
    assert_eq!(read_status(&mnt)["epoch"], 0);
    d.unmount().assert_clean();
}

/// The saved manifest is a shortcut, written without fsync: one lost to a crash may leave an
/// older, valid manifest behind. A start must notice that it does not match the state file
/// (by fingerprint) and rescan the source, not refuse the cache as "built with other settings".
#[test]
fn a_stale_saved_manifest_is_ignored_and_the_source_rescanned() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    Daemon::mount(&data.root, &cache, &mnt, &["--seed", "3"])
        .unmount()
        .assert_clean();
    let old = fs::read(cache.join("manifest.bin")).unwrap();
    // The source gains a sample; the cache is rebuilt for it, then its manifest is "lost".
    fs::write(data.root.join("cat/new.jpg"), b"a new sample").unwrap();
    let args = ["--seed", "3", "--reset-cache"];
    Daemon::mount(&data.root, &cache, &mnt, &args)
        .unmount()
        .assert_clean();
    fs::write(cache.join("manifest.bin"), &old).unwrap();
    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "3"]);
    let cat = names(&mnt.join("epoch-0/cat"));
    assert!(cat.contains("new.jpg"), "{cat:?}");
    assert_eq!(
        fs::read(mnt.join("epoch-0/cat/new.jpg")).unwrap(),
        b"a new sample"
    );
    d.unmount().assert_clean();
}

/// One write to the control file is one epoch number: a shell's `printf "1\n2\n3"` writes
/// each line on its own, and only the first advances (the second fails with EINVAL).
#[test]
fn one_write_through_one_open_is_one_epoch() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let mnt = data.dir("mnt");
    let d = Daemon::mount(&data.root, &data.path("cache"), &mnt, &["--seed", "1"]);
    let status = std::process::Command::new("bash")
        .arg("-c")
        .arg("printf '1\\n2\\n3' > \"$1\"")
        .arg("bash")
        .arg(mnt.join(".shufflefs/epoch"))
        .status()
        .unwrap();
    assert!(!status.success(), "the second line's write fails");
    assert_eq!(read_epoch(&mnt), 1, "one open advanced once");
    assert_errno(
        write_epoch(&mnt, "2\n3\n"),
        libc::EINVAL,
        "two numbers in one write",
    );
    assert_eq!(read_epoch(&mnt), 1);
    write_epoch(&mnt, "2").expect("a plain advance still works");
    d.unmount().assert_clean();
}

/// A second daemon on a held cache names the holder's pid and the `{rank}` template.
#[test]
fn a_held_cache_names_its_pid_and_the_rank_template() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let (mnt1, mnt2) = (data.dir("mnt-1"), data.dir("mnt-2"));
    let first = Daemon::mount(&data.root, &cache, &mnt1, &[]);
    let r = mount_refused(&mnt2, &mount_args(&data.root, &cache, &mnt2, &[]), true);
    r.assert_mentions(&format!("(pid {})", first.pid()));
    r.assert_mentions("--cache /path/sfs-{rank}");
    first.unmount().assert_clean();
}

/// The same source by another path (a symlink, a trailing slash) is the same source: the cache resumes with its seed. Another source without --seed is refused
/// without a "--seed" line (no seed was given).
#[test]
fn the_same_source_by_another_path_resumes() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let (cache, mnt) = (data.path("cache"), data.dir("mnt"));
    let first = Daemon::mount(&data.root, &cache, &mnt, &[]);
    let seed = read_status(&mnt)["seed"].clone();
    first.unmount().assert_clean();
    let link = data.path("link");
    std::os::unix::fs::symlink(&data.root, &link).unwrap();
    let slash = format!("{}/", data.root.display());
    for source in [link.clone(), slash.into()] {
        let d = Daemon::mount(&source, &cache, &mnt, &[]);
        assert_eq!(read_status(&mnt)["seed"], seed, "{}", source.display());
        d.unmount().assert_clean();
    }

    let other = DatasetBuilder::new().class("x", &[("a", 10)]).build();
    let r = mount_refused(&mnt, &mount_args(&other.root, &cache, &mnt, &[]), true);
    r.assert_mentions("--source");
    assert!(!r.stderr.contains("--seed"), "{}", r.stderr);
}

#[test]
fn options_that_cannot_apply_are_refused() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let mnt = data.dir("mnt");
    let r = refused(&data, &data.root, &mnt, &["--part-size", "1M"]);
    all_mention(&r, &["--part-size applies to record sources"]);
    let r = refused(&data, &data.root, &mnt, &["--exchange-rate", "0"]);
    all_mention(&r, &["--exchange-rate 0"]);
    assert!(!data.path("cache").exists());
}

/// A `--cache-size` larger than the cache's disk is cut to what the disk gives: under
/// `--require-fit` a share that does not fit the disk is refused, naming the filesystem's
/// numbers and the fix (a 1 GB size on a 512 kB tmpfs used to mount as "fits" and stage
/// into a full disk). Needs root (tmpfs).
#[test]
fn a_cache_size_larger_than_the_disk_is_refused_under_require_fit() {
    if !require_fuse() || !require_root("mounts a small tmpfs as the cache") {
        return;
    }
    let data = standard_dataset();
    let cache = data.dir("cache");
    let flags = nix::mount::MsFlags::empty();
    nix::mount::mount(
        Some("tmpfs"),
        &cache,
        Some("tmpfs"),
        flags,
        Some("size=512k"),
    )
    .unwrap();
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _tmpfs = Unmount(cache);
    let extra = ["--cache-size", "1G", "--require-fit"];
    let r = refused(&data, &data.root, &data.dir("mnt"), &extra);
    all_mention(
        &r,
        &[
            "--require-fit: this rank's share needs up to",
            "--cache-size 1073.7 MB is more than the cache's filesystem can give",
            "of reads would hit",
            "or give --cache-size",
        ],
    );
}

/// A start refused after it made and locked its cache (here: the `--metrics-file` check,
/// which comes after the cache is taken) removes the cache folder it made, foreground and
/// detached (before, `.shufflefs-cache` and `LOCK` stayed); a cache that was there before
/// (an earlier mount's) is kept whole.
#[test]
fn a_refused_start_removes_the_cache_it_made_and_only_that() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let bad = ["--metrics-file", "/nonexistent-folder/m.prom"];
    for r in refused(&data, &data.root, &data.dir("mnt"), &bad) {
        r.assert_mentions("does not exist");
        // Foreground and detached alike: the detached daemon's log and its folder went too
        // (they once stayed).
        assert!(!data.path("cache").exists(), "the made cache folder stayed");
    }
    // A cache folder three levels down, none of which existed: none stays.
    let deep = data.path("deep/a/b");
    let mut mount = shufflefs();
    mount
        .arg("mount")
        .arg("--source")
        .arg(&data.root)
        .arg("--cache")
        .arg(&deep);
    let out = mount.args(bad).arg(data.dir("mnt")).output().unwrap();
    assert!(!out.status.success());
    assert!(
        !data.path("deep").exists(),
        "the folders made for the cache stayed"
    );
    Daemon::mount(&data.root, &data.path("cache"), &data.dir("mnt"), &[])
        .unmount()
        .assert_clean();
    let names = || -> std::collections::BTreeSet<_> {
        (fs::read_dir(data.path("cache")).unwrap())
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "shufflefs.log") // the detached daemon's, added
            .collect()
    };
    let before = names();
    refused(&data, &data.root, &data.dir("mnt"), &bad);
    assert!(
        data.path("cache/state.json").is_file(),
        "an earlier cache was removed"
    );
    assert_eq!(names(), before);
}

/// `--cache-size 1` (a forgotten unit) is refused naming the unit, foreground and detached;
/// before, it mounted with "0.0 MB of cache".
#[test]
fn a_cache_size_without_its_unit_is_refused() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    for r in refused(&data, &data.root, &data.dir("mnt"), &["--cache-size", "1"]) {
        r.assert_mentions("--cache-size");
        r.assert_mentions("a number without a unit counts bytes");
        r.assert_mentions("e.g. 1G or 1M");
    }
    assert!(
        !data.path("cache").exists(),
        "a refused mount made its cache"
    );
}

/// A share larger than `--cache-size` under `--require-fit` is refused, foreground and
/// detached, naming what the share needs, what the cache holds, the hit rate a partial cache
/// would give and the way out; nothing is mounted.
#[test]
fn a_share_that_does_not_fit_is_refused_under_require_fit() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let extra = ["--cache-size", "1K", "--require-fit"];
    let r = refused(&data, &data.root, &data.dir("mnt"), &extra);
    all_mention(
        &r,
        &[
            "--require-fit: this rank's share needs up to",
            "(--cache-size)",
            "of reads would hit",
            "drop --require-fit",
        ],
    );
    // The cache it made is gone again, but for a detached daemon's log.
    let left: Vec<_> = std::fs::read_dir(data.path("cache"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.iter().all(|n| n == "shufflefs.log"), "{left:?}");
}

#[test]
fn metrics_file_in_a_missing_folder_or_over_a_users_file() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let missing = data.path("nofolder");
    let template = missing.join("m-{rank}.prom");
    let extra = ["--metrics-file", template.to_str().unwrap()];
    let r = refused(&data, &data.root, &data.dir("mnt"), &extra);
    all_mention(
        &r,
        &[missing.to_str().unwrap(), "does not exist", "mkdir -p"],
    );

    // A user's own file at the path is never overwritten.
    let theirs = data.path("m-0.prom");
    fs::write(&theirs, "my own data").unwrap();
    let template = data.path("m-{rank}.prom");
    let extra = ["--metrics-file", template.to_str().unwrap()];
    let r = refused(&data, &data.root, &data.dir("mnt"), &extra);
    all_mention(&r, &[theirs.to_str().unwrap(), "never overwrites"]);
    assert_eq!(fs::read_to_string(&theirs).unwrap(), "my own data");
}
