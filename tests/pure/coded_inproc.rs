//! The coded exchange in one process: a server thread and four compute ranks over
//! `LocalComm`, three epochs for every scheme, every byte checked against the synthetic
//! source. Faults: a rank loses a cached sample of its share (packets that need it cannot be
//! decoded: the server sends the sample plainly) and one of its retained samples (re-sent
//! plainly at the next step's hello, as after a crash).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use shufflefs::cache::{CacheDir, FileBackend, SampleStore};
use shufflefs::coded::groups::Communicators;
use shufflefs::coded::{self, Scheme};
use shufflefs::comm::{Comm, LocalComm};
use shufflefs::dataset::manifest::Manifest;
use shufflefs::dataset::{SyntheticSource, synthetic_byte};
use shufflefs::exchange::coded::routes::Multicast;
use shufflefs::exchange::coded::server::Ended;
use shufflefs::exchange::coded::{
    CodedClient, CodedReport, Routes, ServeSettings, Server, ServerSamples,
};
use shufflefs::exchange::{ExchangeState, ExchangeTracker};
use shufflefs::plan::{Plan, PlanParams, SampleId};

const RANKS: u32 = 4;
const ALPHA: f64 = 0.5;
const SEED: u64 = 77;

struct AbortOnPanic;

impl Drop for AbortOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            std::process::abort();
        }
    }
}

fn manifest(samples: u64) -> Arc<Manifest> {
    // Different sizes, an empty one among them: packets pad to their longest part.
    let sizes = [0u64, 1, 17, 300, 2500, 7000, 640];
    let classes = (0..3)
        .map(|c| {
            let names = (0..samples / 3)
                .map(|i| {
                    (
                        format!("s{i:04}.bin").into_bytes(),
                        sizes[(i as usize * 3 + c) % sizes.len()],
                    )
                })
                .collect();
            (format!("class{c}").into_bytes(), names)
        })
        .collect();
    Arc::new(Manifest::from_parts(classes).unwrap())
}

fn plan(samples: u64) -> Plan {
    let params = PlanParams {
        samples,
        world: RANKS,
        fraction: 0.0,
        seed: SEED,
    };
    Plan::coded(params, ALPHA).unwrap()
}

fn check_sample(store: &SampleStore, id: SampleId) {
    let bytes = std::fs::read(FileBackend::path_in(store.dir().root(), id))
        .unwrap_or_else(|e| panic!("sample {id} missing from cache: {e}"));
    assert_eq!(Some(bytes.len() as u64), store.manifest().size(id));
    assert!(
        (bytes.iter().enumerate()).all(|(o, &b)| b == synthetic_byte(id, o as u64)),
        "sample {id} bytes differ"
    );
}

/// The faults for rank 1 before the exchange into epoch 2: a share sample that some packet
/// for rank 1 needs to be XORed out (if the scheme codes at all), and a retained sample.
fn faults(plan: &Plan, scheme: Scheme) -> (Option<SampleId>, SampleId) {
    let shares = plan.coded_shares().unwrap();
    let mut p = shares.placement_at(1);
    let share1: BTreeSet<SampleId> = p.shares(1).remove(1);
    let retained = *p.caches()[1].difference(&share1).next().unwrap();
    let inst = coded::next_placed_instance(&mut p);
    // The server pairs samples by size (the manifest's here).
    let m = manifest(120);
    let size = |s: SampleId| m.size(s).unwrap();
    let needed = coded::plan_by_size(&inst, scheme, &size)
        .into_iter()
        .filter(|tx| tx.receivers().any(|r| r == 1))
        .flat_map(|tx| tx.parts.into_iter())
        .find(|&(s, r)| r != 1 && share1.contains(&s))
        .map(|(s, _)| s);
    (needed, retained)
}

/// Every rank's routes: the communicators of `coded::groups` under `limit`, created over
/// the world (collective).
fn routes(world: &mut LocalComm, me: Option<usize>, limit: usize, how: Multicast) -> Routes {
    let comms = Communicators::for_cache(RANKS as usize, limit, ALPHA).unwrap();
    assert!(comms.len() <= limit);
    let routes = Routes::create(world, me, comms, how).unwrap();
    match how {
        Multicast::Broadcast => assert!(routes.created() >= 1, "sub-communicators in use"),
        Multicast::Ring => assert_eq!(routes.created(), 0, "a ring needs no communicator"),
    }
    routes
}

