//! Exchange throughput under real MPI, against an MPI baseline of the same bytes measured in
//! the same run. Launched by `benches/exchange.sh` (mpirun -np 4); alone it only explains.
//!
//! Each rank builds a synthetic dataset's cache (its epoch-0 share, on local disk), then:
//! * baseline: the bytes the exchange moves between each pair, in frames of the same size,
//!   every peer at once with two frames in flight per stream (as the executor keeps them),
//!   sent from memory on reused buffers — MPI point-to-point with no disk and no copy;
//! * link floor (on shaped links, `SHUFFLEFS_LINK_BYTES_PER_S`): the busiest host link's
//!   bytes across hosts divided by its rate;
//! * exchange: `exchange::run` for epoch 0 -> 1 — reading samples from the cache, framing,
//!   MPI, and writing every received sample into the cache (`--cache-layout files`: a file
//!   each, temp + rename; `packed`: records appended to segment files).
//!
//! Rates are total bytes (or samples) moved by all ranks divided by the slowest rank's time.
//! Every scenario runs once per cache layout (`LAYOUTS=files,packed`, the default), and each
//! row's byte rate is also given as a share of the 100 KB scenario's with the same layout and
//! with `files` (run 100KB first: `SCENARIOS` keeps the order 100KB, 4KB, 362B, 362B-pages), which is how
//! The target: small records should cost no more per byte than 100 KB samples
//! (at least 0.8x their byte rate) with the packed layout.
//!
//! Last results (6eba297, 2-core VM shared with other builds; README "Performance" has both
//! runs and what they mean), byte rate vs 100 KB in the same layout, wall / per CPU second:
//!
//! | cache on | 100 KB files | 100 KB packed | 4 KB files | 4 KB packed | 362 B files | 362 B packed |
//! |---|---|---|---|---|---|---|
//! | ext4  | 244 MB/s | 521 MB/s | 55 MB/s, 0.23x / 0.18x | 416 MB/s, 0.80x / 0.73x | 9 MB/s, 0.04x / 0.01x | 321 MB/s (887k rec/s), 0.62x / 0.31x |
//! | tmpfs | 439 MB/s | 510 MB/s | 166 MB/s, 0.38x / 0.35x | 634 MB/s, 1.24x / 0.67x | 18 MB/s, 0.04x / 0.04x | 218 MB/s (603k rec/s), 0.43x / 0.41x |
//! | ext4, f86327b | 583 MB/s | 458 MB/s | 68 MB/s, 0.12x / 0.22x | 441 MB/s, 0.96x / 0.85x | 4 MB/s, 0.01x / 0.01x | 325 MB/s (897k rec/s), 0.71x / 0.37x |
//!
//! After 6cc3422 (tracker counts per 512 samples, batch insert of received runs, batch read
//! of sent runs), packed only, `SCENARIOS=100KB,362B LAYOUTS=packed mpirun -np 4
//! --oversubscribe` this binary, ext4, 2-core VM shared with other work, alternating with
//! main's (7ea41ea) binary, seven runs each: 362 B packed 402-530 MB/s (mean 484), 0.49x-0.61x
//! wall (mean 0.57x) / 0.41x-0.52x per CPU-s (mean 0.48x) of 100 KB packed (822-898 MB/s);
//! main in the same sequences 397-500 MB/s (mean 446), 0.47x-0.56x (mean 0.52x) / 0.35x-0.45x
//! (mean 0.40x), 100 KB 818-907 MB/s. Still short of 0.8x; see the README.
//!
//! `362B-pages` is the same 400000 records as `--group pages` (the default) exchanges them:
//! page groups of ~11 records. Two runs, packed, ext4, idle 2-core VM: 1.00x / 0.87x wall,
//! 0.91x / 0.85x per CPU-s of 100 KB packed (target met), while `362B` (`--group records`)
//! measured 0.59x / 0.68x wall in the same runs.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use shufflefs::cache::{CacheDir, CacheLayout, SampleStore};
use shufflefs::comm::{Comm, Contract, MpiComm, Op, TcpComm, launched_by_mpi};
use shufflefs::dataset::SyntheticSource;
use shufflefs::dataset::manifest::Manifest;
use shufflefs::dataset::records::PAGE;
use shufflefs::exchange::{self, ExchangeConfig, ExchangeTracker, FRAME, StrategyKind};
use shufflefs::plan::{Plan, PlanParams, Step};

fn barrier(comm: &mut dyn Comm) {
    comm.all_gather(&[]).unwrap();
}

/// CPU seconds (user + system, all threads) this process has used so far.
fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF covers every thread.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// All ranks' `secs` added up.
fn sum(comm: &mut dyn Comm, secs: f64) -> f64 {
    let all = comm.all_gather(&secs.to_le_bytes()).unwrap();
    all.iter()
        .map(|b| f64::from_le_bytes(b.as_slice().try_into().unwrap()))
        .sum()
}

