//! One rank, real FUSE mounts: the view's names and bytes, read-only-ness, the epoch control
//! file and advancing by lookup, the status document, detached mode, and remounts.
//!
//! Every test makes its own dataset, cache and mount point in a temp folder, and its
//! `Daemon` guard unmounts even when an assertion fails.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::common::*;
use serde_json::Value;

fn set<const N: usize>(items: [&str; N]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn libc_result(rc: i32) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn truncate(p: &Path, len: i64) -> io::Result<()> {
    let c = cpath(p);
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    libc_result(unsafe { libc::truncate(c.as_ptr(), len) })
}

fn access_write(p: &Path) -> io::Result<()> {
    let c = cpath(p);
    // SAFETY: as above.
    libc_result(unsafe { libc::access(c.as_ptr(), libc::W_OK) })
}

fn chown_self(p: &Path) -> io::Result<()> {
    let c = cpath(p);
    // SAFETY: as above; getuid/getgid cannot fail.
    libc_result(unsafe { libc::chown(c.as_ptr(), libc::getuid(), libc::getgid()) })
}

/// Reads up to `buf.len()` bytes at `offset`, looping over short reads.
fn read_at_full(f: &File, buf: &mut [u8], offset: u64) -> usize {
    let mut filled = 0;
    while filled < buf.len() {
        match f.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => panic!("read_at({offset}): {e}"),
        }
    }
    filled
}

fn state_json(cache: &Path) -> Value {
    serde_json::from_slice(&fs::read(cache.join("state.json")).expect("read state.json"))
        .expect("state.json is JSON")
}

fn mount_std(data: &Dataset, extra: &[&str]) -> Daemon {
    Daemon::mount(&data.root, &data.path("cache"), &data.dir("mnt"), extra)
}

/// Every sample under `view` (an `epoch-N/` or `current/`) has the source's bytes, read
/// whole and in pieces at odd offsets.
fn check_all_bytes(view: &Path, data: &Dataset) {
    for s in &data.samples {
        let p = view.join(s.rel());
        let whole = fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        assert_eq!(whole.len() as u64, s.size, "{} length", p.display());
        assert!(
            whole == s.bytes(),
            "{} differs from the source",
            p.display()
        );
        let f = File::open(&p).unwrap();
        let size = s.size;
        for (off, len) in [
            (0, 1),
            (1, 10),
            (size / 2, 100),
            (size.saturating_sub(1), 10),
            (size, 10),
            (size + 100, 10),
            (0, size + 50),
            (size / 3, 131_073),
        ] {
            let mut buf = vec![0u8; len as usize];
            let n = read_at_full(&f, &mut buf, off);
            assert!(
                buf[..n] == s.range(off, len)[..],
                "{}: {len} bytes at {off} differ (got {n} bytes)",
                p.display()
            );
        }
    }
}

