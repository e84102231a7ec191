//! Start-up in phases, after each of which all ranks agree (a collective) on whether every
//! rank succeeded. A failure on any rank — a busy mount point, a locked cache, an empty
//! source seen by rank 0, settings that differ — therefore stops *all* ranks with the same
//! message instead of leaving some blocked in a collective.
//!
//! 1. local checks (mount point, source on rank 0, the cache folder and its lock);
//! 2. the same settings everywhere;
//! 3. seed and index, decided by rank 0 (the index is reused from rank 0's cache when its
//!    settings match, else built by the dataset format);
//! 4. does each cache belong to these settings? resume at the furthest epoch any rank saved
//!    (with another number of ranks too: an elastic restart, see `resize`);
//!    under `--exchange-scope node` the settings include the host layout (which ranks share
//!    a host), because the plan's history depends on it: a cache built on another layout is
//!    refused like one built with another seed (see "Host layout on resume" below);
//! 5. finish whatever a crash interrupted (see `node::resume`), or fill the new shares of a
//!    job whose number of ranks changed (`node::regrow`).
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

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use crate::cache::{CacheDir, CacheError, CacheState, FORMAT_VERSION, SampleStore};
use crate::cli::{MountArgs, for_rank};
use crate::comm::{Comm, CommError, agree, decide};
use crate::dataset::Manifest;
use crate::exchange::ExchangeConfig;
use crate::node::regrow::{self, RegrowConfig};
use crate::node::resume;
use crate::node::resumed::Resumed;
use crate::plan::elastic::ElasticPlan;
use crate::plan::{ExchangeScope, Plan, PlanError, PlanParams, Rank};
use crate::sys::mounts;

use super::resize;

/// Why the daemon did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Some ranks failed a phase; every rank reports the same list.
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

/// Fails every rank if any rank failed, naming the ranks and their reasons.
pub fn everyone_ok<E: std::fmt::Display>(
    comm: &mut dyn Comm,
    mine: Result<(), E>,
) -> Result<(), StartError> {
    let failures = agree(comm, mine.map_err(|e| e.to_string()))?;
    if failures.is_empty() {
        return Ok(());
    }
    Err(StartError::Refused {
        failures,
        world: comm.size(),
    })
}

/// Everything needed to serve, once the start-up phases passed.
pub struct Prepared {
    pub store: Arc<SampleStore>,
    pub plan: Plan,
    pub resumed: Resumed,
    pub mountpoint: PathBuf,
}

