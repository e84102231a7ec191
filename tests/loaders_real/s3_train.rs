//! The DDP example trained, unchanged, on a mount of a bucket: a
//! moto server on 127.0.0.1 holds the dataset, four ranks are started with
//! `shufflefs-launch -- --source s3://BUCKET/PREFIX` and only the AWS variables a user would
//! set, and `mount-helpers/examples/train_ddp.py` runs on them under `mpirun` as it does on a
//! folder. The loss must go down and every epoch must see the whole dataset once.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::mpi_job::mpirun;
use crate::common::s3::{S3Server, moto_python};
use crate::common::*;

const RANKS: u32 = 4;
const EPOCHS: usize = 3;

/// The job's folder; the launcher's daemons are torn down (and checked gone) on drop.
struct BucketJob {
    dir: tempfile::TempDir,
}

impl BucketJob {
    fn mount(&self, rank: u32) -> PathBuf {
        self.dir.path().join(format!("mnt-{rank}"))
    }
}

impl Drop for BucketJob {
    fn drop(&mut self) {
        let job = self.dir.path().join("job");
        teardown_launched(&job, (0..RANKS).map(|r| self.mount(r)));
    }
}

/// The AWS variables as `mpirun -x` options, so every rank's daemon gets them (mpirun
/// forwards only what it is told to to remote hosts).
fn forwarded(env: &[(&str, String)]) -> String {
    env.iter().map(|(k, _)| format!("-x {k} ")).collect()
}

fn launch(python: &Path, server: &S3Server) -> BucketJob {
    let job = BucketJob {
        dir: tempfile::tempdir().unwrap(),
    };
    let d = job.dir.path();
    let maker = ["--classes", "4", "--per-class", "30", "--size", "32"];
    let made = Command::new(python)
        .arg(repo().join("mount-helpers/make_dataset.py"))
        .arg(d.join("src"))
        .args(maker)
        .output()
        .unwrap();
    check("make_dataset.py", &made);
    server.upload("train-data", "imagenet-mini/train", &d.join("src"));
    let env = S3Server::env(&server.endpoint());
    let launched = run_with_timeout(
        Command::new(repo().join("mount-helpers/shufflefs-launch"))
            .env("SHUFFLEFS", BIN)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .args(["--np", &RANKS.to_string(), "--job"])
            .arg(d.join("job"))
            .args(["--mpirun-args", &forwarded(&env)])
            .args(["--", "--seed", "5", "--fraction", "0.3"])
            .args(["--source", "s3://train-data/imagenet-mini/train", "--cache"])
            .arg(d.join("cache-{rank}"))
            .arg(d.join("mnt-{rank}")),
        Duration::from_secs(180),
    );
    check("shufflefs-launch", &launched);
    job
}

#[test]
fn ddp_example_trains_on_a_bucket_mount_unchanged() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = venv_python("import torch, torchvision, PIL", "torch and torchvision")
    else {
        return;
    };
    let Some(moto) = moto_python() else {
        return;
    };
    let logs = tempfile::tempdir().unwrap();
    let server = S3Server::start(&moto, &logs.path().join("moto.log"));
    let job = launch(&python, &server);
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = mpirun(RANKS);
    with_package(&mut cmd)
        .env("MASTER_PORT", port.to_string())
        .args(["-x", "MASTER_PORT", "-x", "PYTHONPATH"])
        .arg(&python)
        .arg(repo().join("mount-helpers/examples/train_ddp.py"))
        .arg("--mount")
        .arg(job.dir.path().join("mnt-{rank}"))
        .args(["--epochs", &EPOCHS.to_string()]);
    let stdout = check(
        "train_ddp.py on the bucket mount",
        &run_with_timeout(&mut cmd, Duration::from_secs(600)),
    );
    let field = |name: &str| printed_value(&stdout, name);
    let (first, last) = (field("first_loss"), field("last_loss"));
    assert!(
        last < first,
        "loss did not go down: {first} -> {last}\n{stdout}"
    );
    // 4 classes x 30 samples, every one seen once per epoch across the ranks
    let whole = format!("120 samples on {RANKS} ranks");
    assert_eq!(stdout.matches(&whole).count(), EPOCHS, "{stdout}");
    let (whole_gets, _) = server.object_gets("train-data", "imagenet-mini/train");
    assert!(
        whole_gets >= 120,
        "every object is fetched from the bucket: {whole_gets}"
    );
}
