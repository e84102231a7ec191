//! Real `mpirun -np 4` with real mounts: listings partition the dataset every epoch, bytes
//! match the source, caches stay within (1+Q) x share; Q=0 never changes a listing; a rank
//! started with other settings is refused on every rank with nothing left mounted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shufflefs::sys::mounts::is_mounted;

use crate::common::{require_fuse, require_mpi};

const RANKS: u32 = 4;

fn mpirun() -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["--oversubscribe"]);
    cmd
}

/// A 4-rank job; unmounts every rank and reaps mpirun on drop.
struct Job {
    child: Child,
    mounts: Vec<PathBuf>,
    _dir: tempfile::TempDir,
    source: PathBuf,
}

impl Job {
    fn start(fraction: f64, source_files: &[(&str, usize, usize)]) -> Job {
        Job::start_in(fraction, source_files, "files")
    }

    /// As `start`, with the caches in `--cache-layout layout`.
    fn start_in(fraction: f64, source_files: &[(&str, usize, usize)], layout: &str) -> Job {
        Job::start_with_layout(fraction, 5, layout, |source| {
            for &(class, count, size) in source_files {
                std::fs::create_dir_all(source.join(class)).unwrap();
                for i in 0..count {
                    let len = (size * (i % 7 + 1)) / 4;
                    let bytes: Vec<u8> = (0..len)
                        .map(|o| (o as u64 * 31 + i as u64 * 7 + class.len() as u64) as u8)
                        .collect();
                    std::fs::write(source.join(class).join(format!("{i:04}.png")), bytes).unwrap();
                }
            }
        })
    }

    fn start_with(fraction: f64, seed: u64, build: impl FnOnce(&Path)) -> Job {
        Job::start_with_layout(fraction, seed, "files", build)
    }