#[test]
fn lists_every_class_and_sample() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let d = mount_std(&data, &["--seed", "1"]);
    let mnt = d.mnt.clone();
    let n = data.samples.len();
    assert_eq!(
        d.ready_line,
        format!(
            "shufflefs: rank 0 of 1 mounted {} (epoch 0, {n} samples of {n})",
            mnt.display()
        )
    );
    assert!(is_mounted(&mnt));

    assert_eq!(names(&mnt), set([".shufflefs", "current", "epoch-0"]));
    assert_eq!(
        names(&mnt.join(".shufflefs")),
        set(["epoch", "metrics", "status"])
    );
    let expected = data.expected_listing();
    assert!(expected["empty"].is_empty() && expected["many"].len() == 150);
    assert_eq!(listing(&mnt.join("epoch-0")), expected);
    assert_eq!(
        fs::read_link(mnt.join("current")).unwrap(),
        Path::new("epoch-0")
    );
    assert!(
        fs::symlink_metadata(mnt.join("current"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(listing(&mnt.join("current")), expected);

    for class in &data.classes {
        let m = fs::metadata(mnt.join("epoch-0").join(class)).unwrap();
        assert!(m.is_dir(), "{class}");
        assert_eq!(m.permissions().mode() & 0o7777, 0o555, "{class}");
    }
    for s in &data.samples {
        let p = mnt.join("epoch-0").join(s.rel());
        let m = fs::metadata(&p).unwrap_or_else(|e| panic!("lookup {}: {e}", p.display()));
        assert!(m.is_file(), "{}", p.display());
        assert_eq!(m.len(), s.size, "{}", p.display());
        assert_eq!(m.permissions().mode() & 0o7777, 0o444, "{}", p.display());
    }
    // Names with spaces and non-ASCII resolve directly, not only through a listing.
    for rel in [
        "dog house/spaced name.png",
        "dog house/ünïcødé.jpg",
        "dog house/日本語.bin",
        "ñandú/x",
    ] {
        assert!(mnt.join("epoch-0").join(rel).is_file(), "{rel}");
    }

    let e0 = mnt.join("epoch-0");
    assert_not_found(fs::metadata(e0.join("dog house/gone.jpg")), "dangling link");
    assert_not_found(fs::metadata(e0.join("cat/nope.jpg")), "missing sample");
    assert_not_found(fs::metadata(e0.join("CAT")), "class names are exact");
    assert_not_found(
        fs::metadata(e0.join("empty/a.jpg")),
        "sample of empty class",
    );
    assert_not_found(fs::metadata(mnt.join("epoch-00")), "non-canonical epoch");
    assert_not_found(fs::metadata(mnt.join("epoch-2")), "epoch two ahead");
    assert_not_found(fs::metadata(mnt.join("epoch-x")), "junk epoch name");
    assert_not_found(fs::metadata(mnt.join("nothing")), "junk at the root");
    assert_not_found(
        fs::metadata(mnt.join(".shufflefs/nothing")),
        "junk in .shufflefs",
    );
    assert_errno(
        fs::metadata(e0.join("cat/a.jpg/x")),
        libc::ENOTDIR,
        "a sample is not a folder",
    );
    assert_errno(
        fs::read_dir(e0.join("cat/a.jpg")),
        libc::ENOTDIR,
        "readdir of a sample",
    );
    // None of the lookups above moved the epoch.
    assert_eq!(read_epoch(&mnt), 0);
    d.unmount().assert_clean();
    assert!(!is_mounted(&mnt));
}

#[test]
fn reads_match_the_source() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let d = mount_std(&data, &["--seed", "2"]);
    let mnt = d.mnt.clone();
    check_all_bytes(&mnt.join("epoch-0"), &data);
    check_all_bytes(&mnt.join("current"), &data);
    // The source files hold what the dataset builder says (so the comparison means something).
    for s in &data.samples {
        assert!(fs::read(data.root.join(s.rel())).unwrap() == s.bytes());
    }

    // Sequential reads in odd-sized chunks, with seeks, through one handle.
    let large = data.sample("cat", "large.bin");
    let mut f = File::open(mnt.join("epoch-0").join(large.rel())).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4093];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got == large.bytes(), "chunked read of large.bin differs");
    f.seek(SeekFrom::Start(123_457)).unwrap();
    let mut tail = Vec::new();
    f.read_to_end(&mut tail).unwrap();
    assert!(tail == large.range(123_457, u64::MAX / 2));
    f.seek(SeekFrom::End(-10)).unwrap();
    let mut last = [0u8; 32];
    let n = f.read(&mut last).unwrap();
    assert_eq!(&last[..n], &large.range(large.size - 10, 10)[..]);
    drop(f);

    // Many readers at once, each in its own order.
    std::thread::scope(|scope| {
        for t in 0..4usize {
            let (data, mnt) = (&data, &mnt);
            scope.spawn(move || {
                let mut order: Vec<&Sample> = data.samples.iter().collect();
                let shift = t * order.len() / 4;
                order.rotate_left(shift);
                if t % 2 == 1 {
                    order.reverse();
                }
                for s in order {
                    let got = fs::read(mnt.join("current").join(s.rel())).unwrap();
                    assert!(
                        got == s.bytes(),
                        "thread {t}: {} differs",
                        s.rel().display()
                    );
                }
            });
        }
    });

    let s = read_status(&mnt);
    assert_eq!(s["cache"]["source_errors"], 0, "{s:#}");
    assert_eq!(s["staging"]["errors"], 0, "{s:#}");
    d.unmount().assert_clean();
}

#[test]
fn reads_match_the_source_without_passthrough() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let d = mount_std(&data, &["--seed", "3", "--read-path", "daemon"]);
    check_all_bytes(&d.mnt.join("epoch-0"), &data);
    check_all_bytes(&d.mnt.join("current"), &data);
    d.unmount().assert_clean();
}

