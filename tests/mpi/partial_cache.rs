//! A share larger than the cache, real mpirun, 2 ranks, each cache on a tmpfs
//! only a little larger than `--cache-size`, shares 2x and 5x the cache: every epoch is a
//! partition of the dataset with every byte right, nothing hits a full disk (the cache's
//! bytes stay within its size), and each rank's measured hit rate and source bytes per epoch
//! are at least as good as the plan's (`plan::keep`; the early refill, `cache::early`, may
//! do better), planned with each sample's size on disk (whole blocks). Needs root (tmpfs).

use crate::common::mpi_job::{MpiJob, checked_listing, exchange, wait_all, write_equal_source};
use crate::common::*;
use shufflefs::plan::keep::{DEFAULT_HORIZON, KeepPlanner};
use shufflefs::plan::{Plan, PlanParams};

const RANKS: u32 = 2;
const SEED: u64 = 3;
const FRACTION: f64 = 0.5;
const CLASSES: u32 = 2;
const PER_CLASS: u32 = 40;
const SIZE: usize = 50_000;
const EPOCHS: u64 = 5;

/// The source, the tmpfs caches, and the plan's kept sets for `times`.
struct Setup {
    tmp: tempfile::TempDir,
    cap: u64,
    times: u64,
    planner: KeepPlanner,
    _caches: Tmpfs,
}

impl Setup {
    fn new(times: u64, tmpfs: &str) -> Setup {
        Setup::with_caches(times, tmpfs, RANKS)
    }

    /// As [`Setup::new`], with a tmpfs cache for each of `caches` ranks.
    fn with_caches(times: u64, tmpfs: &str, caches: u32) -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write_equal_source(dir, CLASSES, PER_CLASS, SIZE);
        let share = u64::from(CLASSES * PER_CLASS / RANKS) * SIZE as u64;
        let cap = share / times;
        let mut mounted = Tmpfs::default();
        for r in 0..caches {
            let cache = dir.join(format!("cache{r}"));
            std::fs::create_dir(&cache).unwrap();
            mounted.add(&cache, tmpfs);
        }
        let samples = CLASSES * PER_CLASS;
        let params = PlanParams {
            samples: samples.into(),
            world: RANKS,
            fraction: FRACTION,
            seed: SEED,
        };
        // Sizes as they take the cache's disk: whole blocks of the tmpfs (`cache::footprint`).
        let block = nix::sys::statvfs::statvfs(&mounted.0[0])
            .unwrap()
            .block_size();
        let on_disk = (SIZE as u64).div_ceil(block) * block;
        let sizes = vec![on_disk; samples as usize];
        let planner = KeepPlanner::new(Plan::new(params).unwrap(), sizes, cap, DEFAULT_HORIZON);
        Setup {
            tmp,
            cap,
            times,
            planner,
            _caches: mounted,
        }
    }

    fn start(&self) -> MpiJob {
        self.start_ranks(RANKS)
    }

    fn start_ranks(&self, ranks: u32) -> MpiJob {
        let size = self.cap.to_string();
        let args = ["--share-disk", "never", "--cache-size", &size];
        MpiJob::start(self.tmp.path(), ranks, SEED, FRACTION, &args)
    }

    /// Makes `epoch` current on every rank (from the one before) and waits until the
    /// exchange out of it is done: the samples that left are evicted as it starts, so the
    /// cache then holds this epoch's kept samples only.
    fn advance(&self, job: &MpiJob, epoch: u64) {
        for m in &job.mounts {
            write_epoch(m, epoch.to_string()).unwrap();
        }
        wait_all(job, "the next exchange", |st| {
            exchange(st, epoch + 1).is_some_and(|x| x["state"] == "done")
        });
    }

    /// Reads `epoch` on every rank: a partition with every byte right, no full disk, the
    /// cache within its size; and, when `check_before` (the planner is at the epoch before),
    /// the measured hit rate and source bytes of the epoch before are the plan's.
    fn check(&self, job: &MpiJob, epoch: u64, check_before: bool) {
        let (times, cap) = (self.times, self.cap);
        let samples = (CLASSES * PER_CLASS) as usize;
        let mut all = std::collections::BTreeSet::new();
        let mut total = 0;
        for m in &job.mounts {
            let got = checked_listing(self.tmp.path(), m, epoch);
            total += got.len();
            all.extend(got);
        }
        assert_eq!(
            (total, all.len()),
            (samples, samples),
            "{times}x epoch {epoch}"
        );
        for r in 0..job.mounts.len() as u32 {
            let st = job.status(r as usize);
            let problems = st["cache"]["problems"].to_string();
            assert!(
                !problems.contains("No space left"),
                "{times}x epoch {epoch}: {problems}"
            );
            let bytes = st["cache"]["bytes"].as_u64().unwrap();
            assert!(bytes <= cap, "{times}x epoch {epoch}: {st:#}");
            let partial = &st["partial"];
            assert_eq!(partial["cache_size_bytes"], cap);
            if !check_before {
                continue;
            }
            let planned = self.planner.outcome_of(r);
            let got = partial["hit_rate"].as_f64().unwrap();
            let before = epoch - 1;
            eprintln!(
                "{times}x rank {r} epoch {before}: hit rate {got:.3} (planned {:.3}), {} bytes from the source",
                planned.hit_rate(),
                partial["source_bytes_per_epoch"]
            );
            // The plan is a floor: the early refill (`cache::early`) may do better.
            let source = partial["source_bytes_per_epoch"].as_u64().unwrap();
            assert!(
                source <= planned.source_bytes,
                "{times}x rank {r} epoch {before}: {source} source bytes, planned {}",
                planned.source_bytes
            );
            assert!(
                got >= planned.hit_rate() - 1e-9,
                "{times}x rank {r} epoch {before}: measured {got}, planned {}",
                planned.hit_rate()
            );
        }
    }
}

