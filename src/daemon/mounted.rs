//! A mounted rank: the FUSE session and the threads that live with it, owned by one value
//! with an ordered teardown.
//!
//! Threads, all named:
//! - `fuse`: runs the session until the folder is unmounted (by `shufflefs unmount`,
//!   `fusermount3 -u` or a signal). When it ends it asks the exchange loop to finish (the
//!   `stop` hook), then watches that loop drain: see "Stopping" below.
//! - `invalidate`: tells the kernel to forget an old epoch's names (the kernel takes the
//!   root's lock for it, which the lookup that advanced still holds, so not on a request
//!   thread).
//! - `signals`: SIGTERM, SIGINT or SIGHUP unmount; with files still open the unmount is
//!   refused, so the mount is detached instead and the advances readers wait on fail (a
//!   reader may wait on an advance whose exchange waits on peers); a second signal gives
//!   the exchange in flight up.
//!
//! # Stopping
//! An unmount may come at any moment, also while the background exchange into the next
//! epoch runs. Under MPI a transfer cannot be withdrawn, and a rank that leaves one behind
//! cannot finalize MPI (the whole job ends with it, see `comm`). So a stopping rank *drains*
//! the exchange in flight instead of giving it up: when every rank stops (the usual end of a
//! job) every rank is in the same exchange, it completes, and every rank exits 0 with its
//! cache at a consistent, resumable epoch. A rank that stops while the others go on, or an
//! epoch behind them, then leaves (`super::serving`, "Leaving"): it serves the next exchange
//! without samples, so peers draining it (or reaching it later) complete it and leave this
//! rank out afterwards. The drain is not bounded: a peer an epoch behind (still training)
//! completes it when it advances or stops, and giving it up would end the whole job. Meanwhile
//! the `fuse` thread is named [`DRAINING`], so `shufflefs unmount` returns at once rather
//! than waiting for that peer. Only a second signal gives the exchange up (`abort`), and
//! the daemon then ends with [`super::DaemonError::Abandoned`], for which `launch` picks
//! the exit code. (A first signal with files still open used to give it up too: one rank's
//! SIGTERM while its trainer waited on an advance ended the whole job.)
//!
//! # A stop before the mount
//! A signal that arrives during start-up (a long index scan, or the regrow of a job whose
//! number of ranks changed, which moves samples over MPI) must not kill the rank in the
//! middle of a collective. [`listen_for_stop`] records it instead; the phase in flight
//! finishes, the ranks agree whether any of them was told to stop, and if so none mounts
//! and each exits 0 (`super::mount_everywhere`). A signal between that agreement and the
//! watcher unmounts as soon as the watcher runs.
//!
//! # Teardown order (`stop`, and `Drop` for an early return)
//! 1. the session: already ended (that is what ended the exchange loop), or unmounted now
//!    (`Drop` on an error path); its thread is joined, which also ends the drain watch;
//! 2. the invalidation thread: told to stop and joined (the kernel connection is gone);
//! 3. the signal watcher: closed and joined;
//! 4. the ready file and the mount point's folders, if this daemon made them (`Leftovers`),
//!    unless already removed as the mount went.
//!
//! The caller releases the cache lock after `stop`, so `shufflefs unmount` (which waits for
//! the lock) returns only once nothing writes the cache any more.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use fuser::{Config, MountOption, SessionACL};

use super::DaemonError;
use super::ready::ReadyFile;
use crate::config::{MountConfig, ReadPath};
use crate::fuse::FuseAdapter;
use crate::node::requests::Requests;
use crate::sys::made_dirs::MadeDirs;
use crate::sys::sync::Locked;
use crate::sys::{mounts, readahead};
use crate::vfs::{ShuffleFs, inodes};

/// How long the exchange in flight of a stopping rank may move nothing before the log says
/// what it waits for. Rate-capped exchanges send frames of at least 1 MiB, so this is long
/// enough for a frame at 20 kB/s.
pub(crate) const DRAIN_IDLE: Duration = Duration::from_secs(60);

/// The name the `fuse` thread takes once the mount is gone and only the exchange in flight
/// keeps the daemon: `shufflefs unmount` reads it (`/proc/PID/task/*/comm`) to return
/// without waiting for peers that have not reached that exchange yet.
pub(crate) const DRAINING: &str = "shufflefs-drain";

/// Set by SIGTERM, SIGINT or SIGHUP from [`listen_for_stop`] on.
static STOP_REQUESTED: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// From now on a signal that would end the process is recorded instead (see "A stop before
/// the mount"); once mounted, the signal watcher unmounts on it.
pub(crate) fn listen_for_stop() -> Result<(), DaemonError> {
    let flag = STOP_REQUESTED.get_or_init(|| Arc::new(AtomicBool::new(false)));
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        signal_hook::flag::register(sig, flag.clone()).map_err(thread_error("signal"))?;
    }
    Ok(())
}

