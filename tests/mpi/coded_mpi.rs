//! A real coded job: `mpirun -np 1 shufflefs serve : -np 4 shufflefs mount --exchange coded`
//! with real mounts, walking three epochs: every epoch's listings partition the dataset as
//! the coded plan says, every byte matches the source, and the status shows the scheme and
//! what the packets brought. Then jobs that cannot run (no server; a server alone) are
//! refused with a clear message and leave nothing mounted.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::mpi_job::{MpiJob, exchange, wait_all};
use crate::common::{BIN, is_mounted, require_fuse, require_mpi};

pub(crate) const RANKS: u32 = 4;
pub(crate) const SEED: u64 = 11;
pub(crate) const ALPHA: f64 = 0.5;

pub(crate) fn launcher(dir: &Path) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["--oversubscribe", "-np", "1", BIN, "serve", "--source"])
        .arg(dir.join("src"))
        .args([":", "-np", &RANKS.to_string()]);
    cmd
}

/// Three classes of files of different sizes (one empty).
pub(crate) fn source(dir: &Path) {
    for (class, count) in [("ant", 40u32), ("bee", 35), ("cow", 25)] {
        let d = dir.join("src").join(class);
        std::fs::create_dir_all(&d).unwrap();
        for i in 0..count {
            let len = [0usize, 900, 4_000, 23_000, 61_000][(i % 5) as usize] + i as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|o| (o as u64 * 13 + u64::from(i) * 101 + class.len() as u64) as u8)
                .collect();
            std::fs::write(d.join(format!("{i:03}.bin")), bytes).unwrap();
        }
    }
}

/// `class/name -> rank` of `epoch`, every byte read through the mount and compared.
pub(crate) fn listing(job: &MpiJob, src: &Path, epoch: u64) -> BTreeMap<String, u32> {
    let mut owners = BTreeMap::new();
    for (rank, m) in job.mounts.iter().enumerate() {
        let dir = m.join(format!("epoch-{epoch}"));
        for class in std::fs::read_dir(&dir).unwrap() {
            let class = class.unwrap().file_name();
            for f in std::fs::read_dir(dir.join(&class)).unwrap() {
                let f = f.unwrap();
                let key = format!(
                    "{}/{}",
                    class.to_string_lossy(),
                    f.file_name().to_string_lossy()
                );
                let got = std::fs::read(f.path()).unwrap();
                assert!(
                    got == std::fs::read(src.join(&key)).unwrap(),
                    "rank {rank} epoch {epoch}: {key} differs from the source"
                );
                assert!(
                    owners.insert(key.clone(), rank as u32).is_none(),
                    "{key} listed twice in epoch {epoch}"
                );
            }
        }
    }
    owners
}

/// What the coded plan gives every sample in `epoch`.
pub(crate) fn planned(src: &Path, epoch: u64) -> BTreeMap<String, u32> {
    let m = shufflefs::dataset::scan::scan(src).unwrap();
    let params = shufflefs::plan::PlanParams {
        samples: m.len(),
        world: RANKS,
        fraction: 0.0,
        seed: SEED,
    };
    let plan = shufflefs::plan::Plan::coded(params, ALPHA).unwrap();
    let shares = plan.shares_at(epoch);
    (0..RANKS)
        .flat_map(|r| {
            let m = &m;
            shares
                .share(r)
                .iter()
                .map(move |&id| (m.relative_path(id).to_string_lossy().into_owned(), r))
        })
        .collect()
}

#[test]
fn a_server_and_four_ranks_walk_three_epochs_with_exact_bytes() {
    walk("ubershuffle", &["--multicast", "ring"]);
}

/// The same over MPI broadcasts on merged sub-communicators (4 for the 11 groups of 4 ranks).
#[test]
fn the_walk_over_merged_broadcast_communicators() {
    walk(
        "coded",
        &["--multicast", "broadcast", "--communicators", "4"],
    );
}