pub fn prepare(args: &MountArgs, comm: &mut dyn Comm) -> Result<Prepared, StartError> {
    let rank = comm.rank();
    let world = comm.size();
    let cache_path = for_rank(&args.cache, rank);
    let mountpoint = for_rank(&args.mountpoint, rank);

    // Phase 1: local checks on every rank.
    let local = args
        .record_params()
        .and_then(|_| mounts::mountpoint(&mountpoint).map_err(|e| e.to_string()))
        .and_then(|()| match rank {
            0 => args
                .format
                .check_source(&args.source)
                .map_err(|e| e.to_string()),
            _ => Ok(()),
        })
        .and_then(|()| coded_options(args))
        .and_then(|()| CacheDir::open(&cache_path).map_err(|e| e.to_string()));
    let (local, dir) = match local {
        Ok(dir) => (Ok(()), Some(dir)),
        Err(e) => (Err(e), None),
    };
    everyone_ok(comm, local)?;
    let dir = dir.expect("checked above");

    // Phase 2: the same settings everywhere.
    let settings = same_settings(comm, args)?;
    everyone_ok(comm, settings)?;

    // Phase 3: seed and manifest, decided by rank 0. An unreadable state file is refused,
    // unless the user asked to rebuild the cache.
    let state = dir
        .load_state()
        .or_else(|e| if args.reset_cache { Ok(None) } else { Err(e) });
    everyone_ok(comm, state.as_ref().map(|_| ()).map_err(|e| e.to_string()))?;
    let state = state.expect("checked above");
    let reusable = state.as_ref().filter(|s| {
        !args.reset_cache
            && s.source == args.source.display().to_string()
            && s.format == FORMAT_VERSION
    });
    let seed_bytes = decide(comm, || {
        let seed = args
            .seed
            .or(reusable.map(|s| s.seed))
            .unwrap_or_else(random_seed);
        Ok::<_, String>(seed.to_le_bytes())
    })?;
    let seed = u64::from_le_bytes(
        seed_bytes
            .map_err(|e| StartError::Refused {
                failures: vec![(0, e)],
                world,
            })?
            .try_into()
            .map_err(|_| StartError::Malformed("seed"))?,
    );
    let (manifest, manifest_bytes) = index(args, comm, &dir, reusable)?;

    // Phase 4: does this cache belong to these settings? Resume its epoch if so.
    let expected = CacheState {
        format: FORMAT_VERSION,
        source: args.source.display().to_string(),
        seed,
        fraction: args.fraction,
        world_size: world,
        rank,
        manifest_fingerprint: crc32c::crc32c(&manifest_bytes),
        epoch: 0,
        exchange_scope: args.exchange_scope,
        // Global scope ignores hosts, so its state does not depend on where ranks run.
        hosts: match args.exchange_scope {
            ExchangeScope::Global => None,
            ExchangeScope::Node => Some(comm.hosts().to_vec()),
        },
        world_history: Vec::new(), // set once the job's history is known
        layout: args.layout(),
    };
    // Refused before the backend opens: opening creates its folders (another layout's, for
    // a cache refused for its layout).
    // Coded or partial-local, and alpha: recorded beside the state (`coded::check_mode`).
    let same_mode = super::coded::check_mode(dir.root(), args);
    let kept = match state {
        // Another world size is an elastic restart (`resize`), not a mismatch.
        Some(s) if resize::belongs(&s, &expected) && same_mode.is_ok() => match s.history() {
            Ok(_) => Ok(Some(s)),
            Err(e) => Err(CacheError::Corrupt {
                path: cache_path.clone(),
                what: "a state file",
                detail: e.to_string(),
            }
            .to_string()),
        },
        Some(_) if !args.reset_cache && same_mode.is_err() => {
            Err(same_mode.clone().expect_err("checked in the guard"))
        }
        Some(s) if !args.reset_cache => Err(format!(
            "cache folder {} was built with other settings; pass --reset-cache to rebuild it, or use the old settings:\n  {}",
            cache_path.display(),
            resize::differences(&s, &expected).join("\n  ")
        )),
        _ => Ok(None),
    };
    let local = kept.and_then(|kept| {
        let backend = dir
            .backend(args.layout(), manifest.len())
            .map_err(|e| e.to_string())?;
        if kept.is_none() {
            backend.clear().map_err(|e| {
                CacheError::Io {
                    path: cache_path.clone(),
                    source: e,
                }
                .to_string()
            })?;
            dir.remove_other_layouts(args.layout())
                .map_err(|e| e.to_string())?;
            dir.forget_state().map_err(|e| e.to_string())?;
        }
        Ok((kept, backend))
    });
    everyone_ok(comm, local.as_ref().map(|_| ()).map_err(Clone::clone))?;
    let (mine, backend) = local.expect("checked above");
    // Only a shortcut for the next start, so a failure is a warning (see `save_manifest`).
    if let Err(e) = dir.save_manifest(&manifest_bytes) {
        tracing::warn!(error = %e, "could not save the manifest; the next start rescans the source");
    }
    drop(manifest_bytes); // saved; the manifest itself is all that is needed from here
    // After a crash ranks may be one epoch apart; training had reached the furthest one. A
    // restart with another number of ranks goes on from there as well (see `resize`).
    let job = resize::find_job(comm, args, mine.as_ref(), &expected)?;
    let refusal = match (&job, rank) {
        (Err(e), 0) => Err(e.clone()), // the same on every rank: said once
        _ => Ok(()),
    };
    everyone_ok(comm, refusal)?;
    // Refused above on every rank if on any (each computed it from the same gathered lists).
    let job = job.map_err(|_| StartError::Malformed("job history"))?;
    let epoch = job.epoch;
    let mut state = CacheState { epoch, ..expected };
    state.set_history(&job.history);
    dir.save_state(&state)?;
    super::coded::record_mode(dir.root(), args).map_err(|source| CacheError::Io {
        path: cache_path.clone(),
        source,
    })?;

    let params = PlanParams {
        samples: manifest.len(),
        world,
        fraction: args.fraction,
        seed,
    };
    // A coded job (`daemon::coded`): fresh shares every epoch, caches of alpha.
    let coded = args
        .cache_fraction
        .filter(|_| args.coded_scheme().is_some());
    let elastic = match job.history.is_resized() {
        true if coded.is_some() => {
            return Err(StartError::Refused {
                failures: vec![(0, "this cache was built by a coded run with another number of compute ranks; a coded run cannot change it yet: start it with the ranks it had, or pass --reset-cache".into())],
                world,
            });
        }
        true => Some(ElasticPlan::new(params, job.history.clone())?),
        false => None,
    };
    let plan = match (&elastic, coded) {
        (Some(elastic), _) => elastic.current().clone(),
        (None, Some(alpha)) => Plan::coded(params, alpha)?,
        (None, None) => Plan::with_scope(params, args.exchange_scope, comm.hosts())?,
    };
    if let Some(layout) = plan.layout() {
        tracing::info!(layout = %layout.describe(), "exchange scope node: samples move only between ranks of one host");
    }
    let manifest = Arc::new(manifest);
    let dataset = args.format.open(&args.source, manifest.clone());
    let store = Arc::new(SampleStore::with_backend(
        dir,
        backend,
        manifest.clone(),
        dataset.clone(),
    )?);
    // Phase 5: finish whatever a crash interrupted, or fill the shares of a resized job.
    let resumed = match &elastic {
        Some(elastic) => {
            let orphans = resize::open_orphans(job.orphans, &manifest, &dataset);
            let cfg = RegrowConfig {
                exchange: ExchangeConfig {
                    rate: args.exchange_rate,
                    ..ExchangeConfig::default()
                },
                share_disk: args.share_disk == crate::cli::ShareDisk::Auto,
            };
            regrow::regrow(comm, &store, elastic, epoch, orphans, &cfg)?
        }
        None => resume::resume(comm, &store, &plan, epoch)?,
    };
    Ok(Prepared {
        store,
        plan,
        resumed,
        mountpoint,
    })
}

