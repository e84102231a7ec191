//! A `shufflefs mount` job on private hosts, K ranks per host, looked at only from inside
//! the hosts: on private hosts a rank's mount, cache and status exist in its host's mount
//! namespace alone, so [`common::mpi_job::MpiJob`](crate::common::mpi_job::MpiJob) (which
//! creates the mount points and reads the statuses from here) cannot follow it. Every path
//! here is a host path (LOCAL/..., STORE/...); the mount points are not created beforehand
//! (each daemon makes its own, as on a real cluster), every status, listing and mount table
//! is read through `shufflefs-cluster exec` in the rank's host, and epochs advance by
//! writing the epoch file there.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;
use crate::harness::Cluster;
use crate::private_hosts::host_view;

/// A running job: `launcher BIN mount ... LOCAL/mnt{rank}`, `K` ranks per host (ranks
/// `K*h..K*h+K-1` on host h under mpirun or a static torchrun rendezvous).
pub(crate) struct HostJob<'a> {
    pub cluster: &'a Cluster,
    pub child: Child,
    /// Every rank's mount point, a path inside its host.
    pub mounts: Vec<String>,
    /// Every rank's host, where its mount answered at start.
    hosts: Vec<u32>,
    log: PathBuf,
}

impl<'a> HostJob<'a> {
    /// Starts `launcher` (which runs `per_host` copies of the program that follows on every
    /// host) with `BIN mount --seed S --fraction Q --source SOURCE --cache
    /// LOCAL/cache{rank} EXTRA... LOCAL/mnt{rank}`, stderr to `log`; returns once every
    /// rank's status answers inside its host. Panics if the launcher exits first.
    pub fn start(
        cluster: &'a Cluster,
        mut launcher: Command,
        per_host: u32,
        source: &str,
        (seed, fraction): (u64, f64),
        extra: &[&str],
        log: &Path,
    ) -> HostJob<'a> {
        let local = cluster.config("LOCAL");
        let ranks = cluster.hosts * per_host;
        let mounts = (0..ranks).map(|r| format!("{local}/mnt{r}")).collect();
        let child = launcher
            .args([BIN, "mount", "--seed", &seed.to_string(), "--fraction"])
            .arg(fraction.to_string())
            .args([
                "--source",
                source,
                "--cache",
                &format!("{local}/cache{{rank}}"),
            ])
            .args(extra)
            .arg(format!("{local}/mnt{{rank}}"))
            .stdout(Stdio::null())
            .stderr(fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        let mut job = HostJob {
            cluster,
            child,
            mounts,
            hosts: Vec::new(),
            log: log.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        for r in 0..ranks {
            // Rank r runs where its mount answers (a c10d rendezvous places node ranks in
            // the order the agents joined), most likely on host r / per_host.
            let likely = r / per_host;
            let order = std::iter::once(likely).chain((0..cluster.hosts).filter(|&h| h != likely));
            loop {
                let mount = &job.mounts[r as usize];
                let order = order.clone();
                if let Some(h) = order
                    .into_iter()
                    .find(|&h| status_on(cluster, h, mount).is_some())
                {
                    job.hosts.push(h);
                    break;
                }
                if let Ok(Some(status)) = job.child.try_wait() {
                    panic!("the job exited before mounting: {status}\n{}", job.log());
                }
                assert!(Instant::now() < deadline, "ranks did not mount in time");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        job
    }

    pub fn ranks(&self) -> u32 {
        self.mounts.len() as u32
    }

    /// The host rank `r` runs on (found at start).
    pub fn host(&self, r: u32) -> u32 {
        self.hosts[r as usize]
    }

    /// The launcher's stderr (every rank's log).
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Rank `r`'s status, read inside its host.
    pub fn try_status(&self, r: u32) -> Option<Value> {
        status_on(self.cluster, self.host(r), &self.mounts[r as usize])
    }

    #[track_caller]
    pub fn status(&self, r: u32) -> Value {
        self.try_status(r)
            .unwrap_or_else(|| panic!("no status from rank {r}\n{}", self.log()))
    }

    /// Waits (up to 2 minutes) until `pred` holds for every rank's status.
    #[track_caller]
    pub fn wait_all(&self, what: &str, pred: impl Fn(&Value) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(120);
        for r in 0..self.ranks() {
            loop {
                let st = self.status(r);
                if pred(&st) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "timed out waiting for {what}: {st}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Rank `r` asks for `epoch` (`echo N > MOUNT/.shufflefs/epoch` in its host).
    pub fn advance(&self, r: u32, epoch: u64) {
        let line = format!(
            "echo {epoch} > {}/.shufflefs/epoch",
            self.mounts[r as usize]
        );
        (self.cluster).exec_ok(&self.host(r).to_string(), &["sh", "-c", &line]);
    }

    /// `class/name` of every sample rank `r` lists in `epoch` (looking it up advances to
    /// it), read inside its host, each with the bytes of `ds`; every class must be listed.
    #[track_caller]
    pub fn listing(&self, ds: &Dataset, r: u32, epoch: u64) -> BTreeSet<String> {
        let mnt = &self.mounts[r as usize];
        let view = host_view(self.cluster, self.host(r), mnt, &ds.root, epoch);
        assert!(
            view.failed.is_empty(),
            "rank {r} epoch {epoch}: {:?}",
            view.failed
        );
        assert_eq!(
            view.classes, ds.classes,
            "rank {r} epoch {epoch}: every class"
        );
        view.ok
    }

    /// Every rank's daemon pid, each checked to run in the rank's host.
    #[track_caller]
    pub fn daemons_on_their_hosts(&self) -> Vec<i32> {
        (0..self.ranks())
            .map(|r| {
                let pid = self.status(r)["pid"].as_i64().unwrap() as i32;
                assert_eq!(
                    self.cluster.host_of(pid),
                    Some(self.host(r)),
                    "rank {r}'s host"
                );
                pid
            })
            .collect()
    }

    /// The launcher's exit status once it exits, within `timeout`.
    pub fn wait_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_child(&mut self.child, timeout)
    }

    /// `shufflefs unmount` of every rank inside its host, then as [`HostJob::wait_within`].
    pub fn unmount_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let secs = timeout.as_secs().to_string();
        for r in 0..self.ranks() {
            let m = &self.mounts[r as usize];
            let host = self.host(r).to_string();
            (self.cluster).exec_ok(&host, &[BIN, "unmount", "--timeout", &secs, m]);
        }
        self.wait_within(timeout)
    }
}

impl Drop for HostJob<'_> {
    /// Kills the launcher; what it leaves mounted in the hosts goes with the cluster's `down`.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status of the mount at `mount` inside host `host`, if one answers there.
pub(crate) fn status_on(cluster: &Cluster, host: u32, mount: &str) -> Option<Value> {
    let status = format!("{mount}/.shufflefs/status");
    let out = cluster.exec(&host.to_string(), &["cat", &status]);
    serde_json::from_slice(&out.stdout).ok()
}

/// The FUSE mounts host `host` sees, as (mount point, filesystem type), from its own
/// `/proc/self/mountinfo` (escapes left as they are: the tests' paths have none).
pub(crate) fn host_fuse_mounts(cluster: &Cluster, host: u32) -> Vec<(String, String)> {
    let info = cluster.exec_ok(&host.to_string(), &["cat", "/proc/self/mountinfo"]);
    (info.lines())
        .filter_map(|l| {
            let target = l.split(' ').nth(4)?;
            let (_, after) = l.split_once(" - ")?;
            let fstype = after.split(' ').next()?;
            fstype
                .starts_with("fuse")
                .then(|| (target.to_string(), fstype.to_string()))
        })
        .collect()
}
