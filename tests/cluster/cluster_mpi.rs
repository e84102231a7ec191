//! shufflefs across emulated hosts: `mount-helpers/shufflefs-cluster` makes each host a
//! network namespace with its own hostname, on a bridge with every link shaped to 1gbit, and
//! starts the ranks through Open MPI's rsh agent, with TCP as the only transport between hosts.
//!
//! - The harness itself: links run at their shaped rate in both directions and can be
//!   reshaped, each host has its own hostname, and `down` removes everything after a run that
//!   was killed with its FUSE mounts left dead.
//! - 4 hosts x 1 rank and 2 hosts x 2 ranks: `Comm::hosts()` sees the hosts, every daemon runs
//!   in its host, and over 3 epochs the listings are exactly the plan's shares (so they
//!   partition the dataset), every byte matches the source, caches stay within (1+Q) x share,
//!   and the samples that change host crossed the shaped links; after unmount nothing is
//!   mounted and nothing runs in any host.
//! - A rank SIGKILLed mid-exchange on one host ends the job on every host (a reader waiting on
//!   the next epoch is answered, no daemon, orted or live mount is left), and the same job
//!   started again resumes at the same epoch with the plan's listings.
//!
//! These tests read every rank's status, mount and cache from the root namespace, so their
//! hosts share its mount table (`up --shared`); `private_hosts` covers hosts with their own.
//!
//! Needs root, iproute2, nsenter, mpirun, python3 and /dev/fuse; skips otherwise unless
//! `SHUFFLEFS_REQUIRE_CLUSTER=1`. Each test has its own cluster name and subnet (tests run two at
//! a time) and a lock on the name, so two runs of this file on one machine take turns.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::mpi_job::{MpiJob, exchange, planned, test_name, wait_all};
use crate::common::*;
use crate::harness::{Cluster, STATE, harness_ok, link_exists, measure, ns_exists};
use shufflefs::comm::{Comm, MpiComm};

/// Set (to the expected host list) when this binary runs as a rank under the harness.
pub(crate) const CHILD: &str = "SHUFFLEFS_CLUSTER_MPI_CHILD";
/// How long a job may take to end after an unmount or a killed rank.
const END_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn harness_shapes_links_and_down_cleans_a_killed_run() {
    if !require_cluster() {
        return;
    }
    let ds = DatasetBuilder::new()
        .numbered_class("a", 12, |i| 1_000 + i as u64)
        .build();
    let cluster = Cluster::shared("chs", "10.213.204.0/24", 2);

    // Each host its own hostname, also for the ranks mpirun starts there.
    assert_eq!(
        harness_ok(&["exec", "chs", "1", "hostname"]).trim(),
        "sfs-chs-h1"
    );
    let out = run_with_timeout(cluster.mpirun(1).arg("hostname"), Duration::from_secs(60));
    assert!(out.status.success(), "{out:?}");
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    names.sort();
    assert_eq!(names, ["sfs-chs-h0", "sfs-chs-h1"]);

    // 1gbit is 125 MB/s of which TCP over 1500-byte frames carries ~119; a tenth, both ways.
    let fast = measure("chs", 0, 1);
    assert!(
        (60.0..=130.0).contains(&fast),
        "1gbit link ran at {fast} MB/s"
    );
    harness_ok(&["shape", "chs", "1", "100mbit"]);
    let (into, out_of) = (measure("chs", 0, 1), measure("chs", 1, 0));
    for rate in [into, out_of] {
        assert!(
            (6.0..=13.5).contains(&rate),
            "100mbit link ran at {rate} MB/s"
        );
    }
    eprintln!("1gbit: {fast:.1} MB/s; 100mbit: {into:.1} MB/s in, {out_of:.1} MB/s out");

    // A job killed with everything in it: launcher and daemons SIGKILLed, mounts left dead.
    let job = MpiJob::start_with(cluster.mpirun(1), &ds.base, 2, 1, 0.3, &[]);
    let mounts = job.mounts.clone();
    let daemons: Vec<i32> = (0..2)
        .map(|r| job.status(r)["pid"].as_i64().unwrap() as i32)
        .collect();
    job.kill();
    assert!(mounts.iter().all(|m| is_mounted(m)), "dead mounts stay");
    harness_ok(&["down", "chs"]);
    for m in &mounts {
        assert!(!is_mounted(m), "down left {} mounted", m.display());
    }
    for pid in daemons {
        assert!(!pid_alive(pid), "down left daemon {pid}");
    }
    assert!(!ns_exists("chs"), "down left a namespace");
    assert!(!link_exists("sfs-chs-br") && !link_exists("sfs-chs-h0"));
    assert!(!Path::new(STATE).join("chs").exists());
    // Idempotent: again, and once more when `cluster` drops.
    harness_ok(&["down", "chs"]);
}

