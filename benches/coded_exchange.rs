//! Coded exchange on real MPI: shuffle time of one epoch for `uncoded`, `coded` and
//! `ubershuffle`, and for every rank reading what it lacks straight from the storage host,
//! side by side in one run. Launched by `benches/coded_exchange.sh` (emulated hosts: the
//! server alone on a host whose link is the bottleneck); alone it only explains.
//!
//! World rank 0 is the server, ranks 1..=M compute ranks. Per scheme, every compute rank
//! starts from a fresh cache holding exactly its epoch-0 cache `C^0` (filled from the
//! synthetic source, not timed: the paper's placement phase), then the exchange into epoch 1
//! runs (`CodedClient::run` / `Server::serve`: requests, packets on the merged
//! communicators, decoding, CRC checks, cache writes and the final sync) and its time is the
//! slowest rank's. `direct`: the server sends each rank exactly the samples of its new share
//! it does not cache, all ranks at once, from memory, one message per rank (what reading them
//! from an NFS server at link speed costs, with no coding); the same bytes are written into
//! the cache and synced. `floor`: the server's bytes of that scheme at `SHUFFLEFS_LINK_BYTES_PER_S`.
//! `measured`: what the server's host actually sent on its link (`/proc/self/net/dev`), which
//! shows how many copies MPI's broadcast makes leave the root (a binomial tree sends one per
//! child of the root, a pipeline one in all). CPU: the server's encode seconds (reading samples from memory and XOR) and the slowest
//! rank's decode seconds (reading cached parts from disk, XOR, CRC), per epoch.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use shufflefs::cache::{CacheDir, SampleStore};
use shufflefs::coded::Scheme;
use shufflefs::coded::groups::Communicators;
use shufflefs::comm::{Batch, Comm, MpiComm, launched_by_mpi};
use shufflefs::dataset::manifest::Manifest;
use shufflefs::dataset::{Dataset, SyntheticSource};
use shufflefs::exchange::ExchangeTracker;
use shufflefs::exchange::coded::routes::Multicast;
use shufflefs::exchange::coded::{CodedClient, Routes, ServeSettings, Server, ServerSamples};
use shufflefs::plan::{Plan, PlanParams, SampleId};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn gather_f64(world: &mut dyn Comm, x: f64) -> Vec<f64> {
    world
        .all_gather(&x.to_le_bytes())
        .unwrap()
        .iter()
        .map(|b| f64::from_le_bytes(b.as_slice().try_into().unwrap()))
        .collect()
}

/// Bytes this process's network namespace sent on `eth0` so far (`/proc/self/net/dev`, which
/// shows the namespace of the reader; the emulated hosts' link is `eth0`), if there is one.
fn tx_bytes() -> Option<u64> {
    let dev = std::fs::read_to_string("/proc/self/net/dev").ok()?;
    let line = dev.lines().find(|l| l.trim_start().starts_with("eth0:"))?;
    line.split_once(':')?
        .1
        .split_whitespace()
        .nth(8)?
        .parse()
        .ok()
}

