//! Stopping is clean at any moment, under real `mpirun`: `shufflefs unmount` on every rank
//! while the ranks stage from the source, while a partial exchange runs, or while the coded
//! server multicasts. Every rank exits 0 (so the launcher does), nothing stays mounted or
//! running, and the same command mounts again, resuming the caches.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::mpi_job::{MpiJob, exchange, mpirun, wait_all, write_source};
use crate::common::*;

const SEED: u64 = 7;
const FRACTION: f64 = 0.5;
const RANKS: u32 = 2;

/// The same command mounts again without `--reset-cache`, at the epoch it had reached.
fn remount_resumes(dir: &Path, epoch: u64, fraction: f64, extra: &[&str]) {
    let job = MpiJob::start(dir, RANKS, SEED, fraction, extra);
    for r in 0..RANKS as usize {
        assert_eq!(job.status(r)["epoch"], epoch, "rank {r} resumed elsewhere");
    }
    job.stop_cleanly(dir);
}

#[test]
fn unmount_during_a_partial_exchange_exits_zero_everywhere() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_source(dir, 2, 40, 20_000);
    // Over MPI and slowed down, so the exchange into epoch 1 (started at mount) runs for
    // many seconds.
    let slow = ["--exchange-rate", "50000", "--share-disk", "never"];
    let job = MpiJob::start(dir, RANKS, SEED, FRACTION, &slow);
    wait_all(&job, "the exchange into epoch 1 to run", |st| {
        exchange(st, 1).is_some_and(|x| x["state"] == "running")
    });
    std::thread::sleep(Duration::from_millis(500));
    job.stop_cleanly(dir);
    remount_resumes(dir, 0, FRACTION, &[]);
}

#[test]
fn unmount_during_staging_exits_zero_everywhere() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Many samples staged by one thread, so staging is still going when the ranks stop.
    write_source(dir, 4, 500, 40_000);
    let args = ["--staging-threads", "1"];
    let job = MpiJob::start(dir, RANKS, SEED, 0.0, &args);
    let staging = job.status(0)["staging"].clone();
    job.stop_cleanly(dir);
    assert_ne!(staging["state"], "done", "staging ended before the stop");
    remount_resumes(dir, 0, 0.0, &args);
}

/// `mpirun -np 1 shufflefs serve : -np 2 shufflefs mount --exchange coded`, with mounts
/// `DIR/mnt{rank}` for the two compute ranks.
fn coded_job(dir: &Path) -> MpiJob {
    let mut launcher = mpirun(1);
    launcher
        .args([crate::common::BIN, "serve", "--source"])
        .arg(dir.join("src"))
        .args([":", "-np", &RANKS.to_string()]);
    let coded = ["--exchange", "coded", "--cache-fraction", "0.75"];
    MpiJob::start_with(launcher, dir, RANKS, SEED, FRACTION, &coded)
}

#[test]
fn unmount_during_a_coded_burst_exits_zero_everywhere() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_source(dir, 2, 200, 50_000);
    let job = coded_job(dir);
    wait_all(&job, "the coded exchange into epoch 1 to run", |st| {
        exchange(st, 1).is_some_and(|x| x["state"] == "running")
    });
    job.stop_cleanly(dir);
    let job = coded_job(dir);
    for r in 0..RANKS as usize {
        assert_eq!(job.status(r)["epoch"], 0, "rank {r} resumed elsewhere");
    }
    job.stop_cleanly(dir);
}

/// SIGTERM to every rank (as a scheduler ending a job would) during the partial exchange:
/// the same clean stop.
#[test]
fn sigterm_during_a_partial_exchange_exits_zero_everywhere() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_source(dir, 2, 40, 20_000);
    let slow = ["--exchange-rate", "50000", "--share-disk", "never"];
    let mut job = MpiJob::start(dir, RANKS, SEED, FRACTION, &slow);
    wait_all(&job, "the exchange into epoch 1 to run", |st| {
        exchange(st, 1).is_some_and(|x| x["state"] == "running")
    });
    std::thread::sleep(Duration::from_millis(500));
    let pids = job.pids();
    for &pid in &pids {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .stderr(Stdio::null())
            .status();
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(s) = job.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the job did not end on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = std::fs::read_to_string(dir.join("job.log")).unwrap_or_default();
    assert!(status.success(), "the job ended with {status}\n{log}");
    for m in &job.mounts {
        assert!(!is_mounted(m), "{} is still mounted", m.display());
    }
    for pid in pids {
        assert!(wait_pid_gone(pid, Duration::from_secs(10)), "daemon {pid}");
    }
    job.mounts.clear();
    drop(job);
    remount_resumes(dir, 0, FRACTION, &[]);
}

