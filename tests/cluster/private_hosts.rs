//! shufflefs on private hosts (`shufflefs-cluster up` without `--shared`): each host its own
//! mount namespace and disk (LOCAL), the dataset on a storage host served by sshd on its own
//! shaped link and mounted read-only with sshfs at STORE on every host.
//!
//! - Isolation: a FUSE mount on h0 is seen neither on h1 nor in the root namespace, each
//!   host's disk is its own (and seen from outside at `$DIR/disk-hI`), the store is readable
//!   and read-only everywhere, and `down` after a killed `up` and after a run killed with its
//!   processes and mounts left leaves no mount, loop device, namespace or process.
//! - 4 hosts x 1 rank with `--source` = STORE, caches and mounts on LOCAL: 3 epochs, each a
//!   partition of the dataset with exact bytes, checked by this binary run inside each host
//!   (the mounts exist only there); then the store at a tenth of its rate slows staging and
//!   not the exchange (numbers reported, not asserted: 2 loaded cores make timings loose).
//! - The store taken away during staging: the status and the log name the source, the mount
//!   serves what is cached, and staging resumes when the store is back.
//! - 4 hosts x 1 rank with `--source s3://...`: moto serves the bucket on the bridge address
//!   (cluster `s3c`, 10.214.80.0/24), 3 epochs read exactly inside the hosts, rank 0 alone
//!   lists, every object fetched once (needs moto too; skips without it).
//!
//! Needs what `cluster_mpi` needs plus sshfs and openssh-server; skips otherwise unless
//! `SHUFFLEFS_REQUIRE_CLUSTER=1`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::mpi_job::{exchange, planned, test_name};
use crate::common::*;
use crate::harness::{Cluster, harness, harness_ok, ns_exists};

/// Set to `MOUNT\tSOURCE\tEPOCH` when this binary runs inside a host to list a view.
const CHILD: &str = "SHUFFLEFS_PRIVATE_HOSTS_CHILD";

/// Whether sshfs and sshd are there (the store needs them).
fn require_store() -> bool {
    if !require_cluster() {
        return false;
    }
    let ok = on_path("sshfs") && Path::new("/usr/sbin/sshd").exists();
    assert!(
        ok || std::env::var("SHUFFLEFS_REQUIRE_CLUSTER").is_err(),
        "the store needs sshfs and openssh-server"
    );
    if !ok {
        eprintln!("skipped: the store needs sshfs and openssh-server");
    }
    ok
}

/// The in-host side of [`host_view`]: lists `MOUNT/epoch-EPOCH`, reads every file and
/// compares it with SOURCE; prints `class NAME` per class, then `ok class/name` or
/// `err class/name ERROR` per file.
#[test]
fn lists_a_view_inside_a_host() {
    let Ok(arg) = std::env::var(CHILD) else {
        return;
    };
    let [mnt, src, epoch]: [&str; 3] = arg.split('\t').collect::<Vec<_>>().try_into().unwrap();
    let view = Path::new(mnt).join(format!("epoch-{epoch}"));
    println!(); // libtest's "test NAME ... " has no newline under --nocapture
    let listed = listing(&view);
    for class in listed.keys() {
        println!("class {class}");
    }
    for (class, files) in listed {
        for name in files {
            let rel = format!("{class}/{name}");
            match fs::read(view.join(&rel)) {
                Ok(got) => {
                    let want = fs::read(Path::new(src).join(&rel)).unwrap();
                    let first = (got.iter().zip(&want)).position(|(a, b)| a != b);
                    assert!(
                        got == want,
                        "{rel}: {} bytes read, {} in the source, first difference at {first:?}",
                        got.len(),
                        want.len()
                    );
                    println!("ok {rel}");
                }
                Err(e) => println!("err {rel} {e}"),
            }
        }
    }
}

/// What a host sees in a view (`mnt/epoch-N`), read inside the host by [`host_view`].
pub(crate) struct HostView {
    /// The class folders listed.
    pub classes: Vec<String>,
    /// `class/name` of the samples read with the source's bytes.
    pub ok: BTreeSet<String>,
    /// `class/name ERROR` of the samples that could not be read.
    pub failed: Vec<String>,
}