/// One rank's part of the hosts check; does nothing unless started under the harness.
#[test]
fn rank_sees_hosts() {
    let Ok(want) = std::env::var(CHILD) else {
        return;
    };
    let want: Vec<u32> = want.split(',').map(|h| h.parse().unwrap()).collect();
    let comm = MpiComm::init().unwrap();
    let hostname = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(comm.hosts(), want, "hosts seen by rank {}", comm.rank());
    println!(
        "rank {} on {} hosts {:?} ok",
        comm.rank(),
        hostname.trim(),
        comm.hosts()
    );
}

/// What an uninterrupted run lists on `rank` in `epoch` (`class/name`), from the plan.
/// `class/name` of every sample in `mnt/epoch-N` (looking it up advances to it), each read and
/// compared with the source; every class must be listed.
pub(crate) fn listing(ds: &Dataset, mnt: &Path, epoch: u64) -> BTreeSet<String> {
    let view = mnt.join(format!("epoch-{epoch}"));
    let got = crate::common::listing(&view);
    assert_eq!(
        got.keys().cloned().collect::<Vec<_>>(),
        ds.classes,
        "{} lists every class",
        view.display()
    );
    let mut out = BTreeSet::new();
    for (class, files) in got {
        for name in files {
            let bytes = fs::read(view.join(&class).join(&name)).unwrap();
            assert!(
                bytes == ds.sample(&class, &name).bytes(),
                "{class}/{name} in {} differs from the source",
                view.display()
            );
            out.insert(format!("{class}/{name}"));
        }
    }
    out
}

/// Every rank's daemon runs in its host (ranks 0..K-1 on h0, ...); returns the pids.
#[track_caller]
fn daemons_on_their_hosts(cluster: &Cluster, job: &MpiJob, per_host: u32) -> Vec<i32> {
    (0..job.mounts.len())
        .map(|r| {
            let st = job.status(r);
            assert_eq!(st["rank"], r as u64);
            assert_eq!(st["world_size"], job.mounts.len() as u64);
            let pid = st["pid"].as_i64().unwrap() as i32;
            assert_eq!(
                cluster.host_of(pid),
                Some(r as u32 / per_host),
                "rank {r} (pid {pid}) runs in the wrong host"
            );
            pid
        })
        .collect()
}

