//! Resume after a crash, four ranks in one process: the caches are left as SIGKILL can leave
//! them in the middle of the exchange into epoch E (ranks 0 and 1 already advanced and dropped
//! what they sent; the others hold a random part of what was coming to them), then every rank
//! runs `resume`. Each must end with exactly its epoch-E share plus at most the part of its
//! E+1 share already received, every byte right, and nothing fetched from the source.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use shufflefs::cache::{CacheDir, FileBackend, SampleStore};
use shufflefs::comm::{Comm, LocalComm};
use shufflefs::dataset::manifest::Manifest;
use shufflefs::dataset::{SyntheticSource, synthetic_byte};
use shufflefs::node::resume::resume;
use shufflefs::plan::{Plan, PlanParams};

const WORLD: u32 = 4;
const EPOCH: u64 = 3;

fn manifest() -> Arc<Manifest> {
    let classes = (0..4)
        .map(|c| {
            let names = (0..60)
                .map(|i| {
                    (
                        format!("f{i:03}").into_bytes(),
                        100 + (i * 37 + c * 11) % 900,
                    )
                })
                .collect();
            (format!("c{c}").into_bytes(), names)
        })
        .collect();
    Arc::new(Manifest::from_parts(classes).unwrap())
}

#[test]
fn resume_completes_an_interrupted_exchange_without_the_source() {
    let manifest = manifest();
    let plan = Plan::new(PlanParams {
        samples: manifest.len(),
        world: WORLD,
        fraction: 0.5,
        seed: 77,
    })
    .unwrap();
    let prev = plan.shares_at(EPOCH - 1);
    let step = plan.step(&prev);
    let advanced = |r: u32| r < 2;
    // A sample moving from a rank that advanced is durable at its receiver; any other one
    // arrived or not (pseudo-randomly).
    let received = |sample: u64, from: u32| {
        advanced(from) || (sample as u32).wrapping_mul(2654435761) >> 31 == 1
    };
    let dirs: Vec<_> = (0..WORLD).map(|_| tempfile::tempdir().unwrap()).collect();
    for r in 0..WORLD {
        let store = SampleStore::new(
            CacheDir::open(dirs[r as usize].path()).unwrap(),
            manifest.clone(),
            Arc::new(SyntheticSource {
                manifest: manifest.clone(),
            }),
        )
        .unwrap();
        for &id in prev.share(r) {
            let sent_away = step.transfers.iter().any(|t| t.from == r && t.sample == id);
            if !(advanced(r) && sent_away) {
                store.ensure(id).unwrap();
            }
        }
        for t in step.transfers.iter().filter(|t| t.to == r) {
            if received(t.sample, t.from) {
                store.ensure(t.sample).unwrap();
            }
        }
    }
    let handles: Vec<_> = LocalComm::world(WORLD)
        .into_iter()
        .zip(dirs.iter().map(|d| d.path().to_path_buf()))
        .map(|(mut comm, dir)| {
            let (manifest, plan) = (manifest.clone(), plan.clone());
            std::thread::spawn(move || {
                let store = SampleStore::new(
                    CacheDir::open(&dir).unwrap(),
                    manifest.clone(),
                    Arc::new(SyntheticSource { manifest }),
                )
                .unwrap();
                resume(&mut comm, &store, &plan, EPOCH).unwrap();
                (comm.rank(), store)
            })
        })
        .collect();
    let current = plan.shares_at(EPOCH);
    let next = plan.step(&current).next;
    for h in handles {
        let (r, store) = h.join().unwrap();
        assert_eq!(
            store.stats.fetched_from_source.load(Ordering::Relaxed),
            0,
            "rank {r} fetched from the source"
        );
        // Its epoch-E share is saved, so a second crash resumes from it in O(share).
        let saved = store.dir().root().join(format!("slots/{EPOCH}.bin"));
        assert!(saved.is_file(), "rank {r} saved no share of epoch {EPOCH}");
        let held: BTreeSet<u64> = (0..manifest.len()).filter(|&i| store.contains(i)).collect();
        for &id in current.share(r) {
            assert!(
                held.contains(&id),
                "rank {r} lacks sample {id} of its share"
            );
            let bytes = std::fs::read(FileBackend::path_in(store.dir().root(), id)).unwrap();
            assert_eq!(Some(bytes.len() as u64), manifest.size(id));
            assert!(
                bytes
                    .iter()
                    .enumerate()
                    .all(|(o, &b)| b == synthetic_byte(id, o as u64)),
                "rank {r} sample {id} bytes"
            );
        }
        for id in &held {
            assert!(
                current.share(r).binary_search(id).is_ok()
                    || next.share(r).binary_search(id).is_ok(),
                "rank {r} kept sample {id}, which is in neither its epoch {EPOCH} nor {} share",
                EPOCH + 1
            );
        }
    }
}

/// A power loss can leave a cache file renamed in but without all of its data (the rename
/// does not wait for it). With sizes unknown until read (a scanned source), only the length
/// recorded beside the file's checksum tells: such a file is dropped at start-up and fetched
/// again, while whole files, including ones recorded before the length was (CRC only), stay.
#[test]
fn a_cache_file_torn_by_a_crash_is_dropped_at_start_up() {
    use shufflefs::dataset::ImageFolder;
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (src, cache) = (tmp.path().join("src"), tmp.path().join("cache"));
    std::fs::create_dir_all(src.join("c")).unwrap();
    for i in 0..3u8 {
        std::fs::write(src.join(format!("c/{i}.bin")), vec![i + 1; 5000]).unwrap();
    }
    let manifest = Arc::new(shufflefs::dataset::scan::scan(&src).unwrap());
    let open = || {
        let source = Arc::new(ImageFolder::new(src.clone(), manifest.clone()));
        SampleStore::new(CacheDir::open(&cache).unwrap(), manifest.clone(), source).unwrap()
    };
    let store = open();
    for id in 0..3 {
        store.ensure(id).unwrap();
    }
    let (torn, whole, old_format) = (
        FileBackend::path_in(store.dir().root(), 0),
        FileBackend::path_in(store.dir().root(), 1),
        FileBackend::path_in(store.dir().root(), 2),
    );
    drop(store);
    let recorded = xattr::get(&old_format, "user.shufflefs.crc32c")
        .unwrap()
        .expect("the cache's filesystem keeps user xattrs");
    assert_eq!(recorded.len(), 12, "CRC and length are recorded");
    xattr::set(&old_format, "user.shufflefs.crc32c", &recorded[..4]).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&torn)
        .unwrap()
        .set_len(1200)
        .unwrap();

    let store = open();
    assert!(!store.contains(0), "the torn file is dropped");
    assert_eq!(store.size(0), None, "and its length is not learned");
    assert!(store.contains(1) && store.contains(2));
    assert_eq!(store.size(2), Some(5000));
    assert_eq!(store.resolve_size(0).unwrap(), 5000, "fetched again");
    for (id, path) in [(0u8, &torn), (1, &whole), (2, &old_format)] {
        assert_eq!(std::fs::read(path).unwrap(), vec![id + 1; 5000]);
    }
}
