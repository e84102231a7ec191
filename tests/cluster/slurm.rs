//! shufflefs under Slurm in the emulated cluster (`shufflefs-cluster up --slurm`: munged,
//! slurmctld in the root namespace, one slurmd per host; see mount-helpers/cluster-slurm.sh).
//!
//! - `srun --mpi=pmix` with 2 ranks per host wires MPI up through Slurm's PMIx and places the
//!   ranks on their hosts (`Comm::hosts()` from every rank); `mpirun` inside an allocation
//!   (from `salloc` on the head node, and from an `sbatch` script on the first node, its orted
//!   started through srun) does too. `--mpi=pmi2` is not tested: this Open MPI has no Slurm
//!   PMI-2, it fails (see docs/cluster.md).
//! - `srun ... shufflefs mount` on 4 private hosts x 2 ranks, the dataset on the storage
//!   host (`--source` STORE, caches and mount points on each host's own disk, made by the
//!   daemons), walks 3 epochs, each a partition of the dataset with exact bytes, moving
//!   samples within a host through the disk and across hosts over MPI, and `scancel` (SIGTERM
//!   to every task, which unmounts) leaves no mount in any host's mount table and no daemon.
//! - A private host killed mid-exchange (its slurmd, its store mount and every process in
//!   it) ends the job on every host and leaves its mounts dead in its mount namespace; once
//!   the host is back (store mount and slurmd again) the same job, resubmitted, clears the
//!   dead mounts, resumes at the same epoch with the plan's listings and fetches nothing from
//!   the source again.
//! - The example batch script (mount-helpers/examples/shufflefs.sbatch) trains with PyTorch
//!   DDP on 2 hosts x 2 ranks, each rank reading its own mount, and leaves nothing behind.
//! - `down` after a killed run stops every Slurm daemon and removes their files.
//!
//! The first and the last two tests run on hosts sharing the root's mount table (they look at
//! no mount or only at the batch script's from here); the jobs on private hosts are looked at
//! only from inside their hosts (tests/cluster/host_job.rs).
//!
//! Skips like the rest of the group without root and the tools, and also without slurm-wlm
//! and munge, unless `SHUFFLEFS_REQUIRE_CLUSTER=1`.

use std::collections::BTreeMap;
use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use std::path::{Path, PathBuf};

use crate::cluster_mpi::CHILD;
use crate::common::mpi_job::{exchange, planned};
use crate::common::*;
use crate::harness::{Cluster, HARNESS, harness_ok};
use crate::host_job::{HostJob, host_fuse_mounts};

/// How long a job may take to end after `scancel` or a killed host.
const END_TIMEOUT: Duration = Duration::from_secs(60);

/// The cluster's Slurm and MPI tools are there (or CI requires them).
pub(crate) fn require_slurm() -> bool {
    if !require_cluster() {
        return false;
    }
    let have = |tool: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if ["slurmctld", "slurmd", "srun", "munged"]
        .iter()
        .all(|t| have(t))
    {
        return true;
    }
    assert!(
        std::env::var_os("SHUFFLEFS_REQUIRE_CLUSTER").is_none(),
        "SHUFFLEFS_REQUIRE_CLUSTER is set but slurm-wlm or munge is missing"
    );
    eprintln!("skipping: slurm-wlm and munge are needed");
    false
}

/// A cluster with Slurm (`up --slurm`); one place to choose how its hosts are made.
fn slurm_cluster(name: &'static str, subnet: &str, hosts: u32) -> Cluster {
    Cluster::private(name, subnet, hosts, &["--shared", "--slurm"])
}

/// `shufflefs-cluster slurm NAME ARGS...`: a Slurm command from the head node.
pub(crate) fn slurm(name: &str, args: &[&str]) -> Command {
    let mut c = Command::new(HARNESS);
    c.stdin(Stdio::null()).args(["slurm", name]).args(args);
    c
}

