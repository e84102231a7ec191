//! The live coded exchange's issue-29 behaviour under a real `mpirun -np 1 shufflefs serve :
//! -np 4 shufflefs mount --exchange coded`: packets paired by size send at most 0.45 of the
//! uncoded bytes on varied sizes (reported in the status, as is every rank's real
//! `bytes_to_receive`), and a server killed in the middle of an exchange ends the job on
//! every rank (a clear message, no mount left, no daemon left waiting), after which the same
//! job started again resumes.

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::coded_mpi::{ALPHA, RANKS, SEED, advance, launcher, listing, planned, source};
use crate::common::mpi_job::{MpiJob, exchange, wait_all};
use crate::common::*;

/// `count` files over 4 classes with log-normal sizes of mean `mean` bytes and coefficient of
/// variation 0.5 (as `benches/coded_packet.rs` draws them), a function of the index.
fn varied_source(dir: &Path, count: u32, mean: f64) {
    for i in 0..count {
        let h = |k: u64| {
            let x = (u64::from(i) << 8 ^ k).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let z = (-2.0 * h(1).ln()).sqrt() * (std::f64::consts::TAU * h(2)).cos();
        let var = (1.0f64 + 0.25).ln();
        let len = (mean * (z * var.sqrt() - var / 2.0).exp()) as usize;
        let d = dir.join("src").join(format!("class{}", i % 4));
        std::fs::create_dir_all(&d).unwrap();
        let bytes: Vec<u8> = (0..len)
            .map(|o| (o as u32 ^ i.wrapping_mul(31)) as u8)
            .collect();
        std::fs::write(d.join(format!("{i:05}.bin")), bytes).unwrap();
    }
}

/// Bytes of the samples `rank` lacks of its share of `epoch` (what the exchange into it
/// must bring), from the source files.
fn missing_bytes(src: &Path, rank: usize, epoch: u64) -> u64 {
    let m = shufflefs::dataset::scan::scan(src).unwrap();
    let params = shufflefs::plan::PlanParams {
        samples: m.len(),
        world: RANKS,
        fraction: 0.0,
        seed: SEED,
    };
    let plan = shufflefs::plan::Plan::coded(params, ALPHA).unwrap();
    let p = plan.coded_shares().unwrap().placement_at(epoch - 1);
    let share = p.shares(epoch).swap_remove(rank);
    (share.difference(&p.caches()[rank]))
        .map(|&id| {
            std::fs::metadata(src.join(m.relative_path(id)))
                .unwrap()
                .len()
        })
        .sum()
}

/// on samples of varied sizes (CV 0.5) the live server pairs them into packets by
/// size and sends at most 0.45 of what the uncoded scheme would (the status says both, the
/// same on every rank); each rank's `bytes_to_receive` is the real size of what it lacked,
/// though it never read those samples (a scanned source: the manifest has no sizes).
#[test]
fn the_live_server_pairs_varied_sizes_and_reports_its_bytes() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    varied_source(tmp.path(), 2000, 10_000.0);
    let src = tmp.path().join("src");
    let alpha = ALPHA.to_string();
    let extra = ["--exchange", "coded", "--cache-fraction", &alpha];
    let mut job = MpiJob::start_with(launcher(tmp.path()), tmp.path(), RANKS, SEED, 0.3, &extra);
    for epoch in 1..=2u64 {
        advance(&job, epoch);
        wait_all(&job, "the exchange into the next epoch", |st| {
            exchange(st, epoch).is_some_and(|x| x["state"] == "done")
        });
        let mut totals = Vec::new();
        for r in 0..RANKS as usize {
            let st = job.status(r);
            let x = exchange(&st, epoch).unwrap();
            let c = &x["coded"];
            let (sent, uncoded) = (
                c["server_packet_bytes"].as_u64().unwrap(),
                c["uncoded_packet_bytes"].as_u64().unwrap(),
            );
            let ratio = sent as f64 / uncoded as f64;
            eprintln!("epoch {epoch} rank {r}: server {sent} B, uncoded {uncoded} B, {ratio:.3}");
            assert!(sent > 0 && ratio <= 0.45, "rank {r} epoch {epoch}: {c}");
            totals.push((sent, uncoded));
            let want = missing_bytes(&src, r, epoch);
            assert!(want > 0);
            assert_eq!(x["bytes_to_receive"], want, "rank {r} epoch {epoch}: {x}");
        }
        assert!(totals.windows(2).all(|w| w[0] == w[1]), "{totals:?}");
    }
    let status = job.unmount_within(Duration::from_secs(60));
    let log = std::fs::read_to_string(tmp.path().join("job.log")).unwrap_or_default();
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{log}");
    assert!(log.contains("uncoded_bytes="), "{log}");
}

