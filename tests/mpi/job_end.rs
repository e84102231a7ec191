//! The end of an ordinary job, under real `mpirun` at realistic sizes: every rank advances
//! to epoch 1, the background exchange into epoch 2 finishes, then every rank is unmounted,
//! all at once or a while apart, over a shared disk (hand-offs) or over MPI, and after an
//! elastic restart. `mpirun` exits 0 every time, nothing stays mounted or running.
//!
//! Each rank's last ("leaving") exchange once returned with its size lists still pending:
//! the communicator abandoned them, MPI was never finalized and every such job ended with
//! exit 1 (3 of 3 by hand). Size lists of ~20 samples complete at once (MPI's eager
//! sends), so the streams here carry ≥ 150 samples of 10-34 kB each. Loops
//! `SHUFFLEFS_JOB_END_LOOPS` times (default 2) per case: set it higher to trust a change.

use std::path::Path;
use std::time::Duration;

use crate::common::mpi_job::{MpiJob, exchange, wait_all};
use crate::common::*;

const SEED: u64 = 7;
const FRACTION: f64 = 0.5;
const CLASSES: u32 = 8;

/// `CLASSES` classes of samples of 10-40 kB, enough for streams of ≥ 150 samples with
/// `ranks` ranks: a rank receives about a sixth of its share from each of 2 peers, an
/// eighth from each of 3 (measured), so 400 x ranks² samples.
fn write_dataset(dir: &Path, ranks: u32) {
    let per_class = 50 * ranks * ranks;
    for c in 0..CLASSES {
        let class = dir.join(format!("src/class{c}"));
        std::fs::create_dir_all(&class).unwrap();
        for i in 0..per_class {
            let len = 10_000 + (i as usize * 977) % 30_000;
            let data: Vec<u8> = (0..len).map(|o| (o as u32 ^ (i * 31 + c)) as u8).collect();
            std::fs::write(class.join(format!("s{i:04}.bin")), data).unwrap();
        }
    }
}

fn loops() -> usize {
    std::env::var("SHUFFLEFS_JOB_END_LOOPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

/// Every rank advances to the next epoch (at once, as trainers do), then the exchange into
/// the one after runs to its end on every rank; its streams into rank 0 hold `least`
/// samples or more.
fn advance_and_settle(job: &MpiJob, least: u64) {
    let next = job.status(0)["epoch"].as_u64().unwrap() + 1;
    std::thread::scope(|s| {
        for m in &job.mounts {
            s.spawn(move || {
                std::fs::write(m.join(".shufflefs/epoch"), format!("{next}\n")).unwrap()
            });
        }
    });
    wait_all(job, "the next epoch and the exchange after it done", |st| {
        st["epoch"] == next && exchange(st, next + 1).is_some_and(|x| x["state"] == "done")
    });
    let report = job.status(0);
    let peers = exchange(&report, next + 1).unwrap()["peers"]
        .as_array()
        .unwrap()
        .clone();
    let fewest = peers
        .iter()
        .map(|p| p["samples_to_receive"].as_u64().unwrap());
    assert!(
        fewest.min().is_some_and(|n| n >= least),
        "streams too short: {peers:?}"
    );
}

/// Unmounts every rank, `apart` between two, and checks the job ended cleanly: `mpirun`
/// exits 0, no mount and no daemon is left.
fn stop(mut job: MpiJob, dir: &Path, apart: Duration) {
    let pids: Vec<i32> = (0..job.mounts.len())
        .map(|r| job.status(r)["pid"].as_i64().unwrap() as i32)
        .collect();
    for (k, m) in job.mounts.iter().enumerate() {
        if k > 0 {
            std::thread::sleep(apart);
        }
        let out = shufflefs().arg("unmount").arg(m).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let status = job.wait_within(Duration::from_secs(90));
    let log = std::fs::read_to_string(dir.join("job.log")).unwrap_or_default();
    let status = status.unwrap_or_else(|| panic!("the job did not end after unmount\n{log}"));
    assert!(status.success(), "the job ended with {status}\n{log}");
    assert!(
        !log.contains("abandoned"),
        "a transfer was abandoned at the end\n{log}"
    );
    for m in &job.mounts {
        assert!(!is_mounted(m), "{} is still mounted", m.display());
    }
    for pid in pids {
        assert!(wait_pid_gone(pid, Duration::from_secs(10)), "daemon {pid}");
    }
    job.mounts.clear();
}

/// `loops()` jobs of `ranks` over one source, each stopped `apart` between ranks.
fn ends_cleanly(ranks: u32, apart: Duration, extra: &[&str]) {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_dataset(dir, ranks);
    for _ in 0..loops() {
        let mut args = vec!["--reset-cache"];
        args.extend_from_slice(extra);
        let job = MpiJob::start(dir, ranks, SEED, FRACTION, &args);
        advance_and_settle(&job, 150);
        stop(job, dir, apart);
    }
}

#[test]
fn three_ranks_on_one_disk_stopped_at_once_exit_zero() {
    ends_cleanly(3, Duration::ZERO, &[]);
}

#[test]
fn three_ranks_over_mpi_stopped_apart_exit_zero() {
    ends_cleanly(3, Duration::from_secs(2), &["--share-disk", "never"]);
}

#[test]
fn four_ranks_over_mpi_stopped_at_once_exit_zero() {
    ends_cleanly(4, Duration::from_millis(5), &["--share-disk", "never"]);
}

/// An elastic restart's last job (4 ranks, then 3 on the same caches) ends cleanly too.
#[test]
fn the_last_job_after_an_elastic_restart_exits_zero() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_dataset(dir, 4);
    let job = MpiJob::start(dir, 4, SEED, FRACTION, &[]);
    advance_and_settle(&job, 150);
    stop(job, dir, Duration::ZERO);
    for _ in 0..loops() {
        let job = MpiJob::start(dir, 3, SEED, FRACTION, &[]);
        advance_and_settle(&job, 150);
        stop(job, dir, Duration::from_millis(500));
    }
}
