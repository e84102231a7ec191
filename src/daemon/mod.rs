//! Wiring: build every part from the settings, mount, serve until unmounted.
//!
//! Startup runs in phases, and after each one all ranks agree (a collective) on whether
//! every rank succeeded. A failure on any rank — a busy mount point, a locked cache, an
//! empty source seen by rank 0, settings that differ — therefore stops *all* ranks with the
//! same message instead of leaving some blocked in a collective. The mount itself is the
//! last phase: if any rank failed to mount, the ranks that did unmount again before exiting,
//! so a refused start leaves no mount behind.
//!
//! The calling thread owns the `Comm` (and so MPI) for the daemon's whole life.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::thread;

use fuser::{Config, MountOption, SessionACL};

use crate::cache::{CacheDir, CacheState, FORMAT_VERSION, SampleStore};
use crate::cli::{MountArgs, ReadPath, for_rank};
use crate::comm::{Comm, agree, decide};
use crate::dataset::manifest::{self, Manifest};
use crate::dataset::source::DirSource;
use crate::exchange::{self, ExchangeConfig, ExchangeState, ExchangeTracker, MpiCmd};
use crate::fuse::{FuseAdapter, Invalidated};
use crate::node::epochs::Epochs;
use crate::node::resume;
use crate::node::staging::{Staging, StagingCmd};
use crate::node::status::DaemonStatus;
use crate::plan::{Plan, PlanParams, Step};
use crate::sys::{mounts as checks, readahead};
use crate::vfs::ShuffleFs;
use crate::vfs::inodes as view;

/// Fails every rank if any rank failed, naming the ranks and their reasons.
fn everyone_ok(comm: &mut dyn Comm, mine: Result<(), String>) -> Result<(), String> {
    let failures = agree(comm, mine).map_err(|e| e.to_string())?;
    if failures.is_empty() {
        return Ok(());
    }
    let world = comm.size();
    Err(failures
        .iter()
        .map(|(r, m)| {
            if world == 1 {
                m.clone()
            } else {
                format!("rank {r}: {m}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n"))
}

/// The settings every rank must share, as `(name, value)`.
fn shared_settings(args: &MountArgs) -> Vec<(&'static str, String)> {
    vec![
        ("--source", args.source.display().to_string()),
        ("--fraction", args.fraction.to_string()),
        (
            "--seed",
            args.seed.map_or("(default)".into(), |s| s.to_string()),
        ),
        ("--reset-cache", args.reset_cache.to_string()),
    ]
}

fn check_same_settings(comm: &mut dyn Comm, args: &MountArgs) -> Result<(), String> {
    let mine = serde_json::to_vec(&shared_settings(args)).expect("settings serialize");
    let all = comm.all_gather(&mine).map_err(|e| e.to_string())?;
    let root: Vec<(String, String)> = serde_json::from_slice(&all[0]).map_err(|e| e.to_string())?;
    let mut diffs = Vec::new();
    for (rank, bytes) in all.iter().enumerate().skip(1) {
        let theirs: Vec<(String, String)> =
            serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        for ((name, a), (_, b)) in root.iter().zip(&theirs) {
            if a != b {
                diffs.push(format!(
                    "rank {rank} was started with {name} {b}, rank 0 with {a}"
                ));
            }
        }
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "ranks disagree on settings; start every rank with the same options:\n{}",
            diffs.join("\n")
        ))
    }
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

/// Rank 0's reuse of its cache: same source and no reset asked.
fn reusable<'a>(args: &MountArgs, state: Option<&'a CacheState>) -> Option<&'a CacheState> {
    state.filter(|s| {
        !args.reset_cache
            && s.source == args.source.display().to_string()
            && s.format == FORMAT_VERSION
    })
}

/// Everything needed to serve, once the startup phases passed.
struct Prepared {
    store: Arc<SampleStore>,
    plan: Plan,
    resumed: resume::Resumed,
    mountpoint: PathBuf,
}