/// The server SIGKILLed while every compute rank waits on it in the exchange into epoch 2:
/// each rank sees the server's process gone, gives the exchange up with a message naming the
/// server, unmounts and exits; nothing stays mounted or running, and the job ends. The same job started again resumes at epoch 1 with the
/// planned listings and goes on.
#[test]
fn the_server_killed_mid_exchange_ends_every_rank_and_a_restart_resumes() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    source(tmp.path());
    let src = tmp.path().join("src");
    let extra = ["--exchange", "coded", "--cache-fraction", "0.5"];
    let mut job = MpiJob::start_with(launcher(tmp.path()), tmp.path(), RANKS, SEED, 0.3, &extra);
    wait_all(&job, "the exchange into epoch 1", |st| {
        exchange(st, 1).is_some_and(|x| x["state"] == "done")
    });
    let pids: Vec<i32> = (0..RANKS as usize)
        .map(|r| job.status(r)["pid"].as_i64().unwrap() as i32)
        .collect();
    // The server stopped (SIGSTOP), every rank moves on to epoch 1: each one's exchange
    // into 2 starts and waits on the server. Then the server dies.
    signal_server(&src, Signal::SIGSTOP);
    for m in &job.mounts {
        std::fs::write(m.join(".shufflefs/epoch"), "1\n").unwrap();
    }
    wait_all(
        &job,
        "every rank waiting in the exchange into epoch 2",
        |st| exchange(st, 2).is_some_and(|x| x["state"] == "running"),
    );
    signal_server(&src, Signal::SIGKILL);
    let ended = job.wait_within(Duration::from_secs(30));
    let log = std::fs::read_to_string(tmp.path().join("job.log")).unwrap_or_default();
    let ended =
        ended.unwrap_or_else(|| panic!("the job still runs 30 s after the server died\n{log}"));
    assert!(!ended.success(), "{ended:?}\n{log}");
    let gone = "the coded-shuffle server (world rank 0) is gone in the middle of the exchange into epoch 2";
    assert_eq!(
        log.matches(gone).count(),
        RANKS as usize,
        "every rank says so\n{log}"
    );
    for m in &job.mounts {
        assert!(!is_mounted(m), "{} is still mounted\n{log}", m.display());
    }
    for pid in pids {
        assert!(
            wait_pid_gone(pid, Duration::from_secs(10)),
            "daemon {pid} still runs"
        );
    }
    drop(job);

    let job = MpiJob::start_with(launcher(tmp.path()), tmp.path(), RANKS, SEED, 0.3, &extra);
    wait_all(&job, "the resumed epoch", |st| st["epoch"] == 1);
    assert_eq!(listing(&job, &src, 1), planned(&src, 1), "resumed epoch 1");
    advance(&job, 2);
    assert_eq!(
        listing(&job, &src, 2),
        planned(&src, 2),
        "epoch 2 after the resume"
    );
    for r in 0..RANKS as usize {
        let st = job.status(r);
        assert_eq!(exchange(&st, 2).unwrap()["state"], "done", "rank {r}: {st}");
    }
    job.unmount();
}

/// `signal` to the `shufflefs serve` process reading `src` alone (not the launcher, whose
/// command line names it too).
fn signal_server(src: &Path, signal: Signal) {
    let want = src.to_string_lossy().into_owned();
    let mut found = 0;
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
        let server = args.first().is_some_and(|a| a == BIN)
            && args.get(1).is_some_and(|a| a == "serve")
            && args.contains(&want);
        if server {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).unwrap();
            found += 1;
        }
    }
    assert_eq!(found, 1, "one server process");
}
