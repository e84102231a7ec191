//! Four ranks in one process exchange over `LocalComm` for several epochs and values of Q:
//! listings partition the dataset, bytes match the source, caches stay within (1+Q) x share.
//! Misbehaving transports (`comm::doubles`: random delays that reorder arrivals across peers,
//! a capped send rate) and an unreadable cached sample show the exchange still completes
//! correctly; a cached sample whose bytes changed on disk is caught by its checksum and never
//! reaches the receiver; a transport that breaks on one rank fails every rank's exchange
//! with a typed error instead of leaving any of them waiting.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use shufflefs::cache::{CacheDir, FileBackend, SampleStore};
use shufflefs::comm::doubles::{Delaying, Failing, Lagging, Rewriting, Slow};
use shufflefs::comm::{Comm, CommError, LocalComm, Op};
use shufflefs::dataset::manifest::Manifest;
use shufflefs::dataset::{SyntheticSource, synthetic_byte};
use shufflefs::exchange::{
    self, EpochExchange, ExchangeConfig, ExchangeCtx, ExchangeError, ExchangeState,
    ExchangeTracker, Partial, Peers, SlowPeers,
};
use shufflefs::plan::{Plan, PlanParams};

/// A rank that panics would leave the others waiting at the barrier forever: end the test
/// process instead (the panic message is printed first).
struct AbortOnPanic;

impl Drop for AbortOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            std::process::abort();
        }
    }
}

fn manifest(samples: u64) -> Arc<Manifest> {
    // Sizes cycle through 0 bytes, tiny, and larger than the test frame, so samples both
    // share frames and span several.
    let sizes = [0u64, 1, 17, 300, 2500, 7000];
    let classes = (0..3)
        .map(|c| {
            let names = (0..samples / 3)
                .map(|i| {
                    (
                        format!("s{i:04}.bin").into_bytes(),
                        sizes[(i as usize + c) % sizes.len()],
                    )
                })
                .collect();
            (format!("class{c}").into_bytes(), names)
        })
        .collect();
    Arc::new(Manifest::from_parts(classes).unwrap())
}

/// A cache over the synthetic source of `manifest` holding `share`: its folder (keep it
/// alive) and the store.
fn staged(manifest: Arc<Manifest>, share: &[u64]) -> (tempfile::TempDir, Arc<SampleStore>) {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(SyntheticSource {
        manifest: manifest.clone(),
    });
    let store = SampleStore::new(CacheDir::open(dir.path()).unwrap(), manifest, source).unwrap();
    for &id in share {
        store.ensure(id).unwrap();
    }
    (dir, Arc::new(store))
}

fn check_sample(store: &SampleStore, id: u64) {
    let bytes = std::fs::read(FileBackend::path_in(store.dir().root(), id))
        .unwrap_or_else(|e| panic!("sample {id} missing from cache: {e}"));
    assert_eq!(
        Some(bytes.len() as u64),
        store.manifest().size(id),
        "sample {id} length"
    );
    assert!(
        bytes
            .iter()
            .enumerate()
            .all(|(o, &b)| b == synthetic_byte(id, o as u64)),
        "sample {id} bytes differ"
    );
}

/// What goes wrong with rank 0's first outgoing sample before the first exchange.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// The file vanishes from the cache (disk trouble).
    Vanish,
    /// One byte of the file changes, length unchanged (silent corruption).
    Flip,
}

/// What each rank's transport does besides its job.
#[derive(Clone, Copy, PartialEq)]
enum Wrap {
    None,
    Delaying,
    /// Sends capped at this many bytes per second.
    Slow(u64),
}