/// Whether a signal asked this rank to stop (see [`listen_for_stop`]).
pub(crate) fn stop_requested() -> bool {
    STOP_REQUESTED
        .get()
        .is_some_and(|f| f.load(Ordering::Relaxed))
}

/// What the mounted rank needs of the node behind it (see `super::serving`).
pub(crate) struct Hooks {
    /// Asks the exchange loop to finish once the exchange in flight drained.
    pub stop: Box<dyn FnOnce() + Send>,
    /// A counter that grows while the exchange moves data (bytes and samples).
    pub progress: Box<dyn Fn() -> u64 + Send>,
    /// Old epochs whose kernel entries must go; each is reported done through `invalidated`.
    pub invalidations: Receiver<u64>,
    pub invalidated: Box<dyn Fn(u64) + Send>,
    /// Fails the advances readers wait on (the mount was detached on a signal).
    pub give_up_waits: Box<dyn Fn() + Send>,
}

/// A session mounted, before it serves: the last phase of start-up is whether every rank
/// got here (`super::mount_everywhere`).
pub(crate) type Session = fuser::Session<FuseAdapter>;

/// Mounts `fs` at `mountpoint` (the session does not serve yet).
pub(crate) fn mount(
    fs: ShuffleFs,
    config: &MountConfig,
    (read_path, requests): (ReadPath, Arc<Requests>),
    mountpoint: &Path,
) -> Result<Session, String> {
    // Without opens (page-cache mode) the status is read through a link; see `fuse`.
    let fs = Arc::new(match read_path {
        ReadPath::PageCache => fs.with_status_link(),
        _ => fs,
    });
    let adapter = FuseAdapter::new(fs, read_path, requests)
        .map_err(|e| format!("starting the threads that answer the kernel: {e}"))?;
    crate::fuse::mount(adapter, mountpoint, &fuse_config(config, read_path))
        .map_err(|e| format!("mounting {} failed: {e}", mountpoint.display()))
}

/// A rank's mount while it serves, with its threads.
pub(crate) struct Mounted {
    mountpoint: PathBuf,
    session: Option<JoinHandle<std::io::Result<()>>>,
    invalidation: Option<JoinHandle<()>>,
    signals: signal_hook::iterator::Handle,
    signal_thread: Option<JoinHandle<()>>,
    /// Set when the exchange in flight must be given up (a detached mount, or a drain that
    /// stopped moving).
    abort: Arc<AtomicBool>,
    /// Set once the exchange loop returned: the drain watch ends.
    drained: Arc<AtomicBool>,
    /// Set when the threads must end.
    closing: Arc<AtomicBool>,
    /// The ready file and the mount point's folders: removed as the mount goes (see
    /// [`Leftovers`]), or at the latest after everything above (fields drop after
    /// `Drop::drop`, in order), so after the unmount or detach.
    leftovers: SharedLeftovers,
}

impl Mounted {
    /// Starts serving `session` and the threads around it.
    pub(crate) fn serve(
        mut session: Session,
        mountpoint: &Path,
        hooks: Hooks,
        made: MadeDirs,
    ) -> Result<Mounted, DaemonError> {
        let leftovers = Arc::new(Mutex::new(Leftovers {
            ready: None,
            made: Some(made),
        }));
        match readahead::raise(mountpoint, readahead::WINDOW_KB) {
            Ok(kb) => tracing::debug!(kb, "readahead window of the mount"),
            Err(e) => {
                tracing::info!(error = %e, "could not raise the mount's readahead window (needs root); large samples stream in 128 KiB requests without passthrough")
            }
        }
        let abort = Arc::new(AtomicBool::new(false));
        let drained = Arc::new(AtomicBool::new(false));
        let closing = Arc::new(AtomicBool::new(false));
        let invalidation =
            invalidation_thread(&session, hooks.invalidations, hooks.invalidated, &closing)?;
        let on_signal = Signalled {
            abort: abort.clone(),
            leftovers: leftovers.clone(),
            give_up_waits: hooks.give_up_waits,
        };
        let (signals, signal_thread) = watch_signals(&mut session, mountpoint, on_signal)?;
        if stop_requested() {
            // Told to stop after the ranks agreed to mount, before the watcher listened.
            tracing::info!("signal received during start-up; unmounting");
            if let Err(e) = session.unmount_callable().unmount() {
                tracing::warn!(error = %e, "unmount on a signal during start-up failed");
            }
        }
        let (stop, progress) = (hooks.stop, hooks.progress);
        let (abort2, drained2, left2) = (abort.clone(), drained.clone(), leftovers.clone());
        let session = thread::Builder::new()
            .name("fuse".into())
            .spawn(move || {
                let result = session.run();
                clean_up(&left2);
                name_this_thread(DRAINING);
                stop();
                watch_drain(&*progress, &drained2, &abort2);
                result
            })
            .map_err(thread_error("FUSE session"))?;
        Ok(Mounted {
            mountpoint: mountpoint.to_path_buf(),
            session: Some(session),
            invalidation: Some(invalidation),
            signals,
            signal_thread: Some(signal_thread),
            abort,
            drained,
            closing,
            leftovers,
        })
    }

