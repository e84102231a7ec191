//! `MpiComm` under a real `mpirun -np 4`: the checks every transport passes
//! (`comm::conformance`, which the TCP transport's tests run too): hosts, all-reduce, `split`,
//! batched transfers with several peers in flight, broadcasts, interleaved tags.
//!
//! The test re-runs its own binary under `mpirun`, selecting `ranks` below through an
//! environment variable; each rank prints a line once its checks pass. (Giving up with
//! transfers in flight, `CommError::Abandoned`, is covered end to end by `signal_mpi.rs`.)

use crate::common::mpi_job::{mpirun, test_name};
use crate::common::require_mpi;
use shufflefs::comm::{Comm, MpiComm, conformance};

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
    let me = comm.rank();
    conformance::four_ranks(&mut comm);
    println!("rank {me} ok");
}
