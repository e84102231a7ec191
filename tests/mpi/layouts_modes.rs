//! A tree source with side files and equal shares (`--format tree --replicate GLOB
//! --equal-shares drop`) under every way a job can run, 4 ranks on this host: the coded
//! exchange (with its server), node scope, a job killed with SIGKILL and started again, an
//! elastic restart from 4 ranks to 3, and the packed cache layout (walked and resumed). In
//! every epoch checked, each rank's view holds exactly `floor(N/M)` samples, the views are
//! disjoint with the source's bytes, every folder of the source is on every rank, and the
//! side files are whole on every rank. (All ranks share one host here, so node scope is
//! checked for what it does to the views, not for keeping samples on their host.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use crate::coded_mpi::kill_server;
use crate::common::mpi_job::{MpiJob, wait_all};
use crate::common::trees::{Walk, views, walk, write_tree};
use crate::common::{BIN, force_unmount, is_mounted, require_fuse, require_mpi};
use shufflefs::plan::PlanParams;
use shufflefs::plan::elastic::{ElasticPlan, History};
use shufflefs::plan::equal::Replay;

const SEED: u64 = 17;
/// 2 left out per epoch on 4 ranks and on 3.
const SAMPLES: usize = 38;
const SIDE: [&str; 2] = ["meta/classes.txt", "a/stats.npy"];

/// A nested tree of `SAMPLES` samples (not divisible by 4 or 3), two side files and an empty
/// folder.
fn source(dir: &Path) {
    let mut files: Vec<(String, usize)> = (0..SAMPLES)
        .map(|i| (format!("{}/{}/s{i:03}.npz", i % 3, i % 2), 900 + i * 131))
        .collect();
    files.extend(SIDE.iter().map(|s| (s.to_string(), 321)));
    write_tree(dir, &files, &["empty/deeper"]);
}

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut out = vec![
        "--format",
        "tree",
        "--replicate",
        "meta/*.txt",
        "--replicate",
        "**/stats.npy",
        "--equal-shares",
        "drop",
    ];
    out.extend_from_slice(extra);
    out
}

/// Epoch `epoch` on every rank of `job`: `floor(SAMPLES/M)` samples each, disjoint, the source's
/// bytes; every folder and both side files on every rank. Returns the samples left out.
fn check_epoch(job: &MpiJob, src: &Path, epoch: u64) -> BTreeSet<String> {
    let mut source: Walk = walk(src);
    let side: BTreeMap<String, Vec<u8>> = (SIDE.iter())
        .map(|s| (s.to_string(), source.files.remove(*s).unwrap()))
        .collect();
    let ranks = job.mounts.len();
    let mut seen = BTreeMap::new();
    for (rank, mut view) in views(job, epoch).into_iter().enumerate() {
        assert_eq!(
            view.dirs, source.dirs,
            "rank {rank}, epoch {epoch}: folders"
        );
        for (path, bytes) in &side {
            let shown = view.files.remove(path);
            assert!(
                shown.as_ref() == Some(bytes),
                "rank {rank}, epoch {epoch}: side file {path}"
            );
        }
        assert_eq!(
            view.files.len(),
            SAMPLES / ranks,
            "rank {rank}, epoch {epoch}: floor({SAMPLES}/{ranks}) samples"
        );
        for (path, bytes) in &view.files {
            assert!(
                source.files.get(path) == Some(bytes),
                "rank {rank}, epoch {epoch}: {path} differs from the source"
            );
            if let Some(other) = seen.insert(path.clone(), rank) {
                panic!("epoch {epoch}: {path} on ranks {other} and {rank}");
            }
        }
    }
    let left: BTreeSet<String> = source.files.into_keys().collect();
    left.into_iter().filter(|p| !seen.contains_key(p)).collect()
}

/// Moves every rank of `job` to `epoch` and checks it.
fn advance_and_check(job: &MpiJob, src: &Path, epoch: u64) {
    for m in &job.mounts {
        std::fs::write(m.join(".shufflefs/epoch"), format!("{epoch}\n")).unwrap();
    }
    wait_all(job, "the epoch", |st| st["epoch"] == epoch);
    check_epoch(job, src, epoch);
}

#[test]
fn coded_exchange_with_side_files_and_equal_shares() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    source(tmp.path());
    let src = tmp.path().join("src");
    let mut launcher = Command::new("mpirun");
    launcher
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args([
            "--oversubscribe",
            "-np",
            "1",
            BIN,
            "serve",
            "--format",
            "tree",
        ])
        .arg("--source")
        .arg(&src)
        .args([":", "-np", "4"]);
    let extra = args(&["--exchange", "coded", "--cache-fraction", "0.5"]);
    let job = MpiJob::start_with(launcher, tmp.path(), 4, SEED, 0.3, &extra);
    check_epoch(&job, &src, 0);
    for epoch in 1..=2 {
        advance_and_check(&job, &src, epoch);
    }
    kill_server(&src);
    job.kill();
    force_unmount_all(tmp.path(), 4);
}

#[test]
fn node_scope_with_side_files_and_equal_shares() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    source(tmp.path());
    let src = tmp.path().join("src");
    let extra = args(&["--exchange-scope", "node"]);
    let job = MpiJob::start(tmp.path(), 4, SEED, 0.5, &extra);
    for epoch in 0..3 {
        check_epoch(&job, &src, epoch);
    }
    assert_eq!(job.status(0)["dataset"]["format"], "tree");
    job.unmount();
}

