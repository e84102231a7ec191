//! Elastic restarts in one process: the whole start-up (state files, gone ranks' caches,
//! regrow, reclaim) over `LocalComm` worlds of 4, then 2, then 3 ranks on the same cache
//! folders, with epochs run in between by the real exchange.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use clap::Parser;

use super::startup::{Prepared, prepare};
use crate::cache::{CacheState, FileBackend};
use crate::cli::{Cli, Command};
use crate::comm::{Comm, LocalComm};
use crate::config::MountConfig;
use crate::exchange::{self, ExchangeConfig, ExchangeTracker};
use crate::node::resumed::RegrowReport;
use crate::plan::elastic::{ElasticPlan, History};
use crate::plan::{PlanParams, SampleId};

const SEED: u64 = 5;
const FRACTION: f64 = 0.5;
const SAMPLES: u32 = 60;

struct Folders {
    root: tempfile::TempDir,
}

/// What one rank saw: its report, and its cache's samples after each epoch it ran.
struct RankRun {
    rank: u32,
    epoch: u64,
    report: Option<RegrowReport>,
    held: Vec<BTreeSet<SampleId>>,
}

impl Folders {
    /// 3 classes x 20 samples of distinct bytes, mount folders for 4 ranks.
    fn new() -> Folders {
        let root = tempfile::tempdir().unwrap();
        for c in 0..3u8 {
            let dir = root.path().join("src").join(format!("c{c}"));
            std::fs::create_dir_all(&dir).unwrap();
            for i in 0..20u8 {
                std::fs::write(
                    dir.join(format!("{i:02}.bin")),
                    vec![c * 20 + i; 50 + i as usize],
                )
                .unwrap();
            }
        }
        for r in 0..4 {
            std::fs::create_dir_all(root.path().join(format!("mnt-{r}"))).unwrap();
        }
        Folders { root }
    }

    fn cache(&self, rank: u32) -> PathBuf {
        self.root.path().join(format!("cache-{rank}"))
    }

    fn args(&self, scope: &str) -> MountConfig {
        let p = |name: &str| self.root.path().join(name).display().to_string();
        let cli = Cli::parse_from([
            "shufflefs",
            "mount",
            "--source",
            &p("src"),
            "--cache",
            &p("cache-{rank}"),
            "--seed",
            &SEED.to_string(),
            "--fraction",
            &FRACTION.to_string(),
            "--exchange-scope",
            scope,
            &p("mnt-{rank}"),
        ]);
        match cli.command {
            Command::Mount(args) => MountConfig::try_from(args).expect("valid settings"),
            Command::Unmount(_) | Command::Plan(_) | Command::Serve(_) | Command::Status(_) => {
                unreachable!()
            }
        }
    }

    /// Starts `world` ranks, fills their shares from the source (as staging would), then runs
    /// `epochs` exchanges as the daemon does (send, drop what left, save the epoch).
    fn run(&self, world: u32, epochs: u64) -> Result<Vec<RankRun>, String> {
        let args = self.args("global");
        let handles: Vec<_> = LocalComm::world(world)
            .into_iter()
            .map(|mut comm| {
                let args = args.clone();
                std::thread::spawn(move || -> Result<RankRun, String> {
                    let prepared = prepare(&args, &mut comm).map_err(|e| e.to_string())?;
                    Ok(run_epochs(&mut comm, prepared, epochs))
                })
            })
            .collect();
        let mut runs: Vec<RankRun> = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Result<_, _>>()?;
        runs.sort_by_key(|r| r.rank);
        Ok(runs)
    }