/// Rank 0's index (loaded from its cache when reusable, else built from the source) and
/// its encoding, on every rank. Rank 0 keeps the manifest it built and ships its encoding;
/// only the other ranks decode, so no rank holds more than one manifest and one encoding.
/// Rank 0's names need no check: a scan's come from the kernel (no '/', NUL, '.', '..' or
/// over 255 bytes), the cache's were checked on load.
fn index(
    args: &MountArgs,
    comm: &mut dyn Comm,
    dir: &CacheDir,
    reusable: Option<&CacheState>,
) -> Result<(Manifest, Vec<u8>), StartError> {
    let mut built = None;
    let params = args.record_params().map_err(|e| StartError::Refused {
        failures: vec![(comm.rank(), e)],
        world: comm.size(),
    })?;
    let bytes = decide(comm, || -> Result<Vec<u8>, String> {
        // A cached index built with another format or framing is not reused.
        let cached = reusable
            .and_then(|s| dir.load_manifest(s.manifest_fingerprint).ok().flatten())
            .filter(|m| args.format.fits(m, &params));
        let m = match cached {
            Some(m) => {
                tracing::info!(
                    samples = m.len(),
                    "manifest loaded from the cache; source not rescanned"
                );
                m
            }
            None => {
                let started = std::time::Instant::now();
                let m = args
                    .format
                    .build_index(&args.source, &params)
                    .map_err(|e| e.to_string())?;
                tracing::info!(
                    classes = m.class_count(),
                    records = m.records().map(|r| r.records()),
                    samples = m.len(),
                    skipped = m.skipped.len(),
                    secs = started.elapsed().as_secs_f64(),
                    "source scanned"
                );
                for s in &m.skipped {
                    tracing::warn!(path = %s.path, reason = %s.reason, "sample skipped");
                }
                m
            }
        };
        let bytes = m.encode();
        built = Some(m);
        Ok(bytes)
    })?
    .map_err(|e| StartError::Refused {
        failures: vec![(0, e)],
        world: comm.size(),
    })?;
    let manifest = match built {
        Some(m) => m,
        None => Manifest::decode(&bytes).map_err(|_| StartError::Malformed("manifest"))?,
    };
    Ok((manifest, bytes))
}