/// Runs `epochs` exchanges on 4 ranks, with `fault` injected on rank 0 first.
fn run_world(fraction: f64, epochs: u64, wrap: Wrap, fault: Fault) {
    let world = 4u32;
    let manifest = manifest(300);
    let plan = plan(manifest.len(), world, fraction, 1234);
    let barrier = Arc::new(Barrier::new(world as usize));
    let handles: Vec<_> = LocalComm::world(world)
        .into_iter()
        .map(|comm| {
            let (manifest, plan, barrier) = (manifest.clone(), plan.clone(), barrier.clone());
            std::thread::spawn(move || {
                let _guard = AbortOnPanic;
                let me = comm.rank();
                let mut comm: Box<dyn Comm> = match wrap {
                    Wrap::None => Box::new(comm),
                    Wrap::Delaying => Box::new(Delaying::new(comm, u64::from(me) + 1)),
                    Wrap::Slow(rate) => Box::new(Slow::new(comm, rate)),
                };
                let dir = tempfile::tempdir().unwrap();
                let source = Arc::new(SyntheticSource {
                    manifest: manifest.clone(),
                });
                let store = SampleStore::new(
                    CacheDir::open(dir.path()).unwrap(),
                    manifest.clone(),
                    source,
                )
                .unwrap();
                let mut cur = plan.initial();
                for &id in cur.share(me) {
                    store.ensure(id).unwrap();
                }
                let share_len = cur.share(me).len() as u64;
                let limit = share_len + plan.exchange_count() as u64;
                let tracker = ExchangeTracker::default();
                let abort = AtomicBool::new(false);
                let cfg = ExchangeConfig {
                    rate: None,
                    frame: 4096,
                    ..ExchangeConfig::default()
                };
                let mut listings = Vec::new();
                for _ in 0..epochs {
                    let step = plan.step(&cur);
                    if fault != Fault::None && me == 0 && cur.epoch == 0 {
                        let t = step
                            .transfers
                            .iter()
                            .find(|t| t.from == 0 && manifest.size(t.sample) > Some(0))
                            .expect("rank 0 sends a non-empty sample");
                        let path = FileBackend::path_in(store.dir().root(), t.sample);
                        if fault == Fault::Vanish {
                            std::fs::remove_file(path).unwrap();
                        } else {
                            let mut bytes = std::fs::read(&path).unwrap();
                            bytes[0] ^= 0xFF;
                            // Rewrite in place: the recorded checksum stays as it was.
                            let mut f =
                                std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                            std::io::Write::write_all(&mut f, &bytes).unwrap();
                        }
                    }
                    exchange::run(comm.as_mut(), &store, &step, cfg, &tracker, &abort).unwrap();
                    // What `advance` does: anything not delivered comes from the source.
                    for &id in step.next.share(me) {
                        store.ensure(id).unwrap();
                        check_sample(&store, id);
                    }
                    let files = store.stats.files.load(std::sync::atomic::Ordering::Relaxed);
                    assert!(
                        files <= limit,
                        "rank {me}: {files} cached files, limit {limit}"
                    );
                    // Publish: drop what left.
                    for &id in cur
                        .share(me)
                        .iter()
                        .filter(|id| step.next.share(me).binary_search(id).is_err())
                    {
                        store.remove(id).unwrap();
                    }
                    let files = store.stats.files.load(std::sync::atomic::Ordering::Relaxed);
                    assert_eq!(
                        files, share_len,
                        "rank {me}: cache should hold exactly the share after eviction"
                    );
                    let report = tracker.snapshot().into_iter().last().unwrap();
                    assert_eq!(report.state, ExchangeState::Done);
                    // A sample that failed arrives as bytes but is not counted as received.
                    assert!(report.samples_received <= report.samples_to_receive);
                    assert!(
                        report.samples_received + report.failed_samples
                            >= report.samples_to_receive
                    );
                    assert_eq!(report.bytes_received, report.bytes_to_receive);
                    listings.push(step.next.share(me).to_vec());
                    cur = step.next;
                    barrier.wait();
                }
                let checksum_failures = store
                    .stats
                    .checksum_failures
                    .load(std::sync::atomic::Ordering::Relaxed);
                (me, listings, tracker.snapshot(), checksum_failures)
            })
        })
        .collect();
    let mut results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    results.sort_by_key(|r| r.0);
    for e in 0..epochs as usize {
        let mut all: Vec<u64> = results.iter().flat_map(|r| r.1[e].clone()).collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..manifest.len()).collect::<Vec<_>>(),
            "epoch {} is not a partition",
            e + 1
        );
    }
    let failed: u64 = results
        .iter()
        .flat_map(|r| r.2.iter().map(|x| x.failed_samples))
        .sum();
    let expected = if fault == Fault::None { 0 } else { 1 };
    assert_eq!(
        failed, expected,
        "a sample that cannot be sent is reported once, by its receiver"
    );
    let checksum_failures: Vec<u64> = results.iter().map(|r| r.3).collect();
    if fault == Fault::Flip {
        assert_eq!(
            checksum_failures[0], 1,
            "the sender catches its corrupt copy"
        );
        assert_eq!(
            checksum_failures.iter().sum::<u64>(),
            2,
            "and the receiver rejects the bytes: {checksum_failures:?}"
        );
    } else {
        assert_eq!(checksum_failures, [0, 0, 0, 0]);
    }
}

#[test]
fn exchange_partitions_and_moves_bytes_exactly() {
    for q in [0.0, 0.3, 1.0] {
        run_world(q, 3, Wrap::None, Fault::None);
    }
}

#[test]
fn exchange_survives_delays_and_reordering() {
    run_world(0.5, 3, Wrap::Delaying, Fault::None);
}

#[test]
fn exchange_completes_over_a_slow_link() {
    run_world(0.5, 2, Wrap::Slow(4 << 20), Fault::None);
}

#[test]
fn unreadable_sample_is_reported_and_refetched() {
    run_world(0.5, 2, Wrap::None, Fault::Vanish);
}

#[test]
fn corrupt_cached_sample_is_caught_by_its_checksum() {
    run_world(0.5, 2, Wrap::None, Fault::Flip);
}

