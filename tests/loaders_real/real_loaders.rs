//! The real loaders, the way users run them: 4 ranks started with `mount-helpers/shufflefs-launch`
//! under real mpirun, a dataset of real PNG images (one class with a single image, so some rank
//! holds none of it), then, under mpirun again, one Python process per rank:
//! - `tests/loaders/check_loaders.py`: torchvision `ImageFolder` + `DataLoader(num_workers=2,
//!   shuffle=True)` and `tf.keras.utils.image_dataset_from_directory` read 3 epochs; classes,
//!   labels and pixels match the source on every rank; here the ranks' lists must partition
//!   the dataset every epoch;
//! - `mount-helpers/examples/train_ddp.py`: a DDP (gloo) training run whose loss goes down;
//! - `mount-helpers/examples/train_tf.py`: Keras on `epoch-N` paths, then on `MOUNT/current`.
//!
//! Needs the venv of `mount-helpers/install-python.sh` (torch, torchvision, tensorflow-cpu,
//! pillow): skipped without it unless SHUFFLEFS_REQUIRE_LOADERS=1 (set by `.ci/run`).

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::common::mpi_job::mpirun;
use crate::common::*;

const RANKS: usize = 4;
const EPOCHS: usize = 3;
const LOADER_TIMEOUT: Duration = Duration::from_secs(600);

/// The venv's python, or `None` (skip) when the loaders are not installed.
fn require_loaders() -> Option<PathBuf> {
    if !require_fuse() || !require_mpi() {
        return None;
    }
    venv_python(
        "import torch, torchvision, tensorflow, PIL",
        "torch, torchvision, tensorflow and pillow",
    )
}

/// A 4-rank job started and torn down with the mount helpers, as the README shows.
struct Job {
    dir: tempfile::TempDir,
    python: PathBuf,
}

impl Job {
    fn start(python: PathBuf) -> Job {
        Job::start_with(python, &[])
    }

    /// As [`Job::start`], with `extra` mount options.
    fn start_with(python: PathBuf, extra: &[&str]) -> Job {
        let maker = ["--classes", "4", "--per-class", "30", "--size", "32"];
        let maker = [&maker[..], &["--small-class", "1"]].concat();
        Job::start_made(python, ("mount-helpers/make_dataset.py", &maker), extra)
    }

    /// As [`Job::start_with`], the source written by the script `maker` (with its arguments
    /// after the source folder).
    fn start_made(python: PathBuf, maker: (&str, &[&str]), extra: &[&str]) -> Job {
        let dir = tempfile::tempdir().unwrap();
        let job = Job { dir, python };
        check(
            maker.0,
            &run_with_timeout(
                Command::new(&job.python)
                    .arg(repo().join(maker.0))
                    .arg(job.source())
                    .args(maker.1),
                Duration::from_secs(120),
            ),
        );
        let d = job.dir.path();
        check(
            "shufflefs-launch",
            &run_with_timeout(
                Command::new(repo().join("mount-helpers/shufflefs-launch"))
                    .env("SHUFFLEFS", BIN)
                    .args(["--np", &RANKS.to_string(), "--job"])
                    .arg(d.join("job"))
                    .args(["--", "--seed", "5", "--fraction", "0.3", "--source"])
                    .arg(job.source())
                    .arg("--cache")
                    .arg(d.join("cache-{rank}"))
                    .args(extra)
                    .arg(d.join("mnt-{rank}")),
                Duration::from_secs(180),
            ),
        );
        job
    }

    fn source(&self) -> PathBuf {
        self.dir.path().join("src")
    }

    fn mount_template(&self) -> PathBuf {
        self.dir.path().join("mnt-{rank}")
    }

    /// Runs `script` with `args` as one Python process per rank.
    fn python(&self, script: &str, args: &[&str], env: &[(&str, String)]) -> String {
        let mut cmd = mpirun(RANKS as u32);
        with_package(&mut cmd)
            .env("TF_CPP_MIN_LOG_LEVEL", "2")
            .args(["-x", "PYTHONPATH"]);
        for (k, v) in env {
            cmd.env(k, v).args(["-x", k]);
        }
        cmd.arg(&self.python)
            .arg(repo().join(script))
            .arg("--mount")
            .arg(self.mount_template())
            .args(args);
        check(script, &run_with_timeout(&mut cmd, LOADER_TIMEOUT))
    }

