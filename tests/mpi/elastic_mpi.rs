//! Elastic restarts under real `mpirun` with real mounts: 4 ranks, then 2, then 3 over six
//! epochs, every job killed with SIGKILL mid-epoch (its exchange into the next epoch under
//! way) and relaunched with another `-np` on the same caches. At every epoch the ranks'
//! listings partition the dataset, every byte matches the source, and each rank lists
//! exactly what the pure plan predicts for the job's history of world sizes; nothing is
//! fetched from the source again, the gone ranks' caches are adopted and then removed, and
//! the status says where each rank's samples came from.

use std::collections::BTreeSet;
use std::path::Path;

use crate::common::mpi_job::{MpiJob, checked_listing, exchange, wait_all};
use crate::common::*;
use serde_json::Value;
use shufflefs::plan::PlanParams;
use shufflefs::plan::elastic::{ElasticPlan, History};

const SEED: u64 = 21;
const FRACTION: f64 = 0.5;
const CLASSES: u32 = 4;
const PER_CLASS: u32 = 30;
const SAMPLES: u64 = (CLASSES * PER_CLASS) as u64;

/// What the pure plan gives `rank` at `epoch` for `history`.
fn predicted(src: &Path, history: &History, epoch: u64, rank: u32) -> BTreeSet<String> {
    let m = shufflefs::dataset::scan::scan(src).unwrap();
    let params = PlanParams {
        samples: m.len(),
        world: history.world(),
        fraction: FRACTION,
        seed: SEED,
    };
    let plan = ElasticPlan::new(params, history.clone()).unwrap();
    plan.shares_at(epoch)
        .share(rank)
        .iter()
        .map(|&id| m.relative_path(id).to_string_lossy().into_owned())
        .collect()
}

/// Lists `epoch` on every rank: the planned shares, disjoint, covering the dataset.
fn check_epoch(dir: &Path, job: &MpiJob, history: &History, epoch: u64) {
    let mut all = BTreeSet::new();
    let mut total = 0;
    for r in 0..job.mounts.len() {
        let got = checked_listing(dir, &job.mounts[r], epoch);
        assert_eq!(
            got,
            predicted(&dir.join("src"), history, epoch, r as u32),
            "rank {r} epoch {epoch} ({})",
            history.describe()
        );
        total += got.len();
        all.extend(got);
    }
    assert_eq!(
        total as u64, SAMPLES,
        "epoch {epoch}: a sample listed twice"
    );
    assert_eq!(all.len() as u64, SAMPLES, "epoch {epoch}: a sample missing");
}

fn resize(job: &MpiJob, rank: usize) -> Value {
    job.status(rank)["resize"].clone()
}

fn sum(v: &Value) -> u64 {
    v.as_object()
        .map_or(0, |o| o.values().filter_map(Value::as_u64).sum())
}

/// Each rank's share at the restart came from its cache, gone ranks' caches and its peers,
/// the source giving nothing; returns what rank `r` received, by sender.
fn check_sources(job: &MpiJob, epoch: u64, world: u64) {
    for r in 0..job.mounts.len() {
        let st = job.status(r);
        assert_eq!(st["epoch"], epoch, "rank {r} resumed at the wrong epoch");
        assert_eq!(st["world_size"], world);
        let x = &st["resize"];
        assert_eq!(x["epoch"], epoch, "rank {r}: {x}");
        let parts = x["kept"].as_u64().unwrap()
            + x["adopted"].as_u64().unwrap()
            + sum(&x["received"])
            + x["from_source"].as_u64().unwrap();
        assert_eq!(Some(parts), x["share_samples"].as_u64(), "rank {r}: {x}");
        assert_eq!(x["from_source"], 0, "rank {r}: {x}");
        assert_eq!(
            st["cache"]["fetched_from_source"], 0,
            "rank {r} fetched from the source"
        );
    }
}

/// Kills `job` while every rank's exchange into `target` is running (slowed down by
/// `--exchange-rate` over MPI so that it is).
fn kill_mid_epoch(job: MpiJob, target: u64) {
    wait_all(&job, "the exchange into the next epoch to run", |st| {
        exchange(st, target).is_some_and(|x| x["state"] == "running")
    });
    job.kill();
}

