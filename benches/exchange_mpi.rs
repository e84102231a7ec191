//! Exchange throughput under real MPI, against an MPI baseline of the same bytes measured in
//! the same run. Launched by `benches/exchange.sh` (mpirun -np 4); alone it only explains.
//!
//! Each rank builds a synthetic dataset's cache (its epoch-0 share, on local disk), then:
//! * baseline: the exact frames the exchange would move (same peers, same sizes, same rounds),
//!   sent from memory with `Comm::transfer` on owned, reused buffers, as the executor sends
//!   them — MPI point-to-point with no disk and no copy;
//! * exchange: `exchange::run` for epoch 0 -> 1 — reading samples from the cache, framing,
//!   MPI, and writing every received sample as a cache file (temp + rename).
//!
//! Rates are total bytes (or samples) moved by all ranks divided by the slowest rank's time.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use shufflefs::cache::{CacheDir, SampleStore};
use shufflefs::comm::{Batch, Comm, MpiComm, launched_by_mpi};
use shufflefs::dataset::SyntheticSource;
use shufflefs::dataset::manifest::Manifest;
use shufflefs::exchange::{self, ExchangeConfig, ExchangeTracker, FRAME};
use shufflefs::plan::{Plan, PlanParams, Step};

fn barrier(comm: &mut dyn Comm) {
    comm.all_gather(&[]).unwrap();
}

/// Slowest rank's seconds.
fn max_time(comm: &mut dyn Comm, secs: f64) -> f64 {
    let all = comm.all_gather(&secs.to_le_bytes()).unwrap();
    all.iter()
        .map(|b| f64::from_le_bytes(b.as_slice().try_into().unwrap()))
        .fold(0.0, f64::max)
}

/// The baseline: the same per-pair byte counts and frames, straight from memory.
fn baseline(comm: &mut dyn Comm, manifest: &Manifest, step: &Step) -> f64 {
    let (me, world) = (comm.rank(), comm.size());
    let len = |from: u32, to: u32| {
        step.transfers
            .iter()
            .filter(|t| t.from == from && t.to == to)
            .map(|t| manifest.size(t.sample).unwrap_or(0) + 4)
            .sum::<u64>()
    };
    let (mut send_buf, mut recv_buf) = (vec![7u8; FRAME], vec![0u8; FRAME]);
    let abort = AtomicBool::new(false);
    barrier(comm);
    let t0 = Instant::now();
    for d in 1..world {
        let (to, from) = ((me + d) % world, (me + world - d) % world);
        let (out_len, in_len) = (len(me, to), len(from, me));
        let frames = |l: u64| l.div_ceil(FRAME as u64);
        for i in 0..frames(out_len).max(frames(in_len)) {
            let o = out_len.saturating_sub(i * FRAME as u64).min(FRAME as u64) as usize;
            let n = in_len.saturating_sub(i * FRAME as u64).min(FRAME as u64) as usize;
            send_buf.resize(o, 7);
            recv_buf.resize(n, 0);
            let take = |buf: &mut Vec<u8>, peer| vec![(peer, std::mem::take(buf))];
            let batch = Batch {
                sends: if o > 0 {
                    take(&mut send_buf, to)
                } else {
                    Vec::new()
                },
                recvs: if n > 0 {
                    take(&mut recv_buf, from)
                } else {
                    Vec::new()
                },
            };
            let mut done = comm.transfer(1, batch, &abort).unwrap();
            // The buffers come back for the next frame.
            if let Some((_, b)) = done.sends.pop() {
                send_buf = b;
            }
            if let Some((_, b)) = done.recvs.pop() {
                recv_buf = b;
            }
        }
    }
    max_time(comm, t0.elapsed().as_secs_f64())
}

