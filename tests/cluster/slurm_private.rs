//! The whole user path on a cluster like a real one: 4 private hosts (each its own mount
//! namespace and disk) x 2 ranks, the dataset on the storage host read over sshfs, Slurm
//! launching everything through the example batch script
//! (mount-helpers/examples/shufflefs.sbatch: `shufflefs-launch --srun`, training with `srun`,
//! teardown).
//!
//! - Images: PyTorch DDP (gloo) with the example `train_ddp.py`, one process per rank reading
//!   its own host's mount, 3 epochs. Each rank records what it read (`--record`): every epoch
//!   is a partition of the dataset with the source's exact bytes, and the status shows the
//!   same-host peer reached through the disk (`--share-disk auto`) and every other over MPI.
//! - Records: the example `train_svm.py` over LIBSVM shards (`--format records`), the same way:
//!   every epoch each record id read exactly once across the ranks.
//! - Afterwards no daemon runs and no shufflefs mount is left in any host (only the store's
//!   sshfs mount).
//!
//! The checks run on what the ranks wrote into a folder every host shares (the job's
//! submission folder, as on a real cluster), since no mount is visible from outside its host.
//! Skips like the other Slurm tests; also without the venv's torch and scikit-learn.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::common::mpi_job::exchange;
use crate::common::*;
use crate::harness::Cluster;
use crate::slurm::{require_slurm, retry_init_crash, slurm};

const HOSTS: u32 = 4;
const PER_HOST: u32 = 2;
const RANKS: u32 = HOSTS * PER_HOST;
const EPOCHS: u64 = 3;

fn make_dataset(out: &Path, args: &[&str]) {
    let made = Command::new("python3")
        .arg(repo().join("mount-helpers/make_dataset.py"))
        .arg(out)
        .args(args)
        .output()
        .unwrap();
    check("make_dataset.py", &made);
}

/// One run of the example batch script on every host; the job's output.
struct Batch<'a> {
    cluster: &'a Cluster,
    python: &'a Path,
    work: &'a Path,
}

impl Batch<'_> {
    /// Submits the script with `--wait`, the dataset at STORE/`dataset`, caches and mounts on
    /// each host's own disk; panics with the job's output unless it succeeds.
    fn run(&self, dataset: &str, env: &[(&str, &str)], train_args: &[&str]) -> String {
        let local = self.cluster.config("LOCAL");
        let store = self.cluster.config("STORE");
        let out = self.work.join(format!("{dataset}.out"));
        let script = repo().join("mount-helpers/examples/shufflefs.sbatch");
        let nodes = format!("--nodes={HOSTS}");
        let per_node = format!("--ntasks-per-node={PER_HOST}");
        let job = retry_init_crash("sbatch", || {
            let mut c = slurm(self.cluster.name, &["sbatch", "--wait", &nodes, &per_node]);
            c.arg("-o").arg(&out).arg(&script).args(train_args);
            c.env("SHUFFLEFS", BIN)
                .env("SHUFFLEFS_SOURCE", format!("{store}/{dataset}"))
                .env(
                    "SHUFFLEFS_CACHE",
                    format!("{local}/cache-{dataset}-{{rank}}"),
                )
                .env("SHUFFLEFS_MOUNT", format!("{local}/mnt-{dataset}-{{rank}}"))
                .env("SHUFFLEFS_HELPERS", repo().join("mount-helpers"))
                .env("PYTHON", self.python)
                .env("PYTHONPATH", package_pythonpath(""))
                .env("TMPDIR", self.work);
            for (k, v) in env {
                c.env(k, v);
            }
            let job = run_with_timeout(&mut c, Duration::from_secs(300));
            (job, fs::read_to_string(&out).unwrap_or_default())
        });
        let log = fs::read_to_string(&out).unwrap_or_default();
        assert!(job.status.success(), "{job:?}\n{log}");
        assert!(log.contains("every mount ready"), "{log}");
        log
    }
}

/// Rank `r`'s record of `epoch` (written by the training script's `--record`).
fn record(folder: &Path, epoch: u64, r: u32) -> Value {
    let path = folder.join(format!("epoch-{epoch}.rank-{r}.json"));
    let text = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (the rank wrote no record)", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Every file under `root`, by relative path, with its size and sha256 (hashed by python3,
/// as the training scripts do).
fn source_hashes(root: &Path) -> BTreeMap<String, (u64, String)> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(
            "import hashlib, json, os, sys\n\
             root = sys.argv[1]; out = {}\n\
             for d, _, files in os.walk(root):\n\
             \x20   for f in files:\n\
             \x20       data = open(os.path.join(d, f), 'rb').read()\n\
             \x20       out[os.path.relpath(os.path.join(d, f), root)] = [len(data), hashlib.sha256(data).hexdigest()]\n\
             json.dump(out, sys.stdout)",
        )
        .arg(root)
        .output()
        .unwrap();
    let text = check("hash the source", &out);
    let all: BTreeMap<String, (u64, String)> = serde_json::from_str(&text).unwrap();
    assert!(!all.is_empty(), "no files under {}", root.display());
    all
}

