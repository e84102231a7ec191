//! SIGTERM while a reader waits on an advance that cannot finish yet, under real
//! `mpirun -np 2`.
//!
//! Rank 0 moves on to epoch 1 alone, so its exchange into epoch 2 waits on rank 1, which
//! has not started it (it still trains epoch 0). A reader on rank 0 looks up `epoch-2` and
//! waits. SIGTERM to rank 0 (its trainer is being stopped): its unmount is refused (the
//! reader is inside the mount), so the daemon detaches the mount and fails the advance the
//! reader waits on, which then has its answer at once. The exchange in flight is not given
//! up (under MPI that ends the whole job: it once did, one rank's SIGTERM ending every
//! rank): rank 1 goes on serving, and once it advances, rank 0 finishes that exchange and
//! exits 0; rank 1 then unmounts, and the job ends with no mount left.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::mpi_job::MpiJob;
use crate::common::*;
use shufflefs::sys::mounts::is_mounted;

#[test]
fn sigterm_answers_a_waiting_reader_and_takes_no_other_rank_down() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let ds = DatasetBuilder::new()
        .numbered_class("cat", 30, |i| 2_000 + i as u64)
        .numbered_class("dog", 30, |i| 3_000 + i as u64)
        .build();
    let mut job = MpiJob::start(&ds.base, 2, 3, 0.5, &[]);
    let mnt0 = job.mounts[0].clone();

    // Epoch 1's exchange ran at mount; advancing rank 0 alone starts the one into epoch 2.
    std::fs::write(mnt0.join(".shufflefs/epoch"), "1\n").unwrap();
    let (tx, rx) = mpsc::channel();
    let waiting = mnt0.join("epoch-2");
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::metadata(&waiting).map(|m| m.is_dir()));
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(2)).is_err(),
        "the lookup of epoch-2 should wait on rank 1, which never exchanges"
    );

    let pid = job.status(0)["pid"].as_i64().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();

    let answer = rx.recv_timeout(Duration::from_secs(30));
    assert!(
        answer.as_ref().is_ok_and(|a| a.is_err()),
        "the reader waiting on epoch-2 was not answered with an error after SIGTERM: {answer:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while is_mounted(&mnt0) {
        assert!(Instant::now() < deadline, "rank 0's mount stayed");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Rank 1 is not taken down: it still serves, and its advance runs the exchange rank 0
    // waits to finish.
    std::thread::sleep(Duration::from_secs(2));
    assert!(job.child.try_wait().unwrap().is_none(), "the job ended");
    let mnt1 = job.mounts[1].clone();
    assert_eq!(job.status(1)["epoch"], 0, "rank 1 still serves");
    std::fs::write(mnt1.join(".shufflefs/epoch"), "1\n").unwrap();
    assert!(std::fs::read_dir(mnt1.join("epoch-1")).is_ok_and(|d| d.count() > 0));
    let out = shufflefs().arg("unmount").arg(&mnt1).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = job.wait_within(Duration::from_secs(60));
    let log = std::fs::read_to_string(ds.base.join("job.log")).unwrap_or_default();
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{log}");
    assert!(!log.contains("ending the MPI job"), "{log}");
    for m in &job.mounts {
        assert!(!is_mounted(m), "{} is still mounted", m.display());
    }
}