    /// Keeps the job's ready file (`super::ready`) until the mount goes: a signal, or the
    /// end of the session, removes it at once, not when the daemon exits (a detached mount
    /// may wait long for its readers).
    pub(crate) fn hold_ready(&self, file: ReadyFile) {
        let ended = self.session.as_ref().is_none_or(JoinHandle::is_finished);
        if !ended && !stop_requested() {
            self.leftovers.locked().ready = Some(file);
        }
    }

    /// What the exchange in flight watches to give up (see "Stopping").
    pub(crate) fn abort_flag(&self) -> &AtomicBool {
        &self.abort
    }

    /// Tears down in order (see the module docs) once the exchange loop returned, which it
    /// does after the session ended; the session's outcome.
    pub(crate) fn stop(mut self) -> Result<(), DaemonError> {
        self.drained.store(true, Ordering::Relaxed);
        let session = self.session.take().map(JoinHandle::join);
        self.close_threads();
        tracing::info!(mountpoint = %self.mountpoint.display(), "unmounted; daemon exiting");
        match session {
            Some(Ok(result)) => ended(result).map_err(DaemonError::Session),
            Some(Err(_)) => Err(DaemonError::Panicked),
            None => Ok(()),
        }
    }

    fn close_threads(&mut self) {
        self.closing.store(true, Ordering::Relaxed);
        if let Some(t) = self.invalidation.take() {
            let _ = t.join();
        }
        self.signals.close();
        if let Some(t) = self.signal_thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Mounted {
    /// An early return (the exchange loop failed before the session ended): unmount, so the
    /// session thread ends, then the same order as `stop`.
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.drained.store(true, Ordering::Relaxed);
            if !session.is_finished() && !mounts::detach(&self.mountpoint) {
                tracing::debug!(mountpoint = %self.mountpoint.display(), "already detached");
            }
            // A detached session ends once its last open file closes: wait a little, but
            // never on a reader that keeps a file open (the process ends without it).
            let deadline = Instant::now() + Duration::from_secs(5);
            while !session.is_finished() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
            if session.is_finished() {
                let _ = session.join();
            }
        }
        self.close_threads();
        clean_up(&self.leftovers);
    }
}

/// The session's outcome. A read of the kernel device that the kernel cut off because it
/// tore the connection down in the middle of handing over a request (`ECONNABORTED`, seen
/// when a lazily detached mount's last file closes under load) is the end of the mount, as
/// `ENODEV` is (which fuser takes for a clean end), not a failure: the rank exits 0.
fn ended(result: std::io::Result<()>) -> std::io::Result<()> {
    match result {
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
            tracing::debug!(error = %e, "the kernel aborted the connection as the mount went");
            Ok(())
        }
        other => other,
    }
}

/// After the session ended: until the exchange loop returned, say what the drain waits
/// for. It is not given up however long it waits: a peer that has not reached the exchange
/// (it trains an epoch behind) completes it when it advances, or when it stops (then it
/// serves it without samples, see `super::serving`), and giving it up would end the job.
fn watch_drain(progress: &dyn Fn() -> u64, drained: &AtomicBool, abort: &AtomicBool) {
    let (mut last, mut since) = (progress(), Instant::now());
    let (mut said, mut warned) = (false, false);
    while !drained.load(Ordering::Relaxed) && !abort.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(100));
        let now = progress();
        if now != last {
            (last, since) = (now, Instant::now());
        } else if !warned && since.elapsed() >= DRAIN_IDLE {
            tracing::warn!(
                idle_s = DRAIN_IDLE.as_secs(),
                "stopping: the exchange in flight waits for peers that have not reached it; this rank finishes it when they advance or stop"
            );
            warned = true;
        } else if !said && since.elapsed() >= Duration::from_secs(1) {
            tracing::info!("stopping: finishing the exchange in flight first");
            said = true;
        }
    }
}

/// Names the calling thread (at most 15 bytes are kept).
fn name_this_thread(name: &str) {
    let Ok(name) = std::ffi::CString::new(name) else {
        return;
    };
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes from a valid
    // pointer, and only renames the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, name.as_ptr());
    }
}

