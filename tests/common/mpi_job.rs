//! A real `mpirun` job of shufflefs daemons for the multi-rank tests.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use shufflefs::sys::mounts::is_mounted;

use super::{BIN, force_unmount, read_status, shufflefs, wait_child};

/// `mpirun -np N --oversubscribe`, allowed to run as root (CI does): 4 ranks on 2 cores.
pub fn mpirun(ranks: u32) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["--oversubscribe", "-np", &ranks.to_string()]);
    cmd
}

/// The harness's name for test `name` of the module at `module` (pass `module_path!()`): the
/// path without the crate, so a test can re-run one of its own tests (`--exact`) per rank.
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, m)) => format!("{m}::{name}"),
        None => name.to_string(),
    }
}

/// An `mpirun -np N shufflefs mount` job over `DIR/src`, caches `DIR/cache{rank}` and mounts
/// `DIR/mnt{rank}` (created if missing); stderr goes to `DIR/job.log`. Drop unmounts.
pub struct MpiJob {
    pub child: Child,
    pub mounts: Vec<PathBuf>,
}

impl MpiJob {
    pub fn start(dir: &Path, ranks: u32, seed: u64, fraction: f64, extra: &[&str]) -> MpiJob {
        MpiJob::start_with(mpirun(ranks), dir, ranks, seed, fraction, extra)
    }

    /// As [`MpiJob::start`], with `launcher` (a launcher command that starts `ranks` copies
    /// of the program that follows its arguments, e.g. `shufflefs-cluster mpirun NAME --`).
    pub fn start_with(
        launcher: Command,
        dir: &Path,
        ranks: u32,
        seed: u64,
        fraction: f64,
        extra: &[&str],
    ) -> MpiJob {
        let source = dir.join("src");
        MpiJob::start_from(
            launcher,
            source.as_os_str(),
            dir,
            ranks,
            seed,
            fraction,
            extra,
        )
    }

