//! Wiring: build every part from the validated settings (`config::MountConfig`), mount,
//! serve until unmounted.
//!
//! Start-up runs in phases that every rank agrees on (`startup/`); the mount itself is the
//! last phase (`mount_everywhere`): if any rank failed to mount, the ranks that did
//! unmount again before exiting, so a refused start leaves no mount behind. Policy lives in
//! the parts: the epoch lifecycle in `node::coordinator`, the filesystem in `vfs`, the
//! kernel binding in `fuse`.
//!
//! The calling thread owns the `Comm` (and so MPI) for the daemon's whole life: after
//! mounting it runs the exchanges (`serving`, the one seam to `node`); the FUSE session and
//! its threads belong to a `mounted::Mounted`, which stops them in order. Nothing here
//! ends the process: an error comes back to `launch`, which picks the exit code.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::comm::{Comm, Reduce};
use crate::config::{ExchangeMode, MountConfig, ReadPath, for_rank};
use crate::exchange::coded::{CodedClient, Routes};
use crate::exchange::{ExchangeConfig, ExchangeError, Peers, SlowPeers};
use crate::node::requests::Requests;
use crate::sys::made_dirs::{MadeDirs, MountDirs};

pub(crate) mod coded;
pub(crate) mod metrics_file;
pub(crate) mod mounted;
mod ready;
mod resize;
mod serving;
mod startup;

#[cfg(test)]
mod elastic_tests;

pub(crate) use startup::StartError;
use startup::{PhaseError, agreed};

