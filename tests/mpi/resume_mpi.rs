//! SIGKILL and resume under real `mpirun -np 4` with real mounts. Every daemon and the
//! launcher are killed with SIGKILL, (1) in the middle of the exchange into epoch 1 and
//! (2) after only ranks 0 and 1 moved on to epoch 2. Each time the job is started again with
//! the same command and caches (the dead mounts are cleaned up by the new daemons): every rank
//! resumes at the furthest epoch reached, its listings (every byte checked) are exactly the
//! plan's for an uninterrupted run, including the epochs that follow, and nothing that was
//! cached is fetched from the source again.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::mpi_job::{MpiJob, checked_listing, exchange, planned, wait_all};
use crate::common::*;
use shufflefs::sys::mounts::is_mounted;

const RANKS: u32 = 4;
const SEED: u64 = 9;
const FRACTION: f64 = 0.5;

fn check_epoch(dir: &Path, job: &MpiJob, epoch: u64) {
    for r in 0..RANKS {
        assert_eq!(
            checked_listing(dir, &job.mounts[r as usize], epoch),
            planned(&dir.join("src"), (RANKS, SEED, FRACTION), epoch, r),
            "rank {r} epoch {epoch} differs from an uninterrupted run"
        );
    }
}

fn assert_all_resumed_at(job: &MpiJob, epoch: u64) {
    for r in 0..RANKS as usize {
        assert_eq!(
            job.status(r)["epoch"],
            epoch,
            "rank {r} resumed at the wrong epoch"
        );
    }
}

fn fetched_from_source(job: &MpiJob) -> Vec<u64> {
    (0..RANKS as usize)
        .map(|r| {
            job.status(r)["cache"]["fetched_from_source"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[test]
fn sigkill_at_any_moment_then_resume_like_an_uninterrupted_run() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for c in 0..4 {
        let class = dir.join(format!("src/class {c}"));
        std::fs::create_dir_all(&class).unwrap();
        for i in 0..40u32 {
            let len = 20_000 + i as usize * 97;
            let bytes: Vec<u8> = (0..len).map(|o| (o as u32 ^ (i * 31 + c)) as u8).collect();
            std::fs::write(class.join(format!("img {i:03}.png")), bytes).unwrap();
        }
    }
    for r in 0..RANKS {
        std::fs::create_dir(dir.join(format!("mnt{r}"))).unwrap();
    }

    // 1. Killed in the middle of the exchange into epoch 1 (slowed down so it is running).
    let job = MpiJob::start(
        dir,
        RANKS,
        SEED,
        FRACTION,
        &["--exchange-rate", "50000", "--share-disk", "never"],
    );
    wait_all(&job, "staging", |st| {
        st["staging"]["state"] == "done"
            && st["staging"]["files_done"] == st["staging"]["files_total"]
    });
    wait_all(&job, "the exchange into epoch 1 to start", |st| {
        exchange(st, 1).is_some_and(|x| x["state"] == "running")
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(0..RANKS as usize).any(|r| {
        exchange(&job.status(r), 1).is_some_and(|x| x["bytes_received"].as_u64() > Some(0))
    }) {
        assert!(Instant::now() < deadline, "exchange never received bytes");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        (0..RANKS as usize).all(|r| exchange(&job.status(r), 1).unwrap()["state"] == "running"),
        "the exchange should still be running when killed"
    );
    job.kill();

    // 2. Same command again: epoch 0, nothing fetched again; epochs 0 and 1 as planned.
    let job = MpiJob::start(dir, RANKS, SEED, FRACTION, &[]);
    assert_all_resumed_at(&job, 0);
    check_epoch(dir, &job, 0);
    check_epoch(dir, &job, 1);
    assert_eq!(fetched_from_source(&job), [0; RANKS as usize]);

    // 3. Only ranks 0 and 1 move on to epoch 2, then everything is killed.
    for r in 0..2 {
        assert!(job.mounts[r].join("epoch-2").is_dir());
    }
    wait_all(&job, "the exchange into epoch 3 to start", |st| {
        st["epoch"] == 1 || exchange(st, 3).is_some()
    });
    job.kill();

    // 4. Everyone resumes at epoch 2, the furthest reached; 2, 3, 4 as planned.
    let job = MpiJob::start(dir, RANKS, SEED, FRACTION, &[]);
    assert_all_resumed_at(&job, 2);
    for epoch in 2..=4 {
        check_epoch(dir, &job, epoch);
    }
    assert_eq!(fetched_from_source(&job), [0; RANKS as usize]);
    for r in 0..RANKS as usize {
        let files = job.status(r)["cache"]["files"].as_u64().unwrap();
        let share = job.status(r)["share_samples"].as_u64().unwrap();
        assert!(
            files as f64 <= share as f64 * (1.0 + FRACTION) + 2.0,
            "rank {r}: {files} cached files for a share of {share}"
        );
    }
    job.unmount();
    for r in 0..RANKS {
        assert!(!is_mounted(&dir.join(format!("mnt{r}"))));
    }
}