#[test]
fn reads_before_staging_reaches_a_sample_fetch_it() {
    if !require_fuse() {
        return;
    }
    // One staging thread and many samples: early reads race the background copy.
    let data = DatasetBuilder::new()
        .numbered_class("a", 200, |i| 1000 + i as u64)
        .numbered_class("b", 200, |i| 3000 - i as u64)
        .build();
    let d = mount_std(&data, &["--seed", "4", "--staging-threads", "1"]);
    for s in data.samples.iter().rev() {
        let got = fs::read(d.mnt.join("epoch-0").join(s.rel())).unwrap();
        assert!(got == s.bytes(), "{} differs", s.rel().display());
    }
    let s = wait_staging_done(&d.mnt);
    // However the race went, each sample was copied from the source exactly once.
    assert_eq!(
        s["cache"]["fetched_from_source"],
        data.samples.len(),
        "{s:#}"
    );
    assert_eq!(s["cache"]["files"], data.samples.len(), "{s:#}");
    assert_eq!(s["cache"]["bytes"], data.total_bytes(), "{s:#}");
    d.unmount().assert_clean();
}

#[test]
fn view_is_read_only() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    // Opens for writing fail at the open with passthrough; with page-cache (which `auto`
    // picks for these small files) the kernel opens without asking and the write fails:
    // tests/fuse/page_cache.rs.
    let d = mount_std(&data, &["--seed", "5", "--read-path", "passthrough"]);
    let mnt = d.mnt.clone();
    let e0 = mnt.join("epoch-0");
    let f = e0.join("cat/a.jpg");
    let rofs = |r: io::Result<()>, what: &str| assert_errno(r, libc::EROFS, what);
    let open = |p: &Path, o: &mut OpenOptions| o.open(p).map(drop);

    rofs(
        open(
            &e0.join("cat/new.jpg"),
            File::options().write(true).create(true),
        ),
        "create in a class",
    );
    rofs(
        open(
            &e0.join("new"),
            File::options().write(true).create_new(true),
        ),
        "create in an epoch folder",
    );
    rofs(
        open(&mnt.join("new"), File::options().write(true).create(true)),
        "create at the root",
    );
    rofs(
        open(
            &mnt.join(".shufflefs/new"),
            File::options().write(true).create(true),
        ),
        "create in .shufflefs",
    );
    rofs(
        open(&f, File::options().write(true)),
        "open a sample for writing",
    );
    rofs(
        open(&f, File::options().read(true).write(true)),
        "open a sample read-write",
    );
    rofs(
        open(&f, File::options().append(true)),
        "open a sample for appending",
    );
    rofs(
        open(&f, File::options().write(true).truncate(true)),
        "open a sample with O_TRUNC",
    );
    rofs(
        open(&mnt.join(".shufflefs/status"), File::options().write(true)),
        "open status for writing",
    );
    rofs(fs::remove_file(&f), "unlink a sample");
    rofs(fs::remove_file(mnt.join("current")), "unlink current");
    rofs(
        fs::remove_file(mnt.join(".shufflefs/epoch")),
        "unlink the epoch file",
    );
    rofs(fs::remove_dir(e0.join("empty")), "rmdir an empty class");
    rofs(fs::create_dir(e0.join("cat/sub")), "mkdir in a class");
    rofs(
        fs::create_dir(e0.join("new class")),
        "mkdir in an epoch folder",
    );
    rofs(fs::create_dir(mnt.join("new")), "mkdir at the root");
    rofs(
        fs::rename(&f, e0.join("cat/renamed.jpg")),
        "rename a sample",
    );
    rofs(fs::rename(&f, e0.join("cat/b.jpg")), "rename over a sample");
    rofs(
        fs::rename(e0.join("cat"), e0.join("kitten")),
        "rename a class",
    );
    rofs(
        fs::set_permissions(&f, Permissions::from_mode(0o644)),
        "chmod a sample",
    );
    rofs(
        fs::set_permissions(e0.join("cat"), Permissions::from_mode(0o755)),
        "chmod a class",
    );
    rofs(
        fs::set_permissions(mnt.join(".shufflefs/epoch"), Permissions::from_mode(0o600)),
        "chmod the epoch file",
    );
    rofs(chown_self(&f), "chown a sample");
    rofs(
        File::open(&f).and_then(|h| h.set_modified(SystemTime::UNIX_EPOCH)),
        "utimes a sample",
    );
    rofs(truncate(&f, 0), "truncate a sample");
    rofs(
        truncate(&mnt.join(".shufflefs/status"), 0),
        "truncate status",
    );
    rofs(
        std::os::unix::fs::symlink("a.jpg", e0.join("cat/link")),
        "symlink in a class",
    );
    rofs(
        fs::hard_link(&f, e0.join("cat/hard.jpg")),
        "hard link in a class",
    );
    rofs(access_write(&f), "access(W_OK) on a sample");

    // Nothing changed.
    assert_eq!(listing(&e0), data.expected_listing());
    assert!(fs::read(&f).unwrap() == data.sample("cat", "a.jpg").bytes());
    assert_eq!(
        fs::metadata(&f).unwrap().permissions().mode() & 0o7777,
        0o444
    );
    assert_eq!(read_epoch(&mnt), 0);
    // Reading is allowed.
    access_read_ok(&f);
    // The refusals are counted by operation and errno, in the status and the metrics.
    let errors = &d.status()["fuse_errors"];
    for op in ["open", "mkdir", "unlink", "rename", "setattr"] {
        assert!(errors[op]["EROFS"].as_u64() >= Some(1), "{op}: {errors}");
    }
    let metrics = fs::read_to_string(mnt.join(".shufflefs/metrics")).unwrap();
    assert!(
        metrics.contains("shufflefs_fuse_errors_total{") && metrics.contains("errno=\"EROFS\""),
        "{metrics}"
    );
    d.unmount().assert_clean();
}