/// Runs 3 epochs under `scheme` with at most `limit` communicators; returns every rank's
/// per-epoch coded reports.
fn run(scheme: Scheme, limit: usize, how: Multicast) -> Vec<Vec<CodedReport>> {
    let manifest = manifest(120);
    let plan = plan(manifest.len());
    let cache_size = (ALPHA * manifest.len() as f64).floor() as u64;
    let (lost_share, lost_retained) = faults(&plan, scheme);
    let barrier = Arc::new(Barrier::new(RANKS as usize));
    let mut comms = LocalComm::world(RANKS + 1).into_iter();
    let server = {
        let mut comm = comms.next().unwrap();
        let (manifest, plan) = (manifest.clone(), plan.clone());
        std::thread::spawn(move || {
            let _guard = AbortOnPanic;
            let settings = ServeSettings {
                shares: plan.coded_shares().unwrap().clone(),
                scheme,
                epoch: 0,
            };
            let samples = ServerSamples::new(
                Arc::new(SyntheticSource {
                    manifest: manifest.clone(),
                }),
                manifest.clone(),
                10_000, // less than the dataset: some samples are re-read every time
            );
            let routes = routes(&mut comm, None, limit, how);
            let mut server = Server::new(settings, routes, samples);
            server.serve(&mut comm, &AtomicBool::new(false)).unwrap()
        })
    };
    let ranks: Vec<_> = comms
        .map(|mut world| {
            let (manifest, plan, barrier) = (manifest.clone(), plan.clone(), barrier.clone());
            std::thread::spawn(move || {
                let _guard = AbortOnPanic;
                let me = world.rank() - 1;
                let dir = tempfile::tempdir().unwrap();
                let source = Arc::new(SyntheticSource {
                    manifest: manifest.clone(),
                });
                let store = SampleStore::new(CacheDir::open(dir.path()).unwrap(), manifest, source)
                    .unwrap();
                let mut cur = plan.initial();
                for &id in cur.share(me) {
                    store.ensure(id).unwrap(); // what staging does
                }
                let routes = routes(&mut world, Some(me as usize), limit, how);
                let mut client = CodedClient::new(&plan, me, scheme, routes, 0);
                let tracker = ExchangeTracker::default();
                let abort = AtomicBool::new(false);
                let mut reports = Vec::new();
                for _ in 0..3 {
                    let step = plan.step(&cur);
                    if me == 1 && step.next.epoch == 2 {
                        // Gone unnoticed (the store still lists it): found when decoding.
                        if let Some(id) = lost_share {
                            std::fs::remove_file(FileBackend::path_in(dir.path(), id)).unwrap();
                        }
                        // Gone as a restart finds it (not in the store).
                        store.remove(lost_retained).unwrap();
                    }
                    let mut settled = None;
                    client
                        .run(&mut world, &store, &step, &tracker, &abort, &mut |r| {
                            settled = Some(r.is_ok())
                        })
                        .unwrap();
                    assert_eq!(settled, Some(true));
                    let report = tracker.snapshot().into_iter().last().unwrap();
                    assert_eq!(report.state, ExchangeState::Done, "{:?}", report.error);
                    // What it lacked of the new share, in samples and their bytes.
                    let share_bytes: u64 = step
                        .next
                        .share(me)
                        .iter()
                        .map(|&id| store.manifest().size(id).unwrap())
                        .sum();
                    assert_eq!(
                        report.samples_to_receive == 0,
                        report.bytes_to_receive == 0,
                        "rank {me}: {report:?}"
                    );
                    assert!(
                        report.bytes_to_receive <= share_bytes,
                        "rank {me}: {report:?}"
                    );
                    // Done counts what the total counts (the lacking samples' bytes, not the
                    // packets' nor the cache fill's): the whole of it, never more.
                    assert_eq!(
                        (report.bytes_received, report.bytes_sent),
                        (report.bytes_to_receive, report.bytes_to_send),
                        "rank {me}: {report:?}"
                    );
                    // The exchange alone delivered the whole share: nothing from the source.
                    for &id in step.next.share(me) {
                        assert!(store.contains(id), "rank {me}: sample {id} not delivered");
                        check_sample(&store, id);
                    }
                    let files = store.stats.files.load(Ordering::Relaxed);
                    let limit = cache_size + step.next.share(me).len() as u64;
                    assert!(files <= limit, "rank {me}: {files} files, limit {limit}");
                    // Side information is dropped once used: what is left is the view being
                    // read and the next cache.
                    let shares = plan.coded_shares().unwrap();
                    let next = shares.placement_at(step.next.epoch);
                    let next_cache = &next.caches()[me as usize];
                    let kept = (cur.share(me).iter())
                        .filter(|s| !next_cache.contains(s))
                        .count()
                        + next_cache.len();
                    assert!(
                        files <= kept as u64,
                        "rank {me}: {files} files, {kept} kept"
                    );
                    reports.push(report.coded.unwrap());
                    cur = step.next;
                    barrier.wait();
                }
                assert_eq!(
                    store.stats.fetched_from_source.load(Ordering::Relaxed) as usize,
                    plan.initial().share(me).len(),
                    "rank {me}: only the first share comes from the source"
                );
                client.goodbye(&mut world);
                (me, reports)
            })
        })
        .collect();
    let mut out: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
    out.sort_by_key(|r| r.0);
    assert!(matches!(server.join().unwrap(), Ended::RankLeft(_)));
    let reports: Vec<Vec<CodedReport>> = out.into_iter().map(|r| r.1).collect();

    let share = 120 / RANKS as u64;
    for (rank, rs) in reports.iter().enumerate() {
        // Epoch 1: the fresh caches are filled by the server (beyond the staged share).
        assert_eq!(rs[0].cache_fill_samples, cache_size - share, "rank {rank}");
        assert_eq!(rs[0].scheme, scheme.name());
        if rank == 1 {
            assert_eq!(rs[1].cache_fill_samples, 1, "the lost retained sample");
            if let Some(s) = lost_share {
                assert!(rs[1].decode_failures >= 1, "sample {s} lost: {:?}", rs[1]);
                assert!(rs[1].fallback_samples >= 1, "{:?}", rs[1]);
            }
        } else {
            assert_eq!(rs[1].decode_failures, 0, "rank {rank}: {:?}", rs[1]);
        }
        assert_eq!(rs[2].decode_failures, 0);
        assert_eq!(rs[2].cache_fill_samples, 0);
    }
    reports
}