/// The status's peers of the exchange into `epoch`: a same-host peer through the disk, the
/// others over MPI (ranks are placed by node: 0-1 on h0, 2-3 on h1...).
fn check_via(st: &Value, epoch: u64, r: u32) {
    let peers = exchange(st, epoch)
        .and_then(|x| x["peers"].as_array())
        .unwrap_or_else(|| panic!("rank {r}: no exchange peers in the status: {st}"));
    assert_eq!(peers.len(), RANKS as usize - 1, "rank {r}: {st}");
    for p in peers {
        let same = p["rank"].as_u64().unwrap() / u64::from(PER_HOST) == u64::from(r / PER_HOST);
        assert_eq!(p["same_host"], same, "rank {r}: {p}");
        assert_eq!(p["via"], if same { "disk" } else { "mpi" }, "rank {r}: {p}");
    }
}

/// Every epoch the ranks' samples are the dataset, each once, with the source's bytes.
fn check_images(folder: &Path, source: &Path) {
    let want = source_hashes(source);
    for epoch in 0..EPOCHS {
        let mut seen: BTreeMap<String, (u64, String)> = BTreeMap::new();
        for r in 0..RANKS {
            let rec = record(folder, epoch, r);
            for s in rec["samples"].as_array().unwrap() {
                let rel = s[0].as_str().unwrap().to_string();
                let got = (s[1].as_u64().unwrap(), s[2].as_str().unwrap().to_string());
                assert_eq!(want.get(&rel), Some(&got), "epoch {epoch} rank {r}: {rel}");
                assert!(
                    seen.insert(rel.clone(), got).is_none(),
                    "{rel} twice in {epoch}"
                );
            }
            if epoch > 0 {
                check_via(&rec["status"], epoch, r);
            }
        }
        assert_eq!(seen.len(), want.len(), "epoch {epoch} misses samples");
    }
}

/// Every epoch each record id in `0..count` read by exactly one rank.
fn check_records(folder: &Path, count: u64) {
    for epoch in 0..EPOCHS {
        let mut seen = BTreeSet::new();
        for r in 0..RANKS {
            let rec = record(folder, epoch, r);
            for id in rec["ids"].as_array().unwrap() {
                let id = id.as_u64().unwrap();
                assert!(seen.insert(id), "record {id} read twice in epoch {epoch}");
            }
        }
        assert_eq!(seen, (0..count).collect(), "epoch {epoch}");
    }
}

/// No shufflefs daemon in any host and no mount but the store's.
fn nothing_left(cluster: &Cluster) {
    for p in cluster.pids() {
        let comm = fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
        assert_ne!(comm.trim(), "shufflefs", "daemon {p} still runs");
    }
    let store = cluster.config("STORE");
    for h in 0..HOSTS {
        let mounts = cluster.exec_ok(&h.to_string(), &["cat", "/proc/self/mounts"]);
        let fuse: Vec<&str> = (mounts.lines())
            .filter(|l| l.contains(" fuse") && !l.contains(&store))
            .collect();
        assert!(fuse.is_empty(), "h{h} still has {fuse:?}");
    }
}

#[test]
fn batch_script_on_private_hosts_trains_from_the_store() {
    if !require_slurm() {
        return;
    }
    let Some(python) = venv_python(
        "import torch, torchvision, sklearn",
        "torch, torchvision and scikit-learn",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let store = work.join("store");
    make_dataset(
        &store.join("images"),
        &["--classes", "4", "--per-class", "16", "--size", "16"],
    );
    make_dataset(
        &store.join("svm"),
        &["--records", "svm", "--count", "400", "--files", "4"],
    );
    let store_arg = store.to_string_lossy().into_owned();
    let cluster = Cluster::private(
        "slp",
        "10.214.92.0/24",
        HOSTS,
        &[
            "--store",
            &store_arg,
            "--disk-type",
            "tmpfs",
            "--disk",
            "256M",
            "--slurm",
        ],
    );
    let batch = Batch {
        cluster: &cluster,
        python: &python,
        work,
    };

    let images = work.join("record-images");
    let rec = images.to_string_lossy().into_owned();
    let log = batch.run(
        "images",
        &[],
        &["--epochs", "3", "--batch-size", "8", "--record", &rec],
    );
    assert_eq!(log.matches("64 samples on 8 ranks").count(), 3, "{log}");
    check_images(&images, &store.join("images"));
    nothing_left(&cluster);

    let records = work.join("record-svm");
    let rec = records.to_string_lossy().into_owned();
    let train = repo().join("mount-helpers/examples/train_svm.py");
    let train = train.to_string_lossy().into_owned();
    let env = [
        ("SHUFFLEFS_ARGS", "--format records --framing lines"),
        ("TRAIN", train.as_str()),
    ];
    batch.run("svm", &env, &["--epochs", "3", "--record", &rec]);
    check_records(&records, 400);
    nothing_left(&cluster);
}