/// Runs a Slurm command; panics with its output unless it succeeds; returns stdout.
#[track_caller]
fn slurm_ok(name: &str, args: &[&str]) -> String {
    let out = run_with_timeout(&mut slurm(name, args), Duration::from_secs(90));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Waits until every node of the cluster is idle again (after a job, or a host's return).
#[track_caller]
fn wait_idle(cluster: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let states = slurm_ok(cluster.name, &["sinfo", "-h", "-N", "-o", "%T"]);
        let idle = states.lines().filter(|l| l.trim() == "idle").count();
        if idle == cluster.hosts as usize {
            return;
        }
        assert!(Instant::now() < deadline, "nodes not idle: {states}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The running jobs' ids.
fn jobs(name: &str) -> Vec<String> {
    slurm_ok(name, &["squeue", "-h", "-o", "%i"])
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// The child check (`cluster_mpi::rank_sees_hosts`) for 2 ranks per host, as arguments.
fn child_args() -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    vec![
        exe.to_string_lossy().into_owned(),
        "cluster_mpi::rank_sees_hosts".into(),
        "--exact".into(),
        "--nocapture".into(),
        "--test-threads=1".into(),
    ]
}

/// Open MPI 4.1.4 started directly by srun (PMIx) sometimes crashes in `MPI_Init` on this
/// loaded 2-core machine: about 1 launch of 8 ranks in 13 under load, never under mpirun (0
/// in 40 in the same conditions). The core shows a null callback called from btl/tcp's
/// receive handler inside `ompi_mpi_init`'s progress loop, apparently a frame from a peer that
/// finished MPI_Init before this rank registered its handlers. Not ours to fix: a launch
/// whose output shows that crash (a task's "Segmentation fault") is tried again, at most
/// twice, and says so; any other failure is the test's.
pub(crate) fn retry_init_crash<T>(what: &str, mut launch: impl FnMut() -> (T, String)) -> T {
    for attempt in 1.. {
        let (result, output) = launch();
        if attempt > 2 || !output.contains("Segmentation fault") {
            return result;
        }
        eprintln!("{what}: a rank crashed in MPI_Init (Open MPI under srun); launching again");
    }
    unreachable!()
}

/// A cluster with Slurm on private hosts (own mount namespace and disk each), the dataset at
/// `store` served by the storage host (STORE in every host), each disk a 256 MB tmpfs.
fn private_slurm_cluster(name: &'static str, subnet: &str, hosts: u32, store: &Path) -> Cluster {
    let store = store.to_string_lossy();
    let extra = [
        "--store",
        &store,
        "--disk-type",
        "tmpfs",
        "--disk",
        "256M",
        "--slurm",
    ];
    Cluster::private(name, subnet, hosts, &extra)
}

/// `shufflefs mount` of `ds` (the store's folder) through srun, 2 ranks per host, caches and
/// mounts on each host's disk (`HostJob::start`), launched again after an MPI_Init crash (see
/// [`retry_init_crash`]); the log is `ds.base/job.log`, a crashed launch's appended to
/// `ds.base/job.crashed.log`.
fn start_job<'a>(
    cluster: &'a Cluster,
    ds: &Dataset,
    plan: (u64, f64),
    extra: &[&str],
) -> HostJob<'a> {
    let source = cluster.config("STORE");
    let log = ds.base.join("job.log");
    let job = retry_init_crash("srun shufflefs mount", || {
        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            HostJob::start(cluster, srun(cluster), 2, &source, plan, extra, &log)
        }));
        let mut text = String::new();
        if started.is_err() {
            text = fs::read_to_string(&log).unwrap_or_default();
            let crashed = ds.base.join("job.crashed.log");
            let earlier = fs::read_to_string(&crashed).unwrap_or_default();
            fs::write(&crashed, earlier + &text).unwrap();
        }
        (started, text)
    });
    job.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Runs `args` (a launch of the child check) and checks every rank reported its host.