fn prepare(args: &MountArgs, comm: &mut dyn Comm) -> Result<Prepared, String> {
    let rank = comm.rank();
    let world = comm.size();
    let cache_path = for_rank(&args.cache, rank);
    let mountpoint = for_rank(&args.mountpoint, rank);

    // Phase 1: local checks on every rank.
    let mut dir = None;
    let local = checks::mountpoint(&mountpoint)
        .and_then(|()| {
            if rank == 0 {
                checks::source(&args.source)
            } else {
                Ok(())
            }
        })
        .and_then(|()| {
            CacheDir::open(&cache_path)
                .map(|d| dir = Some(d))
                .map_err(|e| e.to_string())
        });
    everyone_ok(comm, local)?;
    let dir = dir.expect("checked above");

    // Phase 2: the same settings everywhere.
    check_same_settings(comm, args)?;

    // Phase 3: seed and manifest, decided by rank 0.
    // An unreadable state file is refused, unless the user asked to rebuild the cache.
    let state = dir
        .load_state()
        .or_else(|e| if args.reset_cache { Ok(None) } else { Err(e) });
    let state_ok = state.as_ref().map(|_| ()).map_err(|e| e.to_string());
    everyone_ok(comm, state_ok)?;
    let state = state.expect("checked above");
    let seed_bytes = decide(comm, || {
        let seed = args
            .seed
            .or(reusable(args, state.as_ref()).map(|s| s.seed))
            .unwrap_or_else(random_seed);
        Ok::<_, String>(seed.to_le_bytes())
    })
    .map_err(|e| e.to_string())??;
    let seed = u64::from_le_bytes(
        seed_bytes
            .try_into()
            .map_err(|_| "bad seed from rank 0".to_string())?,
    );
    // Rank 0 keeps the manifest it scanned (or loaded) and ships its encoding; only the other
    // ranks decode. So no rank holds more than one manifest and one encoding, and those bytes
    // go once they are saved in the cache. Rank 0's names need no check: the scan's come from
    // the kernel (no '/', NUL, '.', '..' or over 255 bytes), the cache's were checked on load.
    let mut scanned = None;
    let manifest_bytes = decide(comm, || -> Result<Vec<u8>, String> {
        let cached = reusable(args, state.as_ref())
            .and_then(|s| dir.load_manifest(s.manifest_fingerprint).ok().flatten());
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
                let m = manifest::scan(&args.source).map_err(|e| e.to_string())?;
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
        scanned = Some(m);
        Ok(bytes)
    })
    .map_err(|e| e.to_string())??;
    let manifest = match scanned {
        Some(m) => m,
        None => Manifest::decode(&manifest_bytes).map_err(|e| e.to_string())?,
    };
    let manifest = Arc::new(manifest);

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
    let local_epoch = match &state {
        Some(s) if s.differences(&expected).is_empty() => Ok(s.epoch),
        Some(s) if !args.reset_cache => Err(format!(
            "cache folder {} was built with other settings; pass --reset-cache to rebuild it, or use the old settings:\n  {}",
            cache_path.display(),
            s.differences(&expected).join("\n  ")
        )),
        _ => dir.clear().map(|()| 0).map_err(|e| e.to_string()),
    };
    let epoch_ok = local_epoch.as_ref().map(|_| ()).map_err(Clone::clone);
    everyone_ok(comm, epoch_ok)?;
    let local_epoch = local_epoch.expect("checked above");
    // Only a shortcut for the next start, so a failure is a warning (see `save_manifest`).
    if let Err(e) = dir.save_manifest(&manifest_bytes) {
        tracing::warn!(error = %e, "could not save the manifest; the next start rescans the source");
    }
    drop(manifest_bytes); // saved; the manifest itself is all that is needed from here
    // After a crash ranks may be one epoch apart; training had reached the furthest one.
    let epochs = comm
        .all_gather(&local_epoch.to_le_bytes())
        .map_err(|e| e.to_string())?;
    let epoch = epochs
        .iter()
        .filter_map(|b| b.as_slice().try_into().ok().map(u64::from_le_bytes))
        .max()
        .unwrap_or(0);
    dir.save_state(&CacheState { epoch, ..expected })
        .map_err(|e| e.to_string())?;

    let plan = Plan::new(PlanParams {
        samples: manifest.len(),
        world,
        fraction: args.fraction,
        seed,
    })
    .map_err(|e| e.to_string())?;
    let source = Arc::new(DirSource::new(args.source.clone(), manifest.clone()));
    let store = Arc::new(SampleStore::new(dir, manifest, source).map_err(|e| e.to_string())?);
    // Phase 5: finish whatever a crash interrupted (see `resume`).
    let resumed = resume::resume(comm, &store, &plan, epoch)?;
    Ok(Prepared {
        store,
        plan,
        resumed,
        mountpoint,
    })
}