fn access_read_ok(p: &Path) {
    let c = cpath(p);
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let rc = unsafe { libc::access(c.as_ptr(), libc::R_OK) };
    assert_eq!(rc, 0, "access(R_OK) on {}", p.display());
}

#[test]
fn epoch_control_file() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let d = Daemon::mount(&data.root, &cache, &data.dir("mnt"), &["--seed", "6"]);
    let mnt = d.mnt.clone();
    let expected = data.expected_listing();
    assert_eq!(read_epoch(&mnt), 0);

    write_epoch(&mnt, "0\n").expect("writing the current epoch is a no-op");
    assert_eq!(read_epoch(&mnt), 0);
    assert_eq!(names(&mnt), set([".shufflefs", "current", "epoch-0"]));

    // A file opened in epoch 0 keeps reading after the advance.
    let a = data.sample("cat", "large.bin");
    let held = File::open(mnt.join("epoch-0").join(a.rel())).unwrap();

    write_epoch(&mnt, "1\n").expect("advance to 1");
    assert_eq!(read_epoch(&mnt), 1);
    assert_eq!(
        fs::read_link(mnt.join("current")).unwrap(),
        Path::new("epoch-1")
    );
    assert_eq!(names(&mnt), set([".shufflefs", "current", "epoch-1"]));
    assert_gone_soon(&mnt.join("epoch-0"), "epoch-0 after advancing");
    assert_eq!(read_status(&mnt)["epoch"], 1);
    assert_eq!(state_json(&cache)["epoch"], 1, "the advance is persisted");
    let mut buf = vec![0u8; a.size as usize];
    assert_eq!(read_at_full(&held, &mut buf, 0), a.size as usize);
    assert!(buf == a.bytes(), "a file opened before the advance changed");
    drop(held);

    write_epoch(&mnt, "1").expect("rewriting the current epoch is a no-op");
    assert_eq!(read_epoch(&mnt), 1);

    for bad in [
        &b"abc"[..],
        b"-1",
        b"0",
        b"0\n",
        b"3",
        b"1000",
        b"1.5",
        b"+2",
        b"2x",
        b"0x2",
        b"99999999999999999999",
        b"\xff\xfe",
        b"\n",
    ] {
        let what = format!("writing {:?}", String::from_utf8_lossy(bad));
        assert_errno(write_epoch(&mnt, bad), libc::EINVAL, &what);
        assert_eq!(read_epoch(&mnt), 1, "{what} moved the epoch");
    }
    // Still serving, unchanged.
    assert_eq!(listing(&mnt.join("epoch-1")), expected);
    check_all_bytes(&mnt.join("current"), &data);
    assert_eq!(state_json(&cache)["epoch"], 1);

    // Surrounding space is fine, and so is the shell's `echo N >`.
    write_epoch(&mnt, " 2 \n").expect("advance to 2 with spaces");
    assert_eq!(read_epoch(&mnt), 2);
    let status = shell_echo_epoch(&mnt, "3");
    assert!(status.success(), "echo 3 > epoch: {status:?}");
    assert_eq!(read_epoch(&mnt), 3);
    let status = shell_echo_epoch(&mnt, "5");
    assert!(!status.success(), "echo 5 > epoch (a jump) should fail");
    assert_eq!(read_epoch(&mnt), 3);
    assert_eq!(listing(&mnt.join("epoch-3")), expected);
    assert_eq!(state_json(&cache)["epoch"], 3);
    d.unmount().assert_clean();
}