/// Rank 2 cannot write its cache (its temp folder is gone) during a 4-rank exchange: it
/// still serves every round and the final confirmation, so the others finish with every
/// sample byte-exact, and only rank 2 reports the failure, naming what went wrong.
#[test]
fn a_rank_whose_disk_fails_does_not_stall_the_others() {
    let world = 4u32;
    let manifest = manifest(200);
    let plan = plan(manifest.len(), world, 1.0, 7);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for mut comm in LocalComm::world(world) {
        let (manifest, plan, done_tx) = (manifest.clone(), plan.clone(), done_tx.clone());
        std::thread::spawn(move || {
            let _guard = AbortOnPanic;
            let me = comm.rank();
            let dir = tempfile::tempdir().unwrap();
            let source = Arc::new(SyntheticSource {
                manifest: manifest.clone(),
            });
            let store =
                SampleStore::new(CacheDir::open(dir.path()).unwrap(), manifest, source).unwrap();
            let cur = plan.initial();
            for &id in cur.share(me) {
                store.ensure(id).unwrap();
            }
            if me == 2 {
                std::fs::remove_dir_all(dir.path().join("tmp")).unwrap();
            }
            let step = plan.step(&cur);
            let cfg = ExchangeConfig {
                rate: None,
                frame: 4096,
                ..ExchangeConfig::default()
            };
            let tracker = ExchangeTracker::default();
            let result = exchange::run(
                &mut comm,
                &store,
                &step,
                cfg,
                &tracker,
                &AtomicBool::new(false),
            );
            if me != 2 {
                for t in step.transfers.iter().filter(|t| t.to == me) {
                    assert!(store.contains(t.sample), "rank {me} lacks {}", t.sample);
                    check_sample(&store, t.sample);
                }
            }
            done_tx.send((me, result)).unwrap();
        });
    }
    drop(done_tx);
    let mut results: Vec<_> = (0..world)
        .map(|_| {
            done_rx
                .recv_timeout(std::time::Duration::from_secs(60))
                .expect("every rank finishes the exchange (none is left waiting)")
        })
        .collect();
    results.sort_by_key(|r| r.0);
    for (rank, result) in results {
        if rank == 2 {
            let e = result.expect_err("rank 2 cannot store what it receives");
            assert!(matches!(e, ExchangeError::Store { .. }), "{e}");
        } else {
            result.unwrap();
        }
    }
}

/// Rank 1's link breaks (on its fifth transfer, in the first data round, or once it has sent
/// a few kilobytes): its exchange fails with the transport's error, and every other rank,
/// waiting on rank 1 directly or on a rank that waited on it, ends with a transport error
/// too (rank 1 is gone) instead of waiting forever.
#[test]
fn a_broken_link_on_one_rank_fails_every_exchange_without_a_hang() {
    for budget in [None, Some(5_000)] {
        let world = 4u32;
        let manifest = manifest(200);
        let plan = plan(manifest.len(), world, 1.0, 11);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        for comm in LocalComm::world(world) {
            let (manifest, plan, done_tx) = (manifest.clone(), plan.clone(), done_tx.clone());
            std::thread::spawn(move || {
                let _guard = AbortOnPanic;
                let me = comm.rank();
                let mut comm: Box<dyn Comm> = match (me, budget) {
                    (1, None) => Box::new(Failing::at_message(comm, 4)),
                    (1, Some(bytes)) => Box::new(Failing::after_bytes(comm, bytes)),
                    _ => Box::new(comm),
                };
                let dir = tempfile::tempdir().unwrap();
                let source = Arc::new(SyntheticSource {
                    manifest: manifest.clone(),
                });
                let store = SampleStore::new(CacheDir::open(dir.path()).unwrap(), manifest, source)
                    .unwrap();
                let cur = plan.initial();
                for &id in cur.share(me) {
                    store.ensure(id).unwrap();
                }
                let cfg = ExchangeConfig {
                    frame: 1024,
                    ..ExchangeConfig::default()
                };
                let tracker = ExchangeTracker::default();
                let abort = AtomicBool::new(false);
                let result = exchange::run(
                    comm.as_mut(),
                    &store,
                    &plan.step(&cur),
                    cfg,
                    &tracker,
                    &abort,
                );
                // Leaving disconnects this rank, as a process that ends does.
                drop(comm);
                let state = tracker.snapshot().last().unwrap().state;
                done_tx.send((me, result, state)).unwrap();
            });
        }
        drop(done_tx);
        for _ in 0..world {
            let (rank, result, state) = done_rx
                .recv_timeout(Duration::from_secs(60))
                .expect("every rank ends its exchange (none is left waiting)");
            let e = result.expect_err("no exchange succeeds without rank 1");
            assert_eq!(state, ExchangeState::Failed);
            if rank == 1 {
                assert!(
                    matches!(
                        e,
                        ExchangeError::Comm {
                            source: CommError::Injected(_),
                            ..
                        }
                    ),
                    "rank 1: {e}"
                );
            } else {
                assert!(
                    matches!(
                        e,
                        ExchangeError::Comm {
                            source: CommError::PeerGone(_),
                            ..
                        }
                    ),
                    "rank {rank}: {e}"
                );
            }
        }
    }
}

