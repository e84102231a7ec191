//! The job view and the metrics under a real `mpirun -np 3`: every rank's status
//! shows every rank in `job`, `shufflefs status MOUNT` prints the table and `--json`, and
//! the metrics (`MOUNT/.shufflefs/metrics` and `--metrics-file`) parse with Python's
//! `prometheus_client` and move as the job advances epochs; a rank that goes quiet turns
//! stale in the others' view without holding them, and every rank still exits 0.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::mpi_job::{MpiJob, checked_listing, exchange, wait_all, write_source};
use crate::common::*;

const RANKS: u32 = 3;

/// Every sample of each file, parsed by `prometheus_client`'s text parser: `(name, labels)`
/// to value, and each family's type.
struct Parsed {
    values: BTreeMap<(String, BTreeMap<String, String>), f64>,
    types: BTreeMap<String, String>,
}

impl Parsed {
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        (self.values.iter())
            .filter(|((n, l), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(v))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for path in sys.argv[1:]:
    samples, types = [], {}
    for fam in text_string_to_metric_families(open(path).read()):
        types[fam.name] = fam.type
        samples += [[s.name, s.labels, s.value] for s in fam.samples]
    out.append({"samples": samples, "types": types})
print(json.dumps(out))
"#;

fn parse(python: &Path, files: &[PathBuf]) -> Vec<Parsed> {
    let out = Command::new(python)
        .args(["-c", PARSE])
        .args(files)
        .output()
        .unwrap();
    let all: Value = serde_json::from_str(&check("the prometheus_client parser", &out)).unwrap();
    let label_map = |l: &Value| -> BTreeMap<String, String> {
        (l.as_object().unwrap().iter())
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect()
    };
    (all.as_array().unwrap().iter())
        .map(|f| Parsed {
            values: (f["samples"].as_array().unwrap().iter())
                .map(|s| {
                    let key = (s[0].as_str().unwrap().to_string(), label_map(&s[1]));
                    (key, s[2].as_f64().unwrap())
                })
                .collect(),
            types: (f["types"].as_object().unwrap().iter())
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect(),
        })
        .collect()
}

/// Whether `job` lists every rank, each heard from recently, at `epoch` or later.
fn whole_job_at(job: &Value, epoch: u64) -> bool {
    job["ranks"].as_array().is_some_and(|ranks| {
        ranks.len() == RANKS as usize
            && ranks.iter().enumerate().all(|(r, row)| {
                row["rank"] == r
                    && row.get("stale_s").is_none()
                    && row["epoch"].as_u64() >= Some(epoch)
            })
    })
}

fn metrics_files(dir: &Path) -> Vec<PathBuf> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    (0..RANKS)
        .map(|r| dir.join(format!("metrics/sfs-{}-{r}.prom", host.trim())))
        .collect()
}

#[test]
fn every_mount_shows_the_whole_job_and_the_metrics_move() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = venv_python("import prometheus_client", "prometheus_client") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_source(dir, 3, 12, 5000);
    std::fs::create_dir(dir.join("metrics")).unwrap();
    let template = dir.join("metrics/sfs-{host}-{rank}.prom");
    let job = MpiJob::start(
        dir,
        RANKS,
        5,
        0.5,
        &[
            "--metrics-file",
            template.to_str().unwrap(),
            "--share-disk",
            "never",
        ],
    );
    wait_all(&job, "every rank's job view", |st| {
        whole_job_at(&st["job"], 0)
    });
    rows_and_table(&job);
    metrics_move(&job, dir, &python);
    let files = metrics_files(dir);
    files_catch_up(&files, &python);
    watch_into_a_pipe(&job);
    a_quiet_rank_turns_stale(&job);

    // The view's own communicator lets every rank finalize MPI and exit 0.
    let mut job = job;
    let exit = job.unmount_within(Duration::from_secs(60));
    let log = std::fs::read_to_string(dir.join("job.log")).unwrap_or_default();
    assert!(exit.is_some_and(|s| s.success()), "{exit:?}\n{log}");
    assert!(!log.contains("abandoned"), "{log}");
    assert!(
        files.iter().all(|f| f.exists()),
        "the files stay after the job"
    );
}

/// A row has every field; `shufflefs status` prints the table (from another rank's mount
/// than rank 0's) and `--json` the object.
fn rows_and_table(job: &MpiJob) {
    let st = job.status(2);
    let row = &st["job"]["ranks"][1];
    for field in [
        "host",
        "staging",
        "exchange",
        "given_up_peers",
        "source_fallbacks",
    ] {
        assert!(row.get(field).is_some(), "{field} missing in {row:#}");
    }
    assert!(row["exchange"]["rate_bytes_per_s"].is_number(), "{row:#}");

    let out = shufflefs()
        .arg("status")
        .arg(&job.mounts[2])
        .output()
        .unwrap();
    let table = check("shufflefs status", &out);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("job of 3 ranks"), "{table}");
    assert!(lines[1].starts_with("RANK"), "{table}");
    for r in 0..RANKS {
        assert!(
            lines[2 + r as usize].starts_with(&format!("{r} ")),
            "{table}"
        );
    }
    let out = (shufflefs()
        .args(["status", "--json"])
        .arg(&job.mounts[1])
        .output())
    .unwrap();
    let json: Value = serde_json::from_str(&check("shufflefs status --json", &out)).unwrap();
    assert_eq!(json["ranks"].as_array().unwrap().len(), 3);
}

