//! Calls a view gets from the host rather than from a data loader's reads: `isatty()` (an
//! ioctl) on every Python `open()`, and `statfs` from `df`. Each once misbehaved for a new
//! user: 111,000 WARN lines about ioctl in a 2-rank run, and a `df` of all zeros.

mod common;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;

use common::*;

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
