//! Process-level concerns: detaching into the background, logging, MPI or not, unmounting.
//!
//! Without `--foreground` (and outside mpirun/srun) the command forks before any thread or
//! MPI exists; the parent waits on a pipe until the child reports "mounted" or the reason it
//! could not, and exits 0 or 1 accordingly. Under an MPI launcher the daemon always stays in
//! the foreground: the launcher must keep its ranks alive for the exchange.

use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tracing_subscriber::EnvFilter;

use crate::cli::{MountArgs, ServeArgs, UnmountArgs};
use crate::comm::{self, Comm, Contract, TcpComm, launched_by_mpi};
use crate::config::{MountConfig, ServeConfig};
use crate::daemon;

fn init_logging() {
    let filter =
        EnvFilter::try_from_env("SHUFFLEFS_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

pub fn mount(args: MountArgs) -> ExitCode {
    // Contradictory options are refused alone on each rank, before MPI or a fork.
    let args = match MountConfig::try_from(args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("shufflefs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let under_mpi = launched_by_mpi();
    let contract = match contract(under_mpi, &args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("shufflefs: {e}");
            return ExitCode::FAILURE;
        }
    };
    if under_mpi || args.foreground {
        crate::sys::memory::fewer_malloc_arenas();
        init_logging();
        let mut comm = match world(under_mpi, contract.as_ref()) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("shufflefs: {e}");
                return ExitCode::FAILURE;
            }
        };
        let result = daemon::run(&args, comm.as_mut(), &mut |msg| {
            println!("{msg}");
            let _ = std::io::stdout().flush();
        });
        return exit_code(result);
    }
    detached(&args, contract.as_ref())
}

/// Where a job without an MPI launcher meets over TCP (`--rendezvous`, or torchrun's and a
/// Kubernetes job's environment; `None`: a job of one). Under mpirun/srun the ranks meet
/// through MPI, and a `--rendezvous` there is a mistake worth naming (mixed transports).
fn contract(under_mpi: bool, args: &MountConfig) -> Result<Option<Contract>, String> {
    match (under_mpi, &args.rendezvous) {
        (true, Some(_)) => Err(
            "mpirun/srun started this rank, so it meets the others through MPI: --rendezvous is for jobs started without an MPI launcher (torchrun, a Kubernetes job); drop it, or start every rank without mpirun"
                .into(),
        ),
        (true, None) => Ok(None),
        (false, r) => Contract::from_env(r.as_deref()),
    }
}

/// This rank's world: MPI under an MPI launcher, TCP with a contract, else a job of one.
fn world(under_mpi: bool, contract: Option<&Contract>) -> Result<Box<dyn Comm>, String> {
    match (under_mpi, contract) {
        (true, _) => mpi_world(),
        (false, Some(c)) => match TcpComm::connect(c) {
            Ok(c) => Ok(Box::new(c)),
            Err(e) => Err(e.to_string()),
        },
        (false, None) => Ok(Box::new(comm::single())),
    }
}

/// `shufflefs serve`: the server rank of a coded job (see `daemon::coded`). Only under an MPI
/// launcher: it serves compute ranks of its own job.
pub fn serve(args: ServeArgs) -> ExitCode {
    if !launched_by_mpi() {
        eprintln!(
            "shufflefs serve: runs as world rank 0 of an MPI job with the compute ranks: mpirun -np 1 shufflefs serve --source SRC : -np M shufflefs mount --exchange coded --cache-fraction ALPHA ..."
        );
        return ExitCode::FAILURE;
    }
    crate::sys::memory::fewer_malloc_arenas();
    init_logging();
    let mut world = match mpi_world() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("shufflefs serve: {e}");
            return ExitCode::FAILURE;
        }
    };
    report(daemon::coded::serve(
        &ServeConfig::from(args),
        world.as_mut(),
    ))
}

/// This rank's MPI world (collective over the job's ranks).
#[cfg(feature = "mpi")]
fn mpi_world() -> Result<Box<dyn Comm>, String> {
    comm::MpiComm::init()
        .map(|c| Box::new(c) as Box<dyn Comm>)
        .map_err(|e| e.to_string())
}