fn walk(scheme: &str, how: &[&str]) {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    source(tmp.path());
    let src = tmp.path().join("src");
    let alpha = ALPHA.to_string();
    let mut extra = vec![
        "--exchange",
        "coded",
        "--cache-fraction",
        &alpha,
        "--scheme",
        scheme,
    ];
    extra.extend_from_slice(how);
    let mut job = MpiJob::start_with(launcher(tmp.path()), tmp.path(), RANKS, SEED, 0.3, &extra);
    for epoch in 0..=3u64 {
        if epoch > 0 {
            for m in &job.mounts {
                std::fs::write(m.join(".shufflefs/epoch"), format!("{epoch}\n")).unwrap();
            }
        }
        wait_all(&job, "the epoch", |st| st["epoch"] == epoch);
        assert_eq!(
            listing(&job, &src, epoch),
            planned(&src, epoch),
            "epoch {epoch}"
        );
        if epoch > 0 {
            for r in 0..RANKS as usize {
                let st = job.status(r);
                assert_eq!(st["cache_fraction"], ALPHA);
                let x = exchange(&st, epoch).unwrap_or_else(|| panic!("rank {r}: {st}"));
                assert_eq!(x["state"], "done", "rank {r} epoch {epoch}: {x}");
                let coded = &x["coded"];
                assert_eq!(coded["scheme"], scheme);
                assert_eq!(coded["multicast"], how[1]);
                assert_eq!(coded["decode_failures"], 0, "{coded}");
                assert!(coded["samples_decoded"].as_u64().unwrap() > 0, "{coded}");
                // Every sample of the share arrived from the server, none from the source.
                assert!(
                    x["peers"].as_array().is_none_or(|p| p.is_empty()),
                    "rank {r}: {x}"
                );
            }
        }
    }
    let fetched: Vec<u64> = (0..RANKS as usize)
        .map(|r| {
            job.status(r)["cache"]["fetched_from_source"]
                .as_u64()
                .unwrap()
        })
        .collect();
    let shares: Vec<u64> = (0..RANKS)
        .map(|r| planned(&src, 0).values().filter(|&&o| o == r).count() as u64)
        .collect();
    assert_eq!(
        fetched, shares,
        "only epoch 0's shares come from the source"
    );
    let status = job.unmount_within(Duration::from_secs(60));
    let log = std::fs::read_to_string(tmp.path().join("job.log")).unwrap_or_default();
    assert!(
        status.is_some_and(|s| s.success()),
        "the job (server included) ends cleanly once every rank unmounted: {status:?}\n{log}"
    );
    // The server served each step (a log line per epoch; the exchange into epoch 4 starts
    // in the background once 3 is published, and may be served or stopped by the unmount).
    let served = log.matches("coded exchange served").count();
    assert!((3..=4).contains(&served), "{served} steps served\n{log}");
    assert!(
        log.contains("a compute rank left; the server stops"),
        "{log}"
    );
    if how.contains(&"broadcast") {
        assert!(log.contains("multicast=\"broadcast\""), "{log}");
        assert!(
            !log.contains("communicators=0 "),
            "sub-communicators in use: {log}"
        );
    } else {
        assert!(log.contains("communicators=0 "), "a ring needs none: {log}");
    }
}

/// SIGKILL to the `shufflefs serve` process reading `src` (it has no status file).
pub(crate) fn kill_server(src: &Path) {
    let want = src.to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = (cmdline.split(|&b| b == 0))
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a == "serve") && args.contains(&want) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

pub(crate) fn advance(job: &MpiJob, epoch: u64) {
    for m in &job.mounts {
        std::fs::write(m.join(".shufflefs/epoch"), format!("{epoch}\n")).unwrap();
    }
    wait_all(job, "the epoch", |st| st["epoch"] == epoch);
}

/// Everything SIGKILLed at epoch 2 (the exchange into 3 under way or done), then the same
/// job again: it resumes at epoch 2 with the planned listings and goes on to epoch 3.
#[test]
fn a_killed_coded_job_resumes_at_its_epoch() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    source(tmp.path());
    let src = tmp.path().join("src");
    let extra = [
        "--exchange",
        "coded",
        "--cache-fraction",
        "0.5",
        "--scheme",
        "coded",
    ];
    let job = MpiJob::start_with(launcher(tmp.path()), tmp.path(), RANKS, SEED, 0.3, &extra);
    advance(&job, 1);
    advance(&job, 2);
    assert_eq!(listing(&job, &src, 2), planned(&src, 2));
    kill_server(&src);
    job.kill();

    let mut job = MpiJob::start_with(launcher(tmp.path()), tmp.path(), RANKS, SEED, 0.3, &extra);
    wait_all(&job, "the resumed epoch", |st| st["epoch"] == 2);
    assert_eq!(listing(&job, &src, 2), planned(&src, 2), "resumed epoch 2");
    advance(&job, 3);
    assert_eq!(
        listing(&job, &src, 3),
        planned(&src, 3),
        "epoch 3 after the resume"
    );
    for r in 0..RANKS as usize {
        let st = job.status(r);
        let x = exchange(&st, 3).unwrap();
        assert_eq!(x["state"], "done", "rank {r}: {x}");
        assert_eq!(x["coded"]["scheme"], "coded");
    }
    let status = job.unmount_within(Duration::from_secs(60));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

/// Runs a job that must be refused; returns its log.
fn refused(mut cmd: Command, dir: &Path, mounts: u32) -> String {
    let log = dir.join("job.log");
    let status = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .status()
        .unwrap();
    assert!(!status.success(), "the job should be refused");
    for r in 0..mounts {
        assert!(
            !is_mounted(&dir.join(format!("mnt{r}"))),
            "mnt{r} left mounted"
        );
    }
    std::fs::read_to_string(log).unwrap()
}

