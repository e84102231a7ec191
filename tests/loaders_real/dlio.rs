//! DLIO (argonne-lcf's dlio-benchmark 2.0) as a real, unmodified client: DLIO generates a
//! small unet3d-style dataset (a flat folder of `.npz` files, N not divisible by the ranks),
//! 4 shufflefs ranks serve it (`--format tree --equal-shares drop`), and
//! `mount-helpers/dlio_rank.sh` runs one DLIO per rank on that rank's view, under mpirun. Each
//! DLIO must run in a world of one and read exactly its view's floor(N/M) files (not split
//! them again).
//!
//! Needs DLIO importable by the venv's python: installed into the venv, or into a folder
//! named by `SHUFFLEFS_DLIO_PATH` (`bash mount-helpers/install-dlio.sh DIR`). Skipped
//! without it unless `SHUFFLEFS_REQUIRE_DLIO=1`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::mpi_job::{MpiJob, mpirun};
use crate::common::skip::require;
use crate::common::*;

const RANKS: u32 = 4;
const FILES: u32 = 18;

/// Sizes small enough for CI: 16 KiB samples, one epoch, little simulated compute.
const DLIO_ARGS: &[&str] = &[
    "workload=unet3d_h100",
    "++workload.workflow.checkpoint=False",
    "++workload.dataset.record_length=16384",
    "++workload.dataset.record_length_stdev=0",
    "++workload.dataset.record_length_resize=16384",
    "++workload.train.epochs=1",
    "++workload.train.computation_time=0.01",
    "++workload.reader.read_threads=1",
    "++workload.reader.batch_size=2",
];

/// The venv's python and the `PYTHONPATH` under which it imports DLIO, or `None` (skip).
fn require_dlio() -> Option<(PathBuf, String)> {
    if !require_fuse() || !require_mpi() {
        return None;
    }
    let python = venv_python("import torch, numpy", "torch and numpy")?;
    let path = std::env::var("SHUFFLEFS_DLIO_PATH").unwrap_or_default();
    let imports = Command::new(&python)
        .args(["-c", "import dlio_benchmark.main"])
        .env("PYTHONPATH", &path)
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .output()
        .is_ok_and(|o| o.status.success());
    let missing = (!imports).then(|| {
        "dlio_benchmark does not import; run `bash mount-helpers/install-dlio.sh` (or install it into a folder and set SHUFFLEFS_DLIO_PATH)".to_string()
    });
    require("DLIO", "SHUFFLEFS_REQUIRE_DLIO", missing).then_some((python, path))
}

fn dlio(python: &Path, path: &str) -> Command {
    let mut cmd = Command::new(python);
    cmd.args(["-m", "dlio_benchmark.main"])
        .env("PYTHONPATH", path)
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    cmd
}

#[test]
fn dlio_reads_each_rank_view_once_without_splitting_it() {
    let Some((python, path)) = require_dlio() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let src = dir.join("src");
    check(
        "DLIO's data generation",
        &run_with_timeout(
            dlio(&python, &path)
                .args(DLIO_ARGS)
                .arg(format!("++workload.dataset.num_files_train={FILES}"))
                .args([
                    "++workload.workflow.generate_data=True",
                    "++workload.workflow.train=False",
                ])
                .arg(format!("++workload.dataset.data_folder={}", src.display()))
                .arg(format!(
                    "++workload.output.folder={}",
                    dir.join("gen").display()
                ))
                .arg(format!("hydra.run.dir={}", dir.join("gen/hydra").display())),
            Duration::from_secs(300),
        ),
    );
    let args = ["--format", "tree", "--equal-shares", "drop"];
    let job = MpiJob::start(dir, RANKS, 7, 0.3, &args);
    let out = dir.join("out");
    let mut cmd = mpirun(RANKS);
    cmd.env("PYTHONPATH", package_pythonpath(&path))
        .env("PYTHON", &python)
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .args([
            "-x",
            "PYTHONPATH",
            "-x",
            "PYTHON",
            "-x",
            "TF_CPP_MIN_LOG_LEVEL",
        ])
        .arg(repo().join("mount-helpers/dlio_rank.sh"))
        .arg("--mount")
        .arg(dir.join("mnt{rank}"))
        .arg("--output")
        .arg(&out)
        .arg("--")
        .args(DLIO_ARGS);
    check(
        "dlio_rank.sh",
        &run_with_timeout(&mut cmd, Duration::from_secs(600)),
    );
    let per_rank = FILES / RANKS;
    for r in 0..RANKS {
        let summary = out.join(format!("rank-{r}/summary.json"));
        let s: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
        assert_eq!(s["num_accelerators"], 1, "rank {r}: a world of one\n{s:#}");
        assert_eq!(
            s["num_files_train"], per_rank,
            "rank {r}: its view, not a split of it"
        );
        let tput = &s["metric"]["train_throughput_samples_per_second"];
        assert!(tput.as_array().is_some_and(|t| !t.is_empty()), "{s:#}");
    }
    job.unmount();
}
