//! The TCP transport across hosts: 4 emulated private hosts (their own network at 1 Gbit,
//! disk and mount table), the dataset on the storage host over sshfs, and `shufflefs-cluster
//! torchrun` starting one torchrun agent per host (2 ranks each): no MPI anywhere, the
//! daemons meet at MASTER_ADDR and exchange over TCP between hosts.
//!
//! - `torchrun --no-python shufflefs mount` under a static rendezvous: every epoch each rank
//!   holds its planned share with the source's bytes (so the shares partition the dataset),
//!   the exchange crossed hosts, and `shufflefs unmount` on every rank ends every torchrun
//!   with exit 0 and leaves no FUSE mount in any host; again with the dataset in an S3
//!   bucket (moto on the bridge), each object fetched once.
//! - The DDP example mounting from its script (`shufflefs.torch.mount`) under a c10d
//!   rendezvous; with a host killed mid-exchange and the same torchrun command run on the 3
//!   hosts left; and under torchrun's own elastic restart (`--nnodes 3:4`).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::mpi_job::{exchange, planned};
use crate::common::*;
use crate::harness::Cluster;
use crate::host_job::{HostJob, host_fuse_mounts, status_on};
use crate::private_hosts::{four_classes, staged};

const HOSTS: u32 = 4;
const PER_HOST: u32 = 2;
const SEED: u64 = 43;
const Q: f64 = 0.5;

fn require() -> bool {
    if !require_cluster() {
        return false;
    }
    let store = on_path("sshfs") && Path::new("/usr/sbin/sshd").exists();
    assert!(
        store || std::env::var("SHUFFLEFS_REQUIRE_CLUSTER").is_err(),
        "the store needs sshfs and openssh-server"
    );
    store && venv_python("import torch.distributed.run", "torch (torchrun)").is_some()
}

/// `HOSTS` private hosts named `name` on `subnet`, `ds` on the storage host over sshfs.
fn store_cluster(name: &'static str, subnet: &'static str, ds: &Dataset) -> Cluster {
    let root = ds.root.to_str().unwrap();
    Cluster::private(name, subnet, HOSTS, &["--store", root, "--disk", "64M"])
}

#[test]
fn torchrun_on_four_private_hosts_exchanges_over_tcp_and_stops_cleanly() {
    if !require() {
        return;
    }
    let ds = four_classes(24, |i| 3_000 + 517 * i as u64);
    let cluster = store_cluster("tch", "10.214.111.0/24", &ds);
    let log = ds.base.join("job.log");
    let store = cluster.config("STORE");
    let launcher = cluster.torchrun(PER_HOST);
    let plan = (SEED, Q);
    let extra = ["--foreground"];
    let job = HostJob::start(&cluster, launcher, PER_HOST, &store, plan, &extra, &log);
    let ranks = HOSTS * PER_HOST;
    let hosts: Vec<u64> = (0..ranks).map(|r| u64::from(r / PER_HOST)).collect();
    for r in 0..ranks {
        let st = job.status(r);
        assert_eq!(st["world_size"], ranks, "rank {r}: {st}");
        assert_eq!(
            st["hosts"],
            serde_json::json!(hosts),
            "rank {r}: the hosts by name"
        );
    }
    walk_and_stop(&cluster, job, &ds);
}

