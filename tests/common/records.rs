//! Record sources for the `--format records` tests: datasets from
//! `mount-helpers/make_dataset.py --records`, the mount flags of each kind, and the Python
//! loaders of `tests/loaders/check_records.py`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{check, repo, run_with_timeout, venv_python};

/// The kinds `make_dataset.py --records` makes, with the mount flags that read them.
pub const KINDS: [(&str, &[&str]); 5] = [
    ("svm", &["--framing", "lines"]),
    ("csv", &["--framing", "lines", "--header-line"]),
    ("fixed", &["--framing", "fixed", "--record-size", "72"]),
    ("tfrecord", &["--framing", "tfrecord"]),
    ("tar", &["--framing", "tar"]),
];

/// The venv's python with the record loaders (sklearn, pandas, numpy, tensorflow,
/// webdataset), or `None` (skip) when they are not installed.
pub fn loaders_python() -> Option<PathBuf> {
    venv_python(
        "import sklearn, pandas, numpy, tensorflow, webdataset",
        "scikit-learn, pandas, numpy, tensorflow and webdataset",
    )
}

/// `make_dataset.py OUT --records KIND --count N --files F` (with a last line left without
/// its newline for the text kinds), run by the system's python3 (standard library only).
pub fn make_records(out: &Path, kind: &str, count: u32, files: u32) {
    let mut cmd = Command::new("python3");
    cmd.arg(repo().join("mount-helpers/make_dataset.py"))
        .arg(out)
        .args(["--records", kind, "--count", &count.to_string()])
        .args(["--files", &files.to_string(), "--record-size", "72"]);
    if kind == "svm" || kind == "csv" {
        cmd.arg("--no-final-newline");
    }
    check(
        "make_dataset.py",
        &run_with_timeout(&mut cmd, Duration::from_secs(120)),
    );
}

/// `--format records` and the kind's framing flags.
pub fn flags(kind: &str) -> Vec<&'static str> {
    let (_, f) = KINDS.iter().find(|k| k.0 == kind).expect("a known kind");
    let mut v = vec!["--format", "records"];
    v.extend_from_slice(f);
    v
}

/// The ids `check_records.py` wrote for `rank` in `epoch`.
pub fn ids(out: &Path, rank: u32, epoch: u32) -> Vec<u64> {
    let path = out.join(format!("rank{rank}-epoch{epoch}.json"));
    let v: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap();
    v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap())
        .collect()
}

/// Asserts that the ranks' lists of one epoch hold every record exactly once.
pub fn assert_partition(lists: &[Vec<u64>], count: u32, what: &str) {
    let all: Vec<u64> = lists.iter().flatten().copied().collect();
    let unique: BTreeSet<u64> = all.iter().copied().collect();
    assert_eq!(all.len(), unique.len(), "{what}: a record read twice");
    assert_eq!(
        unique,
        (0..u64::from(count)).collect::<BTreeSet<_>>(),
        "{what}: records missing"
    );
}