    fn start_with_layout(fraction: f64, seed: u64, layout: &str, build: impl FnOnce(&Path)) -> Job {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("src");
        build(&source);
        let mounts: Vec<PathBuf> = (0..RANKS)
            .map(|r| dir.path().join(format!("mnt{r}")))
            .collect();
        mounts.iter().for_each(|m| std::fs::create_dir(m).unwrap());
        let child = mpirun()
            .args([
                "-np",
                &RANKS.to_string(),
                env!("CARGO_BIN_EXE_shufflefs"),
                "mount",
                "--seed",
                &seed.to_string(),
            ])
            .arg("--fraction")
            .arg(fraction.to_string())
            .args(["--cache-layout", layout])
            .arg("--source")
            .arg(&source)
            .arg("--cache")
            .arg(dir.path().join("cache{rank}"))
            .arg(dir.path().join("mnt{rank}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let job = Job {
            child,
            mounts,
            _dir: dir,
            source,
        };
        let deadline = Instant::now() + Duration::from_secs(180);
        while !job
            .mounts
            .iter()
            .all(|m| m.join(".shufflefs/status").exists())
        {
            assert!(Instant::now() < deadline, "ranks did not mount in time");
            std::thread::sleep(Duration::from_millis(100));
        }
        job
    }

    /// `class/name -> rank` for `epoch`, reading every byte and comparing with the source.
    fn listing(&self, epoch: u64) -> BTreeMap<String, u32> {
        let mut owners = BTreeMap::new();
        for (rank, m) in self.mounts.iter().enumerate() {
            let dir = m.join(format!("epoch-{epoch}"));
            let mut classes: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            classes.sort();
            let expected: Vec<_> = {
                let mut v: Vec<_> = std::fs::read_dir(&self.source)
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect();
                v.sort();
                v
            };
            assert_eq!(
                classes, expected,
                "rank {rank} epoch {epoch}: every class is listed"
            );
            for class in classes {
                for f in std::fs::read_dir(dir.join(&class)).unwrap() {
                    let f = f.unwrap();
                    let key = format!(
                        "{}/{}",
                        class.to_string_lossy(),
                        f.file_name().to_string_lossy()
                    );
                    let got = std::fs::read(f.path()).unwrap();
                    let want = std::fs::read(self.source.join(&key)).unwrap();
                    assert!(
                        got == want,
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

    fn status(&self, rank: usize) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.mounts[rank].join(".shufflefs/status")).unwrap())
            .unwrap()
    }

    fn advance(&self, epoch: u64) {
        for m in &self.mounts {
            std::fs::write(m.join(".shufflefs/epoch"), format!("{epoch}\n")).unwrap();
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for m in &self.mounts {
            let _ = Command::new(env!("CARGO_BIN_EXE_shufflefs"))
                .arg("unmount")
                .arg(m)
                .arg("--timeout")
                .arg("20")
                .output();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for m in &self.mounts {
            if is_mounted(m) {
                let _ = Command::new("fusermount3").arg("-uz").arg(m).status();
            }
        }
    }
}

#[test]
fn four_ranks_partition_and_exchange_over_epochs() {
    partition_and_exchange_over_epochs("files");
}

/// The same with packed caches: samples move between segment files, whose ranks share a
/// host but exchange through MPI (no sample files to take from each other's caches).
#[test]
fn four_ranks_partition_and_exchange_over_epochs_with_packed_caches() {
    partition_and_exchange_over_epochs("packed");
}

fn partition_and_exchange_over_epochs(layout: &str) {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let job = Job::start_in(
        0.3,
        &[
            ("cat", 60, 40_000),
            ("dog", 50, 90_000),
            ("empty", 0, 0),
            ("eel", 3, 10),
        ],
        layout,
    );
    let total: usize = 113;
    let mut previous: Option<BTreeMap<String, u32>> = None;
    for epoch in 0..3u64 {
        let owners = job.listing(epoch);
        assert_eq!(owners.len(), total, "epoch {epoch} covers the dataset");
        let mut per_rank = [0usize; RANKS as usize];
        owners.values().for_each(|&r| per_rank[r as usize] += 1);
        assert!(
            per_rank.iter().max().unwrap() - per_rank.iter().min().unwrap() <= 1,
            "balanced: {per_rank:?}"
        );
        if let Some(prev) = &previous {
            let moved = owners.iter().filter(|(k, r)| prev[*k] != **r).count();
            assert!(moved > 0, "Q=0.3 moves samples between epochs");
            assert!(
                moved <= (0.3 * total as f64).ceil() as usize,
                "moved {moved} of {total} at Q=0.3"
            );
        }
        for rank in 0..RANKS as usize {
            let st = job.status(rank);
            assert_eq!(st["epoch"], epoch);
            assert_eq!(st["cache"]["layout"], layout);
            assert_eq!(st["world_size"], RANKS);
            let share = st["share_samples"].as_u64().unwrap();
            let cached = st["cache"]["files"].as_u64().unwrap();
            assert!(
                cached as f64 <= (1.3 * share as f64).ceil() + 1.0,
                "rank {rank}: {cached} cached for a share of {share}"
            );
        }
        previous = Some(owners);
        job.advance(epoch + 1);
    }
    // The exchange into the next epoch is reported in the status.
    let exchanges = job.status(0)["exchange"].as_array().unwrap().clone();
    assert!(
        exchanges
            .iter()
            .any(|x| x["state"] == "done" && x["samples_received"].as_u64().unwrap() > 0),
        "{exchanges:?}"
    );
}

#[test]
fn zero_fraction_keeps_every_listing() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let job = Job::start(0.0, &[("a", 20, 1000), ("b", 21, 500)]);
    let first = job.listing(0);
    for epoch in 1..3 {
        job.advance(epoch);
        assert_eq!(job.listing(epoch), first, "Q=0 epoch {epoch}");
    }
}

#[test]
fn rank_with_other_seed_is_refused_everywhere() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("src");
    std::fs::create_dir_all(source.join("c")).unwrap();
    std::fs::write(source.join("c/x.png"), b"x").unwrap();
    let mounts: Vec<PathBuf> = (0..RANKS)
        .map(|r| dir.path().join(format!("mnt{r}")))
        .collect();
    mounts.iter().for_each(|m| std::fs::create_dir(m).unwrap());
    let bin = env!("CARGO_BIN_EXE_shufflefs");
    let common = |seed: &str| {
        vec![
            bin.to_string(),
            "mount".into(),
            "--seed".into(),
            seed.into(),
            "--source".into(),
            source.display().to_string(),
            "--cache".into(),
            dir.path().join("cache{rank}").display().to_string(),
            dir.path().join("mnt{rank}").display().to_string(),
        ]
    };
    let out = mpirun()
        .args(["-np", "3"])
        .args(common("1"))
        .arg(":")
        .args(["-np", "1"])
        .args(common("2"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a mismatched --seed must fail the job"
    );
    assert!(
        stderr.contains("rank 3 was started with --seed 2, rank 0 with 1"),
        "stderr: {stderr}"
    );
    for m in &mounts {
        assert!(!is_mounted(m), "{} left mounted", m.display());
    }
}

/// A sample over 2 GiB (MPI counts are 32-bit) moves between ranks bit-exact.
#[test]
fn sample_over_two_gib_moves_between_ranks() {
    use shufflefs::plan::{Plan, PlanParams};
    use std::os::unix::fs::FileExt;
    if !require_fuse() || !require_mpi() {
        return;
    }
    const BIG: u64 = (2 << 30) + 12_345;
    // Ids follow (class, name) order: class "big" comes first, so the big sample is id 0.
    let seed = (0..1000u64)
        .find(|&seed| {
            let plan = Plan::new(PlanParams {
                samples: 8,
                world: RANKS,
                fraction: 1.0,
                seed,
            })
            .unwrap();
            let owner = |e: u64| {
                (0..RANKS)
                    .find(|&r| plan.shares_at(e).share(r).contains(&0))
                    .unwrap()
            };
            owner(0) != owner(1)
        })
        .unwrap();
    let job = Job::start_with(1.0, seed, |source| {
        std::fs::create_dir_all(source.join("big")).unwrap();
        std::fs::create_dir_all(source.join("small")).unwrap();
        let f = std::fs::File::create(source.join("big/huge.bin")).unwrap();
        f.set_len(BIG).unwrap();
        // Sparse, with markers around the 2 GiB boundary and at both ends.
        for (off, mark) in [
            (0u64, &b"start"[..]),
            ((2 << 30) - 3, b"across"),
            (BIG - 3, b"end"),
        ] {
            f.write_all_at(mark, off).unwrap();
        }
        for i in 0..7 {
            std::fs::write(source.join(format!("small/{i}.bin")), vec![i as u8; 1000]).unwrap();
        }
    });
    job.advance(1);
    let holder = job
        .mounts
        .iter()
        .find(|m| m.join("epoch-1/big/huge.bin").exists())
        .expect("someone holds the big sample");
    let (mut a, mut b) = (
        std::fs::File::open(holder.join("epoch-1/big/huge.bin")).unwrap(),
        std::fs::File::open(job.source.join("big/huge.bin")).unwrap(),
    );
    assert_eq!(a.metadata().unwrap().len(), BIG);
    let (mut x, mut y) = (vec![0u8; 8 << 20], vec![0u8; 8 << 20]);
    loop {
        let n = std::io::Read::read(&mut a, &mut x).unwrap();
        std::io::Read::read_exact(&mut b, &mut y[..n]).unwrap();
        assert!(x[..n] == y[..n], "big sample differs");
        if n == 0 {
            break;
        }
    }
    let received: u64 = job
        .mounts
        .iter()
        .enumerate()
        .map(|(r, _)| {
            job.status(r)["exchange"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|x| x["target_epoch"] == 1)
                .map(|x| x["bytes_received"].as_u64().unwrap())
                .sum::<u64>()
        })
        .sum();
    assert!(
        received >= BIG,
        "the big sample travelled through the exchange ({received} bytes received)"
    );
}
