//! Calls a view gets from the host rather than from a data loader's reads: `isatty()` (an
//! ioctl) on every Python `open()`, `statfs` from `df`, and the unmount at the end. Each once
//! misbehaved for a new user: 111,000 WARN lines about ioctl in a 2-rank run, a `df` of all
//! zeros, and a WARN "Failed to umount filesystem" after every clean unmount.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;

/// Lines of a daemon's log at WARN level or above.
fn warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect()
}

/// `isatty` on an open sample, `times` times: always false with ENOTTY.
fn isatty_many(path: &Path, times: usize) {
    let f = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    for _ in 0..times {
        // SAFETY: `f` keeps the descriptor open for the call.
        let tty = unsafe { libc::isatty(f.as_raw_fd()) };
        assert_eq!(tty, 0, "a sample is no terminal");
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENOTTY)
        );
    }
}

#[test]
fn isatty_is_answered_quietly() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    for mode in ["passthrough", "daemon", "page-cache"] {
        let mnt = data.dir(&format!("mnt-{mode}"));
        let cache = data.path(&format!("cache-{mode}"));
        let d = Daemon::mount(&data.root, &cache, &mnt, &["--read-path", mode]);
        for s in data.samples.iter().take(5) {
            isatty_many(&mnt.join("epoch-0").join(s.rel()), 40);
        }
        let stopped = d.unmount();
        stopped.assert_clean();
        let noisy: Vec<_> = warnings(&stopped.stderr)
            .into_iter()
            .filter(|l| l.contains("ioctl"))
            .collect();
        assert!(noisy.is_empty(), "{mode}: ioctl warnings:\n{noisy:#?}");
    }
}

#[test]
fn a_clean_unmount_logs_no_failure() {
    if !require_fuse() {
        return;
    }
    // No odd entries: the source scan then has nothing to warn about either.
    let data = DatasetBuilder::new()
        .class("cat", &[("a.jpg", 1000), ("b.jpg", 5000)])
        .build();
    let sample = data.samples[0].rel();

    // `shufflefs unmount`.
    let mnt = data.dir("mnt-cli");
    let d = Daemon::mount(&data.root, &data.path("cache-cli"), &mnt, &[]);
    std::fs::read(mnt.join("epoch-0").join(&sample)).unwrap();
    let stopped = d.unmount();
    stopped.assert_clean();
    assert!(!is_mounted(&mnt));
    assert!(
        warnings(&stopped.stderr).is_empty(),
        "shufflefs unmount: the log warns:\n{}",
        stopped.stderr
    );

    // `fusermount3 -u`, from outside.
    let mnt = data.dir("mnt-fusermount");
    let mut d = Daemon::mount(&data.root, &data.path("cache-fusermount"), &mnt, &[]);
    std::fs::read(mnt.join("epoch-0").join(&sample)).unwrap();
    let status = Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(status.success(), "fusermount3 -u: {status:?}");
    let exit = d.wait_exit(Duration::from_secs(20));
    assert!(exit.is_some_and(|s| s.success()), "daemon exit {exit:?}");
    assert!(!is_mounted(&mnt));
    let log = d.stderr();
    assert!(
        warnings(&log).is_empty(),
        "fusermount3 -u: the log warns:\n{log}"
    );

    // SIGTERM: the daemon unmounts itself, and says nothing is wrong.
    let mnt = data.dir("mnt-signal");
    let mut d = Daemon::mount(&data.root, &data.path("cache-signal"), &mnt, &[]);
    d.signal(libc::SIGTERM);
    let exit = d.wait_exit(Duration::from_secs(20));
    assert!(exit.is_some_and(|s| s.success()), "daemon exit {exit:?}");
    assert!(!is_mounted(&mnt), "SIGTERM still unmounts");
    let log = d.stderr();
    assert!(warnings(&log).is_empty(), "SIGTERM: the log warns:\n{log}");
}