/// Waits for the exchange into `step.next.epoch`, then makes sure every sample of the new
/// share is cached; anything the exchange could not deliver comes from the source.
fn prepare_epoch(
    store: &SampleStore,
    tracker: &ExchangeTracker,
    rank: u32,
    step: &Step,
) -> Result<(), String> {
    let target = step.next.epoch;
    let report = tracker.wait(target);
    if report.state != ExchangeState::Done {
        tracing::warn!(target_epoch = target, error = ?report.error, "exchange incomplete; fetching the rest from the source");
    }
    let missing: Vec<_> = step
        .next
        .share(rank)
        .iter()
        .copied()
        .filter(|&id| !store.contains(id))
        .collect();
    if !missing.is_empty() {
        tracing::warn!(
            target_epoch = target,
            samples = missing.len(),
            "samples not delivered by the exchange; fetching from the source"
        );
    }
    // A bad sample is reported, not fatal: `ensure` names it in the status, and readers get
    // EIO for it alone (or its bytes, if its source file comes back).
    let failed = missing
        .iter()
        .filter(|&&id| store.ensure(id).is_err())
        .count();
    if failed > 0 {
        tracing::warn!(
            target_epoch = target,
            samples = failed,
            "samples could not be fetched from the source; reads of them fail until they can be (see the status's problems)"
        );
    }
    Ok(())
}