#[test]
fn four_then_two_then_three_ranks_with_sigkill_between() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for c in 0..CLASSES {
        let class = dir.join(format!("src/class {c}"));
        std::fs::create_dir_all(&class).unwrap();
        for i in 0..PER_CLASS {
            let len = 3000 + i as usize * 97;
            let bytes: Vec<u8> = (0..len).map(|o| (o as u32 ^ (i * 31 + c)) as u8).collect();
            std::fs::write(class.join(format!("img {i:03}.png")), bytes).unwrap();
        }
    }
    // Over MPI, and slow, so that the jobs are killed in the middle of an exchange.
    let slow = |rate: &'static str| ["--exchange-rate", rate, "--share-disk", "never"];

    // 1. Four ranks: epochs 0 and 1, killed while exchanging into 2.
    let four = History::new(4);
    let job = MpiJob::start(dir, 4, SEED, FRACTION, &slow("20000"));
    check_epoch(dir, &job, &four, 0);
    check_epoch(dir, &job, &four, 1);
    assert!(resize(&job, 0).is_null(), "never resized yet");
    kill_mid_epoch(job, 2);
    for r in 2..4 {
        force_unmount(&dir.join(format!("mnt{r}")));
    }

    // 2. Two ranks on the same caches: epoch 1 again, remapped; the caches of ranks 2 and 3
    //    are adopted (or sent on by the rank that took them) and removed.
    let two = four.resized(1, 2).unwrap();
    let job = MpiJob::start(dir, 2, SEED, FRACTION, &slow("40000"));
    check_sources(&job, 1, 2);
    let adopted: u64 = (0..2)
        .map(|r| resize(&job, r)["adopted"].as_u64().unwrap())
        .sum();
    assert!(adopted > 0, "nothing adopted from the gone ranks' caches");
    let reclaimed: BTreeSet<String> = (0..2)
        .flat_map(|r| {
            let list = resize(&job, r)["reclaimed"].as_array().unwrap().clone();
            list.into_iter().map(|p| p.as_str().unwrap().to_string())
        })
        .collect();
    let gone: BTreeSet<String> = (2..4)
        .map(|r| dir.join(format!("cache{r}")).display().to_string())
        .collect();
    assert_eq!(reclaimed, gone);
    assert!(!dir.join("cache2").exists() && !dir.join("cache3").exists());
    for epoch in 1..=3 {
        check_epoch(dir, &job, &two, epoch);
    }
    kill_mid_epoch(job, 4);

    // 3. Three ranks: epoch 3 again; the new rank 2 gets its share from ranks 0 and 1 over
    //    MPI. Then epochs 4 and 5 as planned, and a clean unmount.
    let three = two.resized(3, 3).unwrap();
    let job = MpiJob::start(dir, 3, SEED, FRACTION, &["--share-disk", "never"]);
    check_sources(&job, 3, 3);
    let new = resize(&job, 2);
    assert_eq!(new["kept"], 0, "{new}");
    assert_eq!(Some(sum(&new["received"])), new["share_samples"].as_u64());
    for epoch in 3..=5 {
        check_epoch(dir, &job, &three, epoch);
    }
    let state: Value =
        serde_json::from_slice(&std::fs::read(dir.join("cache0/state.json")).unwrap()).unwrap();
    assert_eq!(state["world_size"], 3);
    assert_eq!(
        state["world_history"],
        serde_json::json!([{"epoch": 0, "world": 4}, {"epoch": 1, "world": 2}, {"epoch": 3, "world": 3}])
    );
    job.unmount();
    for r in 0..4 {
        let mnt = dir.join(format!("mnt{r}"));
        force_unmount(&mnt);
        assert!(!is_mounted(&mnt));
    }
}

/// 4 ranks stopped cleanly, then 3 on the same caches: the gone rank's folder is removed,
/// and every rank's `resize.reclaimed` names it (before, only the rank that happened to lock
/// it did: the others' said `[]`, `shufflefs status` of rank 0 among them).
#[test]
fn four_then_three_ranks_each_report_the_removed_folder() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    crate::common::mpi_job::write_source(dir, 2, 12, 2000);
    let job = MpiJob::start(dir, 4, SEED, FRACTION, &[]);
    wait_all(&job, "staging", |st| st["staging"]["state"] == "done");
    job.unmount();
    let job = MpiJob::start(dir, 3, SEED, FRACTION, &[]);
    let reports: Vec<Value> = (0..3).map(|r| resize(&job, r)).collect();
    job.unmount();
    assert!(!dir.join("cache3").exists(), "cache3 is left");
    let gone = Value::from(dir.join("cache3").display().to_string());
    for (r, x) in reports.iter().enumerate() {
        assert_eq!(
            x["reclaimed"],
            Value::Array(vec![gone.clone()]),
            "rank {r}: {x}"
        );
    }
}
