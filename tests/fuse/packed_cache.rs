//! The packed cache layout end to end: four in-process ranks exchanging small records into
//! segment files (no file per record), and a real mount with `--cache-layout packed` serving
//! every sample's bytes through the daemon, surviving a remount and refusing the other layout.

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use crate::common::*;
use shufflefs::cache::{CacheDir, CacheLayout, SampleStore};
use shufflefs::comm::{Comm, LocalComm};
use shufflefs::dataset::manifest::Manifest;
use shufflefs::dataset::{SyntheticSource, synthetic_byte};
use shufflefs::exchange::{self, ExchangeConfig, ExchangeTracker};
use shufflefs::plan::{Plan, PlanParams};

/// 2,400 records of 362 B and 4 KB (the record sizes the packed layout was made for), a few larger.
fn records() -> Arc<Manifest> {
    let classes = (0..3)
        .map(|c| {
            let names = (0..800u32)
                .map(|i| {
                    let size = match i % 50 {
                        0 => 70_000,
                        n if n % 2 == 0 => 362,
                        _ => 4096,
                    };
                    (format!("r{i:05}").into_bytes(), size)
                })
                .collect();
            (format!("part{c}").into_bytes(), names)
        })
        .collect();
    Arc::new(Manifest::from_parts(classes).unwrap())
}

fn packed_store(dir: &Path, manifest: &Arc<Manifest>) -> SampleStore {
    let cache = CacheDir::open(dir).unwrap();
    let backend = cache.backend(CacheLayout::Packed, manifest.len()).unwrap();
    let source = Arc::new(SyntheticSource {
        manifest: manifest.clone(),
    });
    SampleStore::with_backend(cache, backend, manifest.clone(), source).unwrap()
}

fn assert_right_bytes(store: &SampleStore, id: u64) {
    let bytes = store.read(id).unwrap();
    assert_eq!(Some(bytes.len() as u64), store.manifest().size(id), "{id}");
    assert!(
        bytes
            .iter()
            .enumerate()
            .all(|(o, &b)| b == synthetic_byte(id, o as u64)),
        "sample {id} bytes differ"
    );
}

#[test]
fn the_exchange_writes_received_records_into_segments() {
    let world = 4u32;
    let manifest = records();
    let plan = Plan::new(PlanParams {
        samples: manifest.len(),
        world,
        fraction: 0.5,
        seed: 17,
    })
    .unwrap();
    let barrier = Arc::new(Barrier::new(world as usize));
    let handles: Vec<_> = LocalComm::world(world)
        .into_iter()
        .map(|mut comm| {
            let (manifest, plan, barrier) = (manifest.clone(), plan.clone(), barrier.clone());
            std::thread::spawn(move || {
                let me = comm.rank();
                let dir = tempfile::tempdir().unwrap();
                let store = packed_store(dir.path(), &manifest);
                let mut cur = plan.initial();
                for &id in cur.share(me) {
                    store.ensure(id).unwrap();
                }
                let tracker = ExchangeTracker::default();
                let mut received = 0;
                for _ in 0..3 {
                    let step = plan.step(&cur);
                    let fetched = store.stats.fetched_from_source.load(Ordering::Relaxed);
                    exchange::run(
                        &mut comm,
                        &store,
                        &step,
                        ExchangeConfig {
                            frame: 64 << 10,
                            ..ExchangeConfig::default()
                        },
                        &tracker,
                        &AtomicBool::new(false),
                    )
                    .unwrap();
                    // Everything arrived through the exchange: nothing was fetched.
                    assert_eq!(
                        store.stats.fetched_from_source.load(Ordering::Relaxed),
                        fetched
                    );
                    received += step.transfers.iter().filter(|t| t.to == me).count();
                    for &id in step.next.share(me) {
                        assert!(store.contains(id), "rank {me}: sample {id} missing");
                        assert_right_bytes(&store, id);
                    }
                    for &id in cur.share(me) {
                        if step.next.share(me).binary_search(&id).is_err() {
                            store.remove(id).unwrap();
                        }
                    }
                    cur = step.next.clone();
                    barrier.wait();
                }
                assert!(received > 500, "rank {me} received {received}");
                // A handful of segment files, no file per record.
                let root = dir.path();
                assert!(!root.join("samples").exists());
                let segments = fs::read_dir(root.join("segments")).unwrap().count();
                assert!(
                    segments <= 4,
                    "rank {me}: {segments} segment files for {received} records"
                );
                // The share comes back after a remount (removes included: dropping the store wrote
                // its last batch out).
                let share: Vec<u64> = cur.share(me).to_vec();
                drop(store);
                let store = packed_store(root, &manifest);
                assert_eq!(
                    store.stats.files.load(Ordering::Relaxed),
                    share.len() as u64
                );
                for id in share {
                    assert_right_bytes(&store, id);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn a_packed_mount_serves_every_sample_and_keeps_its_layout() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    let packed = ["--seed", "8", "--cache-layout", "packed"];
    let d = Daemon::mount(&data.root, &cache, &mnt, &packed);
    let s = wait_staging_done(&d.mnt);
    let present = data.samples.len();
    assert_eq!(s["cache"]["files"], present, "{s:#}");
    assert_eq!(s["cache"]["layout"], "packed", "{s:#}");
    for s in &data.samples {
        for view in ["epoch-0", "current"] {
            let p = d.mnt.join(view).join(s.rel());
            let got = fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
            assert!(got == s.bytes(), "{} differs from the source", p.display());
        }
        // Reads at odd offsets through one open file.
        let f = fs::File::open(d.mnt.join("current").join(s.rel())).unwrap();
        for (off, len) in [(1, 10), (s.size / 2, 100), (s.size.saturating_sub(1), 10)] {
            let mut buf = vec![0u8; len as usize];
            let n = std::os::unix::fs::FileExt::read_at(&f, &mut buf, off).unwrap();
            assert!(buf[..n] == s.range(off, len)[..], "{}", s.rel().display());
        }
    }
    d.unmount().assert_clean();
    assert!(!cache.join("samples").exists(), "no file per sample");
    let segments = fs::read_dir(cache.join("segments")).unwrap().count();
    assert!((1..=3).contains(&segments), "{segments} segment files");

    // A remount finds every sample in the segments: nothing is fetched again.
    let d = Daemon::mount(&data.root, &cache, &mnt, &packed);
    let s = read_status(&d.mnt);
    assert_eq!(s["cache"]["files"], present, "{s:#}");
    assert_eq!(s["cache"]["fetched_from_source"], 0, "{s:#}");
    for s in &data.samples {
        assert!(fs::read(d.mnt.join("current").join(s.rel())).unwrap() == s.bytes());
    }
    d.unmount().assert_clean();
    let segments = fs::read_dir(cache.join("segments")).unwrap().count();

    // The other layout is refused, naming both, and nothing is lost.
    let refused = Daemon::try_start(
        &mnt,
        &mount_args(&data.root, &cache, &mnt, &["--seed", "8"]),
    )
    .err()
    .expect("mounting a packed cache as files is refused");
    refused.assert_mentions("--cache-layout: cache has packed, now files");
    refused.assert_mentions("--reset-cache");
    assert_eq!(
        fs::read_dir(cache.join("segments")).unwrap().count(),
        segments
    );
}
