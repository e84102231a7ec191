//! `MpiComm` under a real `mpirun -np 4`: hosts, all-reduce, `split` and batched transfers with several
//! peers in flight, the parts of the transport the daemon's exchange does not reach yet.
//!
//! The test re-runs its own binary under `mpirun`, selecting `ranks` below through an
//! environment variable; each rank prints a line once its checks pass. (Giving up with
//! transfers in flight, `CommError::Abandoned`, is covered end to end by `signal_mpi.rs`.)

use std::sync::atomic::AtomicBool;

use crate::common::mpi_job::{mpirun, test_name};
use crate::common::require_mpi;
use shufflefs::comm::{Batch, Comm, MpiComm, Reduce};

const CHILD: &str = "SHUFFLEFS_COMM_MPI_CHILD";

#[test]
fn split_hosts_and_batches_under_mpirun() {
    if !require_mpi() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = mpirun(4)
        .env(CHILD, "1")
        .arg("-x")
        .arg(CHILD)
        .arg(exe)
        .arg(test_name(module_path!(), "ranks"))
        .args(["--exact", "--nocapture", "--test-threads=1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..4 {
        assert!(stdout.contains(&format!("rank {r} ok")), "{stdout}");
    }
}

/// One rank's part; does nothing unless started by the test above.
#[test]
fn ranks() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let mut comm = MpiComm::init().unwrap();
    let (me, size) = (comm.rank(), comm.size());
    assert_eq!(size, 4);
    // One machine: every rank on host 0.
    assert_eq!(comm.hosts(), [0, 0, 0, 0]);
    let abort = AtomicBool::new(false);

    // All-reduce (`MPI_Allreduce`), element by element.
    let v = [u64::from(me), 10 - u64::from(me)];
    assert_eq!(comm.all_reduce(&v, Reduce::Max).unwrap(), [3, 10]);
    assert_eq!(comm.all_reduce(&v, Reduce::Min).unwrap(), [0, 7]);
    assert_eq!(comm.all_reduce(&v, Reduce::Sum).unwrap(), [6, 34]);

    // Everyone to everyone in one batch, one message each way per pair.
    let others: Vec<u32> = (0..size).filter(|&p| p != me).collect();
    let batch = Batch {
        sends: others
            .iter()
            .map(|&p| (p, vec![me as u8; 3 + p as usize]))
            .collect(),
        recvs: others
            .iter()
            .map(|&p| (p, vec![0; 3 + me as usize]))
            .collect(),
    };
    let done = comm.transfer(5, batch, &abort).unwrap();
    for ((p, got), want) in done.recvs.iter().zip(&others) {
        assert_eq!(p, want);
        assert_eq!(*got, vec![*p as u8; 3 + me as usize]);
    }
    assert_eq!(done.sends.len(), 3, "send buffers come back");

    // Split by parity: two groups of two, numbered in world order.
    let mut sub = comm.split(me % 2).unwrap();
    assert_eq!((sub.rank(), sub.size()), (me / 2, 2));
    assert_eq!(sub.hosts(), [0, 0]);
    let all = sub.all_gather(&[me as u8]).unwrap();
    assert_eq!(all, vec![vec![(me % 2) as u8], vec![(me % 2 + 2) as u8]]);
    let other = 1 - sub.rank();
    let mut got = [0u8; 1];
    sub.sendrecv(
        6,
        Some((other, &[me as u8])),
        Some((other, &mut got)),
        &abort,
    )
    .unwrap();
    assert_eq!(u32::from(got[0]), (me + 2) % 4);
    drop(sub);
    // The world still works after the split.
    assert_eq!(comm.all_gather(&[]).unwrap().len(), 4);
    // Different lengths per rank (one of them empty) come back in rank order.
    let mine: Vec<u8> = (0..me * 1000).map(|i| (i as u8) ^ (me as u8)).collect();
    let all = comm.all_gather(&mine).unwrap();
    for (r, got) in all.iter().enumerate() {
        let want: Vec<u8> = (0..r as u32 * 1000)
            .map(|i| (i as u8) ^ (r as u8))
            .collect();
        assert_eq!(*got, want, "rank {r}'s part");
    }
    println!("rank {me} ok");
}