/// Slowest rank's seconds.
fn max_time(comm: &mut dyn Comm, secs: f64) -> f64 {
    let all = comm.all_gather(&secs.to_le_bytes()).unwrap();
    all.iter()
        .map(|b| f64::from_le_bytes(b.as_slice().try_into().unwrap()))
        .fold(0.0, f64::max)
}

/// Bytes each rank sends to each other rank in `step` (samples plus their checksums).
fn pair_bytes(manifest: &Manifest, step: &Step, world: u32) -> Vec<Vec<u64>> {
    let mut out = vec![vec![0u64; world as usize]; world as usize];
    for t in &step.transfers {
        out[t.from as usize][t.to as usize] += manifest.size(t.sample).unwrap_or(0) + 4;
    }
    out
}

/// The baseline: the same bytes between the same pairs, straight from memory, every peer at
/// once with two frames in flight per stream, as the exchange moves them: MPI point-to-point
/// with no disk and no copy. Returns the slowest rank's seconds and all ranks' CPU seconds.
fn baseline(comm: &mut dyn Comm, pairs: &[Vec<u64>]) -> (f64, f64) {
    const IN_FLIGHT: usize = 2;
    let (me, world) = (comm.rank() as usize, comm.size() as usize);
    let abort = AtomicBool::new(false);
    let frames = |l: u64| l.div_ceil(FRAME as u64) as usize;
    let frame_len = |l: u64, i: usize| (l - (i * FRAME) as u64).min(FRAME as u64) as usize;
    // Per peer: (frames to send, posted, done), (frames to receive, posted, done).
    let mut out: Vec<(usize, usize, usize)> =
        (0..world).map(|p| (frames(pairs[me][p]), 0, 0)).collect();
    let mut inc: Vec<(usize, usize, usize)> =
        (0..world).map(|p| (frames(pairs[p][me]), 0, 0)).collect();
    out[me] = (0, 0, 0);
    inc[me] = (0, 0, 0);
    let mut free: Vec<Vec<u8>> = Vec::new();
    let mut slots: std::collections::HashMap<u64, (bool, usize)> = Default::default();
    barrier(comm);
    let t0 = Instant::now();
    let cpu0 = cpu_seconds();
    loop {
        for p in 0..world {
            while inc[p].1 < IN_FLIGHT && inc[p].1 + inc[p].2 < inc[p].0 {
                let mut buf = free.pop().unwrap_or_default();
                buf.resize(frame_len(pairs[p][me], inc[p].1 + inc[p].2), 0);
                let t = comm.post(Op::recv(p as u32, 1, buf)).unwrap();
                slots.insert(t, (false, p));
                inc[p].1 += 1;
            }
            while out[p].1 < IN_FLIGHT && out[p].1 + out[p].2 < out[p].0 {
                let mut buf = free.pop().unwrap_or_default();
                buf.resize(frame_len(pairs[me][p], out[p].1 + out[p].2), 7);
                let t = comm.post(Op::send(p as u32, 1, buf)).unwrap();
                slots.insert(t, (true, p));
                out[p].1 += 1;
            }
        }
        if slots.is_empty() {
            break;
        }
        for done in comm
            .progress(std::time::Duration::from_millis(2), &abort)
            .unwrap()
        {
            let (sent, p) = slots.remove(&done.ticket).unwrap();
            let s = if sent { &mut out[p] } else { &mut inc[p] };
            (s.1, s.2) = (s.1 - 1, s.2 + 1);
            free.push(done.buf);
        }
    }
    let secs = max_time(comm, t0.elapsed().as_secs_f64());
    (secs, sum(comm, cpu_seconds() - cpu0))
}

/// Seconds the busiest host link needs for the bytes that cross hosts, at `rate` bytes/s
/// each way per host (what the emulated cluster shapes).
fn link_floor(comm: &dyn Comm, pairs: &[Vec<u64>], rate: f64) -> f64 {
    let hosts = comm.hosts();
    let n = hosts.iter().max().map_or(0, |&h| h as usize + 1);
    let (mut up, mut down) = (vec![0u64; n], vec![0u64; n]);
    for (a, row) in pairs.iter().enumerate() {
        for (b, &bytes) in row.iter().enumerate() {
            if hosts[a] != hosts[b] {
                up[hosts[a] as usize] += bytes;
                down[hosts[b] as usize] += bytes;
            }
        }
    }
    up.iter()
        .chain(&down)
        .map(|&b| b as f64 / rate)
        .fold(0.0, f64::max)
}

