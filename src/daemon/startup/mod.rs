//! Start-up in phases, one file each, after each of which all ranks agree (a collective,
//! [`agree::agreed`]) on whether every rank succeeded. A failure on any rank — a busy mount point, a locked cache, an empty
//! source seen by rank 0, settings that differ — therefore stops *all* ranks with the same
//! message instead of leaving some blocked in a collective.
//!
//! 0. the command line's own consistency was checked before (`config`), alone on each rank;
//! 1. local checks (mount point, source on rank 0, the cache folder and its lock): `local`;
//! 2. the same settings everywhere (and a `--metrics-file` no two ranks of a host share, whose
//!    folder exists and that is not a file shufflefs did not write): `settings`;
//! 3. seed and index, decided by rank 0 (the index is reused from rank 0's cache when its
//!    settings match, else built by the dataset format): `index`;
//!    The side files (`--replicate`) are then copied once per host: `side`;
//! 4. does each cache belong to these settings? (`cache`) resume at the furthest epoch any rank saved
//!    (with another number of ranks too: an elastic restart, see `resize`);
//!    under `--exchange-scope node` the settings include the host layout (which ranks share
//!    a host), because the plan's history depends on it: a cache built on another layout is
//!    refused like one built with another seed (see "Host layout on resume" below);
//! 5. the plan; finish whatever a crash interrupted (see `node::resume`), or fill the new
//!    shares of a job whose number of ranks changed (`node::regrow`): `fill`.
//!
//! Mounting is the last phase and lives in `daemon::run`.
//!
//! # Host layout on resume
//! A node-scope plan is a function of the layout, so a resume must either replan with the
//! recorded layout or refuse a different one. We refuse: with the recorded layout, moves
//! the plan keeps "within a host" would join ranks now on different hosts, so samples would
//! cross the network and each real host's set of samples would change, silently breaking
//! both promises of `--exchange-scope node`. Refusing keeps one invariant the exchange can
//! rely on: under node scope every planned move is between two ranks that `Comm::hosts`
//! puts on one host. Only the shape is compared (which ranks share a host, host indices by
//! first appearance), not host names, so a restart on other machines with the same ranks
//! per host resumes. The message names both layouts; the ways out are starting the ranks
//! on hosts as before, or `--reset-cache`.

use std::path::PathBuf;
use std::sync::Arc;

use crate::cache::{CacheError, CacheState, FORMAT_VERSION, SampleStore, SourceScan};
use crate::comm::{Comm, CommError};
use crate::config::{MountConfig, for_rank};
use crate::node::resumed::Resumed;
use crate::plan::elastic::ElasticPlan;
use crate::plan::{ExchangeScope, Plan, PlanError, PlanParams, Rank};
use crate::sys::made_dirs::MountDirs;

mod agree;
mod cache;
mod fill;
pub(crate) mod fit;
mod fit_coded;
mod index;
mod local;
mod rescan;
mod settings;
mod shared;
mod side;

pub(crate) use agree::{PhaseError, agreed};