/// A real source folder scanned the way rank 0 does it, so no size is known up front: each
/// sender learns the sizes of what it sends (fetching the samples it has not staged), the
/// receivers learn them from the size exchange, and the bytes arrive exact. One sample's
/// source file is gone before anyone read it: its sender cannot send it, says so, and it
/// is the only one missing on its receiver.
#[test]
fn sizes_unknown_until_read_still_move_exactly() {
    use shufflefs::dataset::ImageFolder;
    let src = tempfile::tempdir().unwrap();
    for c in 0..3 {
        let class = src.path().join(format!("class{c}"));
        std::fs::create_dir(&class).unwrap();
        for i in 0..40u32 {
            let bytes: Vec<u8> = (0..(i * 37 + c * 5) as usize)
                .map(|o| (o as u32 ^ i ^ c) as u8)
                .collect();
            std::fs::write(class.join(format!("{i:03}.bin")), bytes).unwrap();
        }
    }
    let manifest = Arc::new(shufflefs::dataset::scan::scan(src.path()).unwrap());
    assert!((0..manifest.len()).all(|id| manifest.size(id).is_none()));
    let world = 4u32;
    let plan = plan(manifest.len(), world, 1.0, 5);
    let step = plan.step(&plan.initial());
    // A sample rank 0 sends, whose file goes away before anyone reads it.
    let lost = step
        .transfers
        .iter()
        .find(|t| t.from == 0)
        .unwrap()
        .to_owned();
    std::fs::remove_file(src.path().join(manifest.relative_path(lost.sample))).unwrap();
    let handles: Vec<_> = LocalComm::world(world)
        .into_iter()
        .map(|mut comm| {
            let (manifest, plan, step) = (manifest.clone(), plan.clone(), step.clone());
            let root = src.path().to_path_buf();
            std::thread::spawn(move || {
                let _guard = AbortOnPanic;
                let me = comm.rank();
                let dir = tempfile::tempdir().unwrap();
                let source = Arc::new(ImageFolder::new(root.clone(), manifest.clone()));
                let store = SampleStore::new(
                    CacheDir::open(dir.path()).unwrap(),
                    manifest.clone(),
                    source,
                )
                .unwrap();
                // Only every other sample staged: the rest are fetched by the exchange.
                for &id in plan.initial().share(me).iter().step_by(2) {
                    let _ = store.ensure(id);
                }
                let tracker = ExchangeTracker::default();
                let cfg = ExchangeConfig {
                    rate: None,
                    frame: 1000,
                    ..ExchangeConfig::default()
                };
                exchange::run(
                    &mut comm,
                    &store,
                    &step,
                    cfg,
                    &tracker,
                    &AtomicBool::new(false),
                )
                .unwrap();
                for t in step.transfers.iter().filter(|t| t.to == me) {
                    let want = std::fs::read(root.join(manifest.relative_path(t.sample)));
                    if t.sample == lost.sample {
                        assert!(!store.contains(t.sample) && want.is_err());
                        continue;
                    }
                    let got =
                        std::fs::read(FileBackend::path_in(store.dir().root(), t.sample)).unwrap();
                    assert!(
                        got == want.unwrap(),
                        "rank {me}: sample {} differs",
                        t.sample
                    );
                    assert_eq!(store.size(t.sample), Some(got.len() as u64));
                }
                tracker.snapshot().last().unwrap().failed_samples
            })
        })
        .collect();
    let failed: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(
        failed.iter().sum::<u64>(),
        1,
        "only the lost sample fails, once: {failed:?}"
    );
    assert_eq!(failed[lost.to as usize], 1);
}

/// A peer that stops taking part (its daemon unmounted and left MPI) must not keep this
/// rank's exchange waiting once this daemon shuts down too: every wait of the exchange,
/// including the size lists before the data, gives up when the abort flag is set.
#[test]
fn a_shutdown_interrupts_an_exchange_whose_peer_went_silent() {
    let manifest = manifest(60);
    let plan = plan(manifest.len(), 2, 1.0, 3);
    let mut comms = LocalComm::world(2);
    // Rank 1 stays connected but never answers, as a finalized MPI peer does.
    let _silent = comms.pop().unwrap();
    let mut comm = comms.pop().unwrap();
    let abort = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let flag = abort.clone();
    std::thread::spawn(move || {
        let dir = tempfile::tempdir().unwrap();
        let source = Arc::new(SyntheticSource {
            manifest: manifest.clone(),
        });
        let store =
            SampleStore::new(CacheDir::open(dir.path()).unwrap(), manifest, source).unwrap();
        let step = plan.step(&plan.initial());
        let tracker = ExchangeTracker::default();
        let result = exchange::run(
            &mut comm,
            &store,
            &step,
            ExchangeConfig::default(),
            &tracker,
            &flag,
        );
        let _ = done_tx.send((result, tracker.snapshot()));
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        done_rx.try_recv().is_err(),
        "the exchange waits for its silent peer"
    );
    abort.store(true, std::sync::atomic::Ordering::Relaxed);
    let (result, reports) = done_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the exchange gives up once the daemon shuts down");
    let e = result.expect_err("an abandoned exchange is an error");
    assert!(
        matches!(
            e,
            ExchangeError::Comm {
                source: CommError::Aborted,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(reports.last().unwrap().state, ExchangeState::Failed);
}

/// The plan of `samples` samples on `world` ranks.
fn plan(samples: u64, world: u32, fraction: f64, seed: u64) -> Plan {
    Plan::new(PlanParams {
        samples,
        world,
        fraction,
        seed,
    })
    .unwrap()
}

/// A source whose copies of one sample never finish (a hung filesystem).
struct HangsOn {
    inner: SyntheticSource,
    stuck: u64,
}

impl shufflefs::dataset::Dataset for HangsOn {
    fn copy_to(
        &self,
        id: u64,
        out: &mut dyn std::io::Write,
    ) -> std::io::Result<shufflefs::dataset::Copied> {
        if id == self.stuck {
            std::thread::sleep(Duration::from_secs(3600));
        }
        self.inner.copy_to(id, out)
    }
    fn read_at(&self, id: u64, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read_at(id, offset, buf)
    }
    fn describe(&self, id: u64) -> String {
        self.inner.describe(id)
    }
}

/// The fallback after an exchange (what a given-up peer did not deliver) against a source
/// that hangs on one sample: it returns after the stall limit, fetches everything else,
/// and says so in the status's problems; nothing waits for the hung sample.
#[test]
fn a_source_that_hangs_during_the_fallback_is_reported_not_waited_for() {
    let manifest = manifest(30);
    let plan = plan(manifest.len(), 2, 1.0, 9);
    let step = plan.step(&plan.initial());
    let share = step.next.share(0).to_vec();
    let stuck = share[share.len() / 2];
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(HangsOn {
        inner: SyntheticSource {
            manifest: manifest.clone(),
        },
        stuck,
    });
    let store =
        Arc::new(SampleStore::new(CacheDir::open(dir.path()).unwrap(), manifest, source).unwrap());
    let started = std::time::Instant::now();
    let by_peer = shufflefs::node::fetch_missing(&store, 0, &step, Duration::from_millis(500));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited for the hung sample"
    );
    for &id in &share {
        assert_eq!(store.contains(id), id != stuck, "sample {id}");
    }
    let from_peer: u64 = by_peer.iter().map(|&(_, n)| n).sum();
    let received = step
        .transfers
        .iter()
        .filter(|t| t.to == 0 && t.sample != stuck)
        .count();
    assert_eq!(
        from_peer, received as u64,
        "fetches counted against the peer that owed them"
    );
    let problems = store.stats.problems().join("\n");
    assert!(problems.contains("answered none"), "{problems}");
}

/// A source that refuses every copy after `delay` (a store whose connections are refused,
/// each request giving up after its retries).
struct Refuses {
    manifest: Arc<Manifest>,
    delay: Duration,
}

impl shufflefs::dataset::Dataset for Refuses {
    fn copy_to(
        &self,
        _id: u64,
        _out: &mut dyn std::io::Write,
    ) -> std::io::Result<shufflefs::dataset::Copied> {
        std::thread::sleep(self.delay);
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "the store did not answer after 9 attempts: Connection refused",
        ))
    }
    fn read_at(&self, _id: u64, _offset: u64, _buf: &mut [u8]) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::ConnectionRefused.into())
    }
    fn describe(&self, id: u64) -> String {
        format!("s3://b/{id} of {}", self.manifest.len())
    }
}

