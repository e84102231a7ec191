//! Start-up in phases, after each of which all ranks agree (a collective) on whether every
//! rank succeeded. A failure on any rank — a busy mount point, a locked cache, an empty
//! source seen by rank 0, settings that differ — therefore stops *all* ranks with the same
//! message instead of leaving some blocked in a collective.
//!
//! 1. local checks (mount point, source on rank 0, the cache folder and its lock);
//! 2. the same settings everywhere;
//! 3. seed and index, decided by rank 0 (the index is reused from rank 0's cache when its
//!    settings match, else built by the dataset format);
//! 4. does each cache belong to these settings? resume at the furthest epoch any rank saved;
//! 5. finish whatever a crash interrupted (see `node::resume`).
//!
//! Mounting is the last phase and lives in `daemon::run`.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use crate::cache::{CacheDir, CacheError, CacheState, FORMAT_VERSION, SampleStore};
use crate::cli::{MountArgs, for_rank};
use crate::comm::{Comm, CommError, agree, decide};
use crate::dataset::Manifest;
use crate::node::resume::{self, Resumed};
use crate::plan::{Plan, PlanError, PlanParams, Rank};
use crate::sys::mounts;

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
    let local = mounts::mountpoint(&mountpoint)
        .map_err(|e| e.to_string())
        .and_then(|()| match rank {
            0 => args
                .format
                .check_source(&args.source)
                .map_err(|e| e.to_string()),
            _ => Ok(()),
        })
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
    };
    let backend = dir.file_backend(manifest.len());
    let local_epoch = backend.map_err(|e| e.to_string()).and_then(|backend| {
        let epoch = match &state {
            Some(s) if s.differences(&expected).is_empty() => s.epoch,
            Some(s) if !args.reset_cache => {
                return Err(format!(
                    "cache folder {} was built with other settings; pass --reset-cache to rebuild it, or use the old settings:\n  {}",
                    cache_path.display(),
                    s.differences(&expected).join("\n  ")
                ));
            }
            _ => {
                use crate::cache::CacheBackend as _;
                backend.clear().map_err(|e| {
                    CacheError::Io {
                        path: cache_path.clone(),
                        source: e,
                    }
                    .to_string()
                })?;
                dir.forget_state().map_err(|e| e.to_string())?;
                0
            }
        };
        Ok((epoch, backend))
    });
    everyone_ok(comm, local_epoch.as_ref().map(|_| ()).map_err(Clone::clone))?;
    let (local_epoch, backend) = local_epoch.expect("checked above");
    // Only a shortcut for the next start, so a failure is a warning (see `save_manifest`).
    if let Err(e) = dir.save_manifest(&manifest_bytes) {
        tracing::warn!(error = %e, "could not save the manifest; the next start rescans the source");
    }
    drop(manifest_bytes); // saved; the manifest itself is all that is needed from here
    // After a crash ranks may be one epoch apart; training had reached the furthest one.
    let epoch = comm
        .all_gather(&local_epoch.to_le_bytes())?
        .iter()
        .filter_map(|b| b.as_slice().try_into().ok().map(u64::from_le_bytes))
        .max()
        .unwrap_or(0);
    dir.save_state(&CacheState { epoch, ..expected })?;

    let plan = Plan::new(PlanParams {
        samples: manifest.len(),
        world,
        fraction: args.fraction,
        seed,
    })?;
    let manifest = Arc::new(manifest);
    let dataset = args.format.open(&args.source, manifest.clone());
    let store = Arc::new(SampleStore::with_backend(
        dir,
        Box::new(backend),
        manifest,
        dataset,
    )?);
    // Phase 5: finish whatever a crash interrupted.
    let resumed = resume::resume(comm, &store, &plan, epoch)?;
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
    let bytes = decide(comm, || -> Result<Vec<u8>, String> {
        let cached =
            reusable.and_then(|s| dir.load_manifest(s.manifest_fingerprint).ok().flatten());
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
                    .build_index(&args.source)
                    .map_err(|e| e.to_string())?;
                tracing::info!(
                    classes = m.class_count(),
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
        (
            "--seed",
            args.seed.map_or("(default)".into(), |s| s.to_string()),
        ),
        ("--reset-cache", args.reset_cache.to_string()),
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

fn random_seed() -> u64 {
    let mut buf = [0u8; 8];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)) {
        Ok(()) => u64::from_le_bytes(buf),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    }
}
