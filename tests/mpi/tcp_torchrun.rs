//! The TCP transport end to end: real `torchrun --no-python` jobs of shufflefs daemons, no MPI
//! in how they start or talk (`comm::TcpComm`, meeting at MASTER_ADDR and MASTER_PORT + 1).
//! The same promises as the MPI jobs: every epoch a partition of the dataset with exact bytes,
//! a rank that leaves does not take the others down, `shufflefs unmount` on every rank ends
//! the job with exit 0 and nothing left, and the same command resumes at the epoch reached.
//! Bad input: a rendezvous nobody answers, a rank of another job at this job's rendezvous,
//! and `--rendezvous` under mpirun.

use std::collections::BTreeSet;
use std::path::Path;

use crate::common::mpi_job::{MpiJob, checked_listing, torchrun, write_source};
use crate::common::*;

const SEED: u64 = 11;
const FRACTION: f64 = 0.5;

fn torchrun_job(dir: &Path, ranks: u32) -> Option<MpiJob> {
    let launcher = torchrun(ranks)?;
    Some(MpiJob::start_with(
        launcher,
        dir,
        ranks,
        SEED,
        FRACTION,
        &["--foreground"],
    ))
}

/// Every rank's listing of `epoch`, checked against the source: disjoint, and together
/// every sample.
fn partition(dir: &Path, job: &MpiJob, epoch: u64) -> Vec<BTreeSet<String>> {
    let lists: Vec<BTreeSet<String>> = (job.mounts.iter())
        .map(|m| checked_listing(dir, m, epoch))
        .collect();
    let total: usize = lists.iter().map(BTreeSet::len).sum();
    let all: BTreeSet<&String> = lists.iter().flatten().collect();
    assert_eq!(total, all.len(), "epoch {epoch}: a sample on two ranks");
    assert_eq!(
        all.len(),
        3 * 30,
        "epoch {epoch}: every sample on some rank"
    );
    lists
}

#[test]
fn a_torchrun_job_partitions_every_epoch_stops_with_exit_0_and_resumes() {
    if !require_fuse() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_source(dir, 3, 30, 3_000);
    let Some(job) = torchrun_job(dir, 3) else {
        return;
    };
    for r in 0..3 {
        let st = job.status(r);
        assert_eq!(
            (st["rank"].as_u64(), st["world_size"].as_u64()),
            (Some(r as u64), Some(3))
        );
    }
    let mut before = partition(dir, &job, 0);
    for epoch in 1..3 {
        let now = partition(dir, &job, epoch);
        let moved: usize = (before.iter().zip(&now))
            .map(|(a, b)| a.difference(b).count())
            .sum();
        assert!(
            moved > 0,
            "epoch {epoch}: the exchange moved samples between ranks"
        );
        before = now;
    }
    job.stop_cleanly(dir);
    let Some(again) = torchrun_job(dir, 3) else {
        return;
    };
    for r in 0..3 {
        assert_eq!(again.status(r)["epoch"], 2, "rank {r} resumed elsewhere");
    }
    assert_eq!(
        partition(dir, &again, 2),
        before,
        "the resumed epoch is the same"
    );
    again.stop_cleanly(dir);
}

/// A torchrun job restarted with fewer ranks (an elastic restart: 3 -> 2) goes on at the
/// epoch it had reached, every epoch still a partition with exact bytes.
#[test]
fn a_torchrun_job_restarted_on_fewer_ranks_goes_on_at_its_epoch() {
    if !require_fuse() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_source(dir, 3, 30, 3_000);
    let Some(job) = torchrun_job(dir, 3) else {
        return;
    };
    for epoch in 0..3 {
        partition(dir, &job, epoch);
    }
    job.stop_cleanly(dir);
    let Some(fewer) = torchrun_job(dir, 2) else {
        return;
    };
    for r in 0..2 {
        let st = fewer.status(r);
        assert_eq!(st["epoch"], 2, "rank {r} went on elsewhere: {st}");
        assert_eq!(st["world_size"], 2);
    }
    for epoch in 2..4 {
        partition(dir, &fewer, epoch);
    }
    fewer.stop_cleanly(dir);
}

