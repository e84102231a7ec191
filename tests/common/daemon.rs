//! [`Daemon`]: a `shufflefs mount --foreground` child that is always unmounted and reaped,
//! even when the test panics.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::process::{drain, text};
use super::{Refusal, force_unmount, is_mounted, mount_args, read_status, shufflefs};

/// How long a mount may take to report "mounted" (or fail).
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a daemon may take to exit once unmounted.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(20);

/// What a daemon left when it stopped.
#[derive(Debug)]
pub struct Stopped {
    /// The daemon's own exit status (None if it had to be killed).
    pub status: Option<ExitStatus>,
    /// The `shufflefs unmount` run that stopped it.
    pub unmount: Option<Output>,
    pub stderr: String,
}

impl Stopped {
    /// Asserts the clean path: `shufflefs unmount` succeeded and the daemon exited 0.
    #[track_caller]
    pub fn assert_clean(&self) {
        let um = self.unmount.as_ref().expect("shufflefs unmount was run");
        assert!(
            um.status.success(),
            "shufflefs unmount failed: {:?}\nstdout: {}\nstderr: {}",
            um.status,
            String::from_utf8_lossy(&um.stdout),
            String::from_utf8_lossy(&um.stderr)
        );
        assert!(
            self.status.is_some_and(|s| s.success()),
            "daemon did not exit 0 after unmount: {:?}\nstderr:\n{}",
            self.status,
            self.stderr
        );
    }
}

/// A foreground `shufflefs mount` child. Dropping it unmounts (with `shufflefs unmount`,
/// falling back to lazy unmounts), waits for the process and kills it if it hangs.
pub struct Daemon {
    child: Option<Child>,
    pub mnt: PathBuf,
    /// The "... mounted ..." line.
    pub ready_line: String,
    stderr: Arc<Mutex<Vec<u8>>>,
    stderr_done: mpsc::Receiver<()>,
}

impl Daemon {
    /// Starts `shufflefs mount --foreground ARGS` and waits for it to report "mounted";
    /// panics with its stderr if it fails.
    #[track_caller]
    pub fn start(mnt: &Path, args: &[OsString]) -> Daemon {
        match Daemon::try_start(mnt, args) {
            Ok(d) => d,
            Err(r) => panic!(
                "shufflefs mount {args:?} failed ({:?}):\n{}",
                r.status, r.stderr
            ),
        }
    }

    /// The usual case: `--source SRC --cache CACHE EXTRA... MNT`.
    #[track_caller]
    pub fn mount(source: &Path, cache: &Path, mnt: &Path, extra: &[&str]) -> Daemon {
        Daemon::start(mnt, &mount_args(source, cache, mnt, extra))
    }

    /// Like [`Daemon::start`], but a refusal is returned instead of panicking.
    pub fn try_start(mnt: &Path, args: &[OsString]) -> Result<Daemon, Refusal> {
        Daemon::try_start_with(shufflefs(), mnt, args)
    }

