//! `--read-path page-cache`: the kernel opens files without asking the daemon, so samples,
//! the status document and the epoch control file are all served without handles. These
//! tests run the things a user does through that mode: read every byte (also before staging
//! reached a sample), read the status while it changes, advance epochs both ways, and try
//! to write. Plus one property of every mode: a sample kept from one epoch to the next is
//! the same inode, so what the kernel cached for it carries over.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use crate::common::*;

const PAGE_CACHE: [&str; 2] = ["--read-path", "page-cache"];

fn mount(data: &Dataset, extra: &[&str]) -> Daemon {
    let args: Vec<&str> = PAGE_CACHE.iter().chain(extra).copied().collect();
    Daemon::mount(&data.root, &data.path("cache"), &data.dir("mnt"), &args)
}

/// Every sample of the current epoch, whole and from an odd offset, equals the source.
fn check_bytes(data: &Dataset, mnt: &std::path::Path, epoch: u64) {
    for s in &data.samples {
        let p = mnt.join(format!("epoch-{epoch}")).join(s.rel());
        let got = fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        assert!(got == s.bytes(), "{} differs from the source", p.display());
        let mut f = File::open(&p).unwrap();
        let off = s.size / 3;
        f.seek(SeekFrom::Start(off)).unwrap();
        let mut tail = Vec::new();
        f.read_to_end(&mut tail).unwrap();
        assert!(tail == s.range(off, s.size - off), "{} tail", p.display());
    }
}

#[test]
fn samples_status_and_epochs_work_without_opens() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    // One staging thread: the first reads race the background copy and fetch on demand.
    let d = mount(&data, &["--seed", "7", "--staging-threads", "1"]);
    let mnt = d.mnt.clone();
    assert_eq!(listing(&mnt.join("epoch-0")), data.expected_listing());
    check_bytes(&data, &mnt, 0);
    check_bytes(&data, &mnt, 0); // again, now from the kernel's cache
    let s = wait_staging_done(&mnt);
    assert_eq!(s["cache"]["fetched_from_source"], data.samples.len());

    // The status changes between reads and every read is one whole document.
    assert_eq!(read_status(&mnt)["epoch"], 0);
    assert_eq!(read_epoch(&mnt), 0);
    write_epoch(&mnt, "1\n").expect("advance by writing");
    assert_eq!(read_epoch(&mnt), 1);
    assert_eq!(read_status(&mnt)["epoch"], 1);
    assert_gone_soon(&mnt.join("epoch-0"), "epoch-0 after advancing");
    check_bytes(&data, &mnt, 1);

    // The shell's way, then by looking up the next epoch.
    assert!(shell_echo_epoch(&mnt, "2").success());
    assert_eq!(read_epoch(&mnt), 2);
    assert!(!shell_echo_epoch(&mnt, "9").success(), "a jump must fail");
    assert_eq!(read_epoch(&mnt), 2);
    assert_errno(write_epoch(&mnt, "x"), libc::EINVAL, "writing junk");
    assert_eq!(listing(&mnt.join("epoch-3")), data.expected_listing());
    assert_eq!(read_epoch(&mnt), 3);
    assert_eq!(read_status(&mnt)["epoch"], 3);
    check_bytes(&data, &mnt, 3);
    d.unmount().assert_clean();
}