/// Runs one rank's daemon: prepares, mounts, reports readiness through `on_ready`, then
/// serves until the folder is unmounted or a signal arrives. The calling thread runs the
/// exchanges (it owns `comm`); the FUSE session runs on its own threads.
pub fn run(
    args: &MountArgs,
    comm: &mut dyn Comm,
    on_ready: &mut dyn FnMut(&str),
) -> Result<(), String> {
    let Prepared {
        store,
        plan,
        resumed,
        mountpoint,
    } = prepare(args, comm)?;
    let rank = comm.rank();

    let tracker = Arc::new(ExchangeTracker::default());
    let (prep_store, prep_tracker) = (store.clone(), tracker.clone());
    let persist_store = store.clone();
    let epochs = Arc::new(Epochs::starting_at(
        plan,
        rank,
        resumed.current,
        Some(resumed.next),
        Box::new(move |step| prepare_epoch(&prep_store, &prep_tracker, rank, step)),
        Box::new(move |step| {
            let dir = persist_store.dir();
            let mut state = dir
                .load_state()
                .map_err(|e| e.to_string())?
                .ok_or("state file vanished")?;
            state.epoch = step.next.epoch;
            dir.save_state(&state).map_err(|e| e.to_string())
        }),
    ));
    let staging = Arc::new(Staging::start(
        store.clone(),
        rank,
        usize::from(args.staging_threads),
    ));
    let status = Arc::new(DaemonStatus {
        source: args.source.display().to_string(),
        mountpoint: mountpoint.display().to_string(),
        store: store.clone(),
        epochs: epochs.clone(),
        staging: staging.progress.clone(),
        exchange: tracker.clone(),
    });
    let fs = ShuffleFs::new(store.clone(), epochs.clone(), status);
    // Without opens (page-cache mode) the status is read through a link; see `fuse`.
    let fs = Arc::new(match args.read_path {
        ReadPath::PageCache => fs.with_status_link(),
        _ => fs,
    });
    let invalidated = Arc::new(Invalidated::new(epochs.epoch()));
    let adapter = FuseAdapter::new(fs, args.read_path, invalidated.clone())
        .map_err(|e| format!("starting the threads that answer the kernel: {e}"));

    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("shufflefs".into()),
        MountOption::Subtype("shufflefs".into()),
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
    ];
    config.acl = if args.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(args.fuse_threads(crate::fuse::may_pass_through(args.read_path)));
    config.clone_fd = true;

    // Phase 6: mount everywhere, or nowhere.
    let session = adapter.and_then(|adapter| {
        fuser::Session::new(adapter, &mountpoint, &config)
            .map_err(|e| format!("mounting {} failed: {e}", mountpoint.display()))
    });
    let mounted = session.as_ref().map(|_| ()).map_err(Clone::clone);
    let mut session = match everyone_ok(comm, mounted) {
        Ok(()) => session.expect("checked above"),
        Err(e) => {
            drop(session); // unmounts where the mount succeeded
            return Err(e);
        }
    };

    match readahead::raise(&mountpoint, readahead::WINDOW_KB) {
        Ok(kb) => tracing::debug!(kb, "readahead window of the mount"),
        Err(e) => {
            tracing::info!(error = %e, "could not raise the mount's readahead window (needs root); large samples stream in 128 KiB requests without passthrough")
        }
    }

    // Kernel cache invalidation runs on its own thread (see `fuse::Invalidated`).
    let notifier = session.notifier();
    let (inval_tx, inval_rx) = channel::<u64>();
    thread::Builder::new()
        .name("invalidate".into())
        .spawn(move || {
            for old in inval_rx {
                let root = fuser::INodeNo(view::ROOT);
                let _ =
                    notifier.inval_entry(root, std::ffi::OsStr::new(&view::epoch_dir_name(old)));
                let _ = notifier.inval_entry(root, std::ffi::OsStr::new(view::CURRENT_NAME));
                invalidated.done(old);
            }
        })
        .map_err(|e| e.to_string())?;

    // Each published epoch: drop what left, start the next exchange, stage the new share.
    let (mpi_tx, mpi_rx) = channel::<MpiCmd>();
    let (listener_tx, listener_epochs, listener_tracker) =
        (mpi_tx.clone(), epochs.clone(), tracker.clone());
    let staging_listener = staging.clone();
    epochs.subscribe(Box::new(move |change| {
        let _ = inval_tx.send(change.previous.epoch);
        let mine = change.current.share(rank);
        let evict = change
            .previous
            .share(rank)
            .iter()
            .copied()
            .filter(|id| mine.binary_search(id).is_err())
            .collect();
        let step = listener_epochs.next_step();
        listener_tracker.announce(step.next.epoch);
        let _ = listener_tx.send(MpiCmd::Exchange { evict, step });
        staging_listener.send(StagingCmd::Epoch {
            current: change.current.clone(),
        });
    }));
    staging.send(StagingCmd::Epoch {
        current: epochs.current(),
    });
    let first = epochs.next_step();
    tracker.announce(first.next.epoch);
    let _ = mpi_tx.send(MpiCmd::Exchange {
        evict: Vec::new(),
        step: first,
    });

    // Set when the daemon is going away: an exchange in progress gives up (its peers may
    // be gone already), and whatever waits on it falls back to the source and finishes.
    let abort = Arc::new(AtomicBool::new(false));
    let mut unmounter = session.unmount_callable();
    let (signal_mountpoint, signal_abort) = (mountpoint.clone(), abort.clone());
    let mut signals =
        signal_hook::iterator::Signals::new([libc::SIGTERM, libc::SIGINT, libc::SIGHUP])
            .map_err(|e| e.to_string())?;
    let signal_handle = signals.handle();
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!(signal = sig, "signal received; unmounting");
                // Files still open (readers that have not stopped): detach instead, so the
                // daemon exits once they close rather than never. A reader may be waiting on
                // an advance whose exchange waits on a peer that already left: give up the
                // exchange too (after detaching, so a daemon that exits for it leaves no
                // mount behind), or that reader, and with it this daemon, would wait forever.
                if let Err(e) = unmounter.unmount() {
                    let detached = checks::detach(&signal_mountpoint);
                    tracing::warn!(error = %e, detached, "unmount on signal failed; detached the mount instead");
                    signal_abort.store(true, Ordering::Relaxed);
                }
            }
        })
        .map_err(|e| e.to_string())?;

    let current = epochs.current();
    let (epoch, share) = (current.epoch, current.share(rank).len());
    on_ready(&format!(
        "shufflefs: rank {rank} of {} mounted {} (epoch {epoch}, {share} samples of {})",
        comm.size(),
        mountpoint.display(),
        store.manifest().len()
    ));
    let (session_abort, session_tx) = (abort.clone(), mpi_tx);
    let served = thread::Builder::new()
        .name("fuse".into())
        .spawn(move || {
            let result = session.run();
            session_abort.store(true, Ordering::Relaxed);
            let _ = session_tx.send(MpiCmd::Shutdown);
            result
        })
        .map_err(|e| e.to_string())?;
    let cfg = ExchangeConfig {
        rate: args.exchange_rate,
        ..ExchangeConfig::default()
    };
    for cmd in mpi_rx {
        match cmd {
            MpiCmd::Exchange { evict, step } => {
                for id in evict {
                    if let Err(e) = store.remove(id) {
                        tracing::warn!(sample = id, error = %e, "could not drop a sample that left the share");
                    }
                }
                if let Err(e) = exchange::run(comm, &store, &step, cfg, &tracker, &abort) {
                    tracing::error!("{e}");
                    if e.is_abandoned() {
                        // MPI may still use the abandoned transfers' buffers and cannot be
                        // finalized: leave now (the mount is already detached), which makes
                        // the launcher end the job (the other ranks unmount on its SIGTERM).
                        tracing::error!(
                            "exchange abandoned while a peer still expects data; ending the MPI job"
                        );
                        std::process::exit(3);
                    }
                }
            }
            MpiCmd::Shutdown => break,
        }
    }
    let result = served
        .join()
        .map_err(|_| "FUSE session thread panicked".to_string())?;
    signal_handle.close();
    store.dir().unlock();
    tracing::info!(mountpoint = %mountpoint.display(), "unmounted; daemon exiting");
    result.map_err(|e| format!("FUSE session ended with an error: {e}"))
}

/// The log file of a detached daemon: in its cache folder.
pub fn log_path(args: &MountArgs) -> PathBuf {
    for_rank(&args.cache, 0).join("shufflefs.log")
}

pub fn ensure_parent(path: &Path) {
    if let Some(p) = path.parent() {
        let _ = std::fs::create_dir_all(p);
    }
}