/// What host `host` reads in `mnt/epoch-N`: the samples read with the source's bytes, and
/// the ones that failed (with the error).
fn host_listing(
    cluster: &Cluster,
    host: u32,
    mnt: &str,
    src: &Path,
    epoch: u64,
) -> (BTreeSet<String>, Vec<String>) {
    let view = host_view(cluster, host, mnt, src, epoch);
    (view.ok, view.failed)
}

/// Lists `mnt/epoch-N` inside host `host` (this binary run there: the mount exists only
/// there), every file read and compared with the source `src`, a path the host sees too;
/// a byte that differs fails the test.
pub(crate) fn host_view(
    cluster: &Cluster,
    host: u32,
    mnt: &str,
    src: &Path,
    epoch: u64,
) -> HostView {
    let exe = std::env::current_exe().unwrap();
    let out = run_with_timeout(
        harness()
            .env(CHILD, format!("{mnt}\t{}\t{epoch}", src.display()))
            .args(["exec", cluster.name, &host.to_string()])
            .arg(exe)
            .arg(test_name(module_path!(), "lists_a_view_inside_a_host"))
            .args(["--exact", "--nocapture", "--test-threads=1"]),
        Duration::from_secs(120),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "h{host} {mnt}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut view = HostView {
        classes: Vec::new(),
        ok: BTreeSet::new(),
        failed: Vec::new(),
    };
    for line in stdout.lines() {
        if let Some(class) = line.strip_prefix("class ") {
            view.classes.push(class.to_string());
        } else if let Some(key) = line.strip_prefix("ok ") {
            view.ok.insert(key.to_string());
        } else if let Some(e) = line.strip_prefix("err ") {
            view.failed.push(e.to_string());
        }
    }
    view
}

/// A `shufflefs mount` job on private hosts, one rank per host: caches `LOCAL/TAGcache{rank}`,
/// mounts `LOCAL/TAGmnt{rank}`, the source a path inside the hosts.
struct Job<'a> {
    cluster: &'a Cluster,
    child: Child,
    mounts: Vec<String>,
    log: PathBuf,
}