#[test]
fn parallel_status_readers_each_get_a_whole_document() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let d = mount(&data, &["--seed", "8"]);
    let mnt = d.mnt.clone();
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        let readers: Vec<_> = (0..6)
            .map(|_| {
                scope.spawn(|| {
                    let mut reads = 0u32;
                    while !stop.load(Ordering::Relaxed) || reads < 50 {
                        // Panics (failing the test) on a torn or truncated document.
                        let s = read_status(&mnt);
                        assert!(s["epoch"].is_u64(), "{s:#}");
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        // The status grows and shrinks as epochs advance and exchanges run.
        for e in 1..=6u64 {
            write_epoch(&mnt, e.to_string()).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().expect("a status reader failed") >= 50);
        }
    });
    assert_eq!(read_status(&mnt)["epoch"], 6);
    d.unmount().assert_clean();
}

#[test]
fn writes_into_the_view_fail_and_change_nothing() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let d = mount(&data, &["--seed", "9"]);
    let mnt = d.mnt.clone();
    let a = data.sample("cat", "a.jpg");
    let f = mnt.join("epoch-0").join(a.rel());
    assert!(fs::read(&f).unwrap() == a.bytes()); // opens are now off for this mount
    let rofs = |r: std::io::Result<()>, what: &str| assert_errno(r, libc::EROFS, what);
    rofs(
        File::options()
            .write(true)
            .truncate(true)
            .open(&f)
            .map(drop),
        "open a sample with O_TRUNC",
    );
    // Without opens the kernel cannot refuse a plain open for writing; the write is refused.
    let write = File::options()
        .write(true)
        .open(&f)
        .and_then(|mut h| h.write_all(b"x").and_then(|()| h.sync_all()));
    rofs(write, "write into a sample");
    rofs(
        File::options()
            .write(true)
            .create_new(true)
            .open(mnt.join("epoch-0/cat/new.jpg"))
            .map(drop),
        "create in a class",
    );
    // The status is a link to a rendering in a private folder in memory, off the cache's
    // disk (read-only to its owner); clobbering it as root changes nothing, as every read
    // renders it anew.
    let status_link = fs::read_link(mnt.join(".shufflefs/status")).unwrap();
    let folder = status_link.parent().unwrap().to_path_buf();
    let in_memory = folder.to_string_lossy().starts_with("/dev/shm/shufflefs-");
    assert!(in_memory, "{status_link:?}");
    let mode = fs::metadata(&folder).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{folder:?}");
    let _ = fs::write(mnt.join(".shufflefs/status"), "{}");
    // So are the metrics.
    let metrics_link = fs::read_link(mnt.join(".shufflefs/metrics")).unwrap();
    assert!(metrics_link.starts_with(&folder), "{metrics_link:?}");
    let metrics = fs::read_to_string(mnt.join(".shufflefs/metrics")).unwrap();
    assert!(
        metrics.contains("shufflefs_epoch{rank=\"0\"} 0\n"),
        "{metrics}"
    );
    rofs(fs::remove_file(&f), "unlink a sample");
    assert!(fs::read(&f).unwrap() == a.bytes(), "the sample changed");
    assert_eq!(listing(&mnt.join("epoch-0")), data.expected_listing());
    assert_eq!(read_status(&mnt)["epoch"], 0);
    assert_eq!(read_epoch(&mnt), 0);
    d.unmount().assert_clean();
    assert!(!folder.exists(), "{folder:?} left after the unmount");
}

#[test]
fn a_kept_sample_is_the_same_inode_in_the_next_epoch() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    for mode in ["passthrough", "page-cache", "daemon"] {
        let cache = data.path(&format!("cache-{mode}"));
        let mnt = data.dir(&format!("mnt-{mode}"));
        // One rank keeps every sample in every epoch.
        let d = Daemon::mount(
            &data.root,
            &cache,
            &mnt,
            &["--seed", "3", "--read-path", mode],
        );
        let a = data.sample("cat", "a.jpg");
        let before = fs::metadata(mnt.join("epoch-0").join(a.rel())).unwrap();
        assert!(fs::read(mnt.join("epoch-0").join(a.rel())).unwrap() == a.bytes());
        write_epoch(&mnt, "1").unwrap();
        let after = fs::metadata(mnt.join("epoch-1").join(a.rel())).unwrap();
        assert_eq!(before.ino(), after.ino(), "{mode}: inode changed");
        assert_eq!(after.len(), a.size, "{mode}");
        assert!(fs::read(mnt.join("epoch-1").join(a.rel())).unwrap() == a.bytes());
        assert_ne!(
            fs::metadata(mnt.join("epoch-1/cat")).unwrap().ino(),
            fs::metadata(mnt.join("epoch-1/dog house")).unwrap().ino()
        );
        d.unmount().assert_clean();
    }
}

