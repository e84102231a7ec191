//! The cache's disk fills up during an exchange (real mpirun, 2 ranks, each cache on a small
//! tmpfs that holds the share but not what comes in): the exchange fails with a clear error in
//! the status, the current view keeps serving every byte, advancing fails without taking the
//! mount down, and the job unmounts cleanly. And a single rank whose cache cannot even hold its
//! share still serves every byte of it, from the source, as a partial cache that never fills
//! the disk. Needs root for the tmpfs mounts.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::mpi_job::mpirun;
use crate::common::*;
use serde_json::Value;
use shufflefs::sys::mounts::is_mounted;

const RANKS: usize = 2;

struct Setup {
    /// Unmounted after the daemons (fields drop after `drop`), before the folder goes.
    caches: Tmpfs,
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    child: Option<Child>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        for r in 0..RANKS {
            let m = self.dir.join(format!("mnt{r}"));
            if is_mounted(&m) {
                force_unmount(&m);
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn status(mnt: &Path) -> Value {
    read_status(mnt)
}

#[test]
fn disk_full_during_exchange_keeps_the_current_view_serving() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    if !require_root("mounts a small tmpfs as the cache") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let mut setup = Setup {
        caches: Tmpfs::default(),
        _tmp: tmp,
        dir: dir.clone(),
        child: None,
    };
    // 80 samples of 50 kB: 2 MB per rank's share.
    let sample = |c: usize, i: usize| -> Vec<u8> {
        (0..50_000).map(|o| (o * 7 + i * 13 + c) as u8).collect()
    };
    for c in 0..2 {
        std::fs::create_dir_all(dir.join(format!("src/c{c}"))).unwrap();
        for i in 0..40 {
            std::fs::write(dir.join(format!("src/c{c}/{i:03}.bin")), sample(c, i)).unwrap();
        }
    }
    for r in 0..RANKS {
        let cache = dir.join(format!("cache{r}"));
        std::fs::create_dir(&cache).unwrap();
        std::fs::create_dir(dir.join(format!("mnt{r}"))).unwrap();
        // Room for both shares at mount; shrunk below once mounted.
        setup.caches.add(&cache, "10m");
    }
    setup.child = Some(
        mpirun(RANKS as u32)
            .args([BIN, "mount"])
            .args(["--seed", "2", "--fraction", "1"])
            // Received over MPI, as from another host (a sample taken from a peer's cache
            // on this host is tested in the cache's unit tests).
            .args(["--share-disk", "never"])
            // Slow enough that the disk shrinks below (as when another program fills it
            // after the mount) before much arrives: the room was taken at mount, so the
            // cache is no partial one and the exchange meets a full disk.
            .args(["--exchange-rate", "200000"])
            .arg("--source")
            .arg(dir.join("src"))
            .arg("--cache")
            .arg(dir.join("cache{rank}"))
            .arg(dir.join("mnt{rank}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mounts: Vec<PathBuf> = (0..RANKS).map(|r| dir.join(format!("mnt{r}"))).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !mounts.iter().all(|m| m.join(".shufflefs/status").exists()) {
        assert!(Instant::now() < deadline, "ranks did not mount in time");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The disk now holds the share (2.1 MB of blocks) and little more.
    for r in 0..RANKS {
        let cache = dir.join(format!("cache{r}"));
        let flags = nix::mount::MsFlags::MS_REMOUNT;
        nix::mount::mount(
            None::<&str>,
            &cache,
            None::<&str>,
            flags,
            Some("size=2300k"),
        )
        .unwrap();
    }
    let failed = |m: &Path| -> Option<Value> {
        let st = status(m);
        st["exchange"]
            .as_array()?
            .iter()
            .find(|x| x["target_epoch"] == 1 && x["state"] == "failed")
            .cloned()
    };
    while !mounts
        .iter()
        .any(|m| m.join(".shufflefs/status").exists() && failed(m).is_some())
    {
        assert!(
            Instant::now() < deadline,
            "no exchange failed: {:#}",
            status(&mounts[0])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let full = mounts.iter().find(|m| failed(m).is_some()).unwrap();
    let report = failed(full).unwrap();
    let error = report["error"].as_str().unwrap();
    assert!(
        error.contains("No space left") && error.contains("storing received sample"),
        "{report:#}"
    );
    // The current view still serves every byte, on every rank.
    for (r, m) in mounts.iter().enumerate() {
        let mut n = 0;
        for c in 0..2 {
            for f in std::fs::read_dir(m.join(format!("epoch-0/c{c}"))).unwrap() {
                let f = f.unwrap();
                let i: usize = f.file_name().to_str().unwrap()[..3].parse().unwrap();
                assert!(
                    std::fs::read(f.path()).unwrap() == sample(c, i),
                    "rank {r}: {:?}",
                    f.path()
                );
                n += 1;
            }
        }
        assert_eq!(n, 40, "rank {r} share");
    }
    // Advancing on the full rank either fails (the state file cannot be saved: the mount
    // stays and keeps serving epoch 0) or publishes epoch 1 with what the disk could not
    // take read from the source through memory: which one depends on whether a page is left
    // for the state file. Either way the mount serves every byte right.
    let (epoch, serving) = match std::fs::metadata(full.join("epoch-1")) {
        Err(_) => (0, "epoch-0"),
        Ok(_) => (1, "epoch-1"),
    };
    assert_eq!(status(full)["epoch"], epoch);
    if epoch == 0 {
        // The failed advance is named in the status (the job table's first problem).
        let problems = status(full)["cache"]["problems"].to_string();
        assert!(problems.contains("saving epoch 1 failed"), "{problems}");
    }
    let mut n = 0;
    for c in 0..2 {
        for f in std::fs::read_dir(full.join(format!("{serving}/c{c}"))).unwrap() {
            let f = f.unwrap();
            let i: usize = f.file_name().to_str().unwrap()[..3].parse().unwrap();
            let bytes = std::fs::read(f.path());
            assert!(
                bytes.as_deref().ok() == Some(&sample(c, i)[..]),
                "{:?}",
                f.path()
            );
            n += 1;
        }
    }
    assert_eq!(n, 40, "the full rank's share of {serving}");
    for m in &mounts {
        let out = shufflefs().arg("unmount").arg(m).output().unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let mut child = setup.child.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "daemons did not exit after unmount"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A cache on a 1 MB tmpfs under a 3 MB share: samples that do not fit are read from the
/// source through memory, in both read paths and both cache layouts, and the status says why.
#[test]
fn a_cache_smaller_than_the_share_still_serves_every_byte() {
    if !require_fuse() {
        return;
    }
    if !require_root("mounts a small tmpfs as the cache") {
        return;
    }
    let data = DatasetBuilder::new()
        .numbered_class("a", 30, |i| 50_000 + i as u64)
        .numbered_class("b", 30, |i| 60_000 - i as u64)
        .build();
    for (read_path, layout) in [
        ("passthrough", "files"),
        ("page-cache", "files"),
        ("passthrough", "packed"),
        ("page-cache", "packed"),
    ] {
        let read_path = read_path.to_string();
        let cache = data.dir(&format!("cache-{read_path}-{layout}"));
        // Unmounted however the test ends (a failed run once left one behind).
        let tmpfs = Tmpfs::at(&cache, "1m");
        let d = Daemon::mount(
            &data.root,
            &cache,
            &data.dir(&format!("mnt-{read_path}-{layout}")),
            &["--read-path", &read_path, "--cache-layout", layout],
        );
        let read_path = format!("{read_path}, {layout}");
        for s in &data.samples {
            let p = d.mnt.join("epoch-0").join(s.rel());
            let got = std::fs::read(&p).unwrap_or_else(|e| panic!("{read_path}: {p:?}: {e}"));
            assert!(
                got == s.bytes(),
                "{read_path}: {p:?} differs from the source"
            );
        }
        // The share does not fit the tmpfs: a partial cache that never fills
        // the disk, and says so in the status.
        let st = read_status(&d.mnt);
        let problems = st["cache"]["problems"].to_string();
        assert!(
            !problems.contains("No space left"),
            "{read_path}: {problems}"
        );
        assert!(
            st["partial"]["cache_size_bytes"]
                .as_u64()
                .is_some_and(|b| b < 1 << 20),
            "{read_path}: {st:#}"
        );
        let stopped = d.unmount();
        assert!(stopped.status.is_some_and(|s| s.success()), "{stopped:?}");
        drop(tmpfs);
    }
}