/// The disk floor: each rank writes the bytes it will receive as cache files, no MPI at all.
fn disk_floor(
    comm: &mut dyn Comm,
    manifest: &Arc<Manifest>,
    step: &Step,
    dir: &std::path::Path,
) -> f64 {
    let _ = std::fs::remove_dir_all(dir);
    let source = Arc::new(SyntheticSource {
        manifest: manifest.clone(),
    });
    let store = SampleStore::new(CacheDir::open(dir).unwrap(), manifest.clone(), source).unwrap();
    let incoming: Vec<u32> = step
        .transfers
        .iter()
        .filter(|t| t.to == comm.rank())
        .map(|t| t.sample)
        .collect();
    let buf = vec![
        3u8;
        incoming
            .iter()
            .map(|&i| manifest.size(i).unwrap_or(0))
            .max()
            .unwrap_or(0) as usize
    ];
    barrier(comm);
    let t0 = Instant::now();
    for id in incoming {
        let len = manifest.size(id).unwrap_or(0) as usize;
        store
            .insert_with(id, |f| f.write_all(&buf[..len]).map(|()| None))
            .unwrap();
    }
    let secs = max_time(comm, t0.elapsed().as_secs_f64());
    let _ = std::fs::remove_dir_all(dir);
    secs
}

fn scenario(
    comm: &mut dyn Comm,
    name: &str,
    samples: u32,
    size: u64,
    fraction: f64,
    tmp: &std::path::Path,
) {
    let world = comm.size();
    let classes = (0..10)
        .map(|c| {
            (
                format!("c{c}").into_bytes(),
                (0..samples / 10)
                    .map(|i| (format!("{i:07}").into_bytes(), size))
                    .collect(),
            )
        })
        .collect();
    let manifest = Arc::new(Manifest::from_parts(classes).unwrap());
    let plan = Plan::new(PlanParams {
        samples: manifest.len(),
        world,
        fraction,
        seed: 11,
    })
    .unwrap();
    let dir = tmp.join(format!("{name}-rank{}", comm.rank()));
    let _ = std::fs::remove_dir_all(&dir);
    let source = Arc::new(SyntheticSource {
        manifest: manifest.clone(),
    });
    let store = SampleStore::new(CacheDir::open(&dir).unwrap(), manifest.clone(), source).unwrap();
    let cur = plan.initial();
    for &id in cur.share(comm.rank()) {
        store.ensure(id).unwrap();
    }
    let step = plan.step(&cur);
    let bytes: u64 = step
        .transfers
        .iter()
        .filter_map(|t| manifest.size(t.sample))
        .sum();
    let moved = step.transfers.len() as f64;
    let base = baseline(comm, &manifest, &step);
    let floor_dir = tmp.join(format!("{name}-floor-rank{}", comm.rank()));
    let floor = disk_floor(comm, &manifest, &step, &floor_dir);
    // Written pages of the staged share would otherwise still be in flight during the exchange.
    nix::unistd::sync();
    barrier(comm);
    let t0 = Instant::now();
    let tracker = ExchangeTracker::default();
    exchange::run(
        comm,
        &store,
        &step,
        ExchangeConfig::default(),
        &tracker,
        &AtomicBool::new(false),
    )
    .unwrap();
    let exch = max_time(comm, t0.elapsed().as_secs_f64());
    if comm.rank() == 0 {
        let rate = |secs: f64| bytes as f64 / secs / 1e6;
        println!(
            "| {name} | {samples} x {size} B, Q={fraction} | {moved:.0} | {:.0} MB/s | {:.0} MB/s | {:.0} MB/s | {:.2}x | {:.2}x | {:.0} |",
            rate(base),
            rate(floor),
            rate(exch),
            exch.recip() / base.recip(),
            exch.recip() / floor.recip(),
            moved / exch
        );
    }
    barrier(comm);
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    if !launched_by_mpi() {
        println!("exchange_mpi: run it under MPI with `bash benches/exchange.sh` (4 ranks).");
        return;
    }
    let mut comm = MpiComm::init().unwrap();
    let tmp = std::env::var_os("SHUFFLEFS_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    if comm.rank() == 0 {
        println!("ranks: {}, cache under {}", comm.size(), tmp.display());
        println!(
            "| scenario | dataset | samples moved | MPI p2p baseline | disk floor | exchange | exchange / MPI | exchange / disk | exchange samples/s |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
    }
    scenario(&mut comm, "100KB", 8000, 100_000, 1.0, &tmp);
    scenario(&mut comm, "4KB", 100_000, 4096, 1.0, &tmp);
}