#[test]
fn a_coded_job_without_a_server_or_without_compute_ranks_is_refused() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    source(tmp.path());
    let mut no_server = crate::common::mpi_job::mpirun(2);
    no_server.args([
        BIN,
        "mount",
        "--exchange",
        "coded",
        "--cache-fraction",
        "0.5",
    ]);
    no_server
        .arg("--source")
        .arg(tmp.path().join("src"))
        .arg("--cache")
        .arg(tmp.path().join("cache{rank}"))
        .arg(tmp.path().join("mnt{rank}"));
    for r in 0..2 {
        std::fs::create_dir_all(tmp.path().join(format!("mnt{r}"))).unwrap();
    }
    let log = refused(no_server, tmp.path(), 2);
    assert!(log.contains("needs a `shufflefs serve` rank"), "{log}");
    assert!(log.contains("mpirun -np 1 shufflefs serve"), "{log}");

    // A server whose --seed differs from the compute ranks': refused before anything mounts.
    let mut seeds = Command::new("mpirun");
    seeds
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args([
            "--oversubscribe",
            "-np",
            "1",
            BIN,
            "serve",
            "--seed",
            "1",
            "--source",
        ])
        .arg(tmp.path().join("src"))
        .args([
            ":",
            "-np",
            "2",
            BIN,
            "mount",
            "--seed",
            "2",
            "--exchange",
            "coded",
        ])
        .args(["--cache-fraction", "0.5", "--source"])
        .arg(tmp.path().join("src"))
        .arg("--cache")
        .arg(tmp.path().join("cache{rank}"))
        .arg(tmp.path().join("mnt{rank}"));
    let log = refused(seeds, tmp.path(), 2);
    assert!(
        log.contains("the server was started with --seed 1, the compute ranks use 2"),
        "{log}"
    );

    let mut alone = crate::common::mpi_job::mpirun(1);
    alone
        .args([BIN, "serve", "--source"])
        .arg(tmp.path().join("src"));
    let log = refused(alone, tmp.path(), 0);
    assert!(log.contains("without compute ranks"), "{log}");
}

/// Without a launcher there can be no server: refused, naming the way to start one, in the
/// background and in the foreground; wrong option combinations are refused too.
#[test]
fn a_coded_mount_started_alone_is_refused() {
    if !require_fuse() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    source(tmp.path());
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let (src, cache) = (tmp.path().join("src"), tmp.path().join("cache"));
    let coded = ["--exchange", "coded", "--cache-fraction", "0.5"];
    for foreground in [false, true] {
        let args = crate::common::mount_args(&src, &cache, &mnt, &coded);
        let r = crate::common::mount_refused(&mnt, &args, foreground);
        let text = format!("{}{}", r.stdout, r.stderr);
        assert!(text.contains("needs a `shufflefs serve` rank"), "{text}");
    }
    for (extra, needle) in [
        (&["--exchange", "coded"][..], "--cache-fraction"),
        (
            &["--cache-fraction", "0.5"][..],
            "--cache-fraction applies to --exchange coded only",
        ),
    ] {
        let args = crate::common::mount_args(&src, &cache, &mnt, extra);
        let r = crate::common::mount_refused(&mnt, &args, false);
        let text = format!("{}{}", r.stdout, r.stderr);
        assert!(text.contains(needle), "{extra:?}: {text}");
    }
    let out = crate::common::shufflefs()
        .args(["serve", "--source"])
        .arg(&src)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("runs as world rank 0 of an MPI job"),
        "{text}"
    );
}

/// A record source (`--format records`, lines grouped by page) under the coded exchange:
/// every epoch the ranks' parts hold every record exactly once, and the server serves it.
#[test]
fn record_sources_shuffle_coded_too() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let mut lines: Vec<String> = (0..3000)
        .map(|i| format!("{i} {}", "x".repeat(10 + (i * 37) % 290)))
        .collect();
    std::fs::write(src.join("data.txt"), lines.join("\n") + "\n").unwrap();
    lines.sort();
    let ranks = 3;
    let mut cmd = Command::new("mpirun");
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args([
            "--oversubscribe",
            "-np",
            "1",
            BIN,
            "serve",
            "--format",
            "records",
        ])
        .arg("--source")
        .arg(&src)
        .args([":", "-np", &ranks.to_string()]);
    let extra = [
        "--exchange",
        "coded",
        "--cache-fraction",
        "0.5",
        "--format",
        "records",
        "--framing",
        "lines",
    ];
    let mut job = MpiJob::start_with(cmd, tmp.path(), ranks, SEED, 0.3, &extra);
    for epoch in 0..=2u64 {
        if epoch > 0 {
            advance(&job, epoch);
        }
        let mut got: Vec<String> = Vec::new();
        for m in &job.mounts {
            let dir = m.join(format!("epoch-{epoch}"));
            for part in std::fs::read_dir(&dir).unwrap() {
                let text = std::fs::read_to_string(part.unwrap().path()).unwrap();
                got.extend(text.lines().map(str::to_string));
            }
        }
        got.sort();
        assert!(
            got == lines,
            "epoch {epoch}: the ranks' parts are not the source's records"
        );
    }
    let status = job.unmount_within(Duration::from_secs(60));
    let log = std::fs::read_to_string(tmp.path().join("job.log")).unwrap_or_default();
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{log}");
    assert!(log.contains("coded exchange served"), "{log}");
}
