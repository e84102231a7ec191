//! One rank leaves while the others go on (item 6), under real `mpirun -np 4`.
//!
//! Every rank is advanced to epoch 1, which starts the background exchange into epoch 2;
//! while it runs (slowed by `--exchange-rate`), `shufflefs unmount` on rank 0 alone. That
//! rank finishes what it owes its peers and leaves; the other ranks keep serving epoch 1 (a
//! reader on rank 2 reads every file of it with the right bytes), then advance to epoch 2
//! and list every sample of their shares with the right bytes (what rank 0 did not deliver
//! comes from the source), and once they are unmounted too the launcher exits 0.
//!
//! The other tests: every rank stopping while one is an epoch ahead (no 60 s wait, exit 0),
//! the rank ahead leaving first while its peer catches up, and a plain unmount while a
//! writer waits on an advance (the view is detached, the writer released).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::mpi_job::{MpiJob, checked_listing, exchange, planned, wait_all, write_source};
use crate::common::*;

const SEED: u64 = 11;
const FRACTION: f64 = 0.5;
const RANKS: u32 = 4;

/// Reads every file of `epoch` on `mnt` one by one, `pause` apart, each compared with the
/// source; the names read.
fn slow_reader(dir: PathBuf, mnt: PathBuf, epoch: u64, pause: Duration) -> BTreeSet<String> {
    let view = mnt.join(format!("epoch-{epoch}"));
    let mut names = Vec::new();
    for class in std::fs::read_dir(&view).unwrap() {
        let class = class.unwrap();
        for f in std::fs::read_dir(class.path()).unwrap() {
            let f = f.unwrap().file_name();
            names.push(format!(
                "{}/{}",
                class.file_name().to_string_lossy(),
                f.to_string_lossy()
            ));
        }
    }
    let mut read = BTreeSet::new();
    for rel in names {
        let got = std::fs::read(view.join(&rel))
            .unwrap_or_else(|e| panic!("reading {rel} on {}: {e}", mnt.display()));
        assert!(
            got == std::fs::read(dir.join("src").join(&rel)).unwrap(),
            "{rel} differs from the source"
        );
        read.insert(rel);
        std::thread::sleep(pause);
    }
    read
}

#[test]
fn one_rank_leaves_during_an_exchange_and_the_others_go_on() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    write_source(&dir, 2, 60, 20_000);
    let slow = ["--exchange-rate", "40000", "--share-disk", "never"];
    let mut job = MpiJob::start(&dir, RANKS, SEED, FRACTION, &slow);
    let log = || std::fs::read_to_string(dir.join("job.log")).unwrap_or_default();
    let pid0 = job.status(0)["pid"].as_i64().unwrap() as i32;
    for m in &job.mounts {
        write_epoch(m, "1").unwrap();
    }
    wait_all(&job, "the exchange into epoch 2 to run", |st| {
        exchange(st, 2).is_some_and(|x| x["state"] == "running")
    });
    let reader = {
        let (dir, mnt) = (dir.clone(), job.mounts[2].clone());
        std::thread::spawn(move || slow_reader(dir, mnt, 1, Duration::from_millis(40)))
    };
    std::thread::sleep(Duration::from_millis(500));

    let started = Instant::now();
    let out = shufflefs()
        .args(["unmount", "--timeout", "60"])
        .arg(&job.mounts[0])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "shufflefs unmount m0: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        log()
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "unmount of m0 took {:?}",
        started.elapsed()
    );
    assert!(!is_mounted(&job.mounts[0]));
    for r in 1..RANKS as usize {
        assert!(
            is_mounted(&job.mounts[r]),
            "rank {r} lost its mount\n{}",
            log()
        );
    }
    let read = reader.join().expect("the reader on m2 failed");
    assert_eq!(
        read,
        planned(&dir.join("src"), (RANKS, SEED, FRACTION), 1, 2)
    );

    // Epoch 2 came from an exchange rank 0 finished; into 3 it served without samples (and
    // said it left); into 4 the others exchange without it. What rank 0 would have sent
    // comes from the source.
    for epoch in 2..=4u64 {
        for r in 1..RANKS as usize {
            write_epoch(&job.mounts[r], epoch.to_string())
                .unwrap_or_else(|e| panic!("advancing rank {r} to {epoch}: {e}\n{}", log()));
            let listed = checked_listing(&dir, &job.mounts[r], epoch);
            let want = planned(&dir.join("src"), (RANKS, SEED, FRACTION), epoch, r as u32);
            assert_eq!(listed, want, "rank {r}'s epoch {epoch}");
        }
    }
    let st = job.status(1);
    let into4 = exchange(&st, 4).expect("the exchange into 4 in rank 1's status");
    let zero = (into4["peers"].as_array().unwrap().iter()).find(|p| p["rank"] == 0);
    assert!(
        zero.is_none_or(|p| p["given_up"] == true),
        "rank 0 took part in the exchange into 4: {into4}"
    );

    job.mounts.remove(0);
    for m in &job.mounts {
        let out = shufflefs()
            .args(["unmount", "--timeout", "120"])
            .arg(m)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "unmount {}: {err}\n{}",
            m.display(),
            log()
        );
    }
    let status = job.wait_within(Duration::from_secs(120));
    let status = status.unwrap_or_else(|| panic!("the job did not end\n{}", log()));
    assert!(status.success(), "the job ended with {status}\n{}", log());
    assert!(
        wait_pid_gone(pid0, Duration::from_secs(10)),
        "rank 0 runs on"
    );
    job.mounts.clear();
}

