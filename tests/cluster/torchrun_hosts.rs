//! The TCP transport across hosts: 4 emulated private hosts (their own network at 1 Gbit,
//! disk and mount table), the dataset on the storage host over sshfs, and `shufflefs-cluster
//! torchrun` starting one torchrun agent per host (2 ranks each, a static rendezvous at h0):
//! no MPI anywhere, the daemons meet at MASTER_ADDR and exchange over TCP between hosts.
//! Every epoch each rank holds its planned share with the source's bytes (so the shares
//! partition the dataset), the exchange crossed hosts, and `shufflefs unmount` on every rank
//! ends every torchrun with exit 0 and leaves no FUSE mount in any host.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use crate::common::mpi_job::{exchange, planned};
use crate::common::*;
use crate::harness::Cluster;
use crate::host_job::{HostJob, host_fuse_mounts};

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

#[test]
fn torchrun_on_four_private_hosts_exchanges_over_tcp_and_stops_cleanly() {
    if !require() {
        return;
    }
    let mut b = DatasetBuilder::new();
    for c in ["c0", "c1", "c2", "c3"] {
        b = b.numbered_class(c, 24, |i| 3_000 + 517 * i as u64);
    }
    let ds = b.build();
    let root = ds.root.to_str().unwrap();
    let cluster = Cluster::private(
        "tch",
        "10.214.111.0/24",
        HOSTS,
        &["--store", root, "--disk", "64M"],
    );
    let log = ds.base.join("job.log");
    let store = cluster.config("STORE");
    let launcher = cluster.torchrun(PER_HOST);
    let plan = (SEED, Q);
    let extra = ["--foreground"];
    let mut job = HostJob::start(&cluster, launcher, PER_HOST, &store, plan, &extra, &log);
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
    let pids = job.daemons_on_their_hosts();
    for epoch in 0..3 {
        let mut all = BTreeSet::new();
        for r in 0..ranks {
            let got = job.listing(&ds, r, epoch);
            let want = planned(&ds.root, (ranks, SEED, Q), epoch, r);
            assert_eq!(got, want, "rank {r} epoch {epoch}\n{}", job.log());
            all.extend(got);
        }
        assert_eq!(all.len(), 96, "epoch {epoch}: every sample");
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
        let fuse = host_fuse_mounts(&cluster, h);
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