/// The fallback against a store that refuses every request (each failing after a while,
/// more often than the stall limit): failures are no answer, so it returns after the stall
/// limit with the problem named, as for a source that answers nothing. Fails before issue
/// 40: each failure counted as progress, and the epoch waited for all of them (102 s to
/// 590 s with moto or s3s-fs stopped).
#[test]
fn a_store_refusing_during_the_fallback_does_not_hold_the_epoch() {
    let manifest = manifest(60);
    let plan = plan(manifest.len(), 2, 1.0, 9);
    let step = plan.step(&plan.initial());
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(Refuses {
        manifest: manifest.clone(),
        delay: Duration::from_millis(150),
    });
    let store =
        Arc::new(SampleStore::new(CacheDir::open(dir.path()).unwrap(), manifest, source).unwrap());
    shufflefs::node::fetch_missing(&store, 0, &step, Duration::from_millis(400));
    let problems = store.stats.problems().join("\n");
    assert!(problems.contains("answered none"), "{problems}");
}

/// One rank's uplink is a trickle (`Slow`): the others settle once their other streams are
/// in and the deadline passed, well before its stream could arrive, and fetch what it owed
/// them from the source; it stops sending after the frames it had posted, and every rank
/// ends up holding its next share exactly. The slow rank itself waits for nobody. Given up
/// by every receiver, it leaves the next exchange, which the others run without it (and
/// it without them), each fetching the rest from the source.
#[test]
fn a_slow_peer_is_given_up_and_its_samples_come_from_the_source() {
    slow_peer_given_up(4096);
}

/// The same with frames as large as a whole stream: the slow rank posts every frame before
/// any receiver confirms, and its decision to leave still waits for all the confirmations
/// (it once told the receivers whose confirmation came last "stay" and the others "leave",
/// so the pairs disagreed about the next exchange and waited on each other).
#[test]
fn a_slow_peer_that_posted_everything_still_leaves_every_peer_alike() {
    slow_peer_given_up(1 << 20);
}

