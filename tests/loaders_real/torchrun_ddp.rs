//! `torchrun` is the whole launch: `mount-helpers/examples/train_ddp.py --source ...` calls
//! `shufflefs.torch.mount` after `init_process_group`, so each rank's script starts its own
//! daemon (this checkout's binary via SHUFFLEFS), the daemons meet over TCP at MASTER_ADDR, the
//! DDP loop trains 3 epochs, and the mounts go when the scripts exit. Checked: every epoch the
//! ranks' samples partition the dataset with the source's bytes, the loss goes down, torchrun
//! exits 0, and afterwards nothing is mounted and no daemon runs.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::*;

const RANKS: u32 = 2;
const EPOCHS: u64 = 3;

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn torchrun_alone_launches_a_ddp_job_that_mounts_from_the_script() {
    if !require_fuse() {
        return;
    }
    let Some(python) = venv_python(
        "import torch, torchvision, PIL",
        "torch, torchvision and pillow",
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let src = d.join("src");
    let maker = repo().join("mount-helpers/make_dataset.py");
    let made = Command::new(&python)
        .arg(maker)
        .arg(&src)
        .args(["--classes", "3", "--per-class", "20", "--size", "32"])
        .output()
        .unwrap();
    check("make_dataset.py", &made);
    let mut cmd = Command::new(python.with_file_name("torchrun"));
    with_package(&mut cmd)
        .env("SHUFFLEFS", BIN)
        .env("LOGLEVEL", "WARNING")
        .args(["--standalone", "--nproc_per_node", &RANKS.to_string()])
        .arg(repo().join("mount-helpers/examples/train_ddp.py"))
        .arg("--source")
        .arg(&src)
        .arg("--cache")
        .arg(d.join("cache-{rank}"))
        .arg("--mount")
        .arg(d.join("mnt-{rank}"))
        .args([
            "--fraction",
            "0.5",
            "--epochs",
            &EPOCHS.to_string(),
            "--record",
        ])
        .arg(d.join("rec"));
    let stdout = check(
        "torchrun train_ddp.py",
        &run_with_timeout(&mut cmd, Duration::from_secs(600)),
    );
    let field = |name: &str| -> f64 {
        let at = stdout
            .find(&format!("{name}="))
            .unwrap_or_else(|| panic!("no {name}:\n{stdout}"));
        stdout[at + name.len() + 1..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(
        field("last_loss") < field("first_loss"),
        "loss did not go down:\n{stdout}"
    );
    let mut pids = Vec::new();
    for epoch in 0..EPOCHS {
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        for rank in 0..RANKS {
            let rec = d.join(format!("rec/epoch-{epoch}.rank-{rank}.json"));
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&rec).unwrap()).unwrap();
            assert_eq!(v["status"]["world_size"], RANKS, "rank {rank}");
            pids.push(v["status"]["pid"].as_i64().unwrap() as i32);
            for s in v["samples"].as_array().unwrap() {
                let (path, hash) = (s[0].as_str().unwrap(), s[2].as_str().unwrap());
                let again = seen.insert(path.to_string(), hash.to_string());
                assert!(again.is_none(), "epoch {epoch}: {path} on two ranks");
            }
        }
        let all = walk_files(&src);
        assert_eq!(
            seen.len(),
            all.len(),
            "epoch {epoch}: the ranks' samples are not the dataset"
        );
        for (path, hash) in &seen {
            assert_eq!(
                *hash,
                sha256(&src.join(path)),
                "epoch {epoch}: {path}'s bytes"
            );
        }
    }
    for rank in 0..RANKS {
        let m = d.join(format!("mnt-{rank}"));
        assert!(
            !is_mounted(&m),
            "{} is still mounted after the scripts exited",
            m.display()
        );
    }
    for pid in pids {
        assert!(
            wait_pid_gone(pid, Duration::from_secs(20)),
            "daemon {pid} still runs"
        );
    }
}

/// Every file under `root`, as paths relative to it.
fn walk_files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for class in std::fs::read_dir(root).unwrap() {
        let class = class.unwrap();
        for f in std::fs::read_dir(class.path()).unwrap() {
            let name = f.unwrap().file_name();
            out.push(format!(
                "{}/{}",
                class.file_name().to_string_lossy(),
                name.to_string_lossy()
            ));
        }
    }
    out
}