/// The mounts' metrics move as the job advances two epochs and reads them.
fn metrics_move(job: &MpiJob, dir: &Path, python: &Path) {
    let mount_metrics: Vec<PathBuf> = (job.mounts.iter())
        .map(|m| m.join(".shufflefs/metrics"))
        .collect();
    let before = parse(python, &mount_metrics);
    for target in 1..=2u64 {
        for m in &job.mounts {
            write_epoch(m, target.to_string()).unwrap();
        }
    }
    wait_all(job, "every rank's view at epoch 2", |st| {
        whole_job_at(&st["job"], 2)
    });
    for m in &job.mounts {
        assert!(!checked_listing(dir, m, 2).is_empty());
    }
    let after = parse(python, &mount_metrics);
    for m in &mount_metrics {
        let text = std::fs::read_to_string(m).unwrap();
        // Only the coded exchange moves bytes with a server.
        assert!(!text.contains("peer_host=\"server\""), "{text}");
    }
    for r in 0..RANKS as usize {
        let (b, a) = (&before[r], &after[r]);
        let rank = r.to_string();
        let me = [("rank", rank.as_str())];
        assert_eq!(a.types["shufflefs_exchange_bytes"], "counter");
        assert_eq!(a.types["shufflefs_epoch"], "gauge");
        assert_eq!(a.sum("shufflefs_epoch", &me), 2.0);
        assert_eq!(b.sum("shufflefs_epoch", &me), 0.0);
        let received = [("rank", rank.as_str()), ("direction", "received")];
        let got = a.sum("shufflefs_exchange_bytes_total", &received);
        assert!(
            got > b.sum("shufflefs_exchange_bytes_total", &received),
            "rank {r}"
        );
        assert!(a.sum("shufflefs_exchange_target_epoch", &me) >= 2.0);
        let done = a.sum("shufflefs_staging_done_samples", &me);
        assert!(done > 0.0 && done <= a.sum("shufflefs_staging_expected_samples", &me));
        assert!(a.sum("shufflefs_cache_bytes", &me) > 0.0);
        assert!(a.sum("shufflefs_source_bytes_total", &me) > 0.0);
        // Every file of epoch 2 was read through each mount in between.
        let opens = |p: &Parsed| p.sum("shufflefs_opens_total", &me);
        assert!(
            opens(a) > opens(b),
            "rank {r}: {} then {}",
            opens(b),
            opens(a)
        );
        let at = a.sum("shufflefs_last_update_timestamp_seconds", &me);
        assert!(at >= b.sum("shufflefs_last_update_timestamp_seconds", &me) && at > 1.6e9);
    }
}