/// 3 epochs, each rank holding its planned share with the source's bytes (so every epoch is
/// a partition), the exchange into epoch 1 crossing hosts; then `shufflefs unmount` on every
/// rank ends every torchrun with exit 0, no host mounts anything and no daemon is left.
fn walk_and_stop(cluster: &Cluster, mut job: HostJob, ds: &Dataset) {
    let ranks = HOSTS * PER_HOST;
    let pids = job.daemons_on_their_hosts();
    for epoch in 0..3 {
        let mut all = BTreeSet::new();
        for r in 0..ranks {
            let got = job.listing(ds, r, epoch);
            let want = planned(&ds.root, (ranks, SEED, Q), epoch, r);
            assert_eq!(got, want, "rank {r} epoch {epoch}\n{}", job.log());
            all.extend(got);
        }
        assert_eq!(all.len(), ds.samples.len(), "epoch {epoch}: every sample");
    }
    let across: u64 = (0..ranks)
        .filter_map(|r| exchange(&job.status(r), 1)?["bytes_across_hosts"].as_u64())
        .sum();
    assert!(across > 0, "the exchange into epoch 1 crossed hosts");
    let status = job.unmount_within(Duration::from_secs(90));
    let status = status.unwrap_or_else(|| panic!("torchrun did not end\n{}", job.log()));
    assert!(
        status.success(),
        "torchrun ended with {status}\n{}",
        job.log()
    );
    for h in 0..HOSTS {
        let fuse = host_fuse_mounts(cluster, h);
        assert!(
            !fuse.iter().any(|(m, _)| m.contains("/mnt")),
            "host {h} still mounts {fuse:?}"
        );
    }
    let left: Vec<i32> = cluster
        .pids()
        .into_iter()
        .filter(|p| pids.contains(p))
        .collect();
    assert!(left.is_empty(), "daemons still run: {left:?}");
}

/// `torchrun` alone launches the DDP example across the hosts as multi-node jobs usually
/// are: a c10d rendezvous at h0 (`--rdzv-backend c10d`, node ranks given out in the order the
/// agents join, MASTER_ADDR node rank 0's address), each rank's script mounting its share
/// with `shufflefs.torch.mount` (the daemons meet over TCP), 3 epochs of DDP over gloo on the
/// hosts' own network. Every epoch the ranks' samples partition the dataset with the store's
/// bytes, the loss goes down, every torchrun exits 0, and afterwards no host mounts anything
/// and no daemon runs.
#[test]
fn torchrun_with_a_c10d_rendezvous_runs_the_ddp_example_on_four_private_hosts() {
    let Some((tmp, src, python, cluster)) = ddp_cluster("tcd", "10.214.113.0/24") else {
        return;
    };
    let rec = tmp.path().join("rec");
    let launcher = cluster.torchrun_rdzv(PER_HOST, "c10d");
    let mut launcher = ddp_on_hosts(&cluster, launcher, &python, &rec);
    let out = run_with_timeout(&mut launcher, Duration::from_secs(600));
    let stdout = check("shufflefs-cluster torchrun ... train_ddp.py", &out);
    let ranks = HOSTS * PER_HOST;
    let statuses = ddp::check_run(&stdout, &src, &rec, ranks, 0..ddp::EPOCHS);
    for st in &statuses {
        let hosts = st["hosts"].as_array().unwrap();
        for h in 0..HOSTS {
            let here = hosts.iter().filter(|&x| x == h).count();
            assert_eq!(here as u32, PER_HOST, "{PER_HOST} ranks on host {h}: {st}");
        }
    }
    let last = ddp::EPOCHS - 1;
    let across: u64 = (statuses.iter().skip((last * u64::from(ranks)) as usize))
        .filter_map(|st| exchange(st, last)?["bytes_across_hosts"].as_u64())
        .sum();
    assert!(across > 0, "the exchange into epoch {last} crossed hosts");
    for h in 0..HOSTS {
        let fuse = host_fuse_mounts(&cluster, h);
        assert!(
            !fuse.iter().any(|(m, _)| m.contains("/mnt")),
            "host {h} still mounts {fuse:?}"
        );
    }
    for st in &statuses {
        let pid = st["pid"].as_i64().unwrap() as i32;
        assert!(
            wait_pid_gone(pid, Duration::from_secs(20)),
            "daemon {pid} still runs"
        );
    }
}

