//! The emulated cluster of `mount-helpers/shufflefs-cluster` as the tests use it: up on
//! creation (after a `down` of what a killed earlier run left), `down` on drop, and the
//! harness's subcommands as methods. Shared by `cluster_mpi` (hosts sharing one mount table)
//! and `private_hosts` (hosts with their own mount namespaces, disks and a storage host).

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::*;

pub const HARNESS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/mount-helpers/shufflefs-cluster"
);
pub const STATE: &str = "/run/shufflefs-cluster";

pub fn harness() -> Command {
    let mut c = Command::new(HARNESS);
    c.stdin(Stdio::null());
    c
}

/// Runs the harness with `args`; panics with its output unless it succeeds.
#[track_caller]
pub fn harness_ok(args: &[&str]) -> String {
    let out = run_with_timeout(harness().args(args), Duration::from_secs(60));
    assert!(
        out.status.success(),
        "shufflefs-cluster {args:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An emulated cluster at 1gbit; `down` on drop, panic or not.
pub struct Cluster {
    pub name: &'static str,
    pub hosts: u32,
    /// Held for the cluster's life: another run of the same test waits for it.
    _lock: fs::File,
}

impl Cluster {
    /// Private hosts (each its own mount namespace and disk), with `up`'s `extra` options
    /// (`--store DIR`, `--disk-type tmpfs`...).
    pub fn private(name: &'static str, subnet: &str, hosts: u32, extra: &[&str]) -> Cluster {
        Cluster::up(name, subnet, hosts, extra)
    }

    /// Hosts sharing the root's mount table (`up --shared`): for the tests that read every
    /// rank's mount and cache from here.
    pub fn shared(name: &'static str, subnet: &str, hosts: u32) -> Cluster {
        Cluster::up(name, subnet, hosts, &["--shared"])
    }

    fn up(name: &'static str, subnet: &str, hosts: u32, extra: &[&str]) -> Cluster {
        fs::create_dir_all(STATE).unwrap();
        let lock = fs::File::create(format!("{STATE}/{name}.lock")).unwrap();
        // SAFETY: flock on a descriptor we own; no memory is involved.
        assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
        // What a killed earlier run may have left.
        harness_ok(&["down", name]);
        harness_ok(
            &[
                "up",
                name,
                "--hosts",
                &hosts.to_string(),
                "--rate",
                "1gbit",
                "--subnet",
                subnet,
            ]
            .iter()
            .chain(extra)
            .copied()
            .collect::<Vec<_>>(),
        );
        Cluster {
            name,
            hosts,
            _lock: lock,
        }
    }

    /// `shufflefs-cluster mpirun NAME --per-host K --`, to be followed by the program.
    pub fn mpirun(&self, per_host: u32) -> Command {
        let mut c = harness();
        c.args([
            "mpirun",
            self.name,
            "--per-host",
            &per_host.to_string(),
            "--",
        ]);
        c
    }

    /// `shufflefs-cluster torchrun NAME --per-host K --`: one torchrun agent per host, no MPI
    /// (the program that follows runs `per_host` times on every host).
    pub fn torchrun(&self, per_host: u32) -> Command {
        self.torchrun_rdzv(per_host, "static")
    }

    /// [`Cluster::torchrun`] with torchrun's rendezvous `rdzv` (`static` or `c10d`: then
    /// node ranks go to hosts in the order their agents join).
    pub fn torchrun_rdzv(&self, per_host: u32, rdzv: &str) -> Command {
        self.torchrun_on(self.hosts, per_host, rdzv)
    }

    /// An elastic torchrun job of `min` to all hosts (`--nnodes MIN:N`, c10d, one restart).
    pub fn torchrun_elastic(&self, per_host: u32, min: u32) -> Command {
        let mut c = harness();
        let (hosts, per_host, min) = (
            self.hosts.to_string(),
            per_host.to_string(),
            min.to_string(),
        );
        c.args(["torchrun", self.name, "--per-host", &per_host])
            .args(["--hosts", &hosts, "--rdzv", "c10d", "--elastic", &min, "--"]);
        c
    }

    /// [`Cluster::torchrun_rdzv`] on the first `hosts` hosts only.
    pub fn torchrun_on(&self, hosts: u32, per_host: u32, rdzv: &str) -> Command {
        let mut c = harness();
        let (hosts, per_host) = (hosts.to_string(), per_host.to_string());
        c.args(["torchrun", self.name, "--per-host", &per_host])
            .args(["--hosts", &hosts, "--rdzv", rdzv, "--"]);
        c
    }

    /// Every process inside the cluster's hosts.
    pub fn pids(&self) -> Vec<i32> {
        harness_ok(&["pids", self.name])
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect()
    }

    /// The host `pid` runs in: both its network and its UTS namespace must be the host's.
    pub fn host_of(&self, pid: i32) -> Option<u32> {
        let ns = |kind: &str| {
            let link = fs::read_link(format!("/proc/{pid}/ns/{kind}")).ok()?;
            let link = link.to_string_lossy().into_owned();
            link.trim_start_matches(&format!("{kind}:["))
                .trim_end_matches(']')
                .parse::<u64>()
                .ok()
        };
        let (net, uts) = (ns("net")?, ns("uts")?);
        (0..self.hosts).find(|h| {
            let ino = |p: String| fs::metadata(p).map(|m| m.ino()).ok();
            ino(format!("/run/netns/sfs-{}-h{h}", self.name)) == Some(net)
                && ino(format!("{STATE}/{}/uts-h{h}", self.name)) == Some(uts)
        })
    }

    /// Bytes sent to host `h` over its link so far (the bridge side's tbf counter).
    pub fn bytes_into(&self, h: u32) -> u64 {
        let out = run_with_timeout(
            Command::new("tc").args([
                "-s",
                "qdisc",
                "show",
                "dev",
                &format!("sfs-{}-h{h}", self.name),
            ]),
            Duration::from_secs(10),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .skip_while(|w| *w != "Sent")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no byte count in tc's output:\n{text}"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let out = harness()
            .args(["down", self.name])
            .output()
            .expect("run shufflefs-cluster down");
        if !out.status.success() {
            eprintln!(
                "shufflefs-cluster down {} failed: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// The parsed `MB/s` of `shufflefs-cluster measure NAME FROM TO 1`.
pub fn measure(name: &str, from: u32, to: u32) -> f64 {
    let out = harness_ok(&["measure", name, &from.to_string(), &to.to_string(), "1"]);
    out.split_whitespace().next().unwrap().parse().unwrap()
}

pub fn ns_exists(name: &str) -> bool {
    fs::read_dir("/run/netns").is_ok_and(|d| {
        d.flatten().any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("sfs-{name}-"))
        })
    })
}

pub fn link_exists(link: &str) -> bool {
    Path::new("/sys/class/net").join(link).exists()
}

impl Cluster {
    /// The cluster's state folder (`/run/shufflefs-cluster/NAME`).
    pub fn dir(&self) -> PathBuf {
        Path::new(STATE).join(self.name)
    }

    /// A value of the cluster's config (`LOCAL`, `STORE`...).
    pub fn config(&self, key: &str) -> String {
        let text = fs::read_to_string(self.dir().join("config")).unwrap();
        let prefix = format!("{key}=");
        (text.lines())
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {key} in the config:\n{text}"))
            .to_string()
    }

    /// `shufflefs-cluster exec NAME HOST ARGS...` with a timeout; its output, failed or not.
    pub fn exec(&self, host: &str, args: &[&str]) -> Output {
        run_with_timeout(
            harness().args(["exec", self.name, host]).args(args),
            Duration::from_secs(60),
        )
    }

    /// As [`Cluster::exec`], panicking unless it succeeds; its stdout.
    #[track_caller]
    pub fn exec_ok(&self, host: &str, args: &[&str]) -> String {
        let out = self.exec(host, args);
        assert!(
            out.status.success(),
            "exec {host} {args:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}