    /// As [`MpiJob::start_with`], with `--source SOURCE` (e.g. an `s3://` URL) instead of
    /// `DIR/src`.
    pub fn start_from(
        mut launcher: Command,
        source: &std::ffi::OsStr,
        dir: &Path,
        ranks: u32,
        seed: u64,
        fraction: f64,
        extra: &[&str],
    ) -> MpiJob {
        let mounts: Vec<PathBuf> = (0..ranks).map(|r| dir.join(format!("mnt{r}"))).collect();
        for m in &mounts {
            let _ = std::fs::create_dir(m);
        }
        let child = launcher
            .args([BIN, "mount"])
            .args([
                "--seed",
                &seed.to_string(),
                "--fraction",
                &fraction.to_string(),
            ])
            .arg("--source")
            .arg(source)
            .arg("--cache")
            .arg(dir.join("cache{rank}"))
            .args(extra)
            .arg(dir.join("mnt{rank}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("job.log")).unwrap())
            .spawn()
            .unwrap();
        let mut job = MpiJob { child, mounts };
        let deadline = Instant::now() + Duration::from_secs(120);
        while !job
            .mounts
            .iter()
            .all(|m| m.join(".shufflefs/status").exists())
        {
            if let Ok(Some(status)) = job.child.try_wait() {
                let log = std::fs::read_to_string(dir.join("job.log")).unwrap_or_default();
                panic!("the job exited before mounting: {status}\n{log}");
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join("job.log")).unwrap_or_default();
                panic!("ranks did not mount in time\n{log}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        job
    }

    pub fn status(&self, rank: usize) -> Value {
        read_status(&self.mounts[rank])
    }

    /// SIGKILL to every daemon and to mpirun: nothing gets to clean up.
    pub fn kill(mut self) {
        // Every pid first: once one rank dies, mpirun takes the others down, and their status
        // files stop answering.
        // A rank whose status is gone has exited already (e.g. after its coded server was
        // killed, a rank on the server's host unmounts and exits on its own).
        let pids: Vec<i32> = (self.mounts.iter())
            .filter_map(|m| std::fs::read(m.join(".shufflefs/status")).ok())
            .filter_map(|b| serde_json::from_slice::<Value>(&b).ok())
            .filter_map(|st| st["pid"].as_i64())
            .map(|pid| pid as i32)
            .collect();
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.mounts.clear();
    }

    /// Every rank's daemon pid, from its status.
    pub fn pids(&self) -> Vec<i32> {
        (0..self.mounts.len())
            .map(|r| self.status(r)["pid"].as_i64().unwrap() as i32)
            .collect()
    }

    /// Unmounts every rank and checks the stop was clean: the launcher exits 0 (every rank
    /// did), no mount and no daemon is left. `dir` holds the job's log.
    pub fn stop_cleanly(mut self, dir: &Path) {
        let pids = self.pids();
        let status = self.unmount_within(Duration::from_secs(90));
        let log = std::fs::read_to_string(dir.join("job.log")).unwrap_or_default();
        let status = status.unwrap_or_else(|| panic!("the job did not end after unmount\n{log}"));
        assert!(status.success(), "the job ended with {status}\n{log}");
        for m in &self.mounts {
            assert!(!is_mounted(m), "{} is still mounted", m.display());
        }
        for pid in pids {
            assert!(
                super::wait_pid_gone(pid, Duration::from_secs(10)),
                "daemon {pid} still runs"
            );
        }
    }

    pub fn unmount(mut self) {
        for m in std::mem::take(&mut self.mounts) {
            let _ = shufflefs().arg("unmount").arg(&m).output();
        }
        let _ = self.child.wait();
    }

    /// Unmounts every rank with `shufflefs unmount` and waits up to `timeout` for the
    /// launcher to exit; returns its exit status, or None if it was still running (then
    /// drop cleans up).
    pub fn unmount_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        for m in &self.mounts {
            let out = shufflefs()
                .arg("unmount")
                .arg("--timeout")
                .arg(timeout.as_secs().to_string())
                .arg(m)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "shufflefs unmount {}: {}",
                m.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.wait_within(timeout)
    }

    /// The launcher's exit status once it exits, within `timeout`.
    pub fn wait_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_child(&mut self.child, timeout)
    }
}

impl Drop for MpiJob {
    fn drop(&mut self) {
        for m in &self.mounts {
            if is_mounted(m) {
                force_unmount(m);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `classes` x `per_class` samples of about `bytes` bytes under `dir/src` (`src/class{c}/
/// s{i:03}.bin`), each file's bytes a function of its class, index and offset.
pub fn write_source(dir: &Path, classes: u32, per_class: u32, bytes: usize) {
    for c in 0..classes {
        let class = dir.join(format!("src/class{c}"));
        std::fs::create_dir_all(&class).unwrap();
        for i in 0..per_class {
            let len = bytes + i as usize * 97;
            let data: Vec<u8> = (0..len).map(|o| (o as u32 ^ (i * 31 + c)) as u8).collect();
            std::fs::write(class.join(format!("s{i:03}.bin")), data).unwrap();
        }
    }
}

/// As [`write_source`], every sample exactly `bytes` long, under `src/c{c}/` (the partial
/// cache tests plan with those sizes).
pub fn write_equal_source(dir: &Path, classes: u32, per_class: u32, bytes: usize) {
    for c in 0..classes {
        let class = dir.join(format!("src/c{c}"));
        std::fs::create_dir_all(&class).unwrap();
        for i in 0..per_class {
            let data: Vec<u8> = (0..bytes)
                .map(|o| (o as u32 ^ (i * 31 + c)) as u8)
                .collect();
            std::fs::write(class.join(format!("s{i:03}.bin")), data).unwrap();
        }
    }
}

/// Waits (up to 2 minutes) until `pred` holds for every rank's status.
#[track_caller]
pub fn wait_all(job: &MpiJob, what: &str, pred: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(0..job.mounts.len()).all(|r| pred(&job.status(r))) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The status's report of the exchange into `target`, if it is among the recent ones.
pub fn exchange(st: &Value, target: u64) -> Option<&Value> {
    st["exchange"]
        .as_array()?
        .iter()
        .find(|x| x["target_epoch"] == target)
}

/// What an uninterrupted run lists on `rank` in `epoch` (`class/name`), from the library's
/// own plan over the source folder `src`.
pub fn planned(
    src: &std::path::Path,
    (ranks, seed, fraction): (u32, u64, f64),
    epoch: u64,
    rank: u32,
) -> std::collections::BTreeSet<String> {
    let m = shufflefs::dataset::scan::scan(src).unwrap();
    let plan = shufflefs::plan::Plan::new(shufflefs::plan::PlanParams {
        samples: m.len(),
        world: ranks,
        fraction,
        seed,
    })
    .unwrap();
    plan.shares_at(epoch)
        .share(rank)
        .iter()
        .map(|&id| m.relative_path(id).to_string_lossy().into_owned())
        .collect()
}

/// `class/name` of every file of `epoch` on `mnt` (looking it up advances to it), each read
/// and compared with `dir/src`, the source of
/// `DatasetBuilder` trees.
pub fn checked_listing(dir: &Path, mnt: &Path, epoch: u64) -> BTreeSet<String> {
    let view = mnt.join(format!("epoch-{epoch}"));
    let mut out = BTreeSet::new();
    for class in std::fs::read_dir(&view).unwrap() {
        let class = class.unwrap();
        for f in std::fs::read_dir(class.path()).unwrap() {
            let f = f.unwrap();
            let rel = format!(
                "{}/{}",
                class.file_name().to_string_lossy(),
                f.file_name().to_string_lossy()
            );
            let got = std::fs::read(f.path()).unwrap();
            assert!(
                got == std::fs::read(dir.join("src").join(&rel)).unwrap(),
                "{rel} on {} differs from the source",
                mnt.display()
            );
            out.insert(rel);
        }
    }
    out
}

/// `torchrun --standalone --nproc_per_node N --no-python`, from the loaders' venv: a launcher
/// that starts N ranks with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR,
/// MASTER_PORT) and no MPI, so the daemons meet over TCP. `None` (a skip, a failure under
/// SHUFFLEFS_REQUIRE_LOADERS=1) without a venv that has torch.
pub fn torchrun(ranks: u32) -> Option<Command> {
    let python = super::venv_python("import torch.distributed.run", "torch (torchrun)")?;
    let mut cmd = Command::new(python.with_file_name("torchrun"));
    cmd.args(["--standalone", "--nproc_per_node", &ranks.to_string()])
        .arg("--no-python")
        // torchrun's own logs would go to the job's log; its workers' environment is ours.
        .env("LOGLEVEL", "WARNING")
        .env_remove("OMPI_COMM_WORLD_SIZE");
    // The daemons' rendezvous on a port free now: MASTER_PORT + 1, the default, can be an
    // ephemeral port of another connection on a busy machine.
    let free = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr());
    cmd.env(
        "SHUFFLEFS_PORT",
        free.expect("a free port").port().to_string(),
    );
    Some(cmd)
}