/// A store of `layout` in `dir` over the synthetic source.
fn store_in(dir: &std::path::Path, manifest: &Arc<Manifest>, layout: CacheLayout) -> SampleStore {
    let cache = CacheDir::open(dir).unwrap();
    let backend = cache.backend(layout, manifest.len()).unwrap();
    let source = Arc::new(SyntheticSource {
        manifest: manifest.clone(),
    });
    SampleStore::with_backend(cache, backend, manifest.clone(), source).unwrap()
}

/// The disk floor: each rank writes the bytes it will receive into its cache, no MPI at all.
fn disk_floor(
    comm: &mut dyn Comm,
    manifest: &Arc<Manifest>,
    step: &Step,
    dir: &std::path::Path,
    layout: CacheLayout,
) -> f64 {
    let _ = std::fs::remove_dir_all(dir);
    let store = store_in(dir, manifest, layout);
    let incoming: Vec<u64> = step
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
    store.sync().unwrap();
    let secs = max_time(comm, t0.elapsed().as_secs_f64());
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
    secs
}

/// One scenario's size and the layout it runs with.
struct Scenario<'a> {
    name: &'a str,
    /// Every sample's size, in id order.
    sizes: &'a [u64],
    /// How the dataset column describes them.
    label: &'a str,
    layout: CacheLayout,
}

/// The units `--group pages` (the default) makes of `records` fixed-size records laid end to
/// end in one file: the records starting in each 4 KiB page form one group (as
/// `RecordIndex::group_records` does), so 362 B records travel ~11 at a time.
fn page_groups(records: u64, size: u64) -> Vec<u64> {
    let end = records * size;
    (0..end.div_ceil(PAGE))
        .map(|p| {
            let first = (p * PAGE).div_ceil(size);
            let last = ((p + 1) * PAGE).div_ceil(size).min(records);
            (last - first) * size
        })
        .filter(|&len| len > 0)
        .collect()
}

/// The exchange's byte rates: per second of the slowest rank, and per CPU second of all
/// ranks together (what a machine shared with other work shows more steadily).
#[derive(Clone, Copy)]
struct Rates {
    wall: f64,
    cpu: f64,
}