#[test]
fn looking_up_the_next_epoch_advances() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let d = mount_std(&data, &["--seed", "7"]);
    let mnt = d.mnt.clone();
    let expected = data.expected_listing();
    // Make the kernel know epoch-0 well: its folders and samples are cached entries now.
    assert_eq!(listing(&mnt.join("epoch-0")), expected);
    let a = data.sample("cat", "a.jpg");
    assert!(fs::read(mnt.join("epoch-0").join(a.rel())).unwrap() == a.bytes());

    let classes = names(&mnt.join("epoch-1"));
    assert_eq!(classes, data.classes.iter().cloned().collect());
    assert_eq!(read_epoch(&mnt), 1);
    assert_eq!(
        fs::read_link(mnt.join("current")).unwrap(),
        Path::new("epoch-1")
    );
    assert_gone_soon(&mnt.join("epoch-0"), "epoch-0 after advancing");
    // Not at once: `epoch-0` itself may already answer ENOENT (its attributes are asked
    // again after a listing), while the kernel still holds its cached entries until the
    // invalidation thread gets the root's lock, which the advancing lookup held.
    assert_gone_soon(
        &mnt.join("epoch-0").join(a.rel()),
        "a sample of epoch-0 after advancing",
    );
    assert_not_found(
        fs::read(mnt.join("epoch-0").join(a.rel())),
        "reading a sample of epoch-0 after advancing",
    );
    assert_eq!(names(&mnt), set([".shufflefs", "current", "epoch-1"]));
    assert_eq!(listing(&mnt.join("epoch-1")), expected);
    assert!(fs::read(mnt.join("current").join(a.rel())).unwrap() == a.bytes());

    // Looking at the current one again, or two ahead, does not move.
    assert!(mnt.join("epoch-1").is_dir());
    assert_not_found(fs::metadata(mnt.join("epoch-3")), "two epochs ahead");
    assert_eq!(read_epoch(&mnt), 1);
    // And once more by lookup.
    assert!(mnt.join("epoch-2/cat/a.jpg").is_file());
    assert_eq!(read_epoch(&mnt), 2);
    assert_eq!(read_status(&mnt)["epoch"], 2);
    assert_gone_soon(&mnt.join("epoch-1"), "epoch-1 after advancing");
    d.unmount().assert_clean();
}

#[test]
fn status_reports_settings_and_skipped() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let d = Daemon::mount(
        &data.root,
        &cache,
        &data.dir("mnt"),
        &["--seed", "42", "--fraction", "0.5"],
    );
    let mnt = d.mnt.clone();
    let s = wait_staging_done(&mnt);
    for key in [
        "version",
        "pid",
        "rank",
        "world_size",
        "epoch",
        "ready_epochs",
        "fraction",
        "seed",
        "source",
        "mountpoint",
        "classes",
        "samples",
        "share_samples",
        "share_bytes",
        "staging",
        "exchange",
        "cache",
        "skipped",
    ] {
        assert!(s.get(key).is_some(), "status lacks {key}:\n{s:#}");
    }
    let n = data.samples.len();
    let bytes = data.total_bytes();
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(s["pid"], d.pid());
    assert_eq!(s["rank"], 0);
    assert_eq!(s["world_size"], 1);
    assert_eq!(s["epoch"], 0);
    assert!(
        s["ready_epochs"]
            .as_array()
            .is_some_and(|a| a.contains(&Value::from(0))),
        "{s:#}"
    );
    assert_eq!(s["fraction"], 0.5);
    assert_eq!(s["seed"], 42);
    assert_eq!(s["source"], data.root.to_str().unwrap());
    assert_eq!(s["mountpoint"], mnt.to_str().unwrap());
    assert_eq!(s["classes"], data.classes.len());
    assert_eq!(s["samples"], n);
    assert_eq!(s["share_samples"], n);
    assert_eq!(s["share_bytes"], bytes);

    let st = &s["staging"];
    for key in [
        "state",
        "epoch",
        "files_done",
        "files_total",
        "bytes_done",
        "bytes_total",
        "errors",
        "last_error",
    ] {
        assert!(st.get(key).is_some(), "staging lacks {key}:\n{s:#}");
    }
    assert_eq!(st["files_total"], n);
    assert_eq!(st["bytes_total"], bytes);
    assert_eq!(st["bytes_done"], bytes);
    assert_eq!(st["errors"], 0);
    assert!(st["last_error"].is_null(), "{s:#}");
    // The exchange report's shape is still evolving (one object, or one per epoch step).
    assert!(
        s["exchange"].is_object() || s["exchange"].is_array(),
        "{s:#}"
    );

    let c = &s["cache"];
    assert_eq!(c["dir"], cache.to_str().unwrap());
    assert_eq!(c["files"], n);
    assert_eq!(c["bytes"], bytes);
    assert_eq!(c["fetched_from_source"], n);
    assert_eq!(c["source_errors"], 0);

    let skipped = s["skipped"].as_array().expect("skipped is a list");
    assert_eq!(skipped.len(), 1, "{s:#}");
    assert_eq!(skipped[0]["path"], data.dangling[0].to_str().unwrap());
    assert!(
        skipped[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("dangling")),
        "{s:#}"
    );

    // Regenerated at each open.
    write_epoch(&mnt, "1").unwrap();
    let s = read_status(&mnt);
    assert_eq!(s["epoch"], 1);
    assert_eq!(s["share_samples"], n);
    let stopped = d.unmount();
    stopped.assert_clean();
    assert!(
        stopped.stderr.contains("dangling"),
        "the log should mention the skipped link:\n{}",
        stopped.stderr
    );
}