/// For the DDP example's tests: a folder, the images in it (`src`), the venv's python with
/// torchvision, and `HOSTS` private hosts named `name` with `src` on their store; `None` to
/// skip.
fn ddp_cluster(
    name: &'static str,
    subnet: &str,
) -> Option<(
    tempfile::TempDir,
    std::path::PathBuf,
    std::path::PathBuf,
    Cluster,
)> {
    if !require() {
        return None;
    }
    let python = venv_python("import torch, torchvision, PIL", "torchvision and pillow")?;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    ddp::make_images(&python, &src, 32);
    let args = ["--store", src.to_str().unwrap(), "--disk", "64M"];
    let cluster = Cluster::private(name, subnet, HOSTS, &args);
    Some((tmp, src, python, cluster))
}

/// `launcher` (torchrun on the hosts) made to run `python train_ddp.py`, which mounts the
/// store on each rank (`LOCAL/cache{rank}`, `LOCAL/mnt{rank}`) and records into `rec`.
fn ddp_on_hosts(cluster: &Cluster, mut launcher: Command, python: &Path, rec: &Path) -> Command {
    let (store, local) = (cluster.config("STORE"), cluster.config("LOCAL"));
    // Gloo binds where the host's name resolves; the emulated hosts' names resolve nowhere.
    with_package(&mut launcher)
        .env("SHUFFLEFS", BIN)
        .env("GLOO_SOCKET_IFNAME", "eth0")
        .env("LOGLEVEL", "WARNING")
        .arg(python);
    let spots = (
        format!("{local}/cache{{rank}}"),
        format!("{local}/mnt{{rank}}"),
    );
    ddp::train_ddp(&mut launcher, Path::new(&store), (&spots.0, &spots.1), rec);
    launcher
}

/// The same job reading a bucket: moto serves it on the bridge address (SUBNET.254, which
/// every host reaches over its shaped link), the AWS variables reach the ranks through
/// torchrun's environment, and each sample is fetched from the bucket once (staged by its
/// epoch-0 owner; after that it moves between ranks over TCP).
#[test]
fn torchrun_on_four_private_hosts_mounts_a_bucket() {
    if !require() {
        return;
    }
    let Some(python) = crate::common::s3::moto_python() else {
        return;
    };
    let ds = four_classes(12, |i| 4_000 + 331 * i as u64);
    let cluster = Cluster::private("tcs", "10.214.112.0/24", HOSTS, &["--disk", "64M"]);
    let server =
        crate::common::s3::S3Server::start_on(&python, &ds.base.join("moto.log"), "10.214.112.254");
    server.upload("shufflefs-torchrun", "ds", &ds.root);
    let mut launcher = cluster.torchrun(PER_HOST);
    launcher.envs(crate::common::s3::S3Server::env(&server.endpoint()));
    let source = "s3://shufflefs-torchrun/ds";
    let log = ds.base.join("job.log");
    let extra = ["--foreground"];
    let job = HostJob::start(
        &cluster,
        launcher,
        PER_HOST,
        source,
        (SEED, Q),
        &extra,
        &log,
    );
    job.wait_all("staging", staged);
    assert_eq!(job.status(0)["source"], source);
    let gets = std::fs::read_to_string(&server.log).unwrap_or_default();
    let gets = (gets.lines())
        .filter(|l| l.contains("GET /shufflefs-torchrun/ds/"))
        .count();
    assert_eq!(gets, ds.samples.len(), "object GETs: each sample once");
    walk_and_stop(&cluster, job, &ds);
}