/// After the job: nothing mounted, no daemon, nothing left running in any host.
#[track_caller]
fn all_gone(cluster: &Cluster, mounts: &[PathBuf], daemons: &[i32]) {
    for m in mounts {
        assert!(!is_mounted(m), "{} is still mounted", m.display());
    }
    for &pid in daemons {
        assert!(
            wait_pid_gone(pid, Duration::from_secs(10)),
            "daemon {pid} is still running"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = cluster.pids();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "processes left in the hosts: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Checks `Comm::hosts()` from every rank under the harness.
fn check_hosts(cluster: &Cluster, per_host: u32) {
    let ranks = cluster.hosts * per_host;
    let want: Vec<String> = (0..ranks).map(|r| (r / per_host).to_string()).collect();
    let exe = std::env::current_exe().unwrap();
    let out = run_with_timeout(
        cluster
            .mpirun(per_host)
            .env(CHILD, want.join(","))
            .arg("-x")
            .arg(CHILD)
            .arg(exe)
            .arg(test_name(module_path!(), "rank_sees_hosts"))
            .args(["--exact", "--nocapture", "--test-threads=1"]),
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..ranks {
        let line = format!("rank {r} on sfs-{}-h{} hosts", cluster.name, r / per_host);
        assert!(stdout.contains(&line), "no '{line}' in:\n{stdout}");
    }
}

/// Classes c0..c3 of `per_class` numbered samples each, of `size(i)` bytes.
fn four_classes(per_class: usize, size: fn(usize) -> u64) -> Dataset {
    let mut b = DatasetBuilder::new();
    for c in ["c0", "c1", "c2", "c3"] {
        b = b.numbered_class(c, per_class, size);
    }
    b.build()
}

/// `hosts` x `per_host` ranks walk 3 epochs at 1gbit, then unmount.
fn walk_three_epochs(name: &'static str, subnet: &str, hosts: u32, per_host: u32) {
    const SEED: u64 = 11;
    const Q: f64 = 0.3;
    let started = Instant::now();
    let ds = DatasetBuilder::new()
        .numbered_class("cat", 60, |i| 20_000 + 1_013 * i as u64)
        .numbered_class("dog", 50, |i| 60_000 + 877 * i as u64)
        .class("eel", &[("one.png", 10), ("two.png", 0), ("three.png", 3)])
        .empty_class("fox")
        .build();
    let cluster = Cluster::shared(name, subnet, hosts);
    check_hosts(&cluster, per_host);

    let ranks = hosts * per_host;
    let mut job = MpiJob::start_with(cluster.mpirun(per_host), &ds.base, ranks, SEED, Q, &[]);
    let daemons = daemons_on_their_hosts(&cluster, &job, per_host);
    let launched = started.elapsed();

    let mut owners: Vec<BTreeMap<String, u32>> = Vec::new();
    for epoch in 0..3u64 {
        let mut owner = BTreeMap::new();
        for r in 0..ranks {
            let got = listing(&ds, &job.mounts[r as usize], epoch);
            assert_eq!(
                got,
                planned(&ds.root, (ranks, SEED, Q), epoch, r),
                "rank {r} epoch {epoch} lists other samples than the plan's share"
            );
            for key in got {
                assert!(
                    owner.insert(key.clone(), r).is_none(),
                    "{key} listed twice in epoch {epoch}"
                );
            }
        }
        assert_eq!(
            owner.len(),
            ds.samples.len(),
            "epoch {epoch} covers the dataset"
        );
        for r in 0..ranks as usize {
            let st = job.status(r);
            assert_eq!(st["epoch"], epoch);
            let share = st["share_samples"].as_u64().unwrap();
            let cached = st["cache"]["files"].as_u64().unwrap();
            assert!(
                cached as f64 <= ((1.0 + Q) * share as f64).ceil() + 1.0,
                "rank {r} epoch {epoch}: {cached} cached for a share of {share}"
            );
        }
        owners.push(owner);
        if epoch < 2 {
            for m in &job.mounts {
                write_epoch(m, format!("{}\n", epoch + 1)).unwrap();
            }
        }
    }
    wait_all(&job, "the exchange into epoch 3", |st| {
        exchange(st, 3).is_some_and(|x| x["state"] == "done")
    });
    // Node-aware: a same-host peer's samples come through the disk, the rest over MPI, and
    // the status splits the bytes accordingly.
    for r in 0..ranks as usize {
        let st = job.status(r);
        for target in 1..=3u64 {
            let x = exchange(&st, target).unwrap();
            let peers = x["peers"].as_array().unwrap();
            let (mut within, mut across) = (0u64, 0u64);
            for p in peers {
                let same = p["rank"].as_u64().unwrap() / u64::from(per_host)
                    == r as u64 / u64::from(per_host);
                assert_eq!(p["same_host"], same, "rank {r}: {p}");
                assert_eq!(p["via"], if same { "disk" } else { "mpi" }, "rank {r}: {p}");
                let got = p["bytes_received"].as_u64().unwrap();
                if same {
                    within += got;
                } else {
                    across += got;
                }
            }
            assert_eq!(x["bytes_within_hosts"], within, "rank {r}: {x}");
            assert_eq!(x["bytes_across_hosts"], across, "rank {r}: {x}");
        }
    }

    // The samples that changed host crossed that host's shaped link.
    let size: BTreeMap<String, u64> = ds
        .samples
        .iter()
        .map(|s| (format!("{}/{}", s.class, s.name), s.size))
        .collect();
    let mut crossing = vec![0u64; hosts as usize];
    for pair in owners.windows(2) {
        for (key, &to) in &pair[1] {
            if pair[0][key] / per_host != to / per_host {
                crossing[(to / per_host) as usize] += size[key];
            }
        }
    }
    for h in 0..hosts {
        let link = cluster.bytes_into(h);
        assert!(
            link >= crossing[h as usize],
            "host {h}: {} bytes of samples moved in from other hosts, its link carried {link}",
            crossing[h as usize]
        );
    }

    let status = job.unmount_within(END_TIMEOUT);
    assert!(
        status.is_some_and(|s| s.success()),
        "the job did not end cleanly after unmount: {status:?}\n{}",
        fs::read_to_string(ds.base.join("job.log")).unwrap_or_default()
    );
    all_gone(&cluster, &job.mounts, &daemons);
    eprintln!(
        "{hosts} hosts x {per_host}: launched and mounted in {launched:.1?}, \
         done in {:.1?}; bytes into each host across its link: {crossing:?}",
        started.elapsed()
    );
}

#[test]
fn four_hosts_one_rank_each_walk_three_epochs() {
    if !require_cluster() {
        return;
    }
    walk_three_epochs("cw41", "10.213.201.0/24", 4, 1);
}

#[test]
fn two_hosts_two_ranks_each_walk_three_epochs() {
    if !require_cluster() {
        return;
    }
    walk_three_epochs("cw22", "10.213.202.0/24", 2, 2);
}

#[test]
fn rank_killed_on_one_host_ends_the_job_everywhere_and_resumes() {
    if !require_cluster() {
        return;
    }
    const SEED: u64 = 9;
    const Q: f64 = 0.5;
    const PER_HOST: u32 = 2;
    const RANKS: u32 = 4;
    let ds = four_classes(40, |i| 20_000 + 97 * i as u64);
    let cluster = Cluster::shared("ckill", "10.213.203.0/24", 2);

    // 1. Killed on h1 in the middle of the exchange into epoch 1 (slowed so it is running),
    // while a reader on h0 waits for epoch 1.
    let mut job = MpiJob::start_with(
        cluster.mpirun(PER_HOST),
        &ds.base,
        RANKS,
        SEED,
        Q,
        // Every move over MPI (none through the shared disk), each rank's sends at 20 kB/s.
        &["--exchange-rate", "20000", "--share-disk", "never"],
    );
    let daemons = daemons_on_their_hosts(&cluster, &job, PER_HOST);
    wait_all(&job, "staging", |st| {
        st["staging"]["state"] == "done"
            && st["staging"]["files_done"] == st["staging"]["files_total"]
    });
    wait_all(&job, "the exchange into epoch 1 to run", |st| {
        exchange(st, 1).is_some_and(|x| x["state"] == "running")
    });
    let (tx, rx) = mpsc::channel();
    let waiting = job.mounts[0].join("epoch-1");
    std::thread::spawn(move || {
        let _ = tx.send(fs::metadata(&waiting).map(|m| m.is_dir()));
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(1)).is_err(),
        "epoch-1 should wait for the exchange"
    );
    assert!(
        (0..RANKS as usize).all(|r| exchange(&job.status(r), 1).unwrap()["state"] == "running"),
        "the exchange should still be running when rank 3 is killed"
    );
    let killed = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemons[3]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let answer = rx.recv_timeout(END_TIMEOUT);
    assert!(
        answer.is_ok(),
        "the reader waiting on epoch-1 was never answered"
    );
    let status = job.wait_within(END_TIMEOUT);
    assert!(
        status.is_some_and(|s| !s.success()),
        "the job should end, failed, once a rank is killed: {status:?}"
    );
    // The killed rank's mount is dead until a daemon cleans it up; the others are gone.
    all_gone(&cluster, &job.mounts[..3], &daemons);
    let ended = killed.elapsed();
    let dead = &job.mounts[3];
    assert!(
        !is_mounted(dead)
            || fs::metadata(dead).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN)),
        "rank 3's mount should be gone or dead"
    );
    // Leave the dead mount to the restart, as a scheduler would.
    job.mounts.clear();
    drop(job);

    // 2. The same job again: every rank at epoch 0, epochs 0 and 1 as planned, nothing
    // fetched from the source again.
    let mut job = MpiJob::start_with(cluster.mpirun(PER_HOST), &ds.base, RANKS, SEED, Q, &[]);
    let daemons = daemons_on_their_hosts(&cluster, &job, PER_HOST);
    for r in 0..RANKS as usize {
        assert_eq!(
            job.status(r)["epoch"],
            0,
            "rank {r} resumed at the wrong epoch"
        );
    }
    for epoch in 0..2 {
        for r in 0..RANKS {
            assert_eq!(
                listing(&ds, &job.mounts[r as usize], epoch),
                planned(&ds.root, (RANKS, SEED, Q), epoch, r),
                "rank {r} epoch {epoch} after the restart"
            );
        }
    }
    for r in 0..RANKS as usize {
        assert_eq!(
            job.status(r)["cache"]["fetched_from_source"],
            0,
            "rank {r} fetched from the source again"
        );
    }
    let status = job.unmount_within(END_TIMEOUT);
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    all_gone(&cluster, &job.mounts, &daemons);
    eprintln!("killed rank 3: the job ended on every host in {ended:.1?}");
}

/// Elastic restart across hosts: 2 hosts x 2 ranks, then 2 hosts x 1 rank (rank 1 moves to
/// the second host). The second job goes on at the epoch reached, lists the plan's shares
/// for that history on every rank (a partition, every byte checked) and fetches nothing from
/// the source: what a rank lacks that the other host holds crosses the link. (The emulated
/// hosts share one filesystem, so the gone ranks' folders are visible on both.)
#[test]
fn four_ranks_on_two_hosts_restart_as_two() {
    if !require_cluster() {
        return;
    }
    const SEED: u64 = 13;
    const Q: f64 = 0.5;
    let ds = four_classes(20, |i| 10_000 + 97 * i as u64);
    let cluster = Cluster::shared("celast", "10.213.206.0/24", 2);
    let predicted = |history: &shufflefs::plan::elastic::History, epoch: u64, rank: u32| {
        let m = shufflefs::dataset::scan::scan(&ds.root).unwrap();
        let params = shufflefs::plan::PlanParams {
            samples: m.len(),
            world: history.world(),
            fraction: Q,
            seed: SEED,
        };
        let plan = shufflefs::plan::elastic::ElasticPlan::new(params, history.clone()).unwrap();
        (plan.shares_at(epoch).share(rank).iter())
            .map(|&id| m.relative_path(id).to_string_lossy().into_owned())
            .collect::<BTreeSet<String>>()
    };

    let four = shufflefs::plan::elastic::History::new(4);
    let mut job = MpiJob::start_with(cluster.mpirun(2), &ds.base, 4, SEED, Q, &[]);
    daemons_on_their_hosts(&cluster, &job, 2);
    for epoch in 0..2 {
        for r in 0..4 {
            assert_eq!(
                listing(&ds, &job.mounts[r as usize], epoch),
                predicted(&four, epoch, r)
            );
        }
    }
    // A job ended mid-exchange exits 3 (see `daemon::run`): let the exchange finish.
    wait_all(&job, "the exchange into epoch 2", |st| {
        exchange(st, 2).is_some_and(|x| x["state"] == "done")
    });
    let status = job.unmount_within(END_TIMEOUT);
    let log = || fs::read_to_string(ds.base.join("job.log")).unwrap_or_default();
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{}", log());

    let two = four.resized(1, 2).unwrap();
    let mut job = MpiJob::start_with(cluster.mpirun(1), &ds.base, 2, SEED, Q, &[]);
    let daemons = daemons_on_their_hosts(&cluster, &job, 1);
    for r in 0..2 {
        let st = job.status(r);
        assert_eq!(st["epoch"], 1, "rank {r} resumed at the wrong epoch");
        let x = &st["resize"];
        let received: u64 = x["received"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        let parts = x["kept"].as_u64().unwrap() + x["adopted"].as_u64().unwrap() + received;
        assert_eq!(Some(parts), x["share_samples"].as_u64(), "rank {r}: {x}");
        assert_eq!(x["from_source"], 0, "rank {r}: {x}");
    }
    for epoch in 1..4 {
        let mut all = BTreeSet::new();
        for r in 0..2 {
            let got = listing(&ds, &job.mounts[r as usize], epoch);
            assert_eq!(got, predicted(&two, epoch, r), "rank {r} epoch {epoch}");
            all.extend(got);
        }
        assert_eq!(
            all.len(),
            ds.samples.len(),
            "epoch {epoch} partitions the dataset"
        );
    }
    for r in 0..2 {
        assert_eq!(job.status(r)["cache"]["fetched_from_source"], 0, "rank {r}");
    }
    wait_all(&job, "the exchange into epoch 4", |st| {
        exchange(st, 4).is_some_and(|x| x["state"] == "done")
    });
    let status = job.unmount_within(END_TIMEOUT);
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{}", log());
    all_gone(&cluster, &job.mounts, &daemons);
}

/// One host's link shaped to 2mbit against the others' 1gbit. On 2 cores the "fast"
/// streams are CPU-bound at a few MB/s while the test reads views beside them, and the slow
/// host's streams share its link unevenly (one can get most of it), so a tenth, or even a
/// fortieth, is not reliably far enough behind to call: the ranks on the fast hosts
/// give its rank up (the slow-peer rule), fetch what it owed them from the source, show it
/// per peer in the status, and every view stays exact across epochs; the slow rank's late
/// bytes are dropped, and its own advance waits for nobody but its link.
#[test]
fn a_peer_on_a_slow_link_is_given_up_and_its_samples_come_from_the_source() {
    if !require_cluster() {
        return;
    }
    const SEED: u64 = 5;
    const Q: f64 = 1.0;
    const RANKS: u32 = 4;
    let ds = four_classes(25, |i| 90_000 + 37 * i as u64);
    let cluster = Cluster::shared("cslow", "10.213.205.0/24", RANKS);
    harness_ok(&["shape", "cslow", "3", "2mbit"]);
    let mut job = MpiJob::start_with(
        cluster.mpirun(1),
        &ds.base,
        RANKS,
        SEED,
        Q,
        // Factor 3, not 2: on the slow host the three incoming streams share its link
        // unevenly, and a starved one projected 2.5x the others' rate at its worst (CI, a
        // stream at half its share until the others finished): 2 gave it up there.
        &["--slow-peer-factor", "3", "--slow-peer-grace", "1"],
    );
    let daemons = daemons_on_their_hosts(&cluster, &job, 1);
    wait_all(&job, "staging", |st| {
        st["staging"]["state"] == "done"
            && st["staging"]["files_done"] == st["staging"]["files_total"]
    });
    for epoch in 0..3u64 {
        let mut owner = BTreeMap::new();
        for r in 0..RANKS {
            let got = listing(&ds, &job.mounts[r as usize], epoch);
            assert_eq!(got, planned(&ds.root, (RANKS, SEED, Q), epoch, r));
            for key in got {
                assert!(
                    owner.insert(key, r).is_none(),
                    "listed twice in epoch {epoch}"
                );
            }
        }
        assert_eq!(
            owner.len(),
            ds.samples.len(),
            "epoch {epoch} covers the dataset"
        );
        if epoch < 2 {
            for m in &job.mounts {
                write_epoch(m, format!("{}\n", epoch + 1)).unwrap();
            }
        }
    }
    // The exchanges into epochs 1 and 2, as the fast ranks saw the slow one. Into epoch 1
    // every rank starts together (at mount), so the slow peer is the last by far and is
    // given up. Into epoch 2 a fast rank starts only once its previous exchange drained the
    // slow peer's late bytes (see README, "Slow and dead peers"), so the slow peer need not
    // be the last there; whoever is given up is accounted for.
    for target in 1..=2u64 {
        for r in 0..3usize {
            let st = job.status(r);
            let x = exchange(&st, target).unwrap_or_else(|| panic!("rank {r}: {st}"));
            let peers = x["peers"].as_array().unwrap();
            let slow = peers.iter().find(|p| p["rank"] == 3).unwrap();
            if target == 1 {
                assert_eq!(slow["given_up"], true, "rank {r} into {target}: {x}");
                let fast_given_up = (peers.iter())
                    .filter(|p| p["rank"] != 3 && p["given_up"] == true)
                    .count();
                assert_eq!(fast_given_up, 0, "only the slow peer is given up: {x}");
            }
            for p in peers.iter().filter(|p| p["given_up"] == true) {
                let owed = p["samples_to_receive"].as_u64().unwrap();
                let got = p["samples_received"].as_u64().unwrap();
                assert_eq!(
                    got + p["fetched_from_source"].as_u64().unwrap(),
                    owed,
                    "rank {r} into {target}: what a given-up peer did not deliver came from the source: {x}"
                );
                assert!(owed == got || p["fetched_from_source"].as_u64() > Some(0));
            }
            assert!(
                x["bytes_across_hosts"].as_u64() > Some(0) && x["bytes_within_hosts"] == 0,
                "one rank per host: everything crosses hosts: {x}"
            );
        }
        let slow_view = exchange(&job.status(3), target).unwrap().clone();
        assert!(slow_view["state"] == "done", "{slow_view}");
        // Later, a fast rank still draining the previous exchange starts late, and the
        // slow rank may give it up in turn.
        assert!(
            target > 1
                || (slow_view["peers"].as_array().unwrap().iter()).all(|p| p["given_up"] == false),
            "the slow rank gives nobody up: {slow_view}"
        );
    }
    // An unmount during an exchange ends the job with code 3 (see signal_mpi): let every
    // rank finish the exchange into epoch 3, late bytes included (`seconds` is set then).
    wait_all(&job, "the exchange into epoch 3 to end", |st| {
        exchange(st, 3).is_some_and(|x| x["seconds"].as_f64() > Some(0.0))
    });
    let status = job.unmount_within(END_TIMEOUT);
    assert!(
        status.is_some_and(|s| s.success()),
        "the job did not end cleanly after unmount: {status:?}\n{}",
        fs::read_to_string(ds.base.join("job.log")).unwrap_or_default()
    );
    all_gone(&cluster, &job.mounts, &daemons);
}