#[test]
fn a_rank_that_unmounts_early_leaves_the_others_going_and_the_job_ends_with_exit_0() {
    if !require_fuse() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_source(dir, 3, 30, 3_000);
    let Some(mut job) = torchrun_job(dir, 2) else {
        return;
    };
    partition(dir, &job, 0);
    let out = shufflefs()
        .arg("unmount")
        .arg(&job.mounts[1])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Rank 0 goes on alone: its next epoch comes whole (what it cannot get from rank 1 it
    // reads from the source).
    let alone = checked_listing(dir, &job.mounts[0], 1);
    assert!(!alone.is_empty());
    job.mounts.remove(1);
    job.stop_cleanly(dir);
}

#[test]
fn a_rendezvous_nobody_answers_is_refused_naming_it_and_leaves_nothing() {
    if !require_fuse() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_source(dir, 1, 3, 100);
    let port = crate::common::s3::free_port();
    let (cache, mnt) = (dir.join("cache"), dir.join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    let out = shufflefs()
        .args(["mount", "--source"])
        .arg(dir.join("src"))
        .arg("--cache")
        .arg(&cache)
        .arg(&mnt)
        .envs([
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
        ])
        .env("MASTER_PORT", port.to_string())
        .env("SHUFFLEFS_RENDEZVOUS_WAIT", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "cannot reach the rendezvous at 127.0.0.1:{}",
            port + 1
        )),
        "{err}"
    );
    assert!(err.contains("is rank 0 started"), "{err}");
    assert!(!is_mounted(&mnt));
    assert!(
        !cache.exists(),
        "a refused mount leaves no cache folder behind"
    );
}

#[test]
fn a_rendezvous_under_mpirun_is_refused_on_every_rank() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_source(dir, 1, 3, 100);
    let out = crate::common::mpi_job::mpirun(2)
        .args([BIN, "mount", "--rendezvous", "127.0.0.1:1", "--source"])
        .arg(dir.join("src"))
        .arg("--cache")
        .arg(dir.join("cache{rank}"))
        .arg(dir.join("mnt{rank}"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(
        err.matches("--rendezvous is for jobs started without an MPI launcher")
            .count(),
        2,
        "{err}"
    );
}

/// Two jobs given one rendezvous port (the same SHUFFLEFS_PORT, other torchrun runs): job b's
/// rank 1 reaches job a's rank 0 while a gathers. It is refused, naming the rendezvous and
/// the fix, and leaves no mount or cache; job a goes on, forms when its own rank 1 comes,
/// and both its ranks mount and stop cleanly.
#[test]
fn a_rank_of_another_job_at_the_rendezvous_is_turned_away_and_the_job_goes_on() {
    if !require_fuse() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_source(dir, 1, 3, 100);
    let (port, master) = (
        crate::common::s3::free_port(),
        crate::common::s3::free_port(),
    );
    let spot = |run: &str, r: u32| {
        (
            dir.join(format!("cache-{run}{r}")),
            dir.join(format!("mnt-{run}{r}")),
        )
    };
    let rank = |run: &str, r: u32| {
        let (cache, mnt) = spot(run, r);
        std::fs::create_dir_all(&mnt).unwrap();
        let mut cmd = shufflefs();
        cmd.args(["mount", "--source"])
            .arg(dir.join("src"))
            .arg("--cache")
            .arg(cache)
            .arg(mnt)
            .envs([("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1")])
            .env("RANK", r.to_string())
            .env("MASTER_PORT", master.to_string())
            .env("SHUFFLEFS_PORT", port.to_string())
            .env("TORCHELASTIC_RUN_ID", run);
        cmd
    };
    let mounts = [spot("a", 0).1, spot("a", 1).1];
    let _cleanup: Vec<DetachedMount> = (mounts.iter())
        .map(|m| DetachedMount {
            mnt: m.clone(),
            pid: None,
        })
        .collect();
    let mut zero = rank("a", 0)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let listening = || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !listening() {
        assert!(
            std::time::Instant::now() < deadline,
            "rank 0 never listened"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let other = rank("b", 1).output().unwrap();
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(!other.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "rank 1 of another job came to the rendezvous at 127.0.0.1:{port}"
        )),
        "{err}"
    );
    assert!(err.contains("SHUFFLEFS_PORT"), "{err}");
    let (cache, mnt) = spot("b", 1);
    assert!(
        !is_mounted(&mnt) && !cache.exists(),
        "the refused rank left nothing"
    );
    let one = rank("a", 1).output().unwrap();
    check("job a's rank 1", &one);
    let status = wait_child(&mut zero, std::time::Duration::from_secs(60));
    assert!(
        status.is_some_and(|s| s.success()),
        "job a's rank 0: {status:?}"
    );
    for m in &mounts {
        assert_eq!(read_status(m)["world_size"], 2, "{}", m.display());
    }
    for m in &mounts {
        let out = shufflefs().arg("unmount").arg(m).output().unwrap();
        check("shufflefs unmount", &out);
    }
}