#[test]
fn detached_mount_answers_at_once_and_unmount_ends_it() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    let out = run_with_timeout(
        shufflefs()
            .arg("mount")
            .args(mount_args(&data.root, &cache, &mnt, &["--seed", "8"])),
        MOUNT_TIMEOUT,
    );
    let mut guard = DetachedMount {
        mnt: mnt.clone(),
        pid: None,
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "detached mount failed: {:?}\n{stderr}",
        out.status
    );
    // No waiting or retrying: the command returned only once the view answers.
    assert!(is_mounted(&mnt), "not mounted when the command returned");
    let s = read_status(&mnt);
    let pid = s["pid"].as_i64().expect("pid in status") as i32;
    guard.pid = Some(pid);
    assert!(pid_alive(pid), "daemon {pid} is not running");
    assert!(
        stdout.contains(&format!("shufflefs: rank 0 of 1 mounted {}", mnt.display())),
        "{stdout}"
    );
    let log = cache.join("shufflefs.log");
    assert!(
        stdout.contains(&format!("shufflefs: log in {}", log.display())),
        "{stdout}"
    );
    assert!(log.is_file(), "no log at {}", log.display());
    assert_eq!(listing(&mnt.join("epoch-0")), data.expected_listing());
    let a = data.sample("dog house", "ünïcødé.jpg");
    assert!(fs::read(mnt.join("current").join(a.rel())).unwrap() == a.bytes());

    let um = run_with_timeout(
        shufflefs().arg("unmount").arg(&mnt),
        Duration::from_secs(90),
    );
    assert!(
        um.status.success(),
        "unmount failed: {}",
        String::from_utf8_lossy(&um.stderr)
    );
    assert!(String::from_utf8_lossy(&um.stdout).contains("unmounted"));
    assert!(!is_mounted(&mnt), "still mounted after shufflefs unmount");
    // `shufflefs unmount` returns once the daemon is gone.
    assert!(!pid_alive(pid), "daemon {pid} outlived unmount");
    let log_text = fs::read_to_string(&log).unwrap();
    assert!(log_text.contains("mounted"), "log:\n{log_text}");
    drop(guard);
}

/// Mounts, advances to epoch 2 with staging finished, unmounts; returns the last status.
fn first_life(data: &Dataset, cache: &Path, mnt: &Path, args: &[&str]) -> Value {
    let d = Daemon::mount(&data.root, cache, mnt, args);
    wait_staging_done(mnt);
    write_epoch(mnt, "1").unwrap();
    write_epoch(mnt, "2").unwrap();
    let s = wait_staging_done(mnt);
    d.unmount().assert_clean();
    s
}

#[test]
fn remount_resumes_the_epoch_without_refetching() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    let args = ["--seed", "9", "--fraction", "0.5"];
    let n = data.samples.len();

    let d = Daemon::mount(&data.root, &cache, &mnt, &args);
    wait_staging_done(&mnt);
    write_epoch(&mnt, "1").unwrap();
    assert!(mnt.join("epoch-2").is_dir(), "advance by lookup");
    let s = wait_staging_done(&mnt);
    assert_eq!(s["cache"]["fetched_from_source"], n, "{s:#}");
    let before = listing(&mnt.join("epoch-2"));
    d.unmount().assert_clean();
    assert_eq!(state_json(&cache)["epoch"], 2);
    assert!(!is_mounted(&mnt));
    // Each epoch saved its share beside the state, the last two kept (`cache::slots`).
    assert_eq!(saved_slots(&cache), ["1.bin", "2.bin"]);

    let d = Daemon::mount(&data.root, &cache, &mnt, &args);
    assert_eq!(d.ready_epoch(), 2, "{}", d.ready_line);
    assert_eq!(read_epoch(&mnt), 2);
    assert_eq!(names(&mnt), set([".shufflefs", "current", "epoch-2"]));
    assert_eq!(
        fs::read_link(mnt.join("current")).unwrap(),
        Path::new("epoch-2")
    );
    assert_eq!(listing(&mnt.join("epoch-2")), before);
    let s = wait_staging_done(&mnt);
    assert_eq!(s["seed"], 9);
    assert_eq!(
        s["cache"]["fetched_from_source"], 0,
        "cached samples refetched:\n{s:#}"
    );
    assert_eq!(s["cache"]["files"], n, "{s:#}");
    check_all_bytes(&mnt.join("epoch-2"), &data);
    let s = read_status(&mnt);
    assert_eq!(
        s["cache"]["fetched_from_source"], 0,
        "reads refetched:\n{s:#}"
    );
    // And it carries on from there.
    write_epoch(&mnt, "3").unwrap();
    assert_eq!(listing(&mnt.join("epoch-3")), before);
    d.unmount().assert_clean();
    assert_eq!(state_json(&cache)["epoch"], 3);
    assert_eq!(saved_slots(&cache), ["2.bin", "3.bin"]);
}

