//! SIGTERM while a reader waits on an advance that cannot finish, under real `mpirun -np 2`.
//!
//! Rank 0 moves on to epoch 1 alone, so its exchange into epoch 2 waits on rank 1, which
//! never starts it. A reader on rank 0 looks up `epoch-2` and waits. A scheduler ending the
//! job sends SIGTERM: rank 0's unmount is refused (the reader is inside the mount), so the
//! daemon detaches the mount and must give up the exchange too, or the reader and the
//! daemon would wait forever. Afterwards the reader has its answer, no mount is left on
//! either rank and the job has ended.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::mpi_job::MpiJob;
use crate::common::*;
use shufflefs::sys::mounts::is_mounted;

#[test]
fn sigterm_ends_a_reader_waiting_on_a_peer_that_never_answers() {
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

    let answer = rx.recv_timeout(Duration::from_secs(60));
    assert!(
        answer.is_ok(),
        "the reader waiting on epoch-2 was never answered after SIGTERM"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while job.child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the job did not end after SIGTERM to rank 0"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for m in &job.mounts {
        assert!(!is_mounted(m), "{} is still mounted", m.display());
    }
}