fn main() {
    if !launched_by_mpi() {
        println!("coded_exchange: run under mpirun via benches/coded_exchange.sh");
        return;
    }
    let mut world = MpiComm::init().unwrap();
    let me = world.rank();
    let ranks = world.size() - 1;
    let samples: u64 = env("SHUFFLEFS_BENCH_SAMPLES", 2000);
    let size: u64 = env("SHUFFLEFS_BENCH_SAMPLE_BYTES", 100_000);
    let alpha: f64 = env("SHUFFLEFS_BENCH_ALPHA", 2.0 / f64::from(ranks));
    let link: f64 = env("SHUFFLEFS_LINK_BYTES_PER_S", 0.0);
    let dir = std::path::PathBuf::from(env("SHUFFLEFS_BENCH_DIR", "/tmp".to_string()));
    let names = (0..samples)
        .map(|i| (format!("s{i:06}").into_bytes(), size))
        .collect();
    let manifest = Arc::new(Manifest::from_parts(vec![(b"c".to_vec(), names)]).unwrap());
    let source: Arc<dyn Dataset> = Arc::new(SyntheticSource {
        manifest: manifest.clone(),
    });
    let params = PlanParams {
        samples,
        world: ranks,
        fraction: 0.0,
        seed: 5,
    };
    let plan = Plan::coded(params, alpha).unwrap();
    let shares = plan.coded_shares().unwrap().clone();
    if me == 0 {
        println!(
            "{ranks} compute ranks, {samples} samples of {size} B, alpha {alpha} (cache {} samples per rank)",
            (alpha * samples as f64).floor()
        );
        println!(
            "| scheme | epoch 0->1 time (s) | server payload (MB) | server link sent, measured (MB) | link floor (s) | packets | plain samples | encode CPU (s) | decode CPU, slowest rank (s) |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
    }
    // (name, scheme or direct, communicator limit): 1024 gives every group of up to 10 ranks
    // its own communicator; 1 sends every multicast to every rank on the world communicator.
    let uber = Scheme::Ubershuffle { nu: 2 };
    let (ring, bcast) = (Multicast::Ring, Multicast::Broadcast);
    let schemes = [
        ("uncoded", Some(Scheme::Uncoded), 1024, ring),
        ("coded, ring", Some(Scheme::Coded), 1024, ring),
        ("ubershuffle, ring", Some(uber), 1024, ring),
        ("coded, broadcast", Some(Scheme::Coded), 1024, bcast),
        ("ubershuffle, broadcast", Some(uber), 1024, bcast),
        (
            "ubershuffle, broadcast, 1 communicator",
            Some(uber),
            1,
            bcast,
        ),
        ("direct", None, 1, ring),
    ];
    for (name, scheme, limit, how) in schemes {
        let comms = Communicators::for_cache(ranks as usize, limit, alpha).unwrap();
        let node = (me > 0).then(|| (me - 1) as usize);
        let routes = Routes::create(&mut world, node, comms, how).unwrap();
        let cache_dir = dir.join(format!("coded-bench-{me}-{}", name.replace([' ', ','], "")));
        let _ = std::fs::remove_dir_all(&cache_dir);
        let store = (me > 0).then(|| {
            let store = SampleStore::new(
                CacheDir::open(&cache_dir).unwrap(),
                manifest.clone(),
                source.clone(),
            )
            .unwrap();
            for &id in &shares.placement_at(0).caches()[me as usize - 1] {
                store.ensure(id).unwrap();
            }
            store.sync().unwrap();
            store
        });
        // What each rank lacks of its epoch-1 share (the direct baseline's bytes).
        let lacking = |node: usize| -> Vec<SampleId> {
            let p = shares.placement_at(0);
            let next: BTreeSet<SampleId> = p.shares(1).remove(node);
            next.difference(&p.caches()[node]).copied().collect()
        };
        // The server's samples in memory before the clock starts (both paths send from it).
        let mut held = (me == 0).then(|| {
            let mut held = ServerSamples::new(source.clone(), manifest.clone(), u64::MAX);
            for id in 0..samples {
                held.get(id).unwrap();
            }
            held
        });
        world.all_gather(&[]).unwrap();
        let tx_before = tx_bytes();
        let started = Instant::now();
        let (mut server_bytes, mut packets, mut plain, mut encode, mut decode) =
            (0u64, 0u64, 0u64, 0.0f64, 0.0f64);
        let abort = AtomicBool::new(false);
        match (scheme, &store) {
            (Some(scheme), None) => {
                let settings = ServeSettings {
                    shares: shares.clone(),
                    scheme,
                    epoch: 0,
                };
                let held = held.take().unwrap();
                let mut server = Server::new(settings, routes, held);
                server.serve(&mut world, &abort).unwrap();
                let st = server.steps()[0];
                server_bytes = st.packet_bytes;
                packets = st.packets;
                plain = st.plain_samples;
                encode = st.encode_seconds;
            }
            (Some(scheme), Some(store)) => {
                let mut client = CodedClient::new(&plan, me - 1, scheme, routes, 0);
                let step = plan.step(&plan.initial());
                let tracker = ExchangeTracker::default();
                client
                    .run(&mut world, store, &step, &tracker, &abort, &mut |_| {})
                    .unwrap();
                let report = tracker.snapshot().pop().unwrap();
                decode = report.coded.unwrap().decode_seconds;
                client.goodbye(&mut world);
            }
            (None, None) => {
                let held = held.as_mut().unwrap();
                let sends = (0..ranks as usize)
                    .map(|node| {
                        let mut msg = Vec::new();
                        for id in lacking(node) {
                            msg.extend_from_slice(&held.get(id).unwrap());
                        }
                        server_bytes += msg.len() as u64;
                        (node as u32 + 1, msg)
                    })
                    .collect();
                let batch = Batch {
                    sends,
                    recvs: vec![],
                };
                world.transfer(9, batch, &abort).unwrap();
            }
            (None, Some(store)) => {
                let ids = lacking(me as usize - 1);
                let len = ids.len() * size as usize;
                let batch = Batch {
                    sends: vec![],
                    recvs: vec![(0, vec![0; len])],
                };
                let got = world.transfer(9, batch, &abort).unwrap();
                let bytes = &got.recvs[0].1;
                for (i, id) in ids.into_iter().enumerate() {
                    let part = &bytes[i * size as usize..(i + 1) * size as usize];
                    store
                        .insert_with(id, |out: &mut dyn Write| {
                            out.write_all(part)?;
                            Ok(None)
                        })
                        .unwrap();
                }
                store.sync().unwrap();
            }
        }
        let secs = if me == 0 {
            0.0
        } else {
            started.elapsed().as_secs_f64()
        };
        let time = gather_f64(&mut world, secs).into_iter().fold(0.0, f64::max);
        let decode = gather_f64(&mut world, decode)
            .into_iter()
            .fold(0.0, f64::max);
        let sent = match (tx_before, tx_bytes()) {
            (Some(a), Some(b)) => format!("{:.1}", (b - a) as f64 / 1e6),
            _ => "-".into(),
        };
        if me == 0 {
            let total = server_bytes + plain * size;
            let floor = if link > 0.0 {
                format!("{:.2}", total as f64 / link)
            } else {
                "-".into()
            };
            println!(
                "| {name} | {time:.2} | {:.1} | {sent} | {floor} | {packets} | {plain} | {encode:.2} | {decode:.2} |",
                total as f64 / 1e6
            );
        }
        drop(store);
        let _ = std::fs::remove_dir_all(&cache_dir);
    }
}