/// The files in the cache's `slots/` folder, sorted.
fn saved_slots(cache: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(cache.join("slots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn remount_without_seed_reuses_the_cached_seed() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    let d = Daemon::mount(&data.root, &cache, &mnt, &[]);
    let seed = read_status(&mnt)["seed"].clone();
    assert!(seed.is_u64(), "{seed}");
    assert_eq!(read_status(&mnt)["fraction"], 0.3, "default --fraction");
    write_epoch(&mnt, "1").unwrap();
    d.unmount().assert_clean();

    let d = Daemon::mount(&data.root, &cache, &mnt, &[]);
    assert_eq!(d.ready_epoch(), 1);
    assert_eq!(read_status(&mnt)["seed"], seed);
    d.unmount().assert_clean();
    // Giving the same seed explicitly is the same settings.
    let seed = seed.as_u64().unwrap().to_string();
    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", &seed]);
    assert_eq!(d.ready_epoch(), 1);
    d.unmount().assert_clean();
}

#[test]
fn remount_with_another_seed_is_refused_unless_reset() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    let s = first_life(&data, &cache, &mnt, &["--seed", "1"]);
    assert_eq!(s["epoch"], 2);
    let state_before = fs::read(cache.join("state.json")).unwrap();

    let r = mount_refused(
        &mnt,
        &mount_args(&data.root, &cache, &mnt, &["--seed", "2"]),
        true,
    );
    r.assert_mentions("--seed");
    r.assert_mentions("--reset-cache");
    r.assert_mentions(cache.to_str().unwrap());
    assert_eq!(
        fs::read(cache.join("state.json")).unwrap(),
        state_before,
        "a refused mount changed the cache state"
    );
    // The old settings still work and still resume.
    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "1"]);
    assert_eq!(d.ready_epoch(), 2);
    d.unmount().assert_clean();

    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "2", "--reset-cache"]);
    assert_eq!(d.ready_epoch(), 0, "--reset-cache starts over");
    let s = read_status(&mnt);
    assert_eq!(s["seed"], 2);
    assert_eq!(s["epoch"], 0);
    assert_eq!(listing(&mnt.join("epoch-0")), data.expected_listing());
    check_all_bytes(&mnt.join("epoch-0"), &data);
    d.unmount().assert_clean();
    assert_eq!(state_json(&cache)["seed"], 2);

    // The cache now belongs to seed 2.
    let r = mount_refused(
        &mnt,
        &mount_args(&data.root, &cache, &mnt, &["--seed", "1"]),
        true,
    );
    r.assert_mentions("--seed");
}

#[test]
fn one_rank_keeps_its_listing_every_epoch() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let expected = data.expected_listing();
    for (i, q) in ["1", "0.3", "0"].into_iter().enumerate() {
        let cache = data.path(&format!("cache-{i}"));
        let mnt = data.dir(&format!("mnt-{i}"));
        let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "11", "--fraction", q]);
        for epoch in 0..4u64 {
            let dir = mnt.join(format!("epoch-{epoch}"));
            if epoch % 2 == 1 {
                write_epoch(&mnt, epoch.to_string()).unwrap();
            }
            // Even epochs are reached by looking them up.
            assert_eq!(listing(&dir), expected, "Q={q}, epoch {epoch}");
            assert_eq!(read_epoch(&mnt), epoch, "Q={q}");
            let s = read_status(&mnt);
            assert_eq!(s["share_samples"], data.samples.len(), "Q={q}");
            assert_eq!(s["fraction"], q.parse::<f64>().unwrap());
            let x = data.sample("ñandú", "x");
            assert!(fs::read(dir.join(x.rel())).unwrap() == x.bytes());
        }
        let s = wait_staging_done(&mnt);
        assert_eq!(
            s["cache"]["fetched_from_source"],
            data.samples.len(),
            "Q={q}: a world of one never fetches a sample twice:\n{s:#}"
        );
        d.unmount().assert_clean();
    }
}