/// Why a daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DaemonError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("starting the {what} thread: {source}")]
    Thread {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("FUSE session ended with an error: {0}")]
    Session(std::io::Error),
    #[error("FUSE session thread panicked")]
    Panicked,
    #[error("learning where the other ranks' caches are: {0}")]
    Peers(#[source] crate::comm::CommError),
    /// The coded job's layout or its server (see `coded`).
    #[error(transparent)]
    Coded(#[from] coded::CodedError),
    /// The exchange in flight had to be given up with transfers still posted: this process
    /// must not finalize MPI, and its exit ends the job (`launch` picks the code).
    #[error("exchange abandoned while a peer still expects data; ending the MPI job: {0}")]
    Abandoned(#[source] ExchangeError),
}

/// Runs one rank's daemon: prepares, mounts, reports readiness through `on_ready`, then
/// serves until the folder is unmounted or a signal arrives. `world` is the whole job: in a
/// coded job (a `shufflefs serve` rank at world rank 0, see `coded`) the compute ranks split
/// off their own communicator and keep `world` for the exchange with the server.
pub(crate) fn run(
    config: &MountConfig,
    world: &mut dyn Comm,
    on_ready: &mut dyn FnMut(&str),
) -> Result<(), DaemonError> {
    mounted::listen_for_stop()?;
    match coded::roles(world, &coded::Role::mount(config))? {
        coded::Layout::Plain => run_rank(config, world, None, on_ready),
        coded::Layout::Coded => {
            let mut compute = coded::split_compute(world)?;
            run_rank(config, compute.as_mut(), Some(world), on_ready)
        }
    }
}

/// One compute rank on `comm`; `world` (server included) in a coded job. A start that
/// fails before the mount is ready leaves no cache folder it made behind
/// (`startup::forget_made_cache`): the refusal or failed mount said why, and a folder of
/// ours in the user's scratch space would only be in the way (or taken for a cache).
fn run_rank(
    config: &MountConfig,
    comm: &mut dyn Comm,
    world: Option<&mut dyn Comm>,
    on_ready: &mut dyn FnMut(&str),
) -> Result<(), DaemonError> {
    let cache = for_rank(&config.cache, comm.rank());
    let made = startup::made_by_this_mount(&cache);
    let mut ready = false;
    let result = serve_rank(config, comm, world, &mut |line| {
        ready = true;
        on_ready(line)
    });
    if let (Err(_), false, Some(folder)) = (&result, ready, made) {
        startup::forget_made_cache(&cache, folder);
    }
    result
}

/// [`run_rank`]'s start-up and service.
fn serve_rank(
    config: &MountConfig,
    comm: &mut dyn Comm,
    mut world: Option<&mut dyn Comm>,
    on_ready: &mut dyn FnMut(&str),
) -> Result<(), DaemonError> {
    ready::clear_stale(config, comm.rank());
    let prepared = startup::prepare(config, comm);
    let routes = match world.as_deref_mut() {
        Some(world) => coded_offer(config, comm, world, &prepared)?,
        None => None,
    };
    let prepared = prepared?;
    let rank = comm.rank();
    let coded = match (routes, config.coded_scheme()) {
        (Some(routes), Some(scheme)) => {
            let epoch = prepared.resumed.current.epoch;
            Some(CodedClient::new(
                &prepared.plan,
                rank,
                scheme,
                routes,
                epoch,
            ))
        }
        _ => None,
    };
    let (slow_peers, share_disk) = match &config.exchange {
        ExchangeMode::Partial {
            slow_peers,
            share_disk,
            ..
        } => (*slow_peers, *share_disk),
        ExchangeMode::Coded { .. } => (SlowPeers::default(), false),
    };
    let cfg = ExchangeConfig {
        rate: config.exchange_rate,
        slow_peers,
        ..ExchangeConfig::default()
    };
    // Which ranks of this host can take samples from each other's caches (collective).
    // A packed cache has no sample files a peer could take: its host exchanges through MPI.
    let share = share_disk && config.layout.is_files();
    let root = prepared.store.dir().root().to_path_buf();
    let peers = match world {
        // The server sends everything: no rank takes samples from another's cache.
        Some(_) => Peers::separate(comm.size()),
        None => Peers::discover(comm, &root, share).map_err(DaemonError::Peers)?,
    };
    let exchanges = serving::Exchanges { cfg, peers, coded };
    serving::run_node(config, prepared, exchanges, (comm, world), on_ready)
}

/// Phase 3 of a coded job (`coded`): compute rank 0 offers the run to the server; the
/// multicast routes on its consent.
fn coded_offer(
    config: &MountConfig,
    comm: &dyn Comm,
    world: &mut dyn Comm,
    prepared: &Result<startup::Prepared, StartError>,
) -> Result<Option<Routes>, DaemonError> {
    let ExchangeMode::Coded {
        alpha,
        communicators,
        multicast,
        ..
    } = config.exchange
    else {
        let why = "a coded job's ranks mount coded".to_string();
        return Err(coded::CodedError::Refused(why).into());
    };
    let offer = prepared.as_ref().map_err(ToString::to_string).map(|p| {
        let manifest = p.store.manifest().encode();
        let fingerprint = crate::dataset::manifest::fingerprint_of(&manifest);
        let epoch = p.resumed.current.epoch;
        let offer = coded::Offer::new(config, &p.plan, fingerprint, epoch);
        (offer.expect("a coded mount makes an offer"), manifest)
    });
    let (rank, size) = (comm.rank(), comm.size());
    let comms = || coded::communicators(size, communicators, alpha);
    Ok(coded::offer(world, rank, offer, comms, multicast)?)
}

/// The last phase of start-up: mount everywhere, or nowhere (a rank whose mount succeeded
/// unmounts again, by dropping its session, when another's failed). A missing mount point
/// is created here, once nothing else can refuse the start, and removed again with the
/// session on a refusal (`sys::made_dirs`). `None`: a rank was told to stop during
/// start-up, so none mounts (see `mounted`, "A stop before the mount").
fn mount_everywhere<'w>(
    config: &MountConfig,
    (fs, read_path, requests): (crate::vfs::ShuffleFs, ReadPath, Arc<Requests>),
    (mountpoint, dirs): (&Path, MountDirs),
    comm: &mut dyn Comm,
    world: Option<&mut (dyn Comm + 'w)>,
) -> Result<Option<(mounted::Session, MadeDirs)>, DaemonError> {
    let stops = comm
        .all_reduce(&[u64::from(mounted::stop_requested())], Reduce::Max)
        .map_err(StartError::from)?;
    if stops.first() == Some(&1) {
        tracing::info!("a rank was told to stop during start-up; not mounting");
        if let Some(world) = world {
            coded::mounted(world, coded::Mount::Stopped)?;
        }
        return Ok(None);
    }
    // Dropped on a refusal: the session (unmount) first, then the folders made for it.
    let session = dirs
        .create()
        .map_err(|e| format!("creating the mount point {}: {e}", mountpoint.display()))
        .and_then(|made| {
            let session = mounted::mount(fs, config, (read_path, requests), mountpoint)?;
            Ok((session, made))
        })
        .map_err(PhaseError::Mine);
    let session = agreed(comm, session);
    if let Some(world) = world {
        let mount = match session {
            Ok(_) => coded::Mount::Up,
            Err(_) => coded::Mount::Failed,
        };
        coded::mounted(world, mount)?;
    }
    Ok(Some(session?))
}

/// The line that says this rank is up.
fn ready_line(
    config: &MountConfig,
    comm: &dyn Comm,
    (store, partial): (
        &crate::cache::SampleStore,
        Option<&crate::node::status::PartialSnapshot>,
    ),
    current: &crate::plan::EpochShares,
    coded: bool,
) -> String {
    let rank = comm.rank();
    let how = match config.coded_scheme() {
        Some(s) if coded => format!(", {} exchange from the server", s.name()),
        _ => String::new(),
    };
    // A partial cache is said on the terminal too (the warning with its numbers is in the
    // log, which a detached or launched daemon writes to a file).
    let partial = match partial {
        Some(p) => format!(
            "; partial cache: its shares do not fit {} of cache, the samples not kept are read from the source: expected hit rate {:.0}%, {} from the source per epoch (the log and the status's `partial` say more)",
            startup::fit::mb(p.cache_size_bytes),
            100.0 * p.expected_hit_rate,
            startup::fit::mb(p.expected_source_bytes_per_epoch),
        ),
        None => String::new(),
    };
    format!(
        "shufflefs: rank {rank} of {} mounted {} (epoch {}, {}{how}){partial}",
        comm.size(),
        for_rank(&config.mountpoint, rank).display(),
        current.epoch,
        share_words(store.manifest(), current.share(rank)),
    )
}

/// The log file of a detached daemon: in its cache folder.
pub(crate) fn log_path(args: &MountConfig, rank: u32) -> PathBuf {
    for_rank(&args.cache, rank).join("shufflefs.log")
}

pub(crate) fn ensure_parent(path: &Path) {
    if let Some(p) = path.parent() {
        let _ = std::fs::create_dir_all(p);
    }
}

/// "N samples of T", or for a record source the records too: its units are page groups.
fn share_words(
    manifest: &crate::dataset::manifest::Manifest,
    share: &[crate::plan::SampleId],
) -> String {
    let (n, total) = (share.len(), manifest.len());
    match manifest.records() {
        Some(index) if index.groups() != index.records() => {
            let records: usize = share
                .iter()
                .map(|&g| {
                    let r = index.group_records(g);
                    (r.end - r.start) as usize
                })
                .sum();
            format!(
                "{records} records of {} in {n} page groups of {total}",
                index.records()
            )
        }
        Some(_) => format!("{n} records of {total}"),
        None => format!("{n} samples of {total}"),
    }
}