/// A build without MPI started by an MPI launcher: refused, naming the fix.
#[cfg(not(feature = "mpi"))]
fn mpi_world() -> Result<Box<dyn Comm>, String> {
    Err(
        "this shufflefs was built without MPI (the `mpi` feature), but mpirun/srun started it: \
         run a build with MPI under an MPI launcher (`cargo install --path .`, whose default \
         features include it)"
            .into(),
    )
}

/// The exit code of a rank's daemon: 0 after a clean stop, [`ABANDONED`] when it gave up an
/// exchange with MPI transfers in flight (it must not finalize MPI; a non-zero exit makes
/// the launcher end the job, and the other ranks unmount on its SIGTERM), else 1.
fn exit_code(result: Result<(), daemon::DaemonError>) -> ExitCode {
    match result {
        Err(e @ daemon::DaemonError::Abandoned(_)) => {
            tracing::error!("{e}");
            ExitCode::from(ABANDONED)
        }
        other => report(other),
    }
}

/// The exit code of a rank that gave up an exchange with MPI transfers in flight (see
/// `exit_code`).
pub(crate) const ABANDONED: u8 = 3;

fn report<E: std::fmt::Display>(result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("shufflefs: {e}");
            ExitCode::FAILURE
        }
    }
}

fn detached(args: &MountConfig, contract: Option<&Contract>) -> ExitCode {
    let rank = contract.map_or(0, |c| c.rank);
    let (read_end, write_end) = match nix::unistd::pipe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("shufflefs: cannot create a pipe: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Nothing is created before the overlap check (the log goes into the cache folder).
    if let Err(e) = crate::config::check_overlaps(args, rank) {
        eprintln!("shufflefs: {e}");
        return ExitCode::FAILURE;
    }
    // The log goes into the cache folder: not into a folder that is not ours to take.
    if let Err(e) =
        crate::cache::CacheDir::check_takeable(&crate::config::for_rank(&args.cache, rank))
    {
        eprintln!("shufflefs: {e}");
        return ExitCode::FAILURE;
    }
    let log = daemon::log_path(args, rank);
    // The folders this mount makes for its log (and cache): a refused start removes them.
    let made = first_missing(&crate::config::for_rank(&args.cache, rank));
    // SAFETY: no other thread exists yet (nothing has been spawned and MPI is not initialised),
    // so the child may keep running arbitrary code after fork.
    match unsafe { nix::unistd::fork() } {
        Err(e) => {
            eprintln!("shufflefs: cannot fork: {e}");
            ExitCode::FAILURE
        }
        Ok(nix::unistd::ForkResult::Parent { .. }) => {
            drop(write_end);
            let (code, refused) = wait_for_child(read_end, &log);
            if let (true, Some(top)) = (refused, made) {
                forget_made_folders(&log, &top);
            }
            code
        }
        Ok(nix::unistd::ForkResult::Child) => {
            drop(read_end);
            let _ = nix::unistd::setsid();
            redirect_stdio(&log);
            init_logging();
            let mut pipe = File::from(write_end);
            // The rendezvous runs here, after the fork: its threads belong to the daemon.
            let mut comm = match world(false, contract) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!("{e}");
                    let _ = pipe.write_all(format!("err {e}").as_bytes());
                    return ExitCode::FAILURE;
                }
            };
            let result = daemon::run(args, comm.as_mut(), &mut |msg| {
                tracing::info!("{msg}");
                // The parent returns as soon as it reads this line.
                let _ = pipe.write_all(format!("ok {msg}").as_bytes());
            });
            if let Err(e) = &result {
                let _ = pipe.write_all(format!("err {e}").as_bytes());
            }
            drop(pipe);
            exit_code(result)
        }
    }
}