    /// Like [`Daemon::try_start`], with `cmd` in place of `shufflefs` (a wrapper that
    /// ends by exec'ing it, see [`super::shufflefs_after`]).
    pub fn try_start_with(
        mut cmd: std::process::Command,
        mnt: &Path,
        args: &[OsString],
    ) -> Result<Daemon, Refusal> {
        cmd.arg("mount")
            .arg("--foreground")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: only async-signal-safe prctl runs between fork and exec. If the test
        // process dies without running our Drop (killed by a CI timeout), the daemon gets
        // SIGTERM and unmounts itself. The signal follows the spawning *thread*; a Daemon is
        // always stopped by the test thread that started it, before that thread ends.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn shufflefs");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let stderr_done = drain(child.stderr.take().unwrap(), stderr.clone());
        let (line_tx, line_rx) = mpsc::channel::<String>();
        let stdout = child.stdout.take().unwrap();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line_tx.send(line).is_err() {
                    // Nobody listens any more; keep draining so the daemon never blocks.
                    continue;
                }
            }
        });
        let deadline = Instant::now() + MOUNT_TIMEOUT;
        let mut seen = Vec::new();
        loop {
            match line_rx.recv_timeout(Duration::from_millis(50)) {
                Ok(line) if line.contains(" mounted ") => {
                    return Ok(Daemon {
                        child: Some(child),
                        mnt: mnt.to_path_buf(),
                        ready_line: line,
                        stderr,
                        stderr_done,
                    });
                }
                Ok(line) => seen.push(line),
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    if let Some(status) = child.try_wait().expect("wait for shufflefs") {
                        let _ = stderr_done.recv_timeout(Duration::from_secs(5));
                        return Err(Refusal {
                            status,
                            stdout: seen.join("\n"),
                            stderr: text(&stderr),
                        });
                    }
                    if Instant::now() > deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        force_unmount(mnt);
                        panic!(
                            "shufflefs mount {args:?} printed no \"mounted\" line within {MOUNT_TIMEOUT:?}\nstdout: {}\nstderr:\n{}",
                            seen.join("\n"),
                            text(&stderr)
                        );
                    }
                }
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The epoch named in the "mounted" line.
    pub fn ready_epoch(&self) -> u64 {
        let rest = self
            .ready_line
            .split("(epoch ")
            .nth(1)
            .unwrap_or_else(|| panic!("no epoch in {:?}", self.ready_line));
        rest.split(',').next().unwrap().parse().unwrap()
    }

    /// Everything the daemon wrote to stderr so far (its log).
    pub fn stderr(&self) -> String {
        text(&self.stderr)
    }

    pub fn status(&self) -> Value {
        read_status(&self.mnt)
    }

    /// Whether the daemon process has exited (reaping it if so).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Sends `signal` to the daemon.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
        let rc = unsafe { libc::kill(self.pid() as i32, signal) };
        assert_eq!(rc, 0, "kill({}, {signal})", self.pid());
    }

    /// Waits for the daemon to exit by itself (after a signal, say), up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            if Instant::now() > deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Unmounts with `shufflefs unmount` and waits for the daemon; see [`Stopped`].
    pub fn unmount(mut self) -> Stopped {
        self.stop()
    }

    fn stop(&mut self) -> Stopped {
        let Some(mut child) = self.child.take() else {
            return Stopped {
                status: None,
                unmount: None,
                stderr: self.stderr(),
            };
        };
        let mut status = child.try_wait().ok().flatten();
        let mut unmount = None;
        if status.is_none() || is_mounted(&self.mnt) {
            // `shufflefs unmount` waits for the daemon pid to go away, and the daemon is our
            // child: reap it meanwhile, or its zombie would look alive.
            let spawned = shufflefs()
                .arg("unmount")
                .arg("--timeout")
                .arg(EXIT_TIMEOUT.as_secs().to_string())
                .arg(&self.mnt)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn();
            if let Ok(mut um) = spawned {
                let deadline = Instant::now() + EXIT_TIMEOUT + Duration::from_secs(5);
                loop {
                    if status.is_none() {
                        status = child.try_wait().ok().flatten();
                    }
                    if um.try_wait().ok().flatten().is_some() {
                        unmount = um.wait_with_output().ok();
                        break;
                    }
                    if Instant::now() > deadline {
                        let _ = um.kill();
                        unmount = um.wait_with_output().ok();
                        break;
                    }
                    thread::sleep(Duration::from_millis(10));
                }
            }
        }
        if is_mounted(&self.mnt) {
            force_unmount(&self.mnt);
        }
        let deadline = Instant::now() + EXIT_TIMEOUT;
        while status.is_none() {
            status = child.try_wait().ok().flatten();
            if status.is_some() {
                break;
            }
            if Instant::now() > deadline {
                eprintln!(
                    "shufflefs daemon {} did not exit after unmount; killing it",
                    child.id()
                );
                let _ = child.kill();
                let _ = child.wait();
                force_unmount(&self.mnt);
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = self.stderr_done.recv_timeout(Duration::from_secs(5));
        Stopped {
            status,
            unmount,
            stderr: self.stderr(),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            let stopped = self.stop();
            if thread::panicking() {
                eprintln!(
                    "daemon at {} stopped ({:?}); its stderr:\n{}",
                    self.mnt.display(),
                    stopped.status,
                    stopped.stderr
                );
            }
        }
    }
}
