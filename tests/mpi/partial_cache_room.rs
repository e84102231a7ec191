//! A partial cache's room is what its disk really gives (found by a hostile user
//! test): two ranks whose caches share one small tmpfs, with no `--cache-size`, each take
//! their part of it counted in the disk's blocks (`cache::footprint`), so no rank ever
//! meets a full disk: no "No space left on device" in the log or the status, no source
//! error, every epoch a partition with every byte right. Needs root (tmpfs).

use std::path::Path;

use crate::common::mpi_job::{
    MpiJob, checked_listing, exchange, mpirun, wait_all, write_equal_source,
};
use crate::common::*;

const RANKS: u32 = 2;
const SEED: u64 = 5;
const FRACTION: f64 = 0.5;
const EPOCHS: u64 = 4;
const CLASSES: u32 = 2;
const PER_CLASS: u32 = 40;
/// Five 4 KiB blocks and 20 bytes: each sample takes six blocks, a fifth more than its
/// bytes.
const SIZE: usize = 20_500;
const SAMPLES: usize = (CLASSES * PER_CLASS) as usize;

/// A `size` tmpfs at `dir/shared`, and `dir/cache{r}` a link to `shared/c{r}` on it.
fn shared_tmpfs(dir: &Path, size: &str) -> Tmpfs {
    let shared = dir.join("shared");
    let mounted = Tmpfs::at(&shared, size);
    for r in 0..RANKS {
        std::fs::create_dir(shared.join(format!("c{r}"))).unwrap();
        std::os::unix::fs::symlink(shared.join(format!("c{r}")), dir.join(format!("cache{r}")))
            .unwrap();
    }
    mounted
}

/// Every epoch of `job` read on every rank: a partition, bytes right, no disk-full error,
/// no source error.
fn check(dir: &Path, job: &MpiJob, epoch: u64, samples: usize) {
    let mut all = std::collections::BTreeSet::new();
    let mut total = 0;
    for m in &job.mounts {
        let got = checked_listing(dir, m, epoch);
        total += got.len();
        all.extend(got);
    }
    assert_eq!((total, all.len()), (samples, samples), "epoch {epoch}");
    for r in 0..job.mounts.len() {
        let st = job.status(r);
        let problems = st["cache"]["problems"].to_string();
        assert!(!problems.contains("No space left"), "epoch {epoch}: {st:#}");
        assert_eq!(st["cache"]["source_errors"], 0, "epoch {epoch}: {st:#}");
    }
}

/// The repro: `mpirun -np 2`, both caches on one 1 MiB tmpfs, the default cache size,
/// shares of 820 kB each: counted in bytes each rank would take 24 samples, 590 kB of
/// blocks, and the two would fill the disk; counted in blocks each takes 19. The packed
/// layout counts its segments' bytes (and reserves no more than the disk has).
#[test]
fn ranks_sharing_a_small_disk_never_fill_it() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    if !require_root("mounts a small tmpfs as the caches' disk") {
        return;
    }
    for layout in ["files", "packed"] {
        sharing_a_small_disk(layout);
    }
}

fn sharing_a_small_disk(layout: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_equal_source(dir, CLASSES, PER_CLASS, SIZE);
    let _disk = shared_tmpfs(dir, "1m");
    let args = ["--cache-layout", layout];
    let job = MpiJob::start_with(mpirun(RANKS), dir, RANKS, SEED, FRACTION, &args);
    for r in 0..job.mounts.len() {
        let st = job.status(r);
        assert!(
            st["partial"].is_object(),
            "{layout}: not a partial cache: {st:#}"
        );
    }
    check(dir, &job, 0, SAMPLES);
    for epoch in 1..EPOCHS {
        for m in &job.mounts {
            write_epoch(m, epoch.to_string()).unwrap();
        }
        wait_all(&job, "the next exchange", |st| {
            exchange(st, epoch + 1).is_some_and(|x| x["state"] == "done")
        });
        check(dir, &job, epoch, SAMPLES);
    }
    drop(job);
    let log = std::fs::read_to_string(dir.join("job.log")).unwrap_or_default();
    let full = log.lines().filter(|l| l.contains("No space left")).count();
    assert_eq!(full, 0, "{layout}: {log}");
}

/// A full cache remounted with a smaller `--cache-size` is within its size from the mount
/// on: the samples the plan does not keep now go before staging (a rank used to stay at
/// 3 MB under `--cache-size 1M` for good), and every epoch still reads right.
#[test]
fn a_full_cache_remounted_smaller_shrinks_to_its_size() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_equal_source(dir, CLASSES, PER_CLASS, SIZE);
    let job = MpiJob::start_with(mpirun(RANKS), dir, RANKS, SEED, FRACTION, &[]);
    check(dir, &job, 0, SAMPLES);
    wait_all(&job, "the first exchange", |st| {
        exchange(st, 1).is_some_and(|x| x["state"] == "done")
    });
    let full = job.status(0)["cache"]["bytes"].as_u64().unwrap();
    job.unmount();
    let cap: u64 = 200 << 10;
    assert!(full > 2 * cap, "{full}");
    let size = cap.to_string();
    let args = ["--cache-size", size.as_str()];
    let job = MpiJob::start_with(mpirun(RANKS), dir, RANKS, SEED, FRACTION, &args);
    for r in 0..job.mounts.len() {
        let st = job.status(r);
        let bytes = st["cache"]["bytes"].as_u64().unwrap();
        assert!(bytes <= cap, "rank {r} holds {bytes} under {cap}: {st:#}");
        assert_eq!(st["partial"]["cache_size_bytes"], cap);
    }
    check(dir, &job, 0, SAMPLES);
}