/// The daemon's answer: its exit code, and whether it refused with a message (then its log
/// holds nothing the message did not say).
fn wait_for_child(read_end: OwnedFd, log: &std::path::Path) -> (ExitCode, bool) {
    let mut msg = String::new();
    let mut pipe = File::from(read_end);
    // The child writes one message; reading up to "ok ..." is enough (it keeps the pipe open).
    let mut buf = [0u8; 4096];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                msg.push_str(&String::from_utf8_lossy(&buf[..n]));
                if msg.starts_with("ok ") {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    if let Some(ok) = msg.strip_prefix("ok ") {
        println!("{ok}");
        println!("shufflefs: log in {}", log.display());
        (ExitCode::SUCCESS, false)
    } else if let Some(err) = msg.strip_prefix("err ") {
        eprintln!("shufflefs: {err}");
        (ExitCode::FAILURE, true)
    } else {
        eprintln!(
            "shufflefs: the daemon exited during startup; see {}",
            log.display()
        );
        (ExitCode::FAILURE, false)
    }
}

/// The outermost folder of `path` (itself included) that does not exist yet: what a mount
/// that creates `path` makes.
fn first_missing(path: &std::path::Path) -> Option<std::path::PathBuf> {
    let path = std::path::absolute(path).ok()?;
    let mut top = None;
    for dir in path.ancestors() {
        match dir.symlink_metadata() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => top = Some(dir.to_path_buf()),
            _ => break,
        }
    }
    top
}

/// After a refused detached start: the log, if it is all the cache folder holds (the daemon
/// removed the rest it made), and the empty folders up to `top`, which this mount made. A
/// folder that holds anything else stays.
fn forget_made_folders(log: &std::path::Path, top: &std::path::Path) {
    let Some(cache) = log.parent() else { return };
    let only_log = std::fs::read_dir(cache)
        .map(|entries| entries.flatten().all(|e| e.path() == log))
        .unwrap_or(false);
    if only_log && !crate::cache::CacheDir::is_locked(cache) {
        let _ = std::fs::remove_file(log);
    }
    let Ok(cache) = std::path::absolute(cache) else {
        return;
    };
    for dir in cache.ancestors() {
        if std::fs::remove_dir(dir).is_err() || dir == top {
            break;
        }
    }
}

fn redirect_stdio(log: &std::path::Path) {
    daemon::ensure_parent(log);
    // Private, as everything in the cache folder (see `cache::private`).
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(log)
        .or_else(|_| OpenOptions::new().write(true).open("/dev/null"));
    if let Ok(out) = out {
        // SAFETY: dup2 on valid descriptors we own; only replaces this process's stdout/stderr.
        unsafe {
            libc::dup2(out.as_raw_fd(), 1);
            libc::dup2(out.as_raw_fd(), 2);
        }
    }
    if let Ok(null) = File::open("/dev/null") {
        // SAFETY: as above, for stdin.
        unsafe {
            libc::dup2(null.as_raw_fd(), 0);
        }
    }
}