/// Killed with SIGKILL at epoch 2, then the same command: every rank resumes at epoch 2 with
/// the views it showed before the kill (the equal-shares rule replays to the same choice),
/// goes on to epoch 3, and nothing (sample or side file) is fetched from the source again.
#[test]
fn a_killed_tree_job_resumes_with_side_files_and_equal_shares() {
    killed_and_resumed(&[]);
}

/// The same with the packed cache layout (samples in segment files, not one file each):
/// staging, the exchange's writes into segments, and the resume from them.
#[test]
fn a_tree_job_on_the_packed_cache_layout_walks_and_resumes() {
    killed_and_resumed(&["--cache-layout", "packed"]);
}

fn killed_and_resumed(layout: &[&str]) {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    source(tmp.path());
    let src = tmp.path().join("src");
    let extra = args(layout);
    let job = MpiJob::start(tmp.path(), 4, SEED, 0.5, &extra);
    check_epoch(&job, &src, 0);
    advance_and_check(&job, &src, 1);
    advance_and_check(&job, &src, 2);
    let before: Vec<_> = (0..4)
        .map(|r| walk(&job.mounts[r].join("epoch-2")))
        .collect();
    job.kill();
    force_unmount_all(tmp.path(), 4);

    let job = MpiJob::start(tmp.path(), 4, SEED, 0.5, &extra);
    wait_all(&job, "the resumed epoch", |st| st["epoch"] == 2);
    check_epoch(&job, &src, 2);
    for (r, was) in before.iter().enumerate() {
        let now = walk(&job.mounts[r].join("epoch-2"));
        assert_eq!(now.files, was.files, "rank {r}: epoch 2 after the resume");
    }
    check_epoch(&job, &src, 3);
    let want = layout.get(1).copied().unwrap_or("files");
    for r in 0..4 {
        let st = job.status(r);
        assert_eq!(st["cache"]["fetched_from_source"], 0, "rank {r}: {st:#}");
        assert_eq!(
            st["replicated"]["fetched_bytes"], 0,
            "side files kept: {st:#}"
        );
        assert_eq!(st["cache"]["layout"], want, "rank {r}: {st:#}");
    }
    job.unmount();
}

/// Four ranks to epoch 1, killed, then three ranks on the same caches: epoch 1 again with
/// floor(38/3) = 12 samples per view, then epochs 2 and 3; the side files stay whole on
/// every rank, and the samples left out are those the rule gives replayed through the job's
/// real history (4 ranks in epoch 0, 3 from epoch 1).
#[test]
fn an_elastic_restart_from_four_to_three_ranks_keeps_the_tree_whole() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    source(tmp.path());
    let src = tmp.path().join("src");
    let extra = args(&["--share-disk", "never"]);
    let job = MpiJob::start(tmp.path(), 4, SEED, 0.5, &extra);
    check_epoch(&job, &src, 0);
    advance_and_check(&job, &src, 1);
    job.kill();
    force_unmount_all(tmp.path(), 4);
    let rule = LeftOutRule::new(tmp.path(), History::new(4).resized(1, 3).unwrap());

    let job = MpiJob::start(tmp.path(), 3, SEED, 0.5, &extra);
    wait_all(&job, "the resumed epoch", |st| st["epoch"] == 1);
    for r in 0..3 {
        assert_eq!(job.status(r)["world_size"], 3);
        assert_eq!(job.status(r)["equal_shares"]["view_samples"], 12);
    }
    for epoch in 1..=3 {
        let left = check_epoch(&job, &src, epoch);
        assert_eq!(
            left,
            rule.left_out(epoch),
            "epoch {epoch}: left out by the rule"
        );
    }
    job.unmount();
    force_unmount_all(tmp.path(), 4);
}

/// The equal-shares rule replayed through a job's history of world sizes, from the library.
struct LeftOutRule {
    elastic: ElasticPlan,
    names: Vec<String>,
}

impl LeftOutRule {
    /// The samples' ids are those of the source without its side files: a copy without
    /// them, scanned, numbers them alike (ids go in path order; side files hold none).
    fn new(dir: &Path, history: History) -> LeftOutRule {
        let mut files = walk(&dir.join("src")).files;
        for s in SIDE {
            files.remove(s);
        }
        let plain = dir.join("plain");
        for (path, bytes) in &files {
            std::fs::create_dir_all(plain.join(path).parent().unwrap()).unwrap();
            std::fs::write(plain.join(path), bytes).unwrap();
        }
        let m = shufflefs::dataset::scan::scan_tree(&plain).unwrap();
        let names = (0..m.len())
            .map(|id| m.relative_path(id).to_string_lossy().into_owned())
            .collect();
        let params = PlanParams {
            samples: m.len(),
            world: 0,
            fraction: 0.5,
            seed: SEED,
        };
        let elastic = ElasticPlan::new(params, history).unwrap();
        LeftOutRule { elastic, names }
    }

    fn left_out(&self, epoch: u64) -> BTreeSet<String> {
        let mut replay = Replay::of_history(&self.elastic);
        replay.advance_through(&self.elastic, epoch);
        let plan = self.elastic.plan_at(epoch);
        (replay.left_out_all(plan).into_iter().flatten())
            .map(|id| self.names[id as usize].clone())
            .collect()
    }
}

fn force_unmount_all(dir: &Path, ranks: u32) {
    for r in 0..ranks {
        let mnt = dir.join(format!("mnt{r}"));
        force_unmount(&mnt);
        assert!(!is_mounted(&mnt), "{} left mounted", mnt.display());
    }
}