/// The metrics files catch up within their period (5 s).
fn files_catch_up(files: &[PathBuf], python: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let parsed = files
            .iter()
            .all(|f| f.exists())
            .then(|| parse(python, files));
        let caught_up = parsed.as_ref().is_some_and(|p| {
            (0..RANKS as usize).all(|r| {
                let rank = r.to_string();
                p[r].sum("shufflefs_epoch", &[("rank", rank.as_str())]) == 2.0
            })
        });
        if caught_up {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the metrics files did not reach epoch 2"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `--watch` into a pipe: one plain table after another.
fn watch_into_a_pipe(job: &MpiJob) {
    let mut watch = (shufflefs().args(["status", "--watch"]).arg(&job.mounts[0]))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    watch.kill().unwrap();
    let out = watch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.matches("job of 3 ranks").count() >= 2, "{text}");
    assert!(
        !text.contains('\x1b'),
        "no terminal codes in a pipe: {text}"
    );
}

/// A rank that goes quiet (stopped by SIGSTOP here; a hung or lost rank alike) turns stale
/// in the others' view, and nothing waits for it.
fn a_quiet_rank_turns_stale(job: &MpiJob) {
    let pid = job.status(2)["pid"].to_string();
    let signal = |sig: &str| {
        let ok = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(ok.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = job.status(1);
        let ranks = st["job"]["ranks"].as_array().unwrap().clone();
        let fresh = |r: usize| ranks[r].get("stale_s").is_none();
        if fresh(0) && fresh(1) && !fresh(2) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rank 2 never turned stale: {ranks:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    signal("-CONT");
}

/// Rows stay live while an exchange's streams run: a slowed exchange (over MPI, capped at
/// 20 kB/s a rank, so its one frame per stream goes out in bursts) runs for seconds, and
/// meanwhile rank 0's mount shows rank 1's row fresh (never `stale_s`) with that
/// exchange's bytes growing, before it ends. (Rows froze during exchanges while the view
/// was ticked only between them.) Every rank asks for epoch 1 at once, and
/// `python3 -m shufflefs.progress --follow` (as the Slurm recipe runs it) shows that
/// advance waiting: job-wide lines that grow, the last one at 100%, and exits 0 once the
/// mounts go.
#[test]
fn rows_move_while_an_exchange_runs() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_source(dir, 3, 60, 20_000);
    let slow = ["--exchange-rate", "20000", "--share-disk", "never"];
    let mut job = MpiJob::start(dir, RANKS, 7, 0.5, &slow);
    let (follow, stderr) = follow(&job);
    // The exchange into epoch 1 starts at mount. Its rows are watched before anyone opens
    // epoch 1: an advance right after the last stream arrived would end the watch before a
    // row could show it (a row is up to a period old).
    let seen = rows_move(&job);
    assert!(seen[0] < seen[1], "{seen:?}");
    // Opening epoch 1 waits for the exchange.
    let listings: Vec<_> = (job.mounts.iter().map(|m| m.join("epoch-1")))
        .map(|e| std::thread::spawn(move || std::fs::read_dir(e).map(|d| d.count())))
        .collect();
    for l in listings {
        let listed = l.join().unwrap();
        assert!(listed.as_ref().is_ok_and(|&n| n > 0), "{listed:?}");
    }
    // Time for its last line (every 0.2 s) before the mounts go.
    std::thread::sleep(Duration::from_secs(2));
    let exit = job.unmount_within(Duration::from_secs(60));
    assert!(exit.is_some_and(|s| s.success()), "{exit:?}");
    followed(follow, stderr);
}

/// Watches rank 1's row in rank 0's mount during the exchange into epoch 1: fresh every
/// time, it shows two different bytes-done values (0 included) before the exchange ends.
fn rows_move(job: &MpiJob) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut seen: Vec<u64> = Vec::new();
    while seen.len() < 2 {
        let row = job.status(0)["job"]["ranks"][1].clone();
        // Running until its last byte moved: a rank that holds what it needs reports its
        // exchange done while its own (paced) sends still go out.
        let moving = |x: &serde_json::Value| {
            let n = |k: &str| x[k].as_u64().unwrap_or(0);
            x["state"] == "running"
                || n("bytes_sent") + n("bytes_received")
                    < n("bytes_to_send") + n("bytes_to_receive")
        };
        let running = exchange(&job.status(1), 1).is_some_and(moving);
        let x = &row["exchange"];
        let (done, total) = (x["done_bytes"].as_u64(), x["total_bytes"].as_u64());
        if running && x["into_epoch"] == 1 {
            assert!(
                row.get("stale_s").is_none(),
                "stale during the exchange: {row:#}"
            );
            // 0 counts: a fresh row of a running exchange that shows 0 and later more has
            // moved. (Each stream is one frame here, so a rank with two peers shows few
            // values between 0 and done; which ones depends on the plan's streams.)
            let done = done.filter(|&d| Some(d) < total);
            if let Some(done) = done.filter(|&d| seen.last() != Some(&d)) {
                seen.push(done);
            }
        }
        assert!(
            (running || seen.is_empty()) && Instant::now() < deadline,
            "rank 1's row did not move during the exchange (seen {seen:?}): {row:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    seen
}

type Stderr = std::thread::JoinHandle<String>;

/// `python3 -m shufflefs.progress --follow` over the job's mounts, lines every 0.2 s.
fn follow(job: &MpiJob) -> (std::process::Child, Stderr) {
    let mut follow = Command::new("python3")
        .args(["-m", "shufflefs.progress", "--follow"])
        .args(&job.mounts)
        .env("PYTHONPATH", repo().join("python"))
        .env("SHUFFLEFS_PROGRESS_EVERY", "0.2")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let err = follow.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    (follow, stderr)
}

/// `--follow` ended with the mounts, after lines for the advance into epoch 1.
fn followed(mut follow: std::process::Child, stderr: Stderr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = follow.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = follow.kill();
            panic!("progress --follow did not end with the mounts");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = stderr.join().unwrap();
    let lines: Vec<&str> = (stderr.lines())
        .filter(|l| l.starts_with("exchange into epoch 1"))
        .collect();
    assert!(status.success(), "{stderr}");
    assert!(lines.len() >= 2, "{stderr}");
    let last = lines.last().unwrap();
    assert!(
        last.contains("100%") && last.ends_with("(3 ranks)"),
        "{stderr}"
    );
}