#[test]
fn every_scheme_delivers_exact_bytes_over_three_epochs() {
    // 4 ranks have 11 groups of two or more: 1024 gives each its own communicator, 3 merges
    // them into unions of blocks (members outside a group drop its packets).
    let uncoded = run(Scheme::Uncoded, 1024, Multicast::Ring);
    let coded = run(Scheme::Coded, 1024, Multicast::Broadcast);
    let uber = run(Scheme::Ubershuffle { nu: 2 }, 3, Multicast::Broadcast);
    // Theorem 4's scatter-and-ring, on exact groups and on merged ones.
    let ring = run(Scheme::Coded, 1024, Multicast::Ring);
    let merged_ring = run(Scheme::Ubershuffle { nu: 2 }, 3, Multicast::Ring);
    assert_eq!(ring[0][2].packets_planned, coded[0][2].packets_planned);
    assert_eq!(
        merged_ring[0][2].packets_planned,
        uber[0][2].packets_planned
    );
    // One packet per missing demand uncoded; coding sends fewer (paper, Theorem 2).
    for e in 0..3 {
        let (u, c, b) = (
            uncoded[0][e].packets_planned,
            coded[0][e].packets_planned,
            uber[0][e].packets_planned,
        );
        assert!(
            c < u && b <= c,
            "epoch {}: uncoded {u}, coded {c}, ubershuffle {b}",
            e + 1
        );
    }
    // Coded packets carry something for several ranks: some rank decodes from packets
    // whose other parts it caches.
    assert!(coded.iter().all(|rs| rs[2].samples_decoded > 0));
}