/// The settings every rank must share, as `(name, value)`.
fn shared_settings(args: &MountArgs) -> Vec<(&'static str, String)> {
    vec![
        ("--source", args.source.display().to_string()),
        ("--format", format!("{:?}", args.format).to_lowercase()),
        ("--fraction", args.fraction.to_string()),
        ("--exchange-scope", args.exchange_scope.to_string()),
        ("--cache-layout", args.layout().to_string()),
        (
            "--seed",
            args.seed.map_or("(default)".into(), |s| s.to_string()),
        ),
        ("--reset-cache", args.reset_cache.to_string()),
        ("--exchange", format!("{:?}", args.exchange).to_lowercase()),
        (
            "--cache-fraction",
            args.cache_fraction
                .map_or("(none)".into(), |a| a.to_string()),
        ),
        ("--scheme", format!("{:?}", args.scheme).to_lowercase()),
        ("--nu", args.nu.to_string()),
        ("--communicators", args.communicators.to_string()),
        ("--multicast", args.multicast.name().to_string()),
        (
            "record settings",
            args.record_params().map_or_else(|e| e, |p| p.describe()),
        ),
        ("--part-size", args.part_size.to_string()),
    ]
}

/// Rank 0's settings against everyone's: `Err` on a rank names what differs from rank 0.
fn same_settings(comm: &mut dyn Comm, args: &MountArgs) -> Result<Result<(), String>, StartError> {
    let mine = serde_json::to_vec(&shared_settings(args)).expect("settings serialize");
    let all = comm.all_gather(&mine)?;
    let parse = |bytes: &[u8]| -> Result<Vec<(String, String)>, StartError> {
        serde_json::from_slice(bytes).map_err(|_| StartError::Malformed("settings list"))
    };
    let root = parse(&all[0])?;
    let mut diffs = Vec::new();
    for (rank, bytes) in all.iter().enumerate().skip(1) {
        for ((name, a), (_, b)) in root.iter().zip(&parse(bytes)?) {
            if a != b {
                diffs.push(format!(
                    "rank {rank} was started with {name} {b}, rank 0 with {a}"
                ));
            }
        }
    }
    // Every rank computed the same list; rank 0 alone reports it, once.
    Ok(if diffs.is_empty() || comm.rank() != 0 {
        Ok(())
    } else {
        Err(format!(
            "ranks disagree on settings; start every rank with the same options:\n{}",
            diffs.join("\n")
        ))
    })
}

/// Options that contradict `--exchange coded` (or need it).
fn coded_options(args: &MountArgs) -> Result<(), String> {
    let coded = args.coded_scheme().is_some();
    if coded && args.exchange_scope == ExchangeScope::Node {
        return Err("--exchange-scope node keeps samples on their host, --exchange coded reshuffles the whole dataset every epoch: choose one".into());
    }
    if !coded && args.cache_fraction.is_some() {
        return Err("--cache-fraction applies to --exchange coded only (partial-local shuffling caches (1+--fraction) x the share)".into());
    }
    Ok(())
}

fn random_seed() -> u64 {
    let mut buf = [0u8; 8];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)) {
        Ok(()) => u64::from_le_bytes(buf),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};
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
                Command::Unmount(_) | Command::Plan(_) | Command::Serve(_) => unreachable!(),
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
                    prepare(&args, &mut comm)
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
            prepare(&folders.args_with("global", extra), &mut comm)
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
                    std::thread::spawn(move || prepare(&a, &mut comm).map_err(|e| e.to_string()))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        };
        let started = run(vec![args(Grouping::Pages), args(Grouping::Pages)]);
        let groups: Vec<u32> = started
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
