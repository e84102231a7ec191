//! Runs of `mount-helpers/examples/train_ddp.py` mounting from the script
//! (`shufflefs.torch.mount`), checked from what the script records: the images it learns
//! from, its command line, and the checks on a finished run (loss down; every epoch the
//! ranks' samples partition the dataset with the source's bytes). Used by the one-host
//! torchrun test and the emulated-hosts one, so both check the same things.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::{check, printed_value, repo};

/// Epochs every run trains.
pub const EPOCHS: u64 = 3;

/// `make_dataset.py OUT --classes 3 --per-class N --size 32`: PNG images of classes a small
/// model learns apart (a colour and a stripe direction each).
pub fn make_images(python: &Path, out: &Path, per_class: u32) {
    let made = Command::new(python)
        .arg(repo().join("mount-helpers/make_dataset.py"))
        .arg(out)
        .args(["--classes", "3", "--per-class", &per_class.to_string()])
        .args(["--size", "32"])
        .output()
        .unwrap();
    check("make_dataset.py", &made);
}

/// Appends `train_ddp.py --source SOURCE --cache CACHE --mount MOUNT --fraction 0.5
/// --epochs 3 --batch-size B --record REC` to `cmd` (`{rank}` in CACHE and MOUNT is the
/// rank's number).
pub fn train_ddp(cmd: &mut Command, source: &Path, (cache, mount): (&str, &str), rec: &Path) {
    cmd.arg(repo().join("mount-helpers/examples/train_ddp.py"))
        .arg("--source")
        .arg(source)
        .args(["--cache", cache, "--mount", mount])
        .args(["--fraction", "0.5", "--epochs", &EPOCHS.to_string()])
        .args(["--batch-size", "4", "--record"])
        .arg(rec);
}

/// Checks a finished run of `ranks` ranks whose rank 0 printed `stdout` and recorded into
/// `rec` the epochs `epochs` (`0..EPOCHS` for a new job): the loss went down, and every
/// epoch the ranks' samples are `src`'s files, each on one rank with its bytes, every rank's
/// status saying `ranks` ranks. Returns the recorded statuses (epoch-major).
pub fn check_run(
    stdout: &str,
    src: &Path,
    rec: &Path,
    ranks: u32,
    epochs: Range<u64>,
) -> Vec<Value> {
    let field = |name: &str| printed_value(stdout, name);
    assert!(
        field("last_loss") < field("first_loss"),
        "loss did not go down:\n{stdout}"
    );
    let files = walk_files(src);
    let mut statuses = Vec::new();
    for epoch in epochs {
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        for rank in 0..ranks {
            let at = rec.join(format!("epoch-{epoch}.rank-{rank}.json"));
            let read = std::fs::read(&at);
            let read = read.unwrap_or_else(|e| panic!("{}: {e}\nstdout:\n{stdout}", at.display()));
            let v: Value = serde_json::from_slice(&read).unwrap();
            assert_eq!(v["status"]["world_size"], ranks, "rank {rank}");
            for s in v["samples"].as_array().unwrap() {
                let (path, hash) = (s[0].as_str().unwrap(), s[2].as_str().unwrap());
                let again = seen.insert(path.to_string(), hash.to_string());
                assert!(again.is_none(), "epoch {epoch}: {path} on two ranks");
            }
            statuses.push(v["status"].clone());
        }
        let got: Vec<&String> = seen.keys().collect();
        let want: Vec<&String> = files.keys().collect();
        assert_eq!(
            got, want,
            "epoch {epoch}: the ranks' samples are the dataset"
        );
        for (path, hash) in &seen {
            assert_eq!(*hash, files[path], "epoch {epoch}: {path}'s bytes");
        }
    }
    statuses
}

/// Every file under `root`, as its path relative to `root` and the sha256 of its bytes (one
/// `sha256sum` for them all).
fn walk_files(root: &Path) -> BTreeMap<String, String> {
    let files: Vec<String> = super::trees::walk(root).files.into_keys().collect();
    let out = Command::new("sha256sum")
        .args(&files)
        .current_dir(root)
        .output()
        .unwrap();
    let listed = check("sha256sum", &out);
    let sums: BTreeMap<String, String> = (listed.lines())
        .filter_map(|l| l.split_once("  "))
        .map(|(hash, path)| (path.to_string(), hash.to_string()))
        .collect();
    assert_eq!(sums.len(), files.len(), "a sum per file:\n{listed}");
    sums
}
