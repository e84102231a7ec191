//! `--rescan` under real `mpirun -np 2`: after the source lost a file and gained
//! a class, rank 0 scans again, every rank carries what is still valid over to the new
//! index, and the current and next epochs are exactly the plan over the new source (every
//! byte checked), with the deleted file gone and the new class there.

use std::path::Path;

use crate::common::mpi_job::{MpiJob, checked_listing, planned, wait_all};
use crate::common::*;

const RANKS: u32 = 2;
const SEED: u64 = 3;
const FRACTION: f64 = 0.5;

fn check_epoch(dir: &Path, job: &MpiJob, epoch: u64) -> usize {
    let mut all = 0;
    for r in 0..RANKS {
        let seen = checked_listing(dir, &job.mounts[r as usize], epoch);
        assert_eq!(
            seen,
            planned(&dir.join("src"), (RANKS, SEED, FRACTION), epoch, r),
            "rank {r} epoch {epoch} is not the plan over the source"
        );
        all += seen.len();
    }
    all
}

#[test]
fn rescan_on_every_rank_serves_the_changed_source() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let write_class = |name: &str, count: u32| {
        let class = dir.join("src").join(name);
        std::fs::create_dir_all(&class).unwrap();
        for i in 0..count {
            let bytes: Vec<u8> = (0..3000 + i * 7).map(|o| (o ^ i) as u8).collect();
            std::fs::write(class.join(format!("s{i:02}.bin")), bytes).unwrap();
        }
    };
    write_class("a", 20);
    write_class("b", 20);

    let job = MpiJob::start(dir, RANKS, SEED, FRACTION, &[]);
    wait_all(&job, "staging", |st| st["staging"]["state"] == "done");
    assert_eq!(check_epoch(dir, &job, 0), 40);
    job.unmount();

    std::fs::remove_file(dir.join("src/a/s00.bin")).unwrap();
    write_class("c", 6);

    let job = MpiJob::start(dir, RANKS, SEED, FRACTION, &["--rescan"]);
    let mut dropped = 0;
    for r in 0..RANKS as usize {
        let st = job.status(r);
        assert_eq!(st["samples"], 45, "{st:#}");
        assert_eq!(st["source_scan"]["scanned_this_mount"], true);
        assert!(st["source_scan"]["kept"].as_u64().unwrap() > 0, "{st:#}");
        dropped += st["source_scan"]["dropped"].as_u64().unwrap();
    }
    assert!(dropped >= 1, "the deleted file's cached copy was dropped");
    let epoch = job.status(0)["epoch"].as_u64().unwrap();
    assert_eq!(check_epoch(dir, &job, epoch), 45);
    assert_eq!(check_epoch(dir, &job, epoch + 1), 45);
    assert!(
        !job.mounts
            .iter()
            .any(|m| m.join(format!("epoch-{}/a/s00.bin", epoch + 1)).exists())
    );
    job.unmount();
}
