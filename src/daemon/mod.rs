//! Wiring: build every part from the settings, mount, serve until unmounted.
//!
//! Start-up runs in phases that every rank agrees on (`startup.rs`); the mount itself is the
//! last phase: if any rank failed to mount, the ranks that did unmount again before exiting,
//! so a refused start leaves no mount behind. Policy lives in the parts: the epoch
//! lifecycle in `node::coordinator`, the filesystem in `vfs`, the kernel binding in `fuse`.
//!
//! The calling thread owns the `Comm` (and so MPI) for the daemon's whole life: after
//! mounting it runs the exchanges (`node::serve_exchanges`); the FUSE session runs on its own
//! threads.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use fuser::{Config, MountOption, SessionACL};

use crate::cli::{MountArgs, ReadPath, for_rank};
use crate::comm::Comm;
use crate::exchange::coded::CodedClient;
use crate::exchange::{ExchangeConfig, Peers, SlowPeers};
use crate::fuse::FuseAdapter;
use crate::node::{ExchangeCmd, Exchanger, Node, NodeConfig, serve, serve_exchanges};
use crate::sys::{mounts, readahead};
use crate::vfs::inodes;

pub mod coded;
mod resize;
mod startup;

#[cfg(test)]
mod elastic_tests;

pub use startup::StartError;
use startup::everyone_ok;

/// Why a daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
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
    #[error("{0}")]
    Coded(String),
}

fn thread_error(what: &'static str) -> impl FnOnce(std::io::Error) -> DaemonError {
    move |source| DaemonError::Thread { what, source }
}

/// Runs one rank's daemon: prepares, mounts, reports readiness through `on_ready`, then
/// serves until the folder is unmounted or a signal arrives. `world` is the whole job: in a
/// coded job (a `shufflefs serve` rank at world rank 0, see `coded`) the compute ranks split
/// off their own communicator and keep `world` for the exchange with the server.
pub fn run(
    args: &MountArgs,
    world: &mut dyn Comm,
    on_ready: &mut dyn FnMut(&str),
) -> Result<(), DaemonError> {
    match coded::roles(world, &coded::Role::mount(args)).map_err(DaemonError::Coded)? {
        coded::Layout::Plain => run_rank(args, world, None, on_ready),
        coded::Layout::Coded => {
            let mut compute = coded::split_compute(world).map_err(DaemonError::Coded)?;
            run_rank(args, compute.as_mut(), Some(world), on_ready)
        }
    }
}