/// The DDP example (torchrun alone, each script mounting its rank) when a host dies
/// mid-exchange: every process in h3 is killed while its daemons move samples into epoch 2
/// (slowed through `SHUFFLEFS_OPTIONS`, the script unchanged). The scripts on the other hosts
/// fail and unmount on their way out, every torchrun ends, and nothing stays mounted. The same
/// command on the 3 hosts left goes on at the epoch the job had reached (1, or 2 where the
/// exchange gave h3's ranks up first; an elastic restart from 8 to 6 ranks, each finding its
/// cache on its host's disk): the 3 epochs it trains are partitions with the store's bytes,
/// the loss goes down, and every torchrun exits 0.
#[test]
fn the_ddp_example_after_a_host_dies_mid_exchange_goes_on_at_the_epoch_on_three_hosts() {
    let Some((tmp, src, python, cluster)) = ddp_cluster("tkd", "10.214.115.0/24") else {
        return;
    };
    let local = cluster.config("LOCAL");
    let rec = tmp.path().join("rec");
    let log = tmp.path().join("job.log");
    let launcher = cluster.torchrun(PER_HOST);
    let mut child = ddp_until_the_exchange_into_2(&cluster, launcher, &python, &rec, &log);
    let ranks = HOSTS * PER_HOST;
    crate::slurm::kill_host(&cluster, HOSTS - 1);
    let left = ranks - PER_HOST;
    // The epoch the live ranks reach before their scripts fail and unmount (1, or 2 where
    // the exchange gave h3's ranks up and a script went on to epoch 2 first).
    let mut reached = 1;
    let deadline = Instant::now() + Duration::from_secs(240);
    while child.try_wait().unwrap().is_none() {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            Instant::now() < deadline,
            "the job did not end without h3\n{log}"
        );
        for r in 0..left {
            let st = status_on(&cluster, r / PER_HOST, &format!("{local}/mnt{r}"));
            reached = reached.max(st.and_then(|st| st["epoch"].as_u64()).unwrap_or(0));
        }
    }
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    for h in 0..HOSTS - 1 {
        let fuse = host_fuse_mounts(&cluster, h);
        assert!(
            !fuse.iter().any(|(m, _)| m.contains("/mnt")),
            "host {h} still mounts {fuse:?} after its scripts failed\n{log}"
        );
    }

    let rec = tmp.path().join("again");
    let launcher = cluster.torchrun_on(HOSTS - 1, PER_HOST, "static");
    let mut launcher = ddp_on_hosts(&cluster, launcher, &python, &rec);
    let out = run_with_timeout(&mut launcher, Duration::from_secs(600));
    let stdout = check("the same torchrun command on 3 hosts", &out);
    let start = (0..3)
        .find(|e| rec.join(format!("epoch-{e}.rank-0.json")).exists())
        .unwrap_or_else(|| panic!("no epoch recorded\n{stdout}"));
    assert!(
        (reached..=2).contains(&start),
        "went on at epoch {start}; the job had reached {reached}\n{stdout}"
    );
    let statuses = ddp::check_run(&stdout, &src, &rec, left, start..start + ddp::EPOCHS);
    for st in &statuses[..left as usize] {
        assert!(st["resize"].is_object(), "an elastic restart: {st}");
    }
    for h in 0..HOSTS - 1 {
        let fuse = host_fuse_mounts(&cluster, h);
        assert!(
            !fuse.iter().any(|(m, _)| m.contains("/mnt")),
            "host {h} still mounts {fuse:?}"
        );
    }
}