/// Why the daemon did not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    /// Some ranks failed a phase; every rank reports the same list (built by `agree` only).
    #[error("{}", describe_failures(.failures, *.world))]
    Refused {
        failures: Vec<(Rank, String)>,
        world: u32,
    },
    #[error("talking to the other ranks: {0}")]
    Comm(#[from] CommError),
    #[error("rank 0 sent a malformed {0}")]
    Malformed(&'static str),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    Plan(#[from] PlanError),
}

fn describe_failures(failures: &[(Rank, String)], world: u32) -> String {
    failures
        .iter()
        .map(|(r, m)| {
            if world == 1 {
                m.clone()
            } else {
                format!("rank {r}: {m}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Everything needed to serve, once the start-up phases passed.
pub(crate) struct Prepared {
    pub store: Arc<SampleStore>,
    pub plan: Plan,
    /// The job's plan through its history of world sizes, where it was resized.
    pub elastic: Option<ElasticPlan>,
    pub resumed: Resumed,
    pub mountpoint: PathBuf,
    /// The folders the mount point lacks: created at the mount (`sys::made_dirs`).
    pub mount_dirs: MountDirs,
    /// The cache's room against the share (or a coded cache's peak): `fit::Fit::fits`, or
    /// a partial cache (`Fit::slots` for a coded one).
    pub fit: Option<fit::Fit>,
}

/// Runs the phases in order on this rank (collective): each one's value, or the refusal
/// every rank reports.
pub(crate) fn prepare(config: &MountConfig, comm: &mut dyn Comm) -> Result<Prepared, StartError> {
    let (rank, world) = (comm.rank(), comm.size());
    let cache_path = for_rank(&config.cache, rank);
    let mountpoint = for_rank(&config.mountpoint, rank);

    let made = made_by_this_mount(&cache_path);
    let checked = local::check(config, rank, &mountpoint, &cache_path);
    let (mut dir, mount_dirs) = agreed(comm, checked)?;
    let same = settings::compare(comm, config)?.and_then(|()| {
        let template = config.metrics_file.as_deref();
        crate::daemon::metrics_file::check(template, comm.hosts()).map_err(PhaseError::Shared)?;
        crate::daemon::metrics_file::check_rank(template, rank).map_err(PhaseError::Mine)
    });
    agreed(comm, same)?;

    // An unreadable state file is refused, unless the user asked to rebuild the cache.
    let state = dir.load_state().or_else(|e| match config.reset_cache {
        true => Ok(None),
        false => Err(PhaseError::mine(e)),
    });
    let state = agreed(comm, state)?;
    let reusable = index::reusable(config, state.as_ref());
    let seed = index::seed(comm, config, reusable)?;
    let (manifest, manifest_bytes, scanned) = index::index(config, comm, &dir, reusable)?;
    agreed(comm, equal_shares_fit(config, manifest.len(), world))?;
    let scanned_at = match scanned {
        true => Some(now_secs()),
        false => reusable.and_then(|s| s.scanned_at),
    };

    let source = index::source_name(config, state.as_ref());
    let fingerprint = manifest_bytes.fingerprint();
    let expected = expected_state(config, comm, (source, seed, fingerprint), scanned_at);
    let carried = rescan::carry_over(config, &dir, state, &expected, &manifest);
    let (state, counts) = agreed(comm, carried)?;
    dir.set_source_scan(SourceScan {
        scanned_at,
        scanned_this_mount: scanned,
        stale_possible: !scanned,
        kept: counts.map(|c| c.0),
        dropped: counts.map(|c| c.1),
    });
    let samples = manifest.len();
    let (job, backend) = cache::belongs(comm, config, &dir, state, &expected, samples)?;
    // Rank 0's saved manifest is the one a remount reuses; the others' only serve carrying a
    // folder's samples over a --rescan (a record source's are never carried), so a record
    // index (12 bytes a record at its fixed width) is saved once per job, not once per rank.
    if comm.rank() == 0 || manifest.records().is_none() {
        cache::save_manifest(&dir, &manifest_bytes);
    } else if let Err(e) = dir.forget_manifest() {
        tracing::warn!(error = %e, "could not remove an earlier saved manifest");
    }
    drop(manifest_bytes); // saved; the manifest itself is all that is needed from here
    side::place(comm, config, &manifest, &mut dir)?;

    let params = PlanParams {
        samples,
        world,
        fraction: config.fraction,
        seed,
    };
    let (plan, elastic) = fill::plan(comm, config, params, &job)?;
    let plans = (&plan, elastic.as_ref());
    let store = fill::open_store(config, (dir, backend), manifest, comm.size())?;
    let (fit, store, resumed) =
        fill::fit_and_fill(comm, config, plans, store, (&cache_path, made), job)?;
    // A coded cache that does not fit is planned as kept sets from here on (`fit_coded`).
    let plan = plan.with_coded_slots(fit.as_ref().and_then(|f| f.slots));
    Ok(Prepared {
        fit,
        store,
        plan,
        elastic,
        resumed,
        mountpoint,
        mount_dirs,
    })
}

/// `--equal-shares drop` shows `floor(N/M)` samples in every view: with fewer samples than
/// ranks every view would be empty, a job that trains on nothing. Refused on every rank
/// alike (the manifest is the same everywhere), naming the counts and the ways out.
fn equal_shares_fit(config: &MountConfig, samples: u64, world: u32) -> Result<(), PhaseError> {
    if !config.equal_shares || samples >= u64::from(world) {
        return Ok(());
    }
    Err(PhaseError::Shared(format!(
        "--equal-shares drop: the dataset has {samples} samples for {world} ranks, so every \
         rank's view would be empty (each shows floor({samples}/{world}) = 0 samples); run at \
         most {samples} ranks, or leave out --equal-shares"
    )))
}

/// The cache state this mount expects to find (or writes): what must match for the cache
/// to be reused. `epoch` and `world_history` are set once the job's history is known.
fn expected_state(
    config: &MountConfig,
    comm: &dyn Comm,
    (source, seed, manifest_fingerprint): (String, u64, u32),
    scanned_at: Option<u64>,
) -> CacheState {
    CacheState {
        format: FORMAT_VERSION,
        source,
        seed,
        fraction: config.fraction,
        world_size: comm.size(),
        rank: comm.rank(),
        manifest_fingerprint,
        epoch: 0,
        exchange_scope: config.scope(),
        // Global scope ignores hosts, so its state does not depend on where ranks run.
        hosts: match config.scope() {
            ExchangeScope::Global => None,
            ExchangeScope::Node => Some(comm.hosts().to_vec()),
        },
        world_history: Vec::new(),
        layout: config.layout,
        scanned_at,
    }
}

/// Whether this mount makes the cache at `cache`: `Some(true)` when the folder is missing
/// (made here), `Some(false)` when it is empty but for the log a detached daemon just
/// started there (the user's folder, or the one the detaching parent made: only what this
/// mount writes into it is ours), `None` when it holds anything else (an earlier mount's
/// cache, or not ours): a refused mount then removes nothing.
pub(crate) fn made_by_this_mount(cache: &std::path::Path) -> Option<bool> {
    match std::fs::read_dir(cache) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(true),
        Ok(entries) => {
            let mut names = entries.map(|e| e.map(|e| e.file_name()));
            (names.all(|n| n.is_ok_and(|n| n == "shufflefs.log"))).then_some(false)
        }
        Err(_) => None,
    }
}

/// A start that failed before anything was served (refused on some rank, or its mount
/// failed): what this mount wrote into the cache it made goes again, the folder too when it
/// made it (`folder`, see [`made_by_this_mount`]), as far as the files are ours. Not while
/// a daemon holds the folder's lock: a mount started at the same moment on the same
/// missing folder took it, and this one was refused for that.
pub(crate) fn forget_made_cache(cache: &std::path::Path, folder: bool) {
    if !cache.exists() || crate::cache::CacheDir::is_locked(cache) {
        return;
    }
    match crate::cache::remove_owned(cache, folder) {
        Ok(left) if left.is_empty() => {
            tracing::info!(folder = %cache.display(), "removed the cache this refused mount made")
        }
        Ok(left) => tracing::debug!(?left, "left what the refused mount did not make"),
        Err(e) => tracing::debug!(error = %e, "could not remove the refused mount's cache"),
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command, MountArgs};

    fn cfg(args: MountArgs) -> MountConfig {
        MountConfig::try_from(args).expect("valid settings")
    }
    use crate::comm::LocalComm;
    use crate::plan::HostLayout;

    /// A source of 2 classes x 6 samples and per-rank cache and mount folders.
    struct Folders {
        root: tempfile::TempDir,
    }

    impl Folders {
        fn new(world: u32) -> Folders {
            let root = tempfile::tempdir().unwrap();
            for class in ["a", "b"] {
                let dir = root.path().join("src").join(class);
                std::fs::create_dir_all(&dir).unwrap();
                for i in 0..6 {
                    std::fs::write(dir.join(format!("{i}.bin")), [i as u8; 10]).unwrap();
                }
            }
            for r in 0..world {
                std::fs::create_dir_all(root.path().join(format!("mnt-{r}"))).unwrap();
            }
            Folders { root }
        }

        fn args(&self, scope: &str) -> MountArgs {
            self.args_with(scope, &[])
        }

        fn args_with(&self, scope: &str, extra: &[&str]) -> MountArgs {
            let p = |name: &str| self.root.path().join(name).display().to_string();
            let cli = Cli::parse_from(
                [
                    "shufflefs",
                    "mount",
                    "--source",
                    &p("src"),
                    "--cache",
                    &p("cache-{rank}"),
                    "--seed",
                    "5",
                    "--fraction",
                    "0.5",
                    "--exchange-scope",
                    scope,
                    &p("mnt-{rank}"),
                ]
                .into_iter()
                .chain(extra.iter().copied()),
            );
            match cli.command {
                Command::Mount(args) => args,
                Command::Unmount(_) | Command::Plan(_) | Command::Serve(_) | Command::Status(_) => {
                    unreachable!()
                }
            }
        }

        /// Runs start-up on every rank of a world on `hosts`: each rank's plan, or the error.
        fn start(&self, scope: &str, hosts: &[u32]) -> Vec<Result<Plan, String>> {
            self.start_with(self.args(scope), hosts)
        }

        fn start_with(&self, args: MountArgs, hosts: &[u32]) -> Vec<Result<Plan, String>> {
            start_each(vec![args; hosts.len()], hosts)
        }

        fn state(&self, rank: u32) -> CacheState {
            let path = self.root.path().join(format!("cache-{rank}/state.json"));
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
        }
    }

    /// Runs start-up on every rank of a world on `hosts`, rank r with `args[r]`: each rank's
    /// plan, or the error.
    fn start_each(args: Vec<MountArgs>, hosts: &[u32]) -> Vec<Result<Plan, String>> {
        let handles: Vec<_> = LocalComm::world_on_hosts(hosts)
            .into_iter()
            .zip(args)
            .map(|(mut comm, args)| {
                std::thread::spawn(move || {
                    prepare(&cfg(args), &mut comm)
                        .map(|p| p.plan)
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    /// Node scope plans with the hosts the ranks run on and records them; a resume on the
    /// same layout (whatever the hosts are called) works, one on another layout or scope is
    /// refused naming both, and global scope neither records nor checks hosts.
    #[test]
    fn node_scope_records_and_checks_the_host_layout() {
        let folders = Folders::new(4);
        for plan in folders.start("node", &[0, 0, 1, 1]) {
            let plan = plan.unwrap();
            assert_eq!(plan.scope(), ExchangeScope::Node);
            assert_eq!(plan.layout(), Some(&HostLayout::new(&[0, 0, 1, 1])));
        }
        let state = folders.state(2);
        assert_eq!(state.exchange_scope, ExchangeScope::Node);
        assert_eq!(state.hosts, Some(vec![0, 0, 1, 1]));

        // Same shape on other hosts: resumes.
        assert!(
            folders
                .start("node", &[9, 9, 4, 4])
                .iter()
                .all(Result::is_ok)
        );

        for err in folders.start("node", &[0, 1, 0, 1]) {
            let err = err.unwrap_err();
            assert!(
                err.contains("cache has 2 hosts (ranks 0-1 | 2-3), now 2 hosts (ranks 0,2 | 1,3)"),
                "{err}"
            );
            assert!(err.contains("--reset-cache"), "{err}");
        }
        for err in folders.start("global", &[0, 0, 1, 1]) {
            let err = err.unwrap_err();
            assert!(
                err.contains("--exchange-scope: cache has node, now global"),
                "{err}"
            );
        }
    }

    /// A share larger than `--cache-size` mounts with a partial cache (the estimate
    /// comes with it), or is refused on every rank under `--require-fit`, naming the numbers
    /// and the way out; a cache that fits is no partial cache.
    #[test]
    fn a_share_larger_than_the_cache_is_partial_or_refused() {
        let folders = Folders::new(2);
        let run = |extra: &[&str]| {
            let args = folders.args_with("global", extra);
            let handles: Vec<_> = LocalComm::world(2)
                .into_iter()
                .map(|mut comm| {
                    let args = args.clone();
                    std::thread::spawn(move || {
                        prepare(&cfg(args), &mut comm)
                            .map(|p| p.fit.expect("not coded"))
                            .map_err(|e| e.to_string())
                    })
                })
                .collect();
            let out: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            out
        };
        // 6 samples of 10 bytes per rank, Q 0.5: up to 9 samples with the exchange, each
        // taking a block of the cache's disk (`cache::footprint`).
        let block = crate::cache::footprint::block_of(&std::env::temp_dir(), Default::default());
        for fit in run(&["--cache-size", &(100 * block).to_string()]) {
            assert!(fit.unwrap().fits());
        }
        let three = (3 * block).to_string();
        for fit in run(&["--cache-size", &three]) {
            let fit = fit.unwrap();
            assert!(!fit.fits());
            assert_eq!(
                (fit.capacity, fit.share_bytes, fit.kept_samples),
                (3 * block, 6 * block, 3)
            );
            let snap = fit.snapshot();
            assert!(snap.expected_hit_rate <= 0.5 && snap.hit_rate.is_none());
            assert!(snap.expected_source_bytes_per_epoch >= 3 * block);
        }
        for err in run(&["--cache-size", &three, "--require-fit"]) {
            let err = err.unwrap_err();
            assert!(
                err.contains("--require-fit: this rank's share needs up to"),
                "{err}"
            );
            assert!(err.contains("which holds 0.0 MB (--cache-size)"), "{err}");
            // What is computed: the union of two consecutive shares, not (1 + Q) x share.
            let need = "the most two consecutive epochs' shares take together";
            assert!(err.contains(need) && !err.contains("(1 + Q)"), "{err}");
            assert!(err.contains("drop --require-fit"), "{err}");
        }
    }

    /// What start-up's agreements hand each rank (counted as MPI moves it) grows by less
    /// than 32 bytes per added rank: the agreements are all-reduces and broadcasts, not
    /// all-gathers of every rank's data. Before, the settings went from every
    /// rank to every rank and each agreement gathered every rank's word: 618 bytes per
    /// added rank (now 26: `fit::sharing`'s device word, see docs/performance.md, and the
    /// split listing's all-gather of parts: a length and an empty part per rank).
    #[test]
    fn start_up_traffic_per_rank_barely_grows_with_the_ranks() {
        use crate::comm::doubles::Metered;
        let received = |world: u32| -> Vec<u64> {
            let folders = Folders::new(world);
            let args = folders.args("global");
            let handles: Vec<_> = LocalComm::world(world)
                .into_iter()
                .map(|comm| {
                    let args = args.clone();
                    std::thread::spawn(move || {
                        let (mut comm, count) = Metered::new(comm);
                        prepare(&cfg(args), &mut comm).map(|_| ()).unwrap();
                        count.load(std::sync::atomic::Ordering::Relaxed)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        };
        let (small, large) = (received(2), received(12));
        for rank in 0..2 {
            let grew = large[rank] - small[rank];
            assert!(
                grew < 32 * 10,
                "rank {rank} received {} bytes at 2 ranks, {} at 12",
                small[rank],
                large[rank]
            );
        }
    }

    /// A folder source on several ranks is listed by every rank, each its part:
    /// every rank ends with the manifest one scan gives, byte for byte, and ranks 1 and 2
    /// send theirs (before, rank 0 listed everything alone and broadcast it: they sent
    /// nothing but their agreements).
    #[test]
    fn a_folder_source_is_listed_by_every_rank() {
        use crate::comm::doubles::Metered;
        let folders = Folders::new(3);
        let src = folders.root.path().join("src");
        for class in ["c", "d", "e"] {
            std::fs::create_dir(src.join(class)).unwrap();
            for i in 0..40 {
                let name = format!("{i:03}-{}", "x".repeat(96));
                std::fs::write(src.join(class).join(name), [1u8]).unwrap();
            }
        }
        let want = crate::dataset::scan::scan(&src).unwrap().encode();
        let args = folders.args("global");
        // One rank per host: the listing is split; on one host it is rank 0's alone.
        for hosts in [[0, 1, 2], [0, 0, 0]] {
            let handles: Vec<_> = LocalComm::world_on_hosts(&hosts)
                .into_iter()
                .map(|comm| {
                    let args = args.clone();
                    std::thread::spawn(move || {
                        let (mut comm, _, sent) = Metered::with_sent(comm);
                        let p = prepare(&cfg(args), &mut comm).unwrap();
                        let got = p.store.manifest().encode();
                        (got, sent.load(std::sync::atomic::Ordering::Relaxed))
                    })
                })
                .collect();
            for (rank, h) in handles.into_iter().enumerate() {
                let (got, sent) = h.join().unwrap();
                assert!(got == want, "rank {rank}'s manifest");
                // Split: classes a, d are rank 0's; b, e rank 1's; c rank 2's: 40 names of
                // 100 bytes in each of c, d, e.
                match (hosts[1] != hosts[0], rank) {
                    (true, _) => assert!(sent > 4000, "rank {rank} sent {sent} bytes"),
                    (false, 1 | 2) => assert!(sent < 4000, "rank {rank} sent {sent} bytes"),
                    (false, _) => {}
                }
            }
        }
    }

    /// A listing every rank refuses alike (class folders without samples; a `--replicate`
    /// glob matching nothing) is said once, under rank 0, on every rank.
    #[test]
    fn a_split_listing_refused_alike_is_said_once() {
        let folders = Folders::new(3);
        let src = folders.root.path().join("src");
        let args = folders.args_with("global", &["--replicate", "nothing/*.json"]);
        for err in folders.start_with(args, &[0, 1, 2]) {
            let err = err.unwrap_err();
            assert!(
                err.starts_with("rank 0: ") && err.contains("matches no file"),
                "{err}"
            );
            assert_eq!(err.lines().count(), 1, "{err}");
        }
        for class in ["a", "b"] {
            std::fs::remove_dir_all(src.join(class)).unwrap();
            std::fs::create_dir(src.join(class)).unwrap();
        }
        for err in folders.start("global", &[0, 1, 2]) {
            let err = err.unwrap_err();
            assert!(
                err.starts_with("rank 0: ") && err.contains("no sample files"),
                "{err}"
            );
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }

    /// `--equal-shares drop` with fewer samples (12) than ranks (13) is refused on every rank,
    /// naming the counts (before, it mounted with every view empty and no warning); 12 ranks
    /// mount.
    #[test]
    fn equal_shares_with_fewer_samples_than_ranks_is_refused() {
        let folders = Folders::new(13);
        let args = folders.args_with("global", &["--equal-shares", "drop"]);
        for err in folders.start_with(args.clone(), &[0; 13]) {
            let err = err.unwrap_err();
            assert!(
                err.contains("12 samples for 13 ranks")
                    && err.contains("every rank's view would be empty"),
                "{err}"
            );
            assert!(err.contains("run at most 12 ranks"), "{err}");
        }
        let folders = Folders::new(12);
        let args = folders.args_with("global", &["--equal-shares", "drop"]);
        assert!(folders.start_with(args, &[0; 12]).iter().all(Result::is_ok));
    }

    /// A cache remembers whether a coded run built it and with which cache fraction: another
    /// kind of run is refused naming both, until --reset-cache.
    #[test]
    fn a_coded_cache_is_refused_by_another_kind_of_run() {
        let folders = Folders::new(2);
        let coded = |alpha: f64, reset: bool| {
            let mut a = folders.args("global");
            a.exchange = crate::cli::ExchangeMode::Coded;
            a.cache_fraction = Some(alpha);
            a.reset_cache = reset;
            a
        };
        for plan in folders.start_with(coded(0.5, false), &[0, 0]) {
            assert!(plan.unwrap().coded_shares().is_some());
        }
        assert!(
            folders
                .start_with(coded(0.5, false), &[0, 0])
                .iter()
                .all(Result::is_ok)
        );
        for err in folders.start("global", &[0, 0]) {
            let err = err.unwrap_err();
            assert!(
                err.contains("--exchange coded --cache-fraction 0.5, now --exchange partial"),
                "{err}"
            );
            assert!(err.contains("--reset-cache"), "{err}");
        }
        for err in folders.start_with(coded(0.75, false), &[0, 0]) {
            assert!(
                err.unwrap_err()
                    .contains("now --exchange coded --cache-fraction 0.75")
            );
        }
        assert!(
            folders
                .start_with(coded(0.75, true), &[0, 0])
                .iter()
                .all(Result::is_ok)
        );
        let mut partial = folders.args("global");
        partial.reset_cache = true;
        assert!(
            folders
                .start_with(partial, &[0, 0])
                .iter()
                .all(Result::is_ok)
        );
        // Back to partial-local: no coded record left, a plain remount resumes.
        assert!(folders.start("global", &[0, 0]).iter().all(Result::is_ok));
    }

    /// `--rescan` on two ranks after the source lost a file and gained a class: every rank
    /// agrees on the new index, keeps what is still valid, and plans over the new samples;
    /// without `--rescan` the old index is reused.
    #[test]
    fn rescan_on_several_ranks_plans_over_the_new_index() {
        let folders = Folders::new(2);
        let samples = |extra: &[&str]| -> Vec<u64> {
            let args = folders.args_with("global", extra);
            start_each(vec![args.clone(), args], &[0, 0])
                .into_iter()
                .map(|p| p.unwrap().params().samples)
                .collect()
        };
        assert_eq!(samples(&[]), [12, 12]);
        let src = folders.root.path().join("src");
        std::fs::remove_file(src.join("a/0.bin")).unwrap();
        std::fs::create_dir(src.join("c")).unwrap();
        for i in 0..3 {
            std::fs::write(src.join(format!("c/{i}.bin")), [9u8; 4]).unwrap();
        }
        assert_eq!(samples(&[]), [12, 12], "the cache's index, not rescanned");
        assert_eq!(samples(&["--rescan"]), [14, 14]);
        assert_eq!(
            folders.state(1).manifest_fingerprint,
            folders.state(0).manifest_fingerprint
        );
        assert_eq!(
            samples(&[]),
            [14, 14],
            "the rescanned index is the cache's now"
        );

        // A packed cache cannot carry samples over: it is rebuilt, and the mount goes on.
        let packed = ["--cache-layout", "packed", "--reset-cache"];
        assert_eq!(samples(&packed), [14, 14]);
        std::fs::remove_file(src.join("c/0.bin")).unwrap();
        let packed = ["--cache-layout", "packed", "--rescan"];
        assert_eq!(samples(&packed), [13, 13]);
    }

    #[test]
    fn global_scope_ignores_hosts() {
        let folders = Folders::new(2);
        for plan in folders.start("global", &[0, 0]) {
            assert_eq!(plan.unwrap().scope(), ExchangeScope::Global);
        }
        let state = folders.state(1);
        assert_eq!(
            (state.exchange_scope, state.hosts),
            (ExchangeScope::Global, None)
        );
        let text = std::fs::read_to_string(folders.root.path().join("cache-1/state.json")).unwrap();
        assert!(!text.contains("scope") && !text.contains("hosts"), "{text}");
        // Other hosts: the same global cache resumes.
        assert!(folders.start("global", &[0, 1]).iter().all(Result::is_ok));
    }

    /// A cache keeps the layout it was built with: the other one is refused, naming both,
    /// until `--reset-cache` rebuilds it (and deletes the old layout's files).
    #[test]
    fn a_cache_keeps_its_layout() {
        use crate::cache::CacheLayout;
        let folders = Folders::new(1);
        let start = |extra: &[&str]| {
            let mut comm = LocalComm::world(1).pop().unwrap();
            prepare(&cfg(folders.args_with("global", extra)), &mut comm)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let cache = folders.root.path().join("cache-0");
        start(&[]).unwrap();
        assert_eq!(folders.state(0).layout, CacheLayout::Files);
        assert!(cache.join("samples").is_dir());
        let err = start(&["--cache-layout", "packed"]).unwrap_err();
        assert!(
            err.contains("--cache-layout: cache has files, now packed")
                && err.contains("--reset-cache"),
            "{err}"
        );
        assert!(
            !cache.join("segments").exists(),
            "a refused layout created nothing"
        );
        start(&["--cache-layout", "packed", "--reset-cache"]).unwrap();
        assert_eq!(folders.state(0).layout, CacheLayout::Packed);
        assert!(!cache.join("samples").exists() && cache.join("segments").is_dir());
        start(&["--cache-layout", "packed"]).unwrap();
        let err = start(&[]).unwrap_err();
        assert!(err.contains("cache has packed, now files"), "{err}");
        assert!(
            !cache.join("samples").exists(),
            "a refused layout created nothing"
        );
    }

    #[test]
    fn ranks_must_agree_on_the_cache_layout() {
        let folders = Folders::new(2);
        let (files, packed) = (
            folders.args("global"),
            folders.args_with("global", &["--cache-layout", "packed"]),
        );
        for result in start_each(vec![files, packed], &[0, 0]) {
            let err = result.expect_err("refused on every rank");
            assert!(
                err.contains("rank 1 was started with --cache-layout packed, rank 0 with files"),
                "{err}"
            );
        }
    }

    #[test]
    fn ranks_must_agree_on_the_scope() {
        let folders = Folders::new(2);
        let (node, global) = (folders.args("node"), folders.args("global"));
        for result in start_each(vec![node, global], &[0, 0]) {
            let err = result.expect_err("refused on every rank");
            assert!(
                err.contains("rank 1 was started with --exchange-scope global, rank 0 with node"),
                "{err}"
            );
        }
    }

    /// A record source's index is built by rank 0 and shipped: every rank plans over its
    /// groups. Ranks started with other record settings are refused, naming them.
    #[test]
    fn record_sources_are_indexed_once_and_settings_agree() {
        use crate::dataset::{Format, Grouping};
        let folders = Folders::new(2);
        let rec = folders.root.path().join("rec.svm");
        let lines: String = (0..500).map(|i| format!("1 1:{i} 2:0.5\n")).collect();
        std::fs::write(&rec, lines).unwrap();
        let args = |grouping| {
            let mut a = folders.args("global");
            a.format = Format::Records;
            a.source = rec.clone();
            a.group = grouping;
            a.reset_cache = true;
            a
        };
        let run = |per_rank: Vec<MountArgs>| -> Vec<Result<Prepared, String>> {
            let handles: Vec<_> = LocalComm::world(2)
                .into_iter()
                .zip(per_rank)
                .map(|(mut comm, a)| {
                    std::thread::spawn(move || {
                        prepare(&cfg(a), &mut comm).map_err(|e| e.to_string())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        };
        let started = run(vec![args(Grouping::Pages), args(Grouping::Pages)]);
        let groups: Vec<u64> = started
            .iter()
            .map(|p| {
                let p = p.as_ref().unwrap();
                let index = p.store.manifest().records().expect("a record index");
                assert_eq!(index.records(), 500);
                assert_eq!(p.plan.params().samples, index.groups());
                index.groups()
            })
            .collect();
        assert!(groups[0] < 500 && groups[0] == groups[1], "{groups:?}");
        drop(started);
        for err in run(vec![args(Grouping::Pages), args(Grouping::Records)]) {
            let err = err.err().unwrap();
            assert!(
                err.contains("rank 1 was started with record settings --framing lines --group records, rank 0 with --framing lines --group pages"),
                "{err}"
            );
        }
    }
}