/// Pids of the `shufflefs mount` processes of the job over `dir` (read from /proc: before
/// they mount there is no status file to ask).
fn mount_pids(dir: &Path) -> Vec<i32> {
    job_pids("mount", &dir.join("cache{rank}"))
}

/// Pids of the `shufflefs SUBCOMMAND` processes with `arg` among their arguments.
fn job_pids(subcommand: &str, arg: &Path) -> Vec<i32> {
    let cache = arg.display().to_string();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let ours = args.first().is_some_and(|a| a.ends_with("shufflefs"));
        if ours && args.iter().any(|a| a == subcommand) && args.contains(&cache) {
            pids.push(pid);
        }
    }
    pids
}

/// SIGTERM to every rank while a job restarted with another number of ranks moves samples
/// to the new shares (start-up, before any rank mounts): the move finishes, no rank mounts,
/// every rank exits 0, and the next start resumes.
#[test]
fn sigterm_during_a_resize_exits_zero_everywhere() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_source(dir, 2, 40, 20_000);
    let job = MpiJob::start(dir, RANKS, SEED, FRACTION, &[]);
    wait_all(&job, "staging", |st| st["staging"]["state"] == "done");
    job.stop_cleanly(dir);

    // Three ranks on the two caches: the new rank's share comes over MPI, slowly.
    for r in 0..3 {
        let _ = std::fs::create_dir(dir.join(format!("mnt{r}")));
    }
    let mut child = mpirun(3)
        .args([crate::common::BIN, "mount", "--seed", &SEED.to_string()])
        .args(["--fraction", &FRACTION.to_string(), "--source"])
        .arg(dir.join("src"))
        .arg("--cache")
        .arg(dir.join("cache{rank}"))
        .args(["--exchange-rate", "20000", "--share-disk", "never"])
        .arg(dir.join("mnt{rank}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("job.log")).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(dir.join("job.log")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !log().contains("moving samples to the owners of the new shares") {
        assert!(
            Instant::now() < deadline,
            "the resize never started\n{}",
            log()
        );
        assert!(child.try_wait().unwrap().is_none(), "{}", log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let pids = mount_pids(dir);
    assert_eq!(pids.len(), 3, "{pids:?}");
    for &pid in &pids {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "the job did not end on SIGTERM during the resize\n{}",
                log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "the job ended with {status}\n{}", log());
    for r in 0..3 {
        let m = dir.join(format!("mnt{r}"));
        assert!(!is_mounted(&m), "{} is mounted", m.display());
    }
    for pid in pids {
        assert!(wait_pid_gone(pid, Duration::from_secs(10)), "daemon {pid}");
    }
    // The next start of the three ranks resumes the resized job.
    let job = MpiJob::start(dir, 3, SEED, FRACTION, &[]);
    for r in 0..3 {
        assert_eq!(job.status(r)["epoch"], 0, "rank {r} resumed elsewhere");
    }
    job.stop_cleanly(dir);
}

/// SIGTERM to every process of a coded job, the server included (as a scheduler ending
/// the job does), during a burst: the compute ranks unmount, the server serves on until
/// they leave, and the launcher exits 0.
#[test]
fn sigterm_to_a_whole_coded_job_exits_zero_everywhere() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_source(dir, 2, 200, 50_000);
    let mut job = coded_job(dir);
    wait_all(&job, "the coded exchange into epoch 1 to run", |st| {
        exchange(st, 1).is_some_and(|x| x["state"] == "running")
    });
    let mut pids = job.pids();
    pids.extend(job_pids("serve", &dir.join("src")));
    assert_eq!(pids.len(), RANKS as usize + 1, "{pids:?}");
    for &pid in &pids {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    let status = job.wait_within(Duration::from_secs(90));
    let log = std::fs::read_to_string(dir.join("job.log")).unwrap_or_default();
    let status = status.unwrap_or_else(|| panic!("the job did not end on SIGTERM\n{log}"));
    assert!(status.success(), "the job ended with {status}\n{log}");
    for m in &job.mounts {
        assert!(!is_mounted(m), "{} is still mounted", m.display());
    }
    for pid in pids {
        assert!(wait_pid_gone(pid, Duration::from_secs(10)), "process {pid}");
    }
}