    /// Every source sample as `class/name`.
    fn source_samples(&self) -> BTreeSet<String> {
        let mut all = BTreeSet::new();
        for class in std::fs::read_dir(self.source()).unwrap() {
            let class = class.unwrap();
            for f in std::fs::read_dir(class.path()).unwrap() {
                all.insert(format!(
                    "{}/{}",
                    class.file_name().to_string_lossy(),
                    f.unwrap().file_name().to_string_lossy()
                ));
            }
        }
        all
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let d = self.dir.path();
        teardown_launched(
            &d.join("job"),
            (0..RANKS).map(|r| d.join(format!("mnt-{r}"))),
        );
    }
}

#[test]
fn torch_and_tf_loaders_read_every_sample_on_every_rank() {
    let Some(python) = require_loaders() else {
        return;
    };
    let job = Job::start(python);
    let out = job.dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let source = job.source();
    job.python(
        "tests/loaders/check_loaders.py",
        &[
            "--source",
            source.to_str().unwrap(),
            "--epochs",
            &EPOCHS.to_string(),
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    let all = job.source_samples();
    let mut rank_without_small_class = false;
    for epoch in 0..EPOCHS {
        let mut seen = Vec::new();
        for rank in 0..RANKS {
            let path = out.join(format!("rank{rank}-epoch{epoch}.json"));
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            let list = |k: &str| -> Vec<String> {
                v[k].as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap().to_string())
                    .collect()
            };
            let listing = list("listing");
            assert_eq!(list("torch"), listing, "rank {rank} epoch {epoch}: torch");
            assert_eq!(list("tf"), listing, "rank {rank} epoch {epoch}: tf");
            rank_without_small_class |= !listing.iter().any(|s| s.starts_with("class_04/"));
            seen.extend(listing);
        }
        let unique: BTreeSet<String> = seen.iter().cloned().collect();
        assert_eq!(
            seen.len(),
            unique.len(),
            "epoch {epoch}: a sample on two ranks"
        );
        assert_eq!(
            unique, all,
            "epoch {epoch}: the ranks' lists are not the dataset"
        );
    }
    assert!(
        rank_without_small_class,
        "some rank should hold no sample of the one-image class"
    );
}

#[test]
fn ddp_training_loss_goes_down() {
    let Some(python) = require_loaders() else {
        return;
    };
    let job = Job::start(python);
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let stdout = job.python(
        "mount-helpers/examples/train_ddp.py",
        &["--epochs", &EPOCHS.to_string()],
        &[("MASTER_PORT", port.to_string())],
    );
    let field = |name: &str| printed_value(&stdout, name);
    let (first, last) = (field("first_loss"), field("last_loss"));
    assert!(
        last < first,
        "loss did not go down: {first} -> {last}\n{stdout}"
    );
    assert_eq!(
        stdout.matches("samples on 4 ranks").count(),
        EPOCHS,
        "{stdout}"
    );
}

/// The DDP example without `join()` over 5 epochs: 121 samples on 4 ranks (not divisible),
/// mounted with `--equal-shares drop`, so every rank runs the same number of steps. Without
/// equal views the script stops with its message rather than hanging.
#[test]
fn ddp_trains_without_join_under_equal_shares() {
    let Some(python) = require_loaders() else {
        return;
    };
    let job = Job::start_with(python, &["--equal-shares", "drop"]);
    assert_ne!(
        job.source_samples().len() % RANKS,
        0,
        "N must not divide by M"
    );
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let stdout = job.python(
        "mount-helpers/examples/train_ddp.py",
        &["--epochs", "5", "--no-join"],
        &[("MASTER_PORT", port.to_string())],
    );
    let per_epoch = format!(
        "{} samples on 4 ranks",
        RANKS * (job.source_samples().len() / RANKS)
    );
    assert_eq!(stdout.matches(&per_epoch).count(), 5, "{stdout}");
}

/// COCO-shaped data: real JPEGs in `train2017/`, the annotation file and
/// `classes.txt` replicated to every rank; the detection-style loop (torchvision decode, v2 box
/// transforms, a DataLoader, a CocoDetection-like dataset) trains 2 epochs on each rank's
/// share, and the ranks' images add up to the dataset in every epoch.
#[test]
fn coco_shaped_data_trains_a_detection_loop_unmodified() {
    let Some(python) = require_loaders() else {
        return;
    };
    let images = 50;
    let replicate = ["--replicate", "annotations/*", "--replicate", "classes.txt"];
    let job = Job::start_made(
        python,
        ("mount-helpers/make_coco.py", &["--images", "50"]),
        &[&["--format", "tree"][..], &replicate].concat(),
    );
    let stdout = job.python(
        "mount-helpers/examples/train_detection.py",
        &["--epochs", "2"],
        &[],
    );
    // `rank R epoch E: N images, ...` per rank and epoch; mpirun may put two ranks' lines
    // on one (a line and its newline can reach it in two writes), so they are found
    // anywhere in the output, not line by line.
    let reports: Vec<(usize, usize)> = (stdout.split("rank ").skip(1))
        .filter_map(|piece| {
            let (_, rest) = piece.split_once(" epoch ")?;
            let (epoch, rest) = rest.split_once(": ")?;
            let (n, _) = rest.split_once(" images")?;
            Some((epoch.parse().ok()?, n.parse().ok()?))
        })
        .collect();
    for epoch in 0..2 {
        let counts: Vec<usize> = (reports.iter())
            .filter(|(e, _)| *e == epoch)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(counts.len(), RANKS, "{stdout}");
        let seen: usize = counts.iter().sum();
        assert_eq!(seen, images, "epoch {epoch}: {stdout}");
        assert!(!stdout.contains("nan"), "{stdout}");
    }
}

#[test]
fn tf_example_trains_on_epoch_paths_and_on_current() {
    let Some(python) = require_loaders() else {
        return;
    };
    let job = Job::start(python);
    let stdout = job.python(
        "mount-helpers/examples/train_tf.py",
        &["--epochs", "2"],
        &[],
    );
    assert_eq!(stdout.matches("first_loss=").count(), RANKS, "{stdout}");
    // The mount is now at epoch 1; the `current` variant continues from there.
    let stdout = job.python(
        "mount-helpers/examples/train_tf.py",
        &["--epochs", "2", "--current"],
        &[],
    );
    assert_eq!(stdout.matches("epoch 2: loss").count(), RANKS, "{stdout}");
    assert_eq!(stdout.matches("first_loss=").count(), RANKS, "{stdout}");
}

/// The demo's walk (`mount-helpers/walk_epochs.py --json --plot`, as `demo.sh` runs it) on
/// this host's 4 ranks: every sample moved into an epoch's views was handed over on the disk
/// (one host: no MPI, no network), the source is read for staging only, the plot is drawn,
/// and each daemon's `epoch advanced` line counts the disk hand-offs.
#[test]
fn the_demo_walk_tells_what_moved_and_draws_its_plot() {
    let Some(python) = require_loaders() else {
        return;
    };
    let plotting = Command::new(&python)
        .args(["-c", "import matplotlib"])
        .status()
        .is_ok_and(|s| s.success());
    if !require_plot(plotting) {
        return;
    }
    let job = Job::start(python);
    let d = job.dir.path();
    let (numbers, png) = (d.join("epochs.json"), d.join("epochs.png"));
    let out = check(
        "walk_epochs.py",
        &run_with_timeout(
            with_package(&mut Command::new(&job.python))
                .arg(repo().join("mount-helpers/walk_epochs.py"))
                .args(["--epochs", &EPOCHS.to_string(), "--json"])
                .arg(&numbers)
                .arg("--plot")
                .arg(&png)
                .args((0..RANKS).map(|r| d.join(format!("mnt-{r}")))),
            LOADER_TIMEOUT,
        ),
    );
    let epochs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&numbers).unwrap()).unwrap();
    let epochs = epochs.as_array().unwrap();
    assert_eq!(epochs.len(), EPOCHS, "{out}");
    assert!(epochs[0]["source_bytes"].as_u64().unwrap() > 0, "{out}");
    for e in &epochs[1..] {
        let shares = &e["shares"];
        let moved = e["samples"].as_u64().unwrap() - shares["kept"].as_u64().unwrap();
        assert!(moved > 0, "nothing moved into epoch {}: {out}", e["epoch"]);
        assert_eq!(shares["disk"].as_u64().unwrap(), moved, "{e}\n{out}");
        for way in ["mpi, same host", "network", "source"] {
            assert_eq!(shares[way], 0, "{way}: {e}\n{out}");
        }
        assert_eq!(
            e["source_bytes"], 0,
            "the source was read again: {e}\n{out}"
        );
    }
    let png = std::fs::read(&png).expect("the plot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let log = std::fs::read_to_string(d.join("job.log")).unwrap();
    let advanced: Vec<&str> = (log.lines())
        .filter(|l| l.contains("epoch advanced"))
        .collect();
    assert_eq!(advanced.len(), RANKS * (EPOCHS - 1), "{log}");
    assert!(
        advanced
            .iter()
            .any(|l| !l.contains("disk_handed_over=0 ") && l.contains("disk_handed_over=")),
        "no disk hand-off logged: {advanced:#?}"
    );
}

/// matplotlib in the loaders' venv (`install-python.sh` adds it), else skip.
fn require_plot(plotting: bool) -> bool {
    let missing = (!plotting).then(|| "no matplotlib in the loaders' venv".to_string());
    require("the demo's plot", "SHUFFLEFS_REQUIRE_LOADERS", missing)
}