/// Starts `launcher` running the DDP example with its exchanges slowed (2 kB/s a rank,
/// through `SHUFFLEFS_OPTIONS`: the script unchanged), stderr to `log` and stdout beside it
/// (`.out`), and returns once the exchange into epoch 2 runs on a rank of the last host (the
/// one the tests kill). One host's ranks are watched, not all: on 2 loaded cores a round of
/// status reads over every host can outlast the exchange.
fn ddp_until_the_exchange_into_2(
    cluster: &Cluster,
    launcher: Command,
    python: &Path,
    rec: &Path,
    log: &Path,
) -> std::process::Child {
    let mut launcher = ddp_on_hosts(cluster, launcher, python, rec);
    let mut child = launcher
        .env(
            "SHUFFLEFS_OPTIONS",
            "--exchange-rate 2000 --share-disk never",
        )
        .stdout(std::fs::File::create(log.with_extension("out")).unwrap())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let local = cluster.config("LOCAL");
    let deadline = Instant::now() + Duration::from_secs(180);
    // The last host's ranks: where their mounts answer (under c10d, node ranks follow the
    // order the agents joined in).
    let mut there: Vec<u32> = Vec::new();
    loop {
        if there.len() < PER_HOST as usize {
            there = (0..HOSTS * PER_HOST)
                .filter(|r| status_on(cluster, HOSTS - 1, &format!("{local}/mnt{r}")).is_some())
                .collect();
        }
        let running = there.iter().any(|r| {
            let st = status_on(cluster, HOSTS - 1, &format!("{local}/mnt{r}"));
            st.is_some_and(|st| exchange(&st, 2).is_some_and(|x| x["state"] == "running"))
        });
        if running {
            return child;
        }
        let log = std::fs::read_to_string(log).unwrap_or_default();
        assert!(Instant::now() < deadline, "no exchange into epoch 2\n{log}");
        assert!(child.try_wait().unwrap().is_none(), "the job ended\n{log}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The first epoch `rec` holds a record of from a world of `ranks` (a restart's first).
fn first_epoch_of_world(rec: &Path, ranks: u32) -> Option<u64> {
    (0..10).find(|e| {
        let at = rec.join(format!("epoch-{e}.rank-0.json"));
        let v: Option<serde_json::Value> =
            (std::fs::read(at).ok()).and_then(|b| serde_json::from_slice(&b).ok());
        v.is_some_and(|v| v["status"]["world_size"] == ranks)
    })
}

/// torchrun's own elastic restart under the DDP example: agents of an elastic job of 3 to 4
/// nodes (`--nnodes 3:4`, c10d, one restart allowed). h3 dies while the daemons move samples
/// into epoch 2; the scripts left fail in gloo and unmount on their way out, the agents left
/// meet again as 3 nodes and start the same script with WORLD_SIZE 6, whose mounts go on at
/// the epoch reached (1 or 2, as above) as an elastic restart: no one runs anything by hand.
/// The epochs the new world trains are partitions with the store's bytes, the loss goes
/// down, every surviving torchrun exits 0 and nothing stays mounted.
///
/// With `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`: by default the workers share the agents'
/// rendezvous store, which outlives a round, and torch 2.15's restarted world then read the
/// old world's gloo addresses from it (`connectFullMesh`: connection refused) and never
/// trained.
#[test]
fn torchrun_elastic_restarts_the_ddp_example_on_three_hosts_at_the_epoch() {
    let Some((tmp, src, python, cluster)) = ddp_cluster("tke", "10.214.116.0/24") else {
        return;
    };
    let rec = tmp.path().join("rec");
    let log = tmp.path().join("job.log");
    let mut launcher = cluster.torchrun_elastic(PER_HOST, HOSTS - 1);
    launcher.env("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1");
    let mut child = ddp_until_the_exchange_into_2(&cluster, launcher, &python, &rec, &log);
    crate::slurm::kill_host(&cluster, HOSTS - 1);
    let ended = wait_child(&mut child, Duration::from_secs(400));
    let out = std::fs::read_to_string(log.with_extension("out")).unwrap_or_default();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(ended.is_some(), "the elastic job did not end\n{log}");
    // The launcher's status is h3's killed agent's; no agent left gave up (torchrun raises
    // ChildFailedError when its restarts run out).
    assert!(!log.contains("ChildFailedError"), "{log}");
    let left = (HOSTS - 1) * PER_HOST;
    let start = first_epoch_of_world(&rec, left);
    let start = start.unwrap_or_else(|| panic!("no epoch of the 6-rank world\n{log}"));
    assert!((1..=2).contains(&start), "went on at epoch {start}\n{log}");
    let statuses = ddp::check_run(&out, &src, &rec, left, start..start + ddp::EPOCHS);
    for st in &statuses[..left as usize] {
        assert!(st["resize"].is_object(), "an elastic restart: {st}");
    }
    for h in 0..HOSTS - 1 {
        let fuse = host_fuse_mounts(&cluster, h);
        assert!(
            !fuse.iter().any(|(m, _)| m.contains("/mnt")),
            "host {h} still mounts {fuse:?}"
        );
    }
}