fn slow_peer_given_up(frame: usize) {
    let world = 4;
    let manifest = manifest(600);
    let plan = plan(manifest.len(), world, 1.0, 77);
    let step = plan.step(&plan.initial());
    let handles: Vec<_> = LocalComm::world(world)
        .into_iter()
        .map(|comm| {
            let (manifest, plan, step) = (manifest.clone(), plan.clone(), step.clone());
            std::thread::spawn(move || {
                let _guard = AbortOnPanic;
                let me = comm.rank();
                // Rank 3 sends its ~80 KB per peer at 20 kB/s: seconds, not milliseconds.
                let mut comm: Box<dyn Comm> = if me == 3 {
                    Box::new(Slow::new(comm, 20_000))
                } else {
                    Box::new(comm)
                };
                let (_dir, store) = staged(manifest, plan.initial().share(me));
                let cfg = ExchangeConfig {
                    frame,
                    slow_peers: SlowPeers {
                        factor: 4.0,
                        grace: Duration::from_millis(300),
                        ..SlowPeers::default()
                    },
                    ..ExchangeConfig::default()
                };
                let tracker = ExchangeTracker::default();
                let started = std::time::Instant::now();
                let mut settled_after = None;
                let mut partial = Partial {
                    cfg,
                    peers: Peers::separate(world),
                };
                let ctx = ExchangeCtx {
                    store: &store,
                    tracker: &tracker,
                    abort: &AtomicBool::new(false),
                };
                partial
                    .run(comm.as_mut(), &step, ctx, &mut |r| {
                        r.unwrap();
                        settled_after = Some(started.elapsed());
                    })
                    .unwrap();
                let fetched =
                    shufflefs::node::fetch_missing(&store, me, &step, Duration::from_secs(30));
                for &id in step.next.share(me) {
                    let got = store.read(id).unwrap();
                    let want: Vec<u8> = (0..got.len() as u64)
                        .map(|o| synthetic_byte(id, o))
                        .collect();
                    assert_eq!(got, want, "rank {me}: sample {id}");
                }
                let report = tracker.snapshot().pop().unwrap();
                let total = started.elapsed();
                // The next exchange: every receiver gave rank 3 up, so it left the
                // exchanges; both sides leave each other out and fetch from the source.
                let step2 = plan.step(&step.next);
                partial
                    .run(comm.as_mut(), &step2, ctx, &mut |r| r.unwrap())
                    .unwrap();
                shufflefs::node::fetch_missing(&store, me, &step2, Duration::from_secs(30));
                for &id in step2.next.share(me) {
                    let got = store.read(id).unwrap();
                    assert!(
                        got.iter()
                            .enumerate()
                            .all(|(o, &b)| b == synthetic_byte(id, o as u64))
                    );
                }
                let next = tracker.snapshot().pop().unwrap();
                assert_eq!(next.target_epoch, 2);
                for p in &next.peers {
                    let left_out = me == 3 || p.rank == 3;
                    assert_eq!(p.given_up, left_out, "rank {me} into 2: {next:?}");
                    if left_out {
                        assert_eq!(p.samples_received, 0, "rank {me} into 2: {next:?}");
                    }
                }
                (me, settled_after.unwrap(), total, report, fetched)
            })
        })
        .collect();
    for h in handles {
        let (me, settled, total, report, fetched) = h.join().unwrap();
        let slow = report.peers.iter().find(|p| p.rank == 3);
        if me == 3 {
            assert!(
                report.peers.iter().all(|p| !p.given_up),
                "the slow rank gives nobody up"
            );
            continue;
        }
        let slow = slow.unwrap();
        assert!(
            slow.given_up,
            "rank {me} waited for the slow peer: {report:?}"
        );
        assert!(
            settled < Duration::from_secs(3) && settled < total,
            "rank {me} settled after {settled:?} (run took {total:?})"
        );
        assert!(
            fetched.iter().any(|&(peer, n)| peer == 3 && n > 0),
            "rank {me}: {fetched:?}"
        );
        assert!(
            report
                .peers
                .iter()
                .filter(|p| p.rank != 3)
                .all(|p| !p.given_up),
            "only the slow peer is given up: {report:?}"
        );
    }
}

/// Rank 3 stops (`Partial::leave`) while the others run the exchange into epoch 1: it
/// serves that exchange without a sample, the others complete it (fetching what it owed
/// them from the source), and their exchange into epoch 2 leaves it out at once (shown
/// given up) instead of waiting for it. Every rank that stays holds its shares exactly.
#[test]
fn a_rank_that_leaves_serves_one_exchange_without_samples_then_is_left_out() {
    let world = 4;
    let manifest = manifest(300);
    let plan = plan(manifest.len(), world, 0.5, 31);
    let handles: Vec<_> = LocalComm::world(world)
        .into_iter()
        .map(|comm| {
            let (manifest, plan) = (manifest.clone(), plan.clone());
            std::thread::spawn(move || {
                let _guard = AbortOnPanic;
                let me = comm.rank();
                let mut comm = comm;
                let (_dir, store) = staged(manifest, plan.initial().share(me));
                let cfg = ExchangeConfig {
                    frame: 4096,
                    ..ExchangeConfig::default()
                };
                let mut partial = Partial {
                    cfg,
                    peers: Peers::separate(world),
                };
                let tracker = ExchangeTracker::default();
                let into1 = plan.step(&plan.initial());
                if me == 3 {
                    partial.leave(&mut comm, &store, &tracker, &into1).unwrap();
                    return (me, Vec::new());
                }
                let abort = AtomicBool::new(false);
                let ctx = ExchangeCtx {
                    store: &store,
                    tracker: &tracker,
                    abort: &abort,
                };
                let into2 = plan.step(&into1.next);
                for step in [&into1, &into2] {
                    partial
                        .run(&mut comm, step, ctx, &mut |r| r.unwrap())
                        .unwrap();
                    shufflefs::node::fetch_missing(&store, me, step, Duration::from_secs(30));
                    for &id in step.next.share(me) {
                        check_sample(&store, id);
                    }
                }
                (me, tracker.snapshot())
            })
        })
        .collect();
    for h in handles {
        let (me, reports) = h.join().unwrap();
        if me == 3 {
            continue;
        }
        let report = |target: u64| reports.iter().find(|r| r.target_epoch == target).unwrap();
        let gone = |target: u64| report(target).peers.iter().find(|p| p.rank == 3).cloned();
        let in1 = gone(1).expect("rank 3 in the exchange into 1");
        assert!(in1.samples_received == 0, "rank {me}: {in1:?}");
        let in2 = gone(2).expect("rank 3 shown in the exchange into 2");
        assert!(
            in2.given_up && in2.samples_to_receive == 0,
            "rank {me}: {in2:?}"
        );
        assert_eq!(report(2).state, ExchangeState::Done);
    }
}