/// Without passthrough the kernel asks for a file's bytes in requests as large as the
/// mount's readahead window: the daemon raises it to FUSE's 1 MiB limit (root only), so a
/// large sample streams in 1 MiB requests instead of 128 KiB ones, and its bytes are right.
#[test]
fn the_readahead_window_is_raised_for_streaming() {
    if !require_fuse() {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: raising a mount's readahead window needs root");
        return;
    }
    let data = DatasetBuilder::new()
        .class("big", &[("video.bin", 5 << 20)])
        .build();
    let d = mount(&data, &[]);
    let dev = fs::metadata(&d.mnt).unwrap().dev();
    let sysfs = std::path::PathBuf::from(format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev)
    ));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while fs::read_to_string(&sysfs).unwrap().trim() != "1024" {
        assert!(
            std::time::Instant::now() < deadline,
            "{} stayed at {}",
            sysfs.display(),
            fs::read_to_string(&sysfs).unwrap().trim()
        );
        thread::sleep(std::time::Duration::from_millis(20));
    }
    check_bytes(&data, &d.mnt, 0);
    d.unmount().assert_clean();
}

/// The default `--read-path auto`: a share of small files that fits in memory is read
/// through the page cache (a file read before costs no request), samples averaging over
/// 256 KiB pass through; the status says which and why, and counts the requests.
#[test]
fn auto_reads_small_files_through_the_page_cache_and_large_ones_through_passthrough() {
    if !require_fuse() {
        return;
    }
    let small = DatasetBuilder::new()
        .numbered_class("a", 20, |i| 1000 + i as u64)
        .build();
    let d = Daemon::mount(&small.root, &small.path("cache"), &small.dir("mnt"), &[]);
    let s = wait_staging_done(&d.mnt);
    assert_eq!(s["read_path"]["path"], "page-cache", "{s:#}");
    let why = s["read_path"]["why"].as_str().unwrap();
    assert!(
        why.starts_with("auto: small samples (average 4 KiB) and the share (80 KiB)"),
        "{why}"
    );
    let read_all = || {
        for sample in &small.samples {
            let p = d.mnt.join("epoch-0").join(sample.rel());
            assert!(fs::read(&p).unwrap() == sample.bytes(), "{}", p.display());
        }
    };
    read_all();
    let requests = |s: &serde_json::Value, op: &str| s["fuse_requests"][op].as_u64().unwrap();
    let before = read_status(&d.mnt);
    assert!(
        requests(&before, "read") >= small.samples.len() as u64,
        "{before:#}"
    );
    read_all();
    read_all();
    let after = read_status(&d.mnt);
    // Each file's first `fstat` after its READ asks once (its atime went stale); then nothing
    // (lookups: reading the status looks it up again, as a control file is never cached).
    for op in ["read", "open", "release"] {
        assert_eq!(
            requests(&after, op),
            requests(&before, op),
            "{op}: {after:#}"
        );
    }
    assert!(requests(&after, "getattr") <= requests(&before, "getattr") + 20);
    let metrics = fs::read_to_string(d.mnt.join(".shufflefs/metrics")).unwrap();
    assert!(metrics.contains("shufflefs_fuse_requests_total{rank=\"0\",op=\"read\"}"));
    d.unmount().assert_clean();

    let large = DatasetBuilder::new()
        .class("a", &[("big.bin", 600_000), ("small.bin", 10)])
        .build();
    let d = Daemon::mount(&large.root, &large.path("cache"), &large.dir("mnt"), &[]);
    let s = wait_staging_done(&d.mnt);
    assert_eq!(s["read_path"]["path"], "passthrough", "{s:#}");
    assert!(
        s["read_path"]["why"]
            .as_str()
            .unwrap()
            .contains("over 256 KiB"),
        "{s:#}"
    );
    for sample in &large.samples {
        let p = d.mnt.join("epoch-0").join(sample.rel());
        assert!(fs::read(&p).unwrap() == sample.bytes(), "{}", p.display());
    }
    let s = read_status(&d.mnt);
    assert!(requests(&s, "open") >= 2, "{s:#}");
    d.unmount().assert_clean();
}