#[track_caller]
fn check_hosts_with(cluster: &Cluster, args: &[&str], what: &str) {
    let per_host = 2;
    let ranks = cluster.hosts * per_host;
    let want: Vec<String> = (0..ranks).map(|r| (r / per_host).to_string()).collect();
    let out = retry_init_crash(what, || {
        let out = run_with_timeout(
            slurm(cluster.name, args).env(CHILD, want.join(",")),
            Duration::from_secs(90),
        );
        let text = String::from_utf8_lossy(&out.stderr).into_owned();
        (out, text)
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..ranks {
        let line = format!("rank {r} on sfs-{}-h{} hosts", cluster.name, r / per_host);
        assert!(stdout.contains(&line), "{what}: no '{line}' in:\n{stdout}");
    }
}

#[test]
fn srun_pmix_and_mpirun_in_an_allocation_place_ranks_on_their_hosts() {
    if !require_slurm() {
        return;
    }
    let cluster = slurm_cluster("sl1", "10.214.21.0/24", 4);
    let child = child_args();
    let child: Vec<&str> = child.iter().map(String::as_str).collect();
    let alloc = ["-N", "4", "--ntasks-per-node=2"];

    let started = Instant::now();
    let srun = [&["srun", "--mpi=pmix"][..], &alloc, &child].concat();
    check_hosts_with(&cluster, &srun, "srun --mpi=pmix");
    let srun_took = started.elapsed();

    // mpirun on the head node inside an allocation: orted on every node through srun.
    let salloc = [&["salloc"][..], &alloc, &["mpirun", "-x", CHILD], &child].concat();
    check_hosts_with(&cluster, &salloc, "salloc mpirun");

    // mpirun in a batch script, which runs on the first node.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("batch.out");
    let script = format!("mpirun -x {CHILD} {}", child.join(" "));
    let batch = [
        &["sbatch", "--wait", "-o", out.to_str().unwrap()][..],
        &alloc,
        &["--wrap", &script],
    ]
    .concat();
    let sbatch = run_with_timeout(
        slurm(cluster.name, &batch).env(CHILD, "0,0,1,1,2,2,3,3"),
        Duration::from_secs(90),
    );
    let log = fs::read_to_string(&out).unwrap_or_default();
    assert!(sbatch.status.success(), "sbatch mpirun: {sbatch:?}\n{log}");
    for r in 0..8 {
        let line = format!("rank {r} on sfs-sl1-h{} hosts", r / 2);
        assert!(log.contains(&line), "sbatch mpirun: no '{line}' in:\n{log}");
    }
    eprintln!("srun --mpi=pmix of 4 hosts x 2 ranks: MPI up and checked in {srun_took:.1?}");
}

/// `shufflefs-cluster slurm NAME srun -N H --ntasks-per-node=2 ... --`, then the program.
fn srun(cluster: &Cluster) -> Command {
    slurm(
        cluster.name,
        &[
            "srun",
            "-N",
            &cluster.hosts.to_string(),
            "--ntasks-per-node=2",
            "--mpi=pmix",
            "--kill-on-bad-exit",
            "--",
        ],
    )
}

#[test]
fn srun_mounts_walk_three_epochs_and_scancel_leaves_nothing() {
    if !require_slurm() {
        return;
    }
    const SEED: u64 = 3;
    const Q: f64 = 0.3;
    const RANKS: u32 = 8;
    let ds = DatasetBuilder::new()
        .numbered_class("cat", 40, |i| 8_000 + 1_013 * i as u64)
        .numbered_class("dog", 30, |i| 20_000 + 877 * i as u64)
        .class("eel", &[("one.png", 10), ("two.png", 0)])
        .build();
    let cluster = private_slurm_cluster("fa2", "10.214.100.0/24", 4, &ds.root);

    let started = Instant::now();
    let job = start_job(&cluster, &ds, (SEED, Q), &[]);
    let ready = started.elapsed();
    let daemons = job.daemons_on_their_hosts();
    for epoch in 0..3u64 {
        let mut owner = BTreeMap::new();
        for r in 0..RANKS {
            let got = job.listing(&ds, r, epoch);
            assert_eq!(got, planned(&ds.root, (RANKS, SEED, Q), epoch, r));
            for key in got {
                assert!(owner.insert(key, r).is_none(), "listed twice in {epoch}");
            }
        }
        assert_eq!(owner.len(), ds.samples.len(), "epoch {epoch} covers all");
        if epoch < 2 {
            for r in 0..RANKS {
                job.advance(r, epoch + 1);
            }
        }
    }
    job.wait_all("the exchange into epoch 3", |st| {
        exchange(st, 3).is_some_and(|x| x["state"] == "done")
    });
    // Node-aware under srun too: a same-host peer through the disk, the others over MPI.
    for r in 0..RANKS {
        let st = job.status(r);
        for target in 1..=3u64 {
            for p in exchange(&st, target).unwrap()["peers"].as_array().unwrap() {
                let same = p["rank"].as_u64().unwrap() / 2 == u64::from(r / 2);
                assert_eq!(p["same_host"], same, "rank {r}: {p}");
                assert_eq!(p["via"], if same { "disk" } else { "mpi" }, "rank {r}: {p}");
            }
        }
    }

    // scancel: Slurm sends SIGTERM to every task, each daemon unmounts and exits.
    let ids = jobs("fa2");
    assert_eq!(ids.len(), 1, "one job: {ids:?}");
    let cancelled = Instant::now();
    slurm_ok("fa2", &["scancel", &ids[0]]);
    let mut job = job;
    assert!(
        job.wait_within(END_TIMEOUT).is_some(),
        "srun outlived scancel"
    );
    all_gone_in_hosts(&cluster, &[0, 1, 2, 3], &daemons);
    eprintln!(
        "srun of 4 private hosts x 2 ranks: every mount ready {ready:.2?} after srun started; \
         scancel to nothing left: {:.2?}",
        cancelled.elapsed()
    );
    wait_idle(&cluster);
}

#[test]
fn host_killed_mid_exchange_ends_the_job_and_a_resubmitted_job_resumes() {
    if !require_slurm() {
        return;
    }
    const SEED: u64 = 9;
    const Q: f64 = 0.5;
    const RANKS: u32 = 4;
    let mut b = DatasetBuilder::new();
    for c in ["c0", "c1", "c2", "c3"] {
        b = b.numbered_class(c, 30, |i| 20_000 + 97 * i as u64);
    }
    let ds = b.build();
    let cluster = private_slurm_cluster("fa3", "10.214.101.0/24", 2, &ds.root);

    // 1. The exchange into epoch 1 slowed so it is running when h1 dies.
    let slow = ["--exchange-rate", "20000", "--share-disk", "never"];
    let mut job = start_job(&cluster, &ds, (SEED, Q), &slow);
    let daemons = job.daemons_on_their_hosts();
    job.wait_all("staging", |st| {
        st["staging"]["state"] == "done"
            && st["staging"]["files_done"] == st["staging"]["files_total"]
    });
    job.wait_all("the exchange into epoch 1 to run", |st| {
        exchange(st, 1).is_some_and(|x| x["state"] == "running")
    });
    let id = jobs("fa3").pop().expect("the job runs");
    let killed = Instant::now();
    kill_host(&cluster, 1);
    // Slurm declares the node failed (SlurmdTimeout) and cancels the step on the other
    // nodes (SIGTERM, then SIGKILL after KillWait); srun's own exit status is 0 then, and
    // the job stays COMPLETING (Reason=NodeDown) until the host is back.
    let status = job.wait_within(END_TIMEOUT);
    assert!(
        status.is_some(),
        "srun outlived the killed host\n{}",
        job.log()
    );
    let ended = killed.elapsed();
    let state = slurm_ok("fa3", &["scontrol", "show", "job", &id]);
    assert!(
        state.contains("JobState=NODE_FAIL") || state.contains("Reason=NodeDown"),
        "{state}\n{}",
        job.log()
    );
    // h0's ranks unmounted; h1's mounts are left dead in h1 (its store mount too).
    all_gone_in_hosts(&cluster, &[0], &daemons[..2]);
    for m in &job.mounts[2..] {
        let out = cluster.exec("1", &["stat", m]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("not connected"),
            "{m} on h1 is not a dead mount: {err}"
        );
    }
    drop(job);

    // 2. The host comes back (its store mount and its slurmd again, as after a reboot that
    // kept its disk) and the same job is submitted again: the daemons on h1 clear the dead
    // mounts, every rank resumes at epoch 0 from its cache.
    harness_ok(&["store", "fa3", "start"]);
    harness_ok(&["slurmd", "fa3", "1"]);
    wait_idle(&cluster);
    let back = killed.elapsed();
    let mut job = start_job(&cluster, &ds, (SEED, Q), &[]);
    let daemons = job.daemons_on_their_hosts();
    let h1 = host_fuse_mounts(&cluster, 1);
    for m in &job.mounts[2..] {
        let here: Vec<_> = h1.iter().filter(|(t, _)| t == m).collect();
        assert_eq!(
            here.len(),
            1,
            "{m} on h1: one live mount, the dead one gone: {h1:?}"
        );
    }
    // (A launch that crashed in MPI_Init may have cleared some already.)
    let crashed = fs::read_to_string(ds.base.join("job.crashed.log")).unwrap_or_default();
    let cleared = (job.log() + &crashed)
        .matches("removed a dead shufflefs mount")
        .count();
    assert_eq!(
        cleared,
        2,
        "h1's two ranks clear their dead mounts:\n{}",
        job.log()
    );
    for r in 0..RANKS {
        assert_eq!(job.status(r)["epoch"], 0, "rank {r} resumed elsewhere");
    }
    for epoch in 0..2 {
        for r in 0..RANKS {
            assert_eq!(
                job.listing(&ds, r, epoch),
                planned(&ds.root, (RANKS, SEED, Q), epoch, r),
                "rank {r} epoch {epoch} after the restart"
            );
        }
    }
    for r in 0..RANKS {
        let st = job.status(r);
        assert_eq!(st["cache"]["fetched_from_source"], 0, "rank {r}: {st}");
    }
    let status = job.unmount_within(END_TIMEOUT);
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        job.log()
    );
    all_gone_in_hosts(&cluster, &[0, 1], &daemons);
    eprintln!(
        "host h1 killed: the job ended in {ended:.1?}, the node was idle again at {back:.1?}"
    );
}

/// The example batch script (mount-helpers/examples/shufflefs.sbatch) on 2 hosts x 2 ranks:
/// the daemons through `shufflefs-launch --srun`, PyTorch DDP (gloo) through `srun`, each
/// rank reading its own mount, 3 epochs of the whole dataset, then teardown.
#[test]
fn example_sbatch_script_trains_with_ddp_and_tears_down() {
    if !require_slurm() {
        return;
    }
    let Some(python) = venv_python("import torch, torchvision", "torch and torchvision") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let made = Command::new("python3")
        .arg(repo().join("mount-helpers/make_dataset.py"))
        .arg(d.join("src"))
        .args(["--classes", "3", "--per-class", "16", "--size", "16"])
        .output()
        .unwrap();
    check("make_dataset.py", &made);
    let cluster = slurm_cluster("sl4", "10.214.24.0/24", 2);
    let out = d.join("job.out");
    let script = repo().join("mount-helpers/examples/shufflefs.sbatch");
    let job = retry_init_crash("sbatch", || {
        let job = run_with_timeout(
            slurm(
                "sl4",
                &["sbatch", "--wait", "--nodes=2", "--ntasks-per-node=2", "-o"],
            )
            .arg(&out)
            .arg(&script)
            .args(["--epochs", "3", "--batch-size", "8"])
            .env("SHUFFLEFS", BIN)
            .env("SHUFFLEFS_SOURCE", d.join("src"))
            .env("SHUFFLEFS_CACHE", d.join("cache{rank}"))
            .env("SHUFFLEFS_MOUNT", d.join("mnt{rank}"))
            .env("SHUFFLEFS_HELPERS", repo().join("mount-helpers"))
            .env("PYTHON", &python)
            .env("PYTHONPATH", package_pythonpath(""))
            .env("TMPDIR", d),
            Duration::from_secs(300),
        );
        (job, fs::read_to_string(&out).unwrap_or_default())
    });
    let log = fs::read_to_string(&out).unwrap_or_default();
    assert!(job.status.success(), "{job:?}\n{log}");
    assert!(log.contains("every mount ready"), "{log}");
    assert_eq!(log.matches("48 samples on 4 ranks").count(), 3, "{log}");
    assert!(log.contains("first_loss="), "{log}");
    let mounts: Vec<PathBuf> = (0..4).map(|r| d.join(format!("mnt{r}"))).collect();
    all_gone_but_slurmd(&cluster, &mounts, &[]);
}

/// `down` after a run killed half-way (slurmctld and munged SIGKILLed, slurmd left running)
/// stops every Slurm daemon of the cluster and removes its files; again, it has nothing to do.
#[test]
fn down_after_a_killed_run_stops_every_slurm_daemon() {
    if !require_slurm() {
        return;
    }
    let cluster = slurm_cluster("sl5", "10.214.25.0/24", 2);
    let state = PathBuf::from(format!("/run/shufflefs-cluster/{}/slurm", cluster.name));
    let pid = |file: &str| -> i32 {
        let text = fs::read_to_string(state.join(file)).unwrap();
        text.trim().parse().unwrap()
    };
    let daemons = [
        pid("slurmctld.pid"),
        pid("munged.pid"),
        pid("slurmd-sfs-sl5-h0.pid"),
        pid("slurmd-sfs-sl5-h1.pid"),
    ];
    for &p in &daemons[..2] {
        let kill = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
        kill.unwrap();
    }
    harness_ok(&["down", "sl5"]);
    for p in daemons {
        assert!(
            wait_pid_gone(p, Duration::from_secs(5)),
            "{p} survived down"
        );
    }
    assert!(!state.exists(), "down left {}", state.display());
    harness_ok(&["down", "sl5"]);
}

/// SIGKILL to every process in host `h`'s network namespace: slurmd, slurmstepd, daemons.
pub(crate) fn kill_host(cluster: &Cluster, h: u32) {
    let ns = format!("sfs-{}-h{h}", cluster.name);
    let out = run_with_timeout(
        Command::new("ip").args(["netns", "pids", &ns]),
        Duration::from_secs(10),
    );
    let pids: Vec<i32> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(!pids.is_empty(), "nothing runs in {ns}");
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// After the job: nothing mounted, no daemon, nothing but the slurmds left in any host.
#[track_caller]
fn all_gone_but_slurmd(cluster: &Cluster, mounts: &[PathBuf], daemons: &[i32]) {
    for m in mounts {
        assert!(!is_mounted(m), "{} is still mounted", m.display());
    }
    daemons_gone(cluster, daemons);
}

/// After the job on private hosts: no shufflefs mount in any of `hosts` (each host's own
/// mount table read inside it), no daemon, nothing but the slurmds and the store's sshfs
/// mounts (and its sshd) left in the cluster.
#[track_caller]
fn all_gone_in_hosts(cluster: &Cluster, hosts: &[u32], daemons: &[i32]) {
    for &h in hosts {
        let ours: Vec<_> = (host_fuse_mounts(cluster, h).into_iter())
            .filter(|(_, fstype)| fstype != "fuse.sshfs")
            .collect();
        assert!(ours.is_empty(), "h{h} still has {ours:?}");
    }
    daemons_gone(cluster, daemons);
}

/// `daemons` exit (within 10 s), then so does everything in the hosts but slurmd and the
/// store's processes (sshfs and its ssh in the hosts, sshd in the store).
#[track_caller]
fn daemons_gone(cluster: &Cluster, daemons: &[i32]) {
    for &pid in daemons {
        assert!(
            wait_pid_gone(pid, Duration::from_secs(10)),
            "daemon {pid} is still running"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<(i32, String)> = (cluster.pids().into_iter())
            .map(|p| {
                (
                    p,
                    fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default(),
                )
            })
            .filter(|(_, comm)| !matches!(comm.trim(), "" | "slurmd" | "sshfs" | "ssh" | "sshd"))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "left in the hosts: {left:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
