//! The CI test of packed-record sources: 4 ranks under real mpirun serve a record
//! source of each framing; one loader process per rank (`tests/loaders/check_records.py`,
//! under mpirun too) reads 3 epochs of its views with the real readers, and every record is
//! read exactly once per epoch across the ranks while the exchange moves groups between them.

use std::time::Duration;

use crate::common::mpi_job::{MpiJob, mpirun};
use crate::common::records::*;
use crate::common::*;

const RANKS: u32 = 4;
const COUNT: u32 = 3000;
const EPOCHS: u32 = 3;

#[test]
fn loaders_read_three_epochs_on_four_ranks_every_record_once() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = loaders_python() else {
        return;
    };
    for (kind, _) in KINDS {
        let dir = tempfile::tempdir().unwrap();
        make_records(&dir.path().join("src"), kind, COUNT, 5);
        let mut extra = flags(kind);
        extra.extend_from_slice(&["--part-size", "8K"]);
        let job = MpiJob::start(dir.path(), RANKS, 11, 0.5, &extra);
        for r in 0..RANKS as usize {
            assert_eq!(
                job.status(r)["dataset"]["records"],
                COUNT,
                "{kind} rank {r}"
            );
        }
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        let mut cmd = mpirun(RANKS);
        with_package(&mut cmd)
            .env("TF_CPP_MIN_LOG_LEVEL", "3")
            .args(["-x", "TF_CPP_MIN_LOG_LEVEL", "-x", "PYTHONPATH"])
            .arg(&python)
            .arg(repo().join("tests/loaders/check_records.py"))
            .arg("--mount")
            .arg(dir.path().join("mnt{rank}"))
            .args(["--kind", kind, "--epochs", &EPOCHS.to_string()])
            .args(["--record-size", "72", "--out"])
            .arg(&out);
        check(
            &format!("check_records.py --kind {kind} on {RANKS} ranks"),
            &run_with_timeout(&mut cmd, Duration::from_secs(600)),
        );
        let mut moved = false;
        for e in 0..EPOCHS {
            let lists: Vec<Vec<u64>> = (0..RANKS).map(|r| ids(&out, r, e)).collect();
            assert_partition(&lists, COUNT, &format!("{kind} epoch {e}"));
            if e > 0 {
                let before: std::collections::BTreeSet<u64> =
                    ids(&out, 0, e - 1).into_iter().collect();
                moved |= lists[0].iter().any(|i| !before.contains(i));
            }
        }
        assert!(moved, "{kind}: the exchange moved records between ranks");
        job.unmount();
    }
}