/// Runs `sc`; returns the exchange's byte rates.
fn scenario(
    comm: &mut dyn Comm,
    sc: &Scenario<'_>,
    fraction: f64,
    tmp: &std::path::Path,
    per_100kb: &[(CacheLayout, Rates)],
) -> Rates {
    let Scenario {
        name,
        sizes,
        label,
        layout,
    } = *sc;
    let world = comm.size();
    let per_class = sizes.len().div_ceil(10);
    let classes = sizes
        .chunks(per_class)
        .enumerate()
        .map(|(c, sizes)| {
            (
                format!("c{c}").into_bytes(),
                sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &size)| (format!("{i:07}").into_bytes(), size))
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
    let dir = tmp.join(format!("{name}-{layout}-rank{}", comm.rank()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = store_in(&dir, &manifest, layout);
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
    let pairs = pair_bytes(&manifest, &step, world);
    let (base, base_cpu) = baseline(comm, &pairs);
    // Written pages of the staged share would otherwise still be in flight during the exchange.
    nix::unistd::sync();
    barrier(comm);
    let t0 = Instant::now();
    let cpu0 = cpu_seconds();
    let tracker = ExchangeTracker::default();
    // SHUFFLEFS_BENCH_STRATEGY=ring: one peer each way per round instead of every peer.
    let strategy = match std::env::var("SHUFFLEFS_BENCH_STRATEGY").as_deref() {
        Ok("ring") => StrategyKind::Ring,
        _ => StrategyKind::Direct,
    };
    exchange::run(
        comm,
        &store,
        &step,
        ExchangeConfig {
            strategy,
            ..ExchangeConfig::default()
        },
        &tracker,
        &AtomicBool::new(false),
    )
    .unwrap();
    let exch = max_time(comm, t0.elapsed().as_secs_f64());
    let cpu = sum(comm, cpu_seconds() - cpu0);
    // After the exchange: its deletes would otherwise make the exchange's file creates pay
    // ext4's scan of recently freed inodes (`recently_deleted`).
    let floor_dir = tmp.join(format!("{name}-{layout}-floor-rank{}", comm.rank()));
    let floor = disk_floor(comm, &manifest, &step, &floor_dir, layout);
    if std::env::var_os("SHUFFLEFS_BENCH_DETAIL").is_some()
        && let Some(r) = tracker.snapshot().pop()
    {
        eprintln!(
            "rank {}: settled {:.2}s (sync {:.2}s), all {:.2}s",
            comm.rank(),
            r.settled_seconds,
            r.sync_seconds,
            r.seconds
        );
    }
    // The link's own floor, when the bench runs on shaped links (benches/cluster_exchange.sh).
    let link = std::env::var("SHUFFLEFS_LINK_BYTES_PER_S")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .map(|rate| link_floor(comm, &pairs, rate));
    let rates = Rates {
        wall: bytes as f64 / exch,
        cpu: bytes as f64 / cpu,
    };
    if comm.rank() == 0 {
        let rate = |secs: f64| bytes as f64 / secs / 1e6;
        let vs_link = link.map_or("-".to_string(), |l| format!("{:.2}x", l / exch));
        let vs = |l: CacheLayout| {
            per_100kb
                .iter()
                .find(|(x, _)| *x == l)
                .map_or("-".to_string(), |(_, r)| {
                    format!("{:.2}x / {:.2}x", rates.wall / r.wall, rates.cpu / r.cpu)
                })
        };
        println!(
            "| {name} | {layout} | {label}, Q={fraction} | {moved:.0} | {:.0} MB/s | {:.0} MB/s | {:.0} MB/s | {:.2}x | {:.2}x | {vs_link} | {:.0} | {cpu:.2} s, {:.0} MB/CPU-s | {base_cpu:.2} s, {:.2}x | {} | {} |",
            rate(base),
            rate(floor),
            rate(exch),
            exch.recip() / base.recip(),
            exch.recip() / floor.recip(),
            moved / exch,
            rates.cpu / 1e6,
            cpu / base_cpu,
            vs(layout),
            vs(CacheLayout::Files),
        );
    }
    drop(store);
    barrier(comm);
    let _ = std::fs::remove_dir_all(&dir);
    rates
}

/// The transport this run measures: MPI under mpirun, TCP under torchrun
/// (`TRANSPORT=tcp bash benches/exchange.sh`), with its name.
fn transport() -> Option<(Box<dyn Comm>, &'static str)> {
    if launched_by_mpi() {
        return Some((Box::new(MpiComm::init().unwrap()), "MPI"));
    }
    let contract = Contract::from_env(None).unwrap()?;
    Some((Box::new(TcpComm::connect(&contract).unwrap()), "TCP"))
}

fn main() {
    let Some((mut comm, name)) = transport() else {
        println!(
            "exchange_mpi: run it under mpirun or torchrun with `bash benches/exchange.sh` (4 ranks)."
        );
        return;
    };
    let comm = comm.as_mut();
    let tmp = std::env::var_os("SHUFFLEFS_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    if comm.rank() == 0 {
        println!(
            "ranks: {}, transport {name} (its own p2p baseline in the MPI column), cache under {}",
            comm.size(),
            tmp.display()
        );
        println!(
            "| scenario | layout | dataset | samples moved | MPI p2p baseline | disk floor | exchange | exchange / MPI | exchange / disk | exchange / link | exchange samples/s | exchange CPU (all ranks) | MPI baseline CPU, exchange CPU per byte / baseline's | bytes/s vs 100KB same layout (wall / per CPU-s) | vs 100KB files (wall / per CPU-s) |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    }
    // SCENARIOS=100KB,4KB,362B,362B-pages (the default; any subset, run in this order), LAYOUTS=files,packed.
    let only = std::env::var("SCENARIOS").unwrap_or_default();
    let wanted = |name: &str| only.is_empty() || only.split(',').any(|s| s == name);
    let layouts: Vec<CacheLayout> = match std::env::var("LAYOUTS").as_deref() {
        Ok(list) if !list.is_empty() => list
            .split(',')
            .map(|l| {
                <CacheLayout as clap::ValueEnum>::from_str(l, true)
                    .unwrap_or_else(|e| panic!("LAYOUTS: {l}: {e}"))
            })
            .collect(),
        _ => vec![CacheLayout::Files, CacheLayout::Packed],
    };
    let mut per_100kb = Vec::new();
    let scenarios = [
        ("100KB", vec![100_000; 8000], "8000 x 100000 B".to_string()),
        ("4KB", vec![4096; 100_000], "100000 x 4096 B".to_string()),
        // `--group records`: every 362 B record is its own unit.
        ("362B", vec![362; 400_000], "400000 x 362 B".to_string()),
        // The default `--group pages`: the same records in page groups.
        ("362B-pages", page_groups(400_000, 362), String::new()),
    ];
    for (name, sizes, label) in &scenarios {
        let name = *name;
        if !wanted(name) {
            continue;
        }
        let label = if label.is_empty() {
            let mean = sizes.iter().sum::<u64>() / sizes.len() as u64;
            format!("400000 x 362 B in {} page groups of ~{mean} B", sizes.len())
        } else {
            label.clone()
        };
        for &layout in &layouts {
            let sc = Scenario {
                name,
                sizes,
                label: &label,
                layout,
            };
            let rate = scenario(comm, &sc, 1.0, &tmp, &per_100kb);
            if name == "100KB" {
                per_100kb.push((layout, rate));
            }
        }
    }
}