/// One compute rank on `comm`; `world` (server included) in a coded job.
fn run_rank(
    args: &MountArgs,
    comm: &mut dyn Comm,
    mut world: Option<&mut dyn Comm>,
    on_ready: &mut dyn FnMut(&str),
) -> Result<(), DaemonError> {
    let prepared = startup::prepare(args, comm);
    let mut routes = None;
    if let Some(world) = world.as_deref_mut() {
        let offer = prepared.as_ref().map_err(ToString::to_string).map(|p| {
            let manifest = p.store.manifest().encode();
            let fingerprint = crc32c::crc32c(&manifest);
            let offer = coded::Offer::new(args, &p.plan, fingerprint, p.resumed.current.epoch);
            (offer, manifest)
        });
        let (rank, size) = (comm.rank(), comm.size());
        let comms = || {
            let alpha = args.cache_fraction.unwrap_or(0.0);
            coded::communicators(size, args.communicators, alpha)
        };
        routes =
            coded::offer(world, rank, offer, comms, args.multicast).map_err(DaemonError::Coded)?;
    }
    let startup::Prepared {
        store,
        plan,
        resumed,
        mountpoint,
    } = prepared?;
    let rank = comm.rank();
    let coded_client = routes.map(|routes| {
        let scheme = args
            .coded_scheme()
            .expect("a coded job's ranks mount coded");
        CodedClient::new(&plan, rank, scheme, routes, resumed.current.epoch)
    });
    let exchange_cfg = ExchangeConfig {
        rate: args.exchange_rate,
        slow_peers: SlowPeers {
            // Both checked finite and in [0, 1e6] by the command line.
            factor: args.slow_peer_factor,
            grace: Duration::from_secs_f64(args.slow_peer_grace),
            ..SlowPeers::default()
        },
        ..ExchangeConfig::default()
    };
    // Which ranks of this host can take samples from each other's caches (collective).
    // A packed cache has no sample files a peer could take: its host exchanges through MPI.
    let share = args.share_disk == crate::cli::ShareDisk::Auto && args.layout().is_files();
    let peers = match world {
        // The server sends everything: no rank takes samples from another's cache.
        Some(_) => Peers::separate(comm.size()),
        None => Peers::discover(comm, store.dir().root(), share).map_err(DaemonError::Peers)?,
    };
    let (node, exchanges) = Node::start(
        store.clone(),
        plan,
        rank,
        resumed,
        NodeConfig {
            exchange: exchange_cfg,
            staging_threads: usize::from(args.staging_threads),
            source: args.source.display().to_string(),
            mountpoint: mountpoint.display().to_string(),
            exchanges: true,
            hosts: comm.hosts().to_vec(),
        },
    );
    let fs = node
        .fs()
        .with_part_size(args.part_size)
        .with_access(crate::vfs::access::Access::of_source(&args.source));
    // Without opens (page-cache mode) the status is read through a link; see `fuse`.
    let fs = Arc::new(match args.read_path {
        ReadPath::PageCache => fs.with_status_link(),
        _ => fs,
    });

    // The last phase: mount everywhere, or nowhere.
    let session = FuseAdapter::new(fs, args.read_path)
        .map_err(|e| format!("starting the threads that answer the kernel: {e}"))
        .and_then(|adapter| {
            crate::fuse::mount(adapter, &mountpoint, &fuse_config(args))
                .map_err(|e| format!("mounting {} failed: {e}", mountpoint.display()))
        });
    let mounted = session.as_ref().map(|_| ()).map_err(Clone::clone);
    let mounted = everyone_ok(comm, mounted);
    if let Some(world) = world.as_deref_mut() {
        coded::mounted(world, mounted.is_ok()).map_err(DaemonError::Coded)?;
    }
    let mut session = match mounted {
        Ok(()) => session.expect("checked above"),
        Err(e) => {
            drop(session); // unmounts where the mount succeeded
            node.coordinator.shutdown();
            return Err(e.into());
        }
    };
    match readahead::raise(&mountpoint, readahead::WINDOW_KB) {
        Ok(kb) => tracing::debug!(kb, "readahead window of the mount"),
        Err(e) => {
            tracing::info!(error = %e, "could not raise the mount's readahead window (needs root); large samples stream in 128 KiB requests without passthrough")
        }
    }

    // Kernel cache invalidation runs on its own thread: the kernel takes the root's lock for
    // it, which a lookup of `epoch-(N+1)` (the request that advanced) still holds.
    let notifier = session.notifier();
    let (invalidations, coordinator) = (node.invalidations(), node.coordinator.clone());
    thread::Builder::new()
        .name("invalidate".into())
        .spawn(move || {
            for old in invalidations {
                let root = fuser::INodeNo(inodes::ROOT);
                let _ =
                    notifier.inval_entry(root, std::ffi::OsStr::new(&inodes::epoch_dir_name(old)));
                let _ = notifier.inval_entry(root, std::ffi::OsStr::new(inodes::CURRENT_NAME));
                coordinator.invalidated(old);
            }
        })
        .map_err(thread_error("invalidation"))?;

    // Set when the daemon is going away: an exchange in progress gives up (its peers may
    // be gone already), and whatever waits on it falls back to the source and finishes.
    let abort = Arc::new(AtomicBool::new(false));
    let signals = watch_signals(&mut session, &mountpoint, &abort)?;

    let current = node.coordinator.current();
    let how = match args.coded_scheme() {
        Some(s) if world.is_some() => format!(", {} exchange from the server", s.name()),
        _ => String::new(),
    };
    on_ready(&format!(
        "shufflefs: rank {rank} of {} mounted {} (epoch {}, {}{how})",
        comm.size(),
        mountpoint.display(),
        current.epoch,
        share_words(store.manifest(), current.share(rank)),
    ));
    let (session_abort, session_tx) = (abort.clone(), node.exchange_queue());
    let served = thread::Builder::new()
        .name("fuse".into())
        .spawn(move || {
            let result = session.run();
            session_abort.store(true, Ordering::Relaxed);
            let _ = session_tx.send(ExchangeCmd::Shutdown);
            result
        })
        .map_err(thread_error("FUSE session"))?;
    let served_exchanges = match (world, coded_client) {
        (Some(world), Some(mut client)) => serve(
            world,
            &node,
            &exchanges,
            Exchanger::Coded(&mut client),
            &abort,
        ),
        _ => serve_exchanges(comm, &node, &exchanges, exchange_cfg, &peers, &abort),
    };
    if let Err(e) = served_exchanges {
        // MPI cannot withdraw a half-done transfer: leave without finalizing, which makes
        // the launcher end the job (the other ranks unmount on its SIGTERM). The mount was
        // detached before `abort` was set, so nothing is left behind.
        tracing::error!(error = %e, "exchange abandoned while a peer still expects data; ending the MPI job");
        std::process::exit(3);
    }
    node.coordinator.shutdown();
    let result = served.join().map_err(|_| DaemonError::Panicked)?;
    signals.close();
    store.dir().unlock();
    tracing::info!(mountpoint = %mountpoint.display(), "unmounted; daemon exiting");
    result.map_err(DaemonError::Session)
}