impl<'a> Job<'a> {
    fn start(cluster: &'a Cluster, source: &str, tag: &str, log: PathBuf, seed: u64) -> Job<'a> {
        Job::start_env(cluster, source, tag, log, seed, &[])
    }

    /// As [`start`](Self::start), with `env` set for every rank (`mpirun -x`).
    fn start_env(
        cluster: &'a Cluster,
        source: &str,
        tag: &str,
        log: PathBuf,
        seed: u64,
        env: &[(&str, String)],
    ) -> Job<'a> {
        let local = cluster.config("LOCAL");
        let mounts: Vec<String> = (0..cluster.hosts)
            .map(|r| format!("{local}/{tag}mnt{r}"))
            .collect();
        for r in 0..cluster.hosts {
            // LOCAL of host r is $DIR/disk-hr from here.
            let disk = cluster.dir().join(format!("disk-h{r}"));
            fs::create_dir_all(disk.join(format!("{tag}mnt{r}"))).unwrap();
        }
        let mut launcher = cluster.mpirun(1);
        for (name, value) in env {
            launcher.env(name, value).args(["-x", name]);
        }
        let child = launcher
            .args([BIN, "mount", "--seed", &seed.to_string(), "--fraction"])
            .arg(Q.to_string())
            .args(["--source", source, "--cache"])
            .arg(format!("{local}/{tag}cache{{rank}}"))
            .arg(format!("{local}/{tag}mnt{{rank}}"))
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut job = Job {
            cluster,
            child,
            mounts,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        for r in 0..cluster.hosts {
            while job.try_status(r).is_none() {
                if let Ok(Some(status)) = job.child.try_wait() {
                    panic!("the job exited before mounting: {status}\n{}", job.log());
                }
                assert!(Instant::now() < deadline, "ranks did not mount in time");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        job
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Rank `r`'s status, read inside its host.
    fn try_status(&self, r: u32) -> Option<Value> {
        let status = format!("{}/.shufflefs/status", self.mounts[r as usize]);
        let out = self.cluster.exec(&r.to_string(), &["cat", &status]);
        serde_json::from_slice(&out.stdout).ok()
    }

    #[track_caller]
    fn status(&self, r: u32) -> Value {
        self.try_status(r)
            .unwrap_or_else(|| panic!("no status from rank {r}\n{}", self.log()))
    }

    /// Waits (up to 2 minutes) until `pred` holds for every rank's status.
    #[track_caller]
    fn wait_all(&self, what: &str, pred: impl Fn(&Value) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(120);
        for r in 0..self.cluster.hosts {
            loop {
                let st = self.status(r);
                if pred(&st) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "timed out waiting for {what}: {st}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Rank `r` asks for epoch `epoch`.
    fn advance(&self, r: u32, epoch: u64) {
        let file = format!("{}/.shufflefs/epoch", self.mounts[r as usize]);
        let line = format!("echo {epoch} > {file}");
        self.cluster.exec_ok(&r.to_string(), &["sh", "-c", &line]);
    }

    /// Unmounts every rank inside its host; the launcher must then end cleanly.
    fn unmount(mut self) {
        let pids: Vec<i32> = (0..self.cluster.hosts)
            .map(|r| self.status(r)["pid"].as_i64().unwrap() as i32)
            .collect();
        for (r, m) in self.mounts.iter().enumerate() {
            let host = r.to_string();
            self.cluster
                .exec_ok(&host, &[BIN, "unmount", "--timeout", "60", m]);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "the job did not end after unmount"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "{status}\n{}", self.log());
        for pid in pids {
            assert!(
                wait_pid_gone(pid, Duration::from_secs(10)),
                "daemon {pid} left"
            );
        }
    }
}

impl Drop for Job<'_> {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const Q: f64 = 0.3;

/// Classes c0..c3 of `per_class` numbered samples each, of `size(i)` bytes.
pub(crate) fn four_classes(per_class: usize, size: fn(usize) -> u64) -> Dataset {
    let mut b = DatasetBuilder::new();
    for c in ["c0", "c1", "c2", "c3"] {
        b = b.numbered_class(c, per_class, size);
    }
    b.build()
}

pub(crate) fn staged(st: &Value) -> bool {
    st["staging"]["state"] == "done" && st["staging"]["files_done"] == st["staging"]["files_total"]
}

/// The root namespace's mount points under `dir`.
fn root_mounts_under(dir: &Path) -> Vec<String> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir = dir.to_string_lossy();
    (text.lines())
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&*dir))
        .map(String::from)
        .collect()
}

/// SIGKILL to every sshfs of host h0 (found by namespace: there is no pid namespace).
fn kill_sshfs_on_h0(cluster: &Cluster) {
    for pid in cluster.pids() {
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "sshfs" && cluster.host_of(pid) == Some(0) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    std::thread::sleep(Duration::from_millis(100));
}

#[test]
fn private_hosts_are_isolated_and_down_cleans_a_killed_run() {
    if !require_store() {
        return;
    }
    let ds = four_classes(3, |i| 1_000 + i as u64);
    let root = ds.root.to_str().unwrap();
    let cluster = Cluster::private(
        "hai",
        "10.214.3.0/24",
        2,
        &["--store", root, "--disk", "64M"],
    );
    let (local, store, dir) = (
        cluster.config("LOCAL"),
        cluster.config("STORE"),
        cluster.dir(),
    );
    let info = harness_ok(&["info", "hai"]);
    assert!(info.contains(&local) && info.contains(&store), "{info}");

    // Each host's disk is its own, and seen from outside at $DIR/disk-hI only.
    for h in ["0", "1"] {
        let line = format!("echo h{h} > {local}/who");
        cluster.exec_ok(h, &["sh", "-c", &line]);
    }
    for h in 0..2 {
        let who = fs::read_to_string(dir.join(format!("disk-h{h}/who"))).unwrap();
        assert_eq!(who.trim(), format!("h{h}"));
        let seen = cluster.exec_ok(&h.to_string(), &["cat", &format!("{local}/who")]);
        assert_eq!(seen.trim(), format!("h{h}"));
    }
    assert!(
        !Path::new(&local).join("who").exists(),
        "LOCAL in root is not a disk"
    );

    // A FUSE mount on h0 (a second sshfs of the store) is seen neither on h1 nor in root.
    let extra = format!("{local}/extra");
    let ssh_key = dir.join("ssh/id_ed25519");
    let line = format!(
        "mkdir -p {extra} && sshfs -o ro,IdentityFile={},StrictHostKeyChecking=no,\
         UserKnownHostsFile=/dev/null,BatchMode=yes root@{}:{root} {extra}",
        ssh_key.display(),
        cluster.config("STORE_ADDR")
    );
    cluster.exec_ok("0", &["sh", "-c", &line]);
    // Every FUSE mount a host sees (those of other tests running beside this one included:
    // a host drops the root's FUSE mounts when it is made).
    let fuse_on = |h: &str| {
        cluster.exec_ok(
            h,
            &["sh", "-c", "grep -c ' - fuse' /proc/self/mountinfo || true"],
        )
    };
    assert_eq!(
        fuse_on("0").trim(),
        "2",
        "h0: the store and the extra mount"
    );
    assert_eq!(fuse_on("1").trim(), "1", "h1: its store mount alone");
    assert!(root_mounts_under(&dir.join("store")).is_empty());
    assert!(
        root_mounts_under(&dir.join("disk-h0")).len() == 1,
        "only the disk itself"
    );

    // The store is readable and read-only on every host.
    let sample = &ds.samples[0];
    for h in ["0", "1"] {
        let path = format!("{store}/{}", sample.rel().display());
        let out = cluster.exec(h, &["cat", &path]);
        assert!(out.stdout == sample.bytes(), "h{h} reads {path}");
        let out = cluster.exec(h, &["touch", &format!("{store}/new")]);
        assert!(!out.status.success(), "h{h} wrote into the store");
    }

    // sshfs killed on h0: its STORE is dead (ENOTCONN) until `store start` mounts it again.
    let path = format!("{store}/{}", sample.rel().display());
    kill_sshfs_on_h0(&cluster);
    assert!(!cluster.exec("0", &["cat", &path]).status.success());
    harness_ok(&["store", "hai", "start"]);
    assert!(cluster.exec("0", &["cat", &path]).stdout == sample.bytes());

    // A run killed with everything in it: a process left in h1, sshfs on h0 SIGKILLed (its
    // mount left dead), the extra mount left; then `down`.
    let mut sleeper = harness()
        .args(["exec", "hai", "1", "sleep", "600"])
        .spawn()
        .unwrap();
    kill_sshfs_on_h0(&cluster);
    let images: Vec<PathBuf> = (0..2).map(|h| dir.join(format!("disk-h{h}.img"))).collect();
    harness_ok(&["down", "hai"]);
    let _ = sleeper.wait();
    assert!(
        root_mounts_under(&dir).is_empty(),
        "mounts left under {}",
        dir.display()
    );
    let loops = run_with_timeout(Command::new("losetup").arg("-a"), Duration::from_secs(10));
    let loops = String::from_utf8_lossy(&loops.stdout);
    for img in &images {
        assert!(
            !loops.contains(&*img.to_string_lossy()),
            "loop device left: {loops}"
        );
    }
    assert!(!ns_exists("hai") && !dir.exists());
    assert!(cluster.pids().is_empty());

    // An `up` killed half-way: `down` removes what it made.
    let mut up = harness()
        .args([
            "up",
            "hai",
            "--hosts",
            "2",
            "--subnet",
            "10.214.3.0/24",
            "--store",
            root,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(400));
    let _ = up.kill();
    let _ = up.wait();
    // What it had started (mkfs, a mount) ends on its own, as after a real kill.
    std::thread::sleep(Duration::from_secs(1));
    harness_ok(&["down", "hai"]);
    assert!(root_mounts_under(&dir).is_empty() && !ns_exists("hai") && !dir.exists());
}

/// Every rank lists epochs `epochs` (each read inside its host, every byte checked against
/// the source) and the epochs partition the dataset as planned; each rank then asks for the
/// next one.
fn walk(job: &Job, ds: &Dataset, seed: u64, epochs: std::ops::Range<u64>) {
    let ranks = job.cluster.hosts;
    for epoch in epochs.clone() {
        let mut owner = BTreeMap::new();
        for r in 0..ranks {
            let (got, failed) =
                host_listing(job.cluster, r, &job.mounts[r as usize], &ds.root, epoch);
            assert!(failed.is_empty(), "rank {r} epoch {epoch}: {failed:?}");
            assert_eq!(
                got,
                planned(&ds.root, (ranks, seed, Q), epoch, r),
                "rank {r} epoch {epoch}"
            );
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
        if epoch + 1 < epochs.end {
            for r in 0..ranks {
                job.advance(r, epoch + 1);
            }
        }
    }
}

/// Seconds of the exchange into `target`, the longest over the ranks.
fn exchange_secs(job: &Job, target: u64) -> f64 {
    job.wait_all("the exchange to end", |st| {
        exchange(st, target).is_some_and(|x| x["state"] == "done")
    });
    (0..job.cluster.hosts)
        .map(|r| {
            exchange(&job.status(r), target).unwrap()["seconds"]
                .as_f64()
                .unwrap()
        })
        .fold(0.0, f64::max)
}

/// `shufflefs status MOUNT --json` run inside the last host shows every rank of the job,
/// each from its own host, heard from lately, at the epoch the walk reached (the
/// whole job from any host's mount).
fn job_view_from_the_last_host(cluster: &Cluster, job: &Job) {
    let mnt = &job.mounts[3];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = cluster.exec("3", &[BIN, "status", mnt, "--json"]);
        let text = String::from_utf8_lossy(&out.stdout);
        let view: Value = serde_json::from_str(text.trim()).unwrap_or(Value::Null);
        let rows = view["ranks"].as_array().cloned().unwrap_or_default();
        let fresh = |r: &Value| r.get("stale_s").is_none() && r["epoch"] == 2;
        if rows.len() == 4 && rows.iter().all(fresh) {
            let hosts: BTreeSet<&str> = rows.iter().filter_map(|r| r["host"].as_str()).collect();
            assert_eq!(hosts.len(), 4, "one host per rank: {view}");
            return;
        }
        assert!(Instant::now() < deadline, "job view from h3: {text}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn four_private_hosts_read_the_store_and_walk_three_epochs() {
    if !require_store() {
        return;
    }
    const SEED: u64 = 17;
    let ds = four_classes(30, |i| 20_000 + 331 * i as u64);
    let root = ds.root.to_str().unwrap();
    let cluster = Cluster::private(
        "ha4",
        "10.214.4.0/24",
        4,
        &["--store", root, "--disk", "128M"],
    );
    let store = cluster.config("STORE");

    let started = Instant::now();
    let job = Job::start(&cluster, &store, "a", ds.base.join("a.log"), SEED);
    job.wait_all("staging", staged);
    let staging_fast = started.elapsed();
    walk(&job, &ds, SEED, 0..3);
    job_view_from_the_last_host(&cluster, &job);
    let fast = [exchange_secs(&job, 1), exchange_secs(&job, 2)];
    // The caches are on each host's own disk, and only there.
    for r in 0..4 {
        for h in 0..4 {
            let cache = cluster.dir().join(format!("disk-h{h}/acache{r}"));
            assert_eq!(cache.exists(), r == h, "{}", cache.display());
        }
    }
    job.unmount();

    // The store at a tenth of its rate: a new job (new caches) stages more slowly; the
    // exchange runs over the hosts' own links as before.
    harness_ok(&["shape", "ha4", "store", "100mbit"]);
    let started = Instant::now();
    let job = Job::start(&cluster, &store, "b", ds.base.join("b.log"), SEED);
    job.wait_all("staging", staged);
    let staging_slow = started.elapsed();
    walk(&job, &ds, SEED, 0..3);
    let slow = [exchange_secs(&job, 1), exchange_secs(&job, 2)];
    job.unmount();
    eprintln!(
        "{} bytes from the store: mount + staging {staging_fast:.1?} at 1gbit, \
         {staging_slow:.1?} at 100mbit; exchange into epochs 1, 2: {fast:.2?} s at 1gbit, \
         {slow:.2?} s at 100mbit",
        ds.total_bytes()
    );
}

#[test]
fn the_store_going_away_during_staging_is_named_and_staging_resumes() {
    if !require_store() {
        return;
    }
    const SEED: u64 = 23;
    let ds = four_classes(12, |i| 25_000 + 97 * i as u64);
    let root = ds.root.to_str().unwrap();
    // ~1.2 MB through a 2mbit store link (250 kB/s): staging takes about 5 s.
    let cluster = Cluster::private(
        "ha5",
        "10.214.5.0/24",
        2,
        &["--store", root, "--disk", "64M", "--store-rate", "2mbit"],
    );
    let store = cluster.config("STORE");
    let job = Job::start(&cluster, &store, "", ds.base.join("job.log"), SEED);
    job.wait_all("some staging", |st| {
        st["staging"]["files_done"].as_u64() > Some(0)
    });
    harness_ok(&["store", "ha5", "stop"]);
    // Staging meets the missing store: the status and the log name it.
    job.wait_all("staging to fail", |st| {
        st["staging"]["errors"].as_u64() > Some(0)
    });
    let mut cached = Vec::new();
    for r in 0..2 {
        let st = job.status(r);
        let last = st["staging"]["last_error"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(last.contains(&store), "rank {r}: {st}");
        assert!(
            st["cache"]["problems"].to_string().contains(&store),
            "rank {r}: {st}"
        );
        // Of this epoch's share (the cache also holds what the exchange into epoch 1 brought).
        cached.push(st["staging"]["files_done"].as_u64().unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !job.log().contains("the source did not answer; retrying") {
        assert!(
            Instant::now() < deadline,
            "no retry in the log:\n{}",
            job.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // What is cached is served, with its bytes; the rest fails until the store is back.
    for r in 0..2u32 {
        let (ok, failed) = host_listing(&cluster, r, &job.mounts[r as usize], &ds.root, 0);
        assert!(
            ok.len() as u64 >= cached[r as usize] && !ok.is_empty(),
            "rank {r}: {} of the share staged, {ok:?} read",
            cached[r as usize]
        );
        for e in &failed {
            assert!(e.contains("os error 5"), "rank {r}: not EIO: {e}");
        }
    }
    harness_ok(&["store", "ha5", "start"]);
    job.wait_all("staging to resume and finish", staged);
    walk(&job, &ds, SEED, 0..2);
    job.unmount();
}

/// 4 private hosts x 1 rank mounting a bucket: moto serves it on the bridge address
/// (SUBNET.254, which every host reaches over its shaped link), the ranks get the AWS
/// variables through `mpirun -x`, rank 0 alone lists, and 3 epochs are each a partition of
/// the dataset with exact bytes, read inside each host.
#[test]
fn four_private_hosts_mount_a_bucket_and_walk_three_epochs() {
    if !require_cluster() {
        return;
    }
    let Some(python) = crate::common::s3::moto_python() else {
        return;
    };
    const SEED: u64 = 31;
    let ds = four_classes(12, |i| 5_000 + 331 * i as u64);
    let cluster = Cluster::private("s3c", "10.214.80.0/24", 4, &["--disk", "128M"]);
    let server =
        crate::common::s3::S3Server::start_on(&python, &ds.base.join("moto.log"), "10.214.80.254");
    server.upload("shufflefs-cluster", "ds", &ds.root);
    let env = crate::common::s3::S3Server::env(&server.endpoint());
    let before = server.list_requests();
    let source = "s3://shufflefs-cluster/ds";
    let job = Job::start_env(&cluster, source, "s", ds.base.join("s.log"), SEED, &env);
    job.wait_all("staging", staged);
    walk(&job, &ds, SEED, 0..3);
    assert_eq!(server.list_requests() - before, 2, "listing requests");
    assert_eq!(job.status(0)["source"], source);
    let gets = std::fs::read_to_string(&server.log).unwrap_or_default();
    let gets = gets
        .lines()
        .filter(|l| l.contains("GET /shufflefs-cluster/ds/"))
        .count();
    eprintln!(
        "{} samples over 4 hosts from the bucket: {gets} object GETs",
        ds.samples.len()
    );
    // Each sample came from the bucket once (staged by its epoch-0 owner), then from peers.
    assert_eq!(gets, ds.samples.len(), "object GETs");
    job.unmount();
}
