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

const PANIC_CHILD: &str = "SHUFFLEFS_COMM_MPI_PANIC_CHILD";

/// A rank that panics while the others wait on it in a collective ends, and mpirun with it,
/// instead of hanging in MPI_Finalize while unwinding (a daemon that panicked at start-up
/// once held its job until the test's timeout).
#[test]
fn a_rank_that_panics_ends_the_job_instead_of_hanging() {
    if !require_mpi() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let started = std::time::Instant::now();
    let mut child = mpirun(2)
        .env(PANIC_CHILD, "1")
        .arg("-x")
        .arg(PANIC_CHILD)
        .arg(exe)
        .arg(test_name(module_path!(), "panicking_ranks"))
        .args(["--exact", "--nocapture", "--test-threads=1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mpirun still runs a minute after a rank panicked");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(!status.success(), "a panicked rank fails the job");
}

/// One rank's part of the test above: rank 1 panics, rank 0 waits on it.
#[test]
fn panicking_ranks() {
    if std::env::var_os(PANIC_CHILD).is_none() {
        return;
    }
    let mut comm = MpiComm::init().unwrap();
    if comm.rank() == 1 {
        panic!("rank 1 panics on purpose");
    }
    let _ = comm.all_gather(&[1]);
}