/// The FUSE mount's settings.
fn fuse_config(args: &MountArgs) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("shufflefs".into()),
        MountOption::Subtype("shufflefs".into()),
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
    ];
    // Other users see the view only with --allow-other, and then the kernel checks the
    // owners and modes it shows (the source's; see `vfs::access`).
    config.acl = if args.allow_other {
        config.mount_options.push(MountOption::DefaultPermissions);
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(args.fuse_threads(crate::fuse::may_pass_through(args.read_path)));
    config.clone_fd = true;
    config
}

/// Unmounts on SIGTERM, SIGINT or SIGHUP. With files still open (readers that have not
/// stopped) the unmount is refused: the mount is detached instead, so the daemon exits once
/// they close rather than never. A reader may be waiting on an advance whose exchange waits
/// on a peer that already left: `abort` gives up the exchange too (after detaching, so a
/// daemon that exits for it leaves no mount behind), or that reader, and with it this
/// daemon, would wait forever.
fn watch_signals(
    session: &mut fuser::Session<FuseAdapter>,
    mountpoint: &Path,
    abort: &Arc<AtomicBool>,
) -> Result<signal_hook::iterator::Handle, DaemonError> {
    let mut unmounter = session.unmount_callable();
    let (mountpoint, abort) = (mountpoint.to_path_buf(), abort.clone());
    let mut signals =
        signal_hook::iterator::Signals::new([libc::SIGTERM, libc::SIGINT, libc::SIGHUP])
            .map_err(thread_error("signal"))?;
    let handle = signals.handle();
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!(signal = sig, "signal received; unmounting");
                if let Err(e) = unmounter.unmount() {
                    let detached = mounts::detach(&mountpoint);
                    tracing::warn!(error = %e, detached, "unmount on signal failed; detached the mount instead");
                    abort.store(true, Ordering::Relaxed);
                }
            }
        })
        .map_err(thread_error("signal"))?;
    Ok(handle)
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

/// "N samples of T", or for a record source the records too: its units are page groups.
fn share_words(
    manifest: &crate::dataset::manifest::Manifest,
    share: &[crate::plan::SampleId],
) -> String {
    let (n, total) = (share.len(), manifest.len());
    match manifest.records() {
        Some(index) if index.groups() != index.records() => {
            let records: usize = share.iter().map(|&g| index.group_records(g).len()).sum();
            format!(
                "{records} records of {} in {n} page groups of {total}",
                index.records()
            )
        }
        Some(_) => format!("{n} records of {total}"),
        None => format!("{n} samples of {total}"),
    }
}