/// What the daemon does when another rank failed to mount: it drops its session before
/// running it, and that must still unmount (the end of a session unmounts, see `fuse`).
#[test]
fn a_session_dropped_before_it_runs_leaves_no_mount() {
    use shufflefs::cache::{CacheDir, SampleStore};
    use shufflefs::cli::ReadPath;
    use shufflefs::dataset::SyntheticSource;
    use shufflefs::dataset::manifest::Manifest;
    use shufflefs::fuse::FuseAdapter;
    use shufflefs::node::coordinator::{Coordinator, NoExchange};
    use shufflefs::plan::{Plan, PlanParams};
    use shufflefs::vfs::ShuffleFs;

    struct NoStatus;
    impl shufflefs::node::status::StatusReport for NoStatus {
        fn render(&self) -> Vec<u8> {
            b"{}\n".to_vec()
        }
    }

    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let manifest =
        Arc::new(Manifest::from_parts(vec![(b"c".to_vec(), vec![(b"x".to_vec(), 10)])]).unwrap());
    let source = Arc::new(SyntheticSource {
        manifest: manifest.clone(),
    });
    let cache = CacheDir::open(&dir.path().join("cache")).unwrap();
    let store = Arc::new(SampleStore::new(cache, manifest, source).unwrap());
    let plan = Plan::new(PlanParams {
        samples: 1,
        world: 1,
        fraction: 0.0,
        seed: 1,
    })
    .unwrap();
    let initial = plan.initial();
    let epochs = Coordinator::start(plan, 0, initial, None, Arc::new(NoExchange));
    let fs = Arc::new(ShuffleFs::new(store, epochs, Arc::new(NoStatus)));
    let adapter = FuseAdapter::new(fs, ReadPath::Daemon, Default::default()).unwrap();
    let mut config = fuser::Config::default();
    config.mount_options = vec![fuser::MountOption::FSName("shufflefs-test".into())];
    let session = shufflefs::fuse::mount(adapter, &mnt, &config).unwrap();
    assert!(is_mounted(&mnt), "mounted");
    drop(session);
    let gone = is_mounted(&mnt);
    force_unmount(&mnt);
    assert!(!gone, "a dropped session left its mount behind");
}

#[test]
fn df_shows_the_cache_filesystem() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let (mnt, cache) = (data.dir("mnt"), data.path("cache"));
    let d = Daemon::mount(&data.root, &cache, &mnt, &[]);
    let view = nix::sys::statvfs::statvfs(&mnt).unwrap();
    let disk = nix::sys::statvfs::statvfs(&cache).unwrap();
    assert!(view.blocks() > 0, "a df of zeros");
    assert_eq!(
        view.blocks(),
        disk.blocks(),
        "the cache's filesystem, in size"
    );
    assert_eq!(view.fragment_size(), disk.fragment_size());
    assert_eq!(view.block_size(), disk.block_size());
    assert!(view.blocks_available() <= view.blocks_free());
    assert!(view.blocks_free() <= view.blocks());
    assert_eq!(
        view.files(),
        data.samples.len() as u64,
        "files: the samples"
    );
    assert_eq!(view.files_free(), 0, "nothing can be created");
    assert_eq!(view.name_max(), 255);
    // And `df` itself, as a user runs it.
    let out = Command::new("df").arg("-P").arg(&mnt).output().unwrap();
    assert!(out.status.success(), "df: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().nth(1).unwrap_or_else(|| panic!("df: {text}"));
    let total: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(total > 0, "df shows a size: {line}");
    d.unmount().assert_clean();
}

/// A sample shows its source file's modification time (tools that compare times, such as
/// rsync, make and loaders' caches, then behave), and keeps it across a remount.
#[test]
fn samples_show_their_source_files_times() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let when = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    for s in &data.samples {
        let f = File::options()
            .write(true)
            .open(data.root.join(s.rel()))
            .unwrap();
        f.set_modified(when).unwrap();
    }
    let (mnt, cache) = (data.dir("mnt"), data.path("cache"));
    for round in ["first mount", "remount"] {
        let d = Daemon::mount(&data.root, &cache, &mnt, &[]);
        let listed: Vec<_> = std::fs::read_dir(mnt.join("epoch-0"))
            .unwrap()
            .flat_map(|class| std::fs::read_dir(class.unwrap().path()).unwrap())
            .map(|e| e.unwrap().path())
            .collect();
        assert!(!listed.is_empty());
        for path in &listed {
            let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
            assert_eq!(mtime, when, "{round}: {}", path.display());
        }
        d.unmount().assert_clean();
    }
}
