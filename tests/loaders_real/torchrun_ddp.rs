//! `torchrun` is the whole launch: `mount-helpers/examples/train_ddp.py --source ...` calls
//! `shufflefs.torch.mount` after `init_process_group`, so each rank's script starts its own
//! daemon, the daemons meet over TCP at MASTER_ADDR, the DDP loop trains 3 epochs, and the
//! mounts go when the scripts exit. Checked: every epoch the ranks' samples partition the
//! dataset with the source's bytes, the loss goes down, torchrun exits 0, and afterwards
//! nothing is mounted and no daemon runs. Twice: with this checkout's package and binary, and
//! with the wheel `python/wheel` builds (the README's command) installed into a fresh venv,
//! whose binary must not link libmpi.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;

const RANKS: u32 = 2;

fn loaders() -> Option<PathBuf> {
    if !require_fuse() {
        return None;
    }
    venv_python(
        "import torch, torchvision, PIL",
        "torch, torchvision and pillow",
    )
}

#[test]
fn torchrun_alone_launches_a_ddp_job_that_mounts_from_the_script() {
    let Some(python) = loaders() else { return };
    let mut cmd = Command::new(python.with_file_name("torchrun"));
    with_package(&mut cmd).env("SHUFFLEFS", BIN);
    ddp_under_torchrun(&python, cmd);
}

/// `maturin build --release` in python/wheel (README), `pip install` of the wheel into a
/// fresh venv (no index: the wheel has no dependencies), `ldd` of its binary, then the same
/// run with that venv's package first on the path and no SHUFFLEFS: the package finds the
/// binary the wheel installed beside it.
#[test]
fn the_wheel_brings_an_mpi_free_binary_that_torchrun_jobs_run() {
    let Some(python) = loaders() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let wheels = tmp.path().join("wheels");
    let built = run_with_timeout(
        Command::new(python.with_file_name("maturin"))
            .args(["build", "--release", "--out"])
            .arg(&wheels)
            .current_dir(repo().join("python/wheel")),
        Duration::from_secs(900),
    );
    check("maturin build --release", &built);
    let wheel = std::fs::read_dir(&wheels)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let venv = tmp.path().join("venv");
    check(
        "python3 -m venv",
        &Command::new("python3")
            .arg("-m")
            .arg("venv")
            .arg(&venv)
            .output()
            .unwrap(),
    );
    let pip = Command::new(venv.join("bin/pip"))
        .args(["install", "--no-index", "-q"])
        .arg(&wheel)
        .output()
        .unwrap();
    check("pip install WHEEL", &pip);
    let exe = venv.join("bin/shufflefs");
    let ldd = String::from_utf8_lossy(&Command::new("ldd").arg(&exe).output().unwrap().stdout)
        .into_owned();
    assert!(
        !ldd.contains("libmpi"),
        "the wheel's binary links MPI:\n{ldd}"
    );
    let site = check(
        "the venv's site-packages",
        &Command::new(venv.join("bin/python"))
            .args([
                "-c",
                "import sysconfig; print(sysconfig.get_path('purelib'))",
            ])
            .output()
            .unwrap(),
    );
    let site = site.trim().to_string();
    let which = check(
        "which binary the installed package runs",
        &Command::new(&python)
            .env("PYTHONPATH", &site)
            .env_remove("SHUFFLEFS")
            .args([
                "-c",
                "import shufflefs.launch as l; print(l.__file__); print(l.binary())",
            ])
            .output()
            .unwrap(),
    );
    assert!(
        which.contains(&format!("{site}/shufflefs/launch.py")),
        "{which}"
    );
    assert!(which.contains(exe.to_str().unwrap()), "{which}");
    let mut cmd = Command::new(python.with_file_name("torchrun"));
    cmd.env("PYTHONPATH", &site).env_remove("SHUFFLEFS");
    ddp_under_torchrun(&python, cmd);
}

/// `torchrun` (`cmd`, its environment set) runs train_ddp.py --source on 2 ranks for 3
/// epochs; checks what the module docs say.
fn ddp_under_torchrun(python: &Path, mut cmd: Command) {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let src = d.join("src");
    ddp::make_images(python, &src, 20);
    let (cache, mount) = (d.join("cache-{rank}"), d.join("mnt-{rank}"));
    let spots = (cache.to_str().unwrap(), mount.to_str().unwrap());
    cmd.env("LOGLEVEL", "WARNING")
        .args(["--standalone", "--nproc_per_node", &RANKS.to_string()]);
    ddp::train_ddp(&mut cmd, &src, spots, &d.join("rec"));
    let stdout = check(
        "torchrun train_ddp.py",
        &run_with_timeout(&mut cmd, Duration::from_secs(600)),
    );
    let statuses = ddp::check_run(&stdout, &src, &d.join("rec"), RANKS, 0..ddp::EPOCHS);
    for rank in 0..RANKS {
        let m = d.join(format!("mnt-{rank}"));
        assert!(
            !is_mounted(&m),
            "{} is still mounted after the scripts exited",
            m.display()
        );
    }
    for st in statuses {
        let pid = st["pid"].as_i64().unwrap() as i32;
        assert!(
            wait_pid_gone(pid, Duration::from_secs(20)),
            "daemon {pid} still runs"
        );
    }
}