/// Every rank stops at once (the end of an ordinary job): each serves the exchange in flight
/// without samples and returns only once every message it posted completed. Long sends
/// complete late here, as under MPI past its eager limit: the size lists (a leaving rank's
/// only long messages) once were not waited for, so the communicator abandoned them, MPI
/// was never finalized and every job ended with exit 1.
#[test]
fn ranks_leaving_together_return_with_nothing_pending() {
    let world = 4;
    let manifest = manifest(1200);
    let plan = plan(manifest.len(), world, 0.5, 7);
    let handles: Vec<_> = LocalComm::world(world)
        .into_iter()
        .map(|comm| {
            let (manifest, plan) = (manifest.clone(), plan.clone());
            std::thread::spawn(move || {
                let _guard = AbortOnPanic;
                let me = comm.rank();
                let mut comm = Lagging::new(comm, Duration::from_millis(300));
                let open = comm.open();
                let (_dir, store) = staged(manifest, plan.initial().share(me));
                let mut partial = Partial {
                    cfg: ExchangeConfig::default(),
                    peers: Peers::separate(world),
                };
                let tracker = ExchangeTracker::default();
                let into1 = plan.step(&plan.initial());
                partial.leave(&mut comm, &store, &tracker, &into1).unwrap();
                let open = open.load(std::sync::atomic::Ordering::Relaxed);
                assert_eq!(open, 0, "rank {me} returned with messages pending");
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// Rank 0's size lists name other samples than the plan puts in its streams (the first id
/// of each list is off by one, as if its plan disagreed): its receivers store nothing of
/// those streams, count them failed, drain their bytes, and every rank still ends with the
/// exact bytes of its share (fetched from the source). Without the ids in the lists, the
/// receivers stored each of rank 0's samples under the id their own plan expected.
#[test]
fn a_peer_whose_size_lists_disagree_with_the_plan_has_nothing_stored() {
    let world = 3;
    let manifest = manifest(600);
    let plan = plan(manifest.len(), world, 0.5, 9);
    let step = plan.step(&plan.initial());
    let handles: Vec<_> = LocalComm::world(world)
        .into_iter()
        .map(|comm| {
            let (manifest, plan, step) = (manifest.clone(), plan.clone(), step.clone());
            std::thread::spawn(move || {
                let _guard = AbortOnPanic;
                let me = comm.rank();
                let mut seen = std::collections::HashSet::new();
                let mut comm: Box<dyn Comm> = match me {
                    // The data tag of the exchange into epoch 1; a peer's first message on it
                    // is the size list, whose first 8 bytes are its first sample's id.
                    0 => Box::new(Rewriting::new(comm, move |op: &mut Op| {
                        if op.tag == 1 << 2 && seen.insert(op.peer) && op.buf.len() >= 8 {
                            let id = u64::from_le_bytes(op.buf[..8].try_into().unwrap());
                            op.buf[..8].copy_from_slice(&(id + 1).to_le_bytes());
                        }
                    })),
                    _ => Box::new(comm),
                };
                let (_dir, store) = staged(manifest, plan.initial().share(me));
                let cfg = ExchangeConfig {
                    frame: 4096,
                    ..ExchangeConfig::default()
                };
                let tracker = ExchangeTracker::default();
                let abort = AtomicBool::new(false);
                exchange::run(comm.as_mut(), &store, &step, cfg, &tracker, &abort).unwrap();
                let report = tracker.snapshot().into_iter().last().unwrap();
                let from0 = step.transfers.iter().filter(|t| t.from == 0 && t.to == me);
                let expected = from0.count() as u64;
                if me != 0 {
                    assert!(expected > 0, "rank {me} receives from rank 0");
                    assert!(report.failed_samples >= expected, "rank {me}: {report:?}");
                }
                shufflefs::node::fetch_missing(&store, me, &step, Duration::from_secs(30));
                for &id in step.next.share(me) {
                    check_sample(&store, id);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// Samples of one size each, so every stream of a test spans several frames.
fn uniform_manifest(samples: u64, size: u64) -> Arc<Manifest> {
    let names = (0..samples)
        .map(|i| (format!("s{i:05}.bin").into_bytes(), size))
        .collect();
    Arc::new(Manifest::from_parts(vec![(b"all".to_vec(), names)]).unwrap())
}

/// Runs one exchange on `world` ranks with frames of `frame` bytes and a frame budget of
/// `budget` bytes; checks every rank holds its next share exactly and returns each rank's
/// most bytes held in frames at once.
fn exchange_under_budget(world: u32, frame: usize, budget: usize, wrap: Wrap) -> Vec<u64> {
    let manifest = uniform_manifest(u64::from(world) * 48, 3 * frame as u64);
    let plan = plan(manifest.len(), world, 0.75, 77);
    let handles: Vec<_> = LocalComm::world(world)
        .into_iter()
        .map(|comm| {
            let (manifest, plan) = (manifest.clone(), plan.clone());
            std::thread::spawn(move || {
                let _guard = AbortOnPanic;
                let me = comm.rank();
                let mut comm: Box<dyn Comm> = match wrap {
                    Wrap::Delaying => Box::new(Delaying::new(comm, u64::from(me) + 7)),
                    _ => Box::new(comm),
                };
                let cur = plan.initial();
                let (_dir, store) = staged(manifest, cur.share(me));
                let step = plan.step(&cur);
                let (tracker, abort) = (ExchangeTracker::default(), AtomicBool::new(false));
                let cfg = ExchangeConfig {
                    frame,
                    frame_budget: budget,
                    ..ExchangeConfig::default()
                };
                exchange::run(comm.as_mut(), &store, &step, cfg, &tracker, &abort).unwrap();
                let report = tracker.snapshot().into_iter().last().unwrap();
                assert_eq!(report.state, ExchangeState::Done);
                assert_eq!(report.failed_samples, 0, "rank {me}");
                assert_eq!(report.bytes_received, report.bytes_to_receive, "rank {me}");
                for &id in step.next.share(me) {
                    check_sample(&store, id);
                }
                report.frame_bytes_peak
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// the frames a rank holds stay within the budget however many ranks there are.
/// Before, frames shrank to fit the budget only down to 1 MiB and every stream ran at once,
/// so the frames held grew with the number of ranks: here 15 streams out and 15 in against a
/// budget for 4 (the old code held 1.4-3.3x the budget on every rank).
#[test]
fn the_frames_a_rank_holds_stay_within_the_budget_with_many_ranks() {
    let (frame, budget) = (4096, 4 * 9 * 4096);
    for wrap in [Wrap::None, Wrap::Delaying] {
        let peaks = exchange_under_budget(16, frame, budget, wrap);
        assert!(peaks.iter().all(|&p| p > 0), "{peaks:?}");
        assert!(
            peaks.iter().all(|&p| p <= budget as u64),
            "bytes held in frames per rank {peaks:?}, budget {budget}"
        );
    }
}

/// The smallest budget (one stream each way at a time, the most waves) still completes
/// every rank's exchange: waves cannot wait on each other in a cycle.
#[test]
fn an_exchange_with_many_ranks_and_a_tiny_budget_completes() {
    let peaks = exchange_under_budget(24, 4096, 1, Wrap::Delaying);
    assert!(peaks.iter().all(|&p| p <= 2 * 9 * 4096), "{peaks:?}");
}

/// What a store learns of samples (sizes an index lacks, source times) follows the rank's
/// share, not the dataset: each rank plans only its own share (`own_step`),
/// exchanges, and drops what left through the exchange's eviction; after every epoch the
/// store keeps something only of samples of its share. (The old store held two 8-byte
/// slots for every sample of the dataset on every rank; a job of a few ranks still does,
/// which costs less there: `cache::table`.)
#[test]
fn what_a_store_learns_follows_the_share_across_epochs() {
    use shufflefs::dataset::ImageFolder;
    use shufflefs::exchange::{EpochExchange, ExchangeCtx, Partial, Peers};
    let src = tempfile::tempdir().unwrap();
    for c in 0..4 {
        let class = src.path().join(format!("class{c}"));
        std::fs::create_dir(&class).unwrap();
        for i in 0..30u32 {
            std::fs::write(
                class.join(format!("{i:03}.bin")),
                vec![c as u8; 10 + i as usize],
            )
            .unwrap();
        }
    }
    let manifest = Arc::new(shufflefs::dataset::scan::scan(src.path()).unwrap());
    let world = 3u32;
    let plan = plan(manifest.len(), world, 0.5, 11);
    let handles: Vec<_> = LocalComm::world(world)
        .into_iter()
        .map(|mut comm| {
            let (manifest, plan, root) = (manifest.clone(), plan.clone(), src.path().to_path_buf());
            std::thread::spawn(move || {
                let _guard = AbortOnPanic;
                let me = comm.rank();
                let dir = tempfile::tempdir().unwrap();
                let source = Arc::new(ImageFolder::new(root, manifest.clone()));
                let dir = CacheDir::open(dir.path()).unwrap();
                let backend =
                    (dir.backend(shufflefs::cache::CacheLayout::Files, manifest.len())).unwrap();
                // A job of 64 ranks: the store keeps maps, not arrays over every id.
                let store =
                    SampleStore::with_backend_for(dir, backend, manifest.clone(), source, 64)
                        .unwrap();
                let mut cur = plan.own_initial(me);
                for &id in cur.share(me) {
                    store.ensure(id).unwrap();
                }
                let mut partial = Partial {
                    cfg: ExchangeConfig::default(),
                    peers: Peers::separate(world),
                };
                let (tracker, abort) = (ExchangeTracker::default(), AtomicBool::new(false));
                for _ in 0..4 {
                    let step = plan.own_step(me, &cur);
                    let ctx = ExchangeCtx {
                        store: &store,
                        tracker: &tracker,
                        abort: &abort,
                    };
                    partial
                        .run(&mut comm, &step, ctx, &mut |r| r.unwrap())
                        .unwrap();
                    for &id in step.next.share(me) {
                        store.ensure(id).unwrap();
                    }
                    let left: Vec<u64> = (cur.share(me).iter().copied())
                        .filter(|id| step.next.share(me).binary_search(id).is_err())
                        .collect();
                    partial.evict(&store, left);
                    cur = step.next;
                    let share = cur.share(me);
                    assert_eq!(store.learned_samples(), share.len(), "rank {me}");
                    assert!(share.iter().all(|&id| store.size(id).is_some()));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
