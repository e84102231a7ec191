//! A share larger than the cache (issue 33), real mpirun, 2 ranks, each cache on a tmpfs
//! only a little larger than `--cache-size`, shares 2x and 5x the cache: every epoch is a
//! partition of the dataset with every byte right, nothing hits a full disk (the cache's
//! bytes stay within its size), and the hit rate and source bytes each rank measures per
//! epoch are the ones the plan (`plan::keep`) gives. Needs root (tmpfs).

use std::path::Path;

use crate::common::mpi_job::{MpiJob, checked_listing, exchange, wait_all};
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

fn write_equal_source(dir: &Path) {
    for c in 0..CLASSES {
        let class = dir.join(format!("src/c{c}"));
        std::fs::create_dir_all(&class).unwrap();
        for i in 0..PER_CLASS {
            let data: Vec<u8> = (0..SIZE).map(|o| (o as u32 ^ (i * 31 + c)) as u8).collect();
            std::fs::write(class.join(format!("s{i:03}.bin")), data).unwrap();
        }
    }
}

/// Unmounts the tmpfs caches however the test ends.
struct Tmpfs(Vec<std::path::PathBuf>);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

fn run(times: u64, tmpfs: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_equal_source(dir);
    let share = u64::from(CLASSES * PER_CLASS / RANKS) * SIZE as u64;
    let cap = share / times;
    let mut caches = Tmpfs(Vec::new());
    for r in 0..RANKS {
        let cache = dir.join(format!("cache{r}"));
        std::fs::create_dir(&cache).unwrap();
        let options = format!("size={tmpfs}");
        nix::mount::mount(
            Some("tmpfs"),
            &cache,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(options.as_str()),
        )
        .unwrap();
        caches.0.push(cache);
    }
    let size = cap.to_string();
    let job = MpiJob::start(
        dir,
        RANKS,
        SEED,
        FRACTION,
        &["--share-disk", "never", "--cache-size", &size],
    );
    let samples = CLASSES * PER_CLASS;
    let plan = Plan::new(PlanParams {
        samples,
        world: RANKS,
        fraction: FRACTION,
        seed: SEED,
    })
    .unwrap();
    let mut planner = KeepPlanner::new(
        plan,
        vec![SIZE as u64; samples as usize],
        cap,
        DEFAULT_HORIZON,
    );
    for epoch in 0..EPOCHS {
        if epoch > 0 {
            for m in &job.mounts {
                write_epoch(m, epoch.to_string()).unwrap();
            }
            // The samples that left are evicted as the next exchange starts: once it is
            // done, the cache holds this epoch's kept samples only.
            wait_all(&job, "the next exchange", |st| {
                exchange(st, epoch + 1).is_some_and(|x| x["state"] == "done")
            });
        }
        let mut all = std::collections::BTreeSet::new();
        let mut total = 0;
        for m in &job.mounts {
            let got = checked_listing(dir, m, epoch);
            total += got.len();
            all.extend(got);
        }
        assert_eq!(
            (total, all.len()),
            (samples as usize, samples as usize),
            "{times}x epoch {epoch}"
        );
        for r in 0..RANKS {
            let st = job.status(r as usize);
            let problems = st["cache"]["problems"].to_string();
            assert!(
                !problems.contains("No space left"),
                "{times}x epoch {epoch}: {problems}"
            );
            assert!(
                st["cache"]["bytes"].as_u64().unwrap() <= cap,
                "{times}x epoch {epoch}: {st:#}"
            );
            let partial = &st["partial"];
            assert_eq!(partial["cache_size_bytes"], cap);
            if epoch > 0 {
                // The epoch before, measured, against the plan's.
                let expected = planner.outcome_of(r).hit_rate();
                let got = partial["hit_rate"].as_f64().unwrap();
                eprintln!(
                    "{times}x rank {r} epoch {}: hit rate {got:.3} (planned {expected:.3}), {} bytes from the source",
                    epoch - 1,
                    partial["source_bytes_per_epoch"]
                );
                assert!(
                    (got - expected).abs() < 1e-9,
                    "{times}x rank {r} epoch {}: measured {got}, planned {expected}",
                    epoch - 1
                );
            }
        }
        if epoch > 0 {
            planner.advance();
        }
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