fn run(times: u64, tmpfs: &str) {
    let mut s = Setup::new(times, tmpfs);
    let job = s.start();
    s.check(&job, 0, false);
    for epoch in 1..EPOCHS {
        s.advance(&job, epoch);
        s.check(&job, epoch, true);
        s.planner.advance();
    }
    drop(job);
}

#[test]
fn shares_twice_and_five_times_the_cache_stream_the_rest() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    if !require_root("mounts a small tmpfs as the cache") {
        return;
    }
    run(2, "1150k");
    run(5, "520k");
}

/// Killed (SIGKILL) after epoch 2 and started again on the same caches: it resumes at
/// epoch 2 within the cache's size, and the epochs after hit as the plan says.
#[test]
fn a_partial_cache_resumes_after_a_crash() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    if !require_root("mounts a small tmpfs as the cache") {
        return;
    }
    let mut s = Setup::new(2, "1150k");
    let job = s.start();
    s.check(&job, 0, false);
    for epoch in 1..3 {
        s.advance(&job, epoch);
        s.check(&job, epoch, false);
        s.planner.advance();
    }
    job.kill();
    let job = s.start();
    assert_eq!(job.status(0)["epoch"], 2);
    s.check(&job, 2, false);
    for epoch in 3..EPOCHS {
        s.advance(&job, epoch);
        // Epoch 2 was read twice (before the crash and after): its count is not the plan's.
        s.check(&job, epoch, epoch > 3);
        s.planner.advance();
    }
}

/// Killed after epoch 1 and started again on three ranks (an elastic restart): the new
/// shares are planned afresh from the epoch it resumes at, every epoch is still a partition
/// with every byte right and no cache passes its size.
#[test]
fn a_partial_cache_restarts_on_more_ranks() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    if !require_root("mounts a small tmpfs as the cache") {
        return;
    }
    let s = Setup::with_caches(2, "1150k", 3);
    let job = s.start();
    s.check(&job, 0, false);
    s.advance(&job, 1);
    s.check(&job, 1, false);
    job.kill();
    let job = s.start_ranks(3);
    assert_eq!(job.status(0)["epoch"], 1);
    s.check(&job, 1, false);
    for epoch in 2..EPOCHS {
        s.advance(&job, epoch);
        s.check(&job, epoch, false);
    }
}