/// `shufflefs unmount MOUNT`: unmount, then wait for the daemon to exit. Only a shufflefs
/// mount is touched: anything else at that path (a tmpfs, a network file system) or a
/// folder that is no mount point is refused with what it is.
pub fn unmount(args: &UnmountArgs) -> ExitCode {
    let mnt = &args.mountpoint;
    if let Err(why) = ours_to_unmount(mnt) {
        eprintln!("shufflefs: {why}; nothing was unmounted");
        return ExitCode::FAILURE;
    }
    let status = std::fs::read(mnt.join(".shufflefs/status"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
    let field = |name: &str| status.as_ref().and_then(|v| v.get(name).cloned());
    let pid = field("pid").and_then(|v| v.as_u64());
    let world = field("world_size").and_then(|v| v.as_u64()).unwrap_or(1);
    let cache = field("cache").and_then(|c| {
        c.get("dir")
            .and_then(|d| d.as_str().map(std::path::PathBuf::from))
    });
    let unmounted = if args.lazy {
        crate::sys::mounts::detach(mnt) || {
            eprintln!("shufflefs: cannot detach {}", mnt.display());
            false
        }
    } else {
        unmount_now(mnt)
    };
    if !unmounted {
        return ExitCode::FAILURE;
    }
    let Some(pid) = pid else {
        println!("shufflefs: unmounted {}", mnt.display());
        return ExitCode::SUCCESS;
    };
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    while nix::sys::signal::kill(pid, None).is_ok() && !is_zombie(pid.as_raw()) {
        // An MPI rank done serving waits in MPI finalize for the other ranks to unmount;
        // it has released its cache by then.
        let released = cache
            .as_deref()
            .is_some_and(|c| !crate::cache::CacheDir::is_locked(c));
        if world > 1 && (released || draining(pid.as_raw())) {
            println!(
                "shufflefs: unmounted {}; daemon pid {pid} exits once every rank has unmounted",
                mnt.display()
            );
            return ExitCode::SUCCESS;
        }
        if Instant::now() > deadline && args.lazy {
            // Detached as asked: the daemon ends when the files still open there are closed,
            // which may be after this command (a trainer's loader workers on their way out).
            println!(
                "shufflefs: detached {}; daemon pid {pid} exits once the files still open there are closed",
                mnt.display()
            );
            return ExitCode::SUCCESS;
        } else if Instant::now() > deadline {
            eprintln!(
                "shufflefs: unmounted, but daemon pid {pid} is still running after {}s",
                args.timeout
            );
            return ExitCode::FAILURE;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("shufflefs: unmounted {}", mnt.display());
    ExitCode::SUCCESS
}

/// Whether the mount table says `mnt` is a shufflefs mount (a dead one too: its daemon was
/// killed); else what it is.
fn ours_to_unmount(mnt: &std::path::Path) -> Result<(), String> {
    use crate::sys::mounts::{MountKind, mount_kind};
    match mount_kind(mnt) {
        MountKind::Shufflefs => Ok(()),
        MountKind::None => Err(format!(
            "{} is not mounted (it is no mount point)",
            mnt.display()
        )),
        MountKind::Other { fstype, source } => Err(format!(
            "{} is a {fstype} mount (of {source}), not a shufflefs mount",
            mnt.display()
        )),
    }
}

/// A plain unmount, which the kernel refuses while files are open. When the only files open
/// are control files (`.shufflefs/epoch` held by a trainer, a writer waiting on an advance)
/// the mount is detached instead, as on SIGTERM: they hold no data, a waiting writer is
/// answered as soon as the mount leaves the table (`fuse::interrupt`), and refusing would
/// leave no way out but `--lazy`. Open sample files still refuse the unmount: their reader
/// is told to close them first.
fn unmount_now(mountpoint: &std::path::Path) -> bool {
    let refused = match plain_unmount(mountpoint) {
        Ok(()) => return true,
        Err(refused) => refused,
    };
    let open = crate::sys::mounts::open_under(mountpoint);
    let control = crate::sys::mounts::absolute(mountpoint).map(|m| m.join(".shufflefs"));
    let only_control = !open.is_empty()
        && control.is_some_and(|c| open.iter().all(|f| f.starts_with(&c) && *f != c));
    if only_control && crate::sys::mounts::detach(mountpoint) {
        println!(
            "shufflefs: only control files are open in {} ({} of them); detached it: waiting advances end with an error, and the daemon exits once they are closed",
            mountpoint.display(),
            open.len()
        );
        return true;
    }
    eprintln!(
        "shufflefs: cannot unmount {}: {refused}. If files are open there, close them first, or pass --lazy to detach now and let the daemon exit when they close",
        mountpoint.display()
    );
    false
}

/// fusermount3 -u, or umount(2) where fusermount3 refuses (some mounts made by root); the
/// reasons of both when neither works.
fn plain_unmount(mountpoint: &std::path::Path) -> Result<(), String> {
    let out = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(mountpoint)
        .output();
    let said = match out {
        Ok(o) if o.status.success() => return Ok(()),
        Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
        Err(e) => format!("fusermount3: {e}"),
    };
    nix::mount::umount(mountpoint).map_err(|e| format!("{said} ({e})"))
}

/// Whether daemon `pid` lost its mount and only finishes its exchange with its peers
/// (`daemon::mounted::DRAINING`).
fn draining(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("comm"))
            .is_ok_and(|c| c.trim_end() == daemon::mounted::DRAINING)
    })
}

/// An exited process its parent has not collected yet still answers `kill(pid, 0)`.
fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}