/// Every rank stops while one is an epoch ahead: rank 0 at epoch 1 runs the exchange into
/// epoch 2, which rank 1 (at epoch 0) never starts. Rank 1 leaves by serving that exchange
/// without samples, so rank 0's drain completes at once (not after the 60 s drain limit)
/// and both exit 0.
#[test]
fn all_ranks_stop_while_one_is_an_epoch_ahead() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    write_source(&dir, 2, 30, 10_000);
    // Ranks of one host take samples through the disk (the default).
    let mut job = MpiJob::start(&dir, 2, SEED, FRACTION, &[]);
    let log = || std::fs::read_to_string(dir.join("job.log")).unwrap_or_default();
    write_epoch(&job.mounts[0], "1").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while exchange(&job.status(0), 2).is_none_or(|x| x["state"] != "running") {
        assert!(Instant::now() < deadline, "no exchange into 2 on rank 0");
        std::thread::sleep(Duration::from_millis(50));
    }
    let started = Instant::now();
    let mut first = shufflefs()
        .args(["unmount", "--timeout", "60"])
        .arg(&job.mounts[0])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let second = shufflefs()
        .args(["unmount", "--timeout", "60"])
        .arg(&job.mounts[1])
        .output()
        .unwrap();
    let first = first.wait().unwrap();
    assert!(first.success() && second.status.success(), "{}", log());
    let status = job.wait_within(Duration::from_secs(60));
    let status = status.unwrap_or_else(|| panic!("the job did not end\n{}", log()));
    assert!(status.success(), "the job ended with {status}\n{}", log());
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "stopping took {:?}\n{}",
        started.elapsed(),
        log()
    );
    job.mounts.clear();
}

/// The rank an epoch ahead stops first while its peer, an epoch behind, keeps training:
/// `shufflefs unmount` returns at once (the rank finishes its exchange when the peer gets
/// there, never giving it up, which would end the job), the peer advances and reads its
/// epoch whole, and once it is unmounted too both exit 0.
#[test]
fn the_rank_ahead_leaves_first_and_its_peer_catches_up() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    write_source(&dir, 2, 30, 10_000);
    let mut job = MpiJob::start(&dir, 2, SEED, FRACTION, &["--share-disk", "never"]);
    let log = || std::fs::read_to_string(dir.join("job.log")).unwrap_or_default();
    write_epoch(&job.mounts[0], "1").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while exchange(&job.status(0), 2).is_none_or(|x| x["state"] != "running") {
        assert!(Instant::now() < deadline, "no exchange into 2 on rank 0");
        std::thread::sleep(Duration::from_millis(50));
    }
    let started = Instant::now();
    let out = shufflefs()
        .args(["unmount", "--timeout", "60"])
        .arg(&job.mounts[0])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "unmount m0: {err}\n{}", log());
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "unmount of m0 took {:?}",
        started.elapsed()
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        is_mounted(&job.mounts[1]),
        "rank 1 lost its mount\n{}",
        log()
    );
    for epoch in 1..=2u64 {
        write_epoch(&job.mounts[1], epoch.to_string()).unwrap();
        let listed = checked_listing(&dir, &job.mounts[1], epoch);
        let want = planned(&dir.join("src"), (2, SEED, FRACTION), epoch, 1);
        assert_eq!(listed, want, "rank 1's epoch {epoch}");
    }
    let out = shufflefs()
        .arg("unmount")
        .arg(&job.mounts[1])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", log());
    let status = job.wait_within(Duration::from_secs(60));
    let status = status.unwrap_or_else(|| panic!("the job did not end\n{}", log()));
    assert!(status.success(), "the job ended with {status}\n{}", log());
    job.mounts.clear();
}

/// A plain `shufflefs unmount` while a writer waits on an advance (rank 0 at epoch 1 asks
/// for 2, whose exchange waits on rank 1 at epoch 0): the kernel refuses the unmount (the
/// control file is open), so the view is detached instead, the writer is answered with an
/// error, and the unmount succeeds; the job still ends with 0.
#[test]
fn a_plain_unmount_with_a_writer_waiting_on_an_advance_detaches() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    write_source(&dir, 2, 30, 10_000);
    let mut job = MpiJob::start(&dir, 2, SEED, FRACTION, &["--share-disk", "never"]);
    let log = || std::fs::read_to_string(dir.join("job.log")).unwrap_or_default();
    write_epoch(&job.mounts[0], "1").unwrap();
    let control = job.mounts[0].join(".shufflefs/epoch");
    let mut writer = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("echo 2 > '{}'", control.display()))
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        writer.try_wait().unwrap().is_none(),
        "the advance did not wait"
    );
    let out = shufflefs()
        .args(["unmount", "--timeout", "30"])
        .arg(&job.mounts[0])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}\n{}", log());
    assert!(stdout.contains("detached"), "{stdout}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = writer.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the waiting writer was not released"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        !status.success(),
        "the interrupted advance reported success"
    );
    let out = shufflefs()
        .arg("unmount")
        .arg(&job.mounts[1])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", log());
    let status = job.wait_within(Duration::from_secs(60));
    let status = status.unwrap_or_else(|| panic!("the job did not end\n{}", log()));
    assert!(status.success(), "the job ended with {status}\n{}", log());
    job.mounts.clear();
}