fn invalidation_thread(
    session: &Session,
    invalidations: Receiver<u64>,
    invalidated: Box<dyn Fn(u64) + Send>,
    closing: &Arc<AtomicBool>,
) -> Result<JoinHandle<()>, DaemonError> {
    let notifier = session.notifier();
    let closing = closing.clone();
    thread::Builder::new()
        .name("invalidate".into())
        .spawn(move || {
            loop {
                let old = match invalidations.recv_timeout(Duration::from_millis(100)) {
                    Ok(old) => old,
                    Err(RecvTimeoutError::Timeout) if !closing.load(Ordering::Relaxed) => {
                        continue;
                    }
                    Err(_) => return,
                };
                let root = fuser::INodeNo(inodes::ROOT);
                let name = inodes::epoch_dir_name(old);
                let _ = notifier.inval_entry(root, std::ffi::OsStr::new(&name));
                let _ = notifier.inval_entry(root, std::ffi::OsStr::new(inodes::CURRENT_NAME));
                invalidated(old);
            }
        })
        .map_err(thread_error("invalidation"))
}

/// What a signal acts on (see [`watch_signals`]).
struct Signalled {
    abort: Arc<AtomicBool>,
    leftovers: SharedLeftovers,
    give_up_waits: Box<dyn Fn() + Send>,
}

/// Unmounts on SIGTERM, SIGINT or SIGHUP. With files still open (readers that have not
/// stopped) the unmount is refused: the mount is detached instead, so the daemon exits once
/// they close rather than never, and the advances readers wait on fail (the rank will not
/// publish another epoch), so no reader waits on an exchange that may wait on peers. The
/// exchange in flight is still finished, as for any stop ("Stopping"): giving it up would
/// end the whole job under MPI. Only a second signal gives it up (`abort`), for a user who
/// would rather end the job than wait for it.
fn watch_signals(
    session: &mut Session,
    mountpoint: &Path,
    on: Signalled,
) -> Result<(signal_hook::iterator::Handle, JoinHandle<()>), DaemonError> {
    let mut unmounter = session.unmount_callable();
    let mountpoint = mountpoint.to_path_buf();
    let mut signals =
        signal_hook::iterator::Signals::new([libc::SIGTERM, libc::SIGINT, libc::SIGHUP])
            .map_err(thread_error("signal"))?;
    let handle = signals.handle();
    let thread = thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut received = signals.forever();
            let Some(sig) = received.next() else {
                return;
            };
            tracing::info!(signal = sig, "signal received; unmounting");
            drop(on.leftovers.locked().ready.take());
            let gone = match unmounter.unmount() {
                Ok(()) => true,
                Err(e) => {
                    let detached = mounts::detach(&mountpoint);
                    tracing::warn!(error = %e, detached, "unmount on signal failed (files still open); detached the mount instead: waiting advances fail, the exchange in flight is finished, the daemon exits once the files close");
                    (on.give_up_waits)();
                    detached
                }
            };
            // Unmounted or detached: the folders can go now, even if the daemon is
            // killed while its readers keep the detached mount alive.
            if gone {
                clean_up(&on.leftovers);
            }
            if let Some(sig) = received.next() {
                tracing::warn!(signal = sig, "second signal: giving up the exchange in flight (under MPI this ends the job)");
                (on.give_up_waits)();
                on.abort.store(true, Ordering::Relaxed);
            }
        })
        .map_err(thread_error("signal"))?;
    Ok((handle, thread))
}

/// The FUSE mount's settings.
fn fuse_config(config: &MountConfig, read_path: ReadPath) -> Config {
    let mut c = Config::default();
    c.mount_options = vec![
        MountOption::FSName("shufflefs".into()),
        MountOption::Subtype("shufflefs".into()),
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
    ];
    // Other users see the view only with --allow-other, and then the kernel checks the
    // owners and modes it shows (the source's; see `vfs::access`).
    c.acl = if config.allow_other {
        c.mount_options.push(MountOption::DefaultPermissions);
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    let passes_through = crate::fuse::may_pass_through(read_path);
    c.n_threads = Some(config.fuse_threads(passes_through));
    c.clone_fd = true;
    c
}

/// What must not outlive the mount: the job's ready file (it would say ready for a job
/// that is gone) and the folders made for the mount point. Whichever thread sees the mount
/// go first removes them: the signal watcher once it unmounted or detached (a detached
/// mount may keep the daemon alive for its readers, and a launcher may kill the daemon
/// meanwhile), or the session thread when the session ends.
struct Leftovers {
    ready: Option<ReadyFile>,
    made: Option<MadeDirs>,
}

type SharedLeftovers = Arc<Mutex<Leftovers>>;

/// Removes the ready file, then the folders.
fn clean_up(leftovers: &SharedLeftovers) {
    let mut left = leftovers.locked();
    drop(left.ready.take());
    drop(left.made.take());
}

fn thread_error(what: &'static str) -> impl FnOnce(std::io::Error) -> DaemonError {
    move |source| DaemonError::Thread { what, source }
}