#[test]
fn sigterm_unmounts_and_exits() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mnt = data.dir(&format!("mnt-{sig}"));
        let mut d = Daemon::mount(&data.root, &data.path(&format!("cache-{sig}")), &mnt, &[]);
        d.signal(sig);
        let status = d.wait_exit(EXIT_TIMEOUT);
        assert!(
            status.is_some_and(|s| s.success()),
            "signal {sig}: daemon exit {status:?}\n{}",
            d.stderr()
        );
        assert!(!is_mounted(&mnt), "signal {sig}: still mounted");
    }
}

#[test]
fn rank_placeholder_in_cache_and_mountpoint() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let mnt0 = data.dir("mnt-0");
    let cache_t = data.base.join("cache-{rank}");
    let mnt_t = data.base.join("mnt-{rank}");
    let d = Daemon::start(
        &mnt0,
        &mount_args(&data.root, &cache_t, &mnt_t, &["--seed", "1"]),
    );
    assert!(is_mounted(&mnt0));
    assert!(
        d.ready_line
            .contains(&format!("mounted {} ", mnt0.display())),
        "{}",
        d.ready_line
    );
    let s = read_status(&mnt0);
    assert_eq!(s["mountpoint"], mnt0.to_str().unwrap());
    assert_eq!(
        s["cache"]["dir"],
        data.base.join("cache-0").to_str().unwrap()
    );
    assert!(data.base.join("cache-0/state.json").is_file());
    assert!(!data.base.join("cache-{rank}").exists());
    d.unmount().assert_clean();
}

#[test]
fn mountpoint_with_spaces_and_non_ascii() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let mnt: PathBuf = data.dir("mount point ü\\x");
    let d = Daemon::mount(&data.root, &data.path("cache dir ü"), &mnt, &[]);
    assert!(is_mounted(&mnt));
    assert_eq!(listing(&mnt.join("epoch-0")), data.expected_listing());
    assert_eq!(read_status(&mnt)["mountpoint"], mnt.to_str().unwrap());
    d.unmount().assert_clean();
    assert!(!is_mounted(&mnt));
}

/// "After advancing, `epoch-N` is gone", checked many times: at once when the advance was a
/// write to the control file (the write returns after the kernel forgot the old names), and
/// within a second when it was a lookup of `epoch-(N+1)` (the kernel holds the root's lock
/// during that lookup, so the invalidation lands just after it).
#[test]
fn old_epoch_is_gone_after_every_advance() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let d = mount_std(&data, &["--seed", "12"]);
    let mnt = d.mnt.clone();
    let mut stale = Vec::new();
    for e in 1..=200u64 {
        let old = mnt.join(format!("epoch-{}", e - 1));
        // Make sure the kernel holds the old epoch's entries.
        assert!(old.join("cat/a.jpg").is_file());
        if e % 2 == 0 {
            assert!(mnt.join(format!("epoch-{e}")).is_dir());
            assert_gone_soon(
                &old.join("cat/a.jpg"),
                "old epoch's file after a lookup advance",
            );
            assert_gone_soon(&old, "old epoch after a lookup advance");
        } else {
            write_epoch(&mnt, e.to_string()).unwrap();
            let dir_stale = fs::metadata(&old).is_ok();
            let file_stale = fs::metadata(old.join("cat/a.jpg")).is_ok();
            if dir_stale || file_stale {
                stale.push(format!("epoch {e}: dir {dir_stale}, file {file_stale}"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "{} of 100 advances by write left the old epoch visible:\n{}",
        stale.len(),
        stale.join("\n")
    );
    d.unmount().assert_clean();
}

/// A launcher that started the daemon in the foreground (Python's `subprocess.Popen`, say)
/// and then runs `shufflefs unmount` synchronously has not reaped the daemon yet.
#[test]
fn unmount_does_not_wait_for_an_unreaped_daemon() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let d = mount_std(&data, &[]);
    // This thread is blocked in the unmount and does not reap the daemon meanwhile.
    let out = run_with_timeout(
        shufflefs()
            .arg("unmount")
            .arg("--timeout")
            .arg("3")
            .arg(&d.mnt),
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "unmount failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&d.mnt));
}