    fn state(&self, rank: u32) -> CacheState {
        let path = self.cache(rank).join("state.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    /// Every cached sample of `rank` has its source bytes.
    fn check_bytes(&self, rank: u32, held: &BTreeSet<SampleId>) {
        for &id in held {
            let bytes = std::fs::read(FileBackend::path_in(&self.cache(rank), id)).unwrap();
            let (c, i) = (id / 20, id % 20);
            assert_eq!(
                bytes,
                vec![(c * 20 + i) as u8; 50 + i as usize],
                "sample {id}"
            );
        }
    }
}

fn run_epochs(comm: &mut dyn Comm, p: Prepared, epochs: u64) -> RankRun {
    let rank = comm.rank();
    let store = p.store;
    let mut cur = p.resumed.current;
    let start = cur.epoch;
    let held = |store: &crate::cache::SampleStore| -> BTreeSet<SampleId> {
        (0..u64::from(SAMPLES))
            .filter(|&i| store.contains(i))
            .collect()
    };
    for &id in cur.share(rank) {
        store.ensure(id).unwrap();
    }
    let mut seen = vec![held(&store)];
    for _ in 0..epochs {
        let step = p.plan.own_step(rank, &cur);
        exchange::run(
            comm,
            &store,
            &step,
            ExchangeConfig::default(),
            &ExchangeTracker::default(),
            &AtomicBool::new(false),
        )
        .unwrap();
        for t in step.transfers.iter().filter(|t| t.from == rank) {
            store.remove(t.sample).unwrap();
        }
        for &id in step.next.share(rank) {
            store.ensure(id).unwrap();
        }
        let mut state = store.dir().load_state().unwrap().unwrap();
        state.epoch = step.next.epoch;
        store.dir().save_state(&state).unwrap();
        cur = step.next;
        seen.push(held(&store));
    }
    RankRun {
        rank,
        epoch: start,
        report: p.resumed.resize,
        held: seen,
    }
}

fn params() -> PlanParams {
    PlanParams {
        samples: u64::from(SAMPLES),
        world: 0,
        fraction: FRACTION,
        seed: SEED,
    }
}

/// Each rank's cache holds exactly its planned share at every epoch it ran (at the first,
/// also what it happened to hold of the next), with the source's bytes.
fn check_runs(folders: &Folders, runs: &[RankRun], history: &History) {
    let plan = ElasticPlan::new(params(), history.clone()).unwrap();
    let share = |epoch: u64, rank: u32| -> BTreeSet<SampleId> {
        plan.shares_at(epoch).share(rank).iter().copied().collect()
    };
    for run in runs {
        for (i, held) in run.held.iter().enumerate() {
            let epoch = run.epoch + i as u64;
            let planned = share(epoch, run.rank);
            if i == 0 {
                let next = &planned | &share(epoch + 1, run.rank);
                assert!(
                    planned.is_subset(held) && held.is_subset(&next),
                    "rank {} epoch {epoch}: holds {held:?}, share {planned:?}",
                    run.rank
                );
            } else {
                assert_eq!(held, &planned, "rank {} epoch {epoch}", run.rank);
            }
        }
        folders.check_bytes(run.rank, run.held.last().unwrap());
    }
}

#[test]
fn four_then_two_then_three_ranks_over_the_same_caches() {
    let folders = Folders::new();
    let runs = folders.run(4, 2).unwrap();
    check_runs(&folders, &runs, &History::new(4));
    assert!(runs.iter().all(|r| r.report.is_none()), "not resized yet");

    // 4 -> 2 at epoch 2: ranks 0 and 1 keep theirs and take the gone ranks' caches.
    let two = History::new(4).resized(2, 2).unwrap();
    let runs = folders.run(2, 2).unwrap();
    check_runs(&folders, &runs, &two);
    let shrink = ElasticPlan::new(params(), two.clone()).unwrap();
    let (_, remap) = shrink.change_at(2).unwrap();
    for run in &runs {
        let report = run.report.as_ref().unwrap();
        assert_eq!(run.epoch, 2);
        assert_eq!(report.history, two.eras());
        assert_eq!(report.share_samples, 30);
        assert_eq!(report.kept, 15, "rank {}: its old share", run.rank);
        // The rest from caches 2 and 3: adopted, or handed over by the rank that took them.
        let received: u64 = report.received.values().sum();
        assert_eq!(report.adopted + received, 15, "rank {}", run.rank);
        assert_eq!(report.from_source, 0);
    }
    assert_eq!(remap.kept, 30);
    let reclaimed: BTreeSet<PathBuf> = runs
        .iter()
        .flat_map(|r| r.report.as_ref().unwrap().reclaimed.clone())
        .collect();
    assert_eq!(
        reclaimed,
        BTreeSet::from([folders.cache(2), folders.cache(3)])
    );
    assert!(!folders.cache(2).exists() && !folders.cache(3).exists());
    let state = folders.state(1);
    assert_eq!((state.epoch, state.world_size), (4, 2));
    assert_eq!(state.history().unwrap(), two);

    // 2 -> 3 at epoch 4: the new rank 2 gets its share from ranks 0 and 1.
    let three = two.resized(4, 3).unwrap();
    let runs = folders.run(3, 2).unwrap();
    check_runs(&folders, &runs, &three);
    let report = runs[2].report.as_ref().unwrap();
    assert_eq!((report.kept, report.adopted, report.from_source), (0, 0, 0));
    assert_eq!(report.received.values().sum::<u64>(), 20);
    assert_eq!(report.received.keys().copied().collect::<Vec<_>>(), [0, 1]);
    for run in &runs[..2] {
        let report = run.report.as_ref().unwrap();
        assert_eq!((report.kept, report.adopted), (20, 0), "rank {}", run.rank);
    }

    // The same 3 ranks again: an ordinary resume at epoch 6 that keeps the history.
    let runs = folders.run(3, 1).unwrap();
    check_runs(&folders, &runs, &three);
    assert!(runs.iter().all(|r| r.epoch == 6));
    let report = runs[0].report.as_ref().unwrap();
    assert_eq!(report.kept, report.share_samples, "nothing to move");
    assert_eq!(folders.state(2).history().unwrap(), three);
}

/// A restart killed half-way (rank 0 had saved the new history, rank 1 had not, nothing was
/// moved and no folder removed) is simply run again, with the same shares.
#[test]
fn a_restart_killed_half_way_is_run_again() {
    let folders = Folders::new();
    folders.run(4, 2).unwrap();
    let two = History::new(4).resized(2, 2).unwrap();
    let mut state = folders.state(0);
    state.set_history(&two);
    std::fs::write(
        folders.cache(0).join("state.json"),
        serde_json::to_vec(&state).unwrap(),
    )
    .unwrap();
    let runs = folders.run(2, 1).unwrap();
    check_runs(&folders, &runs, &two);
    for run in &runs {
        let report = run.report.as_ref().unwrap();
        assert_eq!((run.epoch, report.from_source), (2, 0), "rank {}", run.rank);
    }
    assert!(!folders.cache(2).exists() && !folders.cache(3).exists());
    assert_eq!(folders.state(1).history().unwrap(), two);
}

/// With another number of ranks a rank may start on a folder another rank used (here ranks
/// 1 and 3 swapped folders): nothing is refused, nothing comes from the source.
#[test]
fn a_rank_may_start_on_another_ranks_folder_when_resizing() {
    let folders = Folders::new();
    folders.run(4, 1).unwrap();
    let swap = folders.root.path().join("swap");
    std::fs::rename(folders.cache(1), &swap).unwrap();
    std::fs::rename(folders.cache(3), folders.cache(1)).unwrap();
    std::fs::rename(&swap, folders.cache(3)).unwrap();
    let runs = folders.run(2, 1).unwrap();
    check_runs(&folders, &runs, &History::new(4).resized(1, 2).unwrap());
    for run in &runs {
        let report = run.report.as_ref().unwrap();
        assert_eq!(report.from_source, 0, "rank {}", run.rank);
    }
    assert_eq!(folders.state(1).rank, 1);
    assert!(!folders.cache(3).exists(), "reclaimed");

    // The same world size on a swapped folder is still refused.
    std::fs::rename(folders.cache(0), &swap).unwrap();
    std::fs::rename(folders.cache(1), folders.cache(0)).unwrap();
    std::fs::rename(&swap, folders.cache(1)).unwrap();
    let err = folders.run(2, 0).err().unwrap();
    assert!(err.contains("rank: cache has 1, now 0"), "{err}");
}

/// Folders that are not this job's are never touched; node scope refuses to resize.
#[test]
fn foreign_folders_are_left_alone_and_node_scope_refuses() {
    let folders = Folders::new();
    folders.run(4, 1).unwrap();
    // cache-3 now holds another seed's state: not an orphan of this job.
    let mut foreign = folders.state(3);
    foreign.seed = 99;
    std::fs::write(
        folders.cache(3).join("state.json"),
        serde_json::to_vec(&foreign).unwrap(),
    )
    .unwrap();
    let runs = folders.run(2, 0).unwrap();
    // Every rank's report lists what the job removed, whichever rank removed it.
    for r in &runs {
        assert_eq!(r.report.as_ref().unwrap().reclaimed, [folders.cache(2)]);
    }
    assert!(folders.cache(3).join("state.json").is_file());
    let from_source: u64 = runs
        .iter()
        .map(|r| r.report.as_ref().unwrap().from_source)
        .sum();
    assert_eq!(from_source, 15, "cache 3's share comes from the source");

    // Ranks whose caches disagree on the job's history: refused, naming both.
    for (rank, world) in [(0, 2), (1, 3)] {
        let mut state = folders.state(rank);
        state.set_history(&History::new(4).resized(1, world).unwrap());
        state.rank = rank;
        std::fs::write(
            folders.cache(rank).join("state.json"),
            serde_json::to_vec(&state).unwrap(),
        )
        .unwrap();
    }
    let err = folders.run(2, 0).err().unwrap();
    assert!(err.contains("belong to different jobs"), "{err}");
    assert!(
        err.contains("4 ranks, 2 from epoch 1") && err.contains("4 ranks, 3 from epoch 1"),
        "{err}"
    );

    let node = tempfile::tempdir().unwrap();
    let folders = Folders { root: node };
    for r in 0..4 {
        std::fs::create_dir_all(folders.root.path().join(format!("mnt-{r}"))).unwrap();
    }
    std::fs::create_dir_all(folders.root.path().join("src/c0")).unwrap();
    std::fs::write(folders.root.path().join("src/c0/a.bin"), b"x").unwrap();
    let start = |world: u32| -> Vec<Result<(), String>> {
        let args = folders.args("node");
        let handles: Vec<_> = LocalComm::world(world)
            .into_iter()
            .map(|mut comm| {
                let args = args.clone();
                std::thread::spawn(move || {
                    prepare(&args, &mut comm)
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    };
    assert!(start(2).iter().all(Result::is_ok));
    for err in start(3) {
        let err = err.unwrap_err();
        assert!(
            err.contains("--exchange-scope node") && err.contains("start 2 ranks"),
            "{err}"
        );
        assert!(err.contains("--reset-cache"), "{err}");
    }
}
