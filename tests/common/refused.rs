//! Mounts that must fail ([`mount_refused`]: the refusal, and no mount left behind) and
//! mounts made by a detached daemon ([`DetachedMount`]: cleaned up on drop).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use super::{
    Daemon, EXIT_TIMEOUT, MOUNT_TIMEOUT, force_unmount, is_mounted, mount_count, run_with_timeout,
    shufflefs, wait_pid_gone,
};

/// A mount that refused to start.
#[derive(Debug)]
pub struct Refusal {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Refusal {
    /// Asserts the exit was non-zero and stderr names `needle`.
    #[track_caller]
    pub fn assert_mentions(&self, needle: &str) {
        assert!(
            !self.status.success(),
            "expected a failure, got {:?}",
            self.status
        );
        assert!(
            self.stderr.contains(needle),
            "stderr should mention {needle:?}:\n{}",
            self.stderr
        );
    }
}

/// A mount made by a detached (forked) daemon: unmounted on drop, its daemon waited for and
/// killed if it hangs.
pub struct DetachedMount {
    pub mnt: PathBuf,
    pub pid: Option<i32>,
}

impl Drop for DetachedMount {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = run_with_timeout(
                shufflefs()
                    .arg("unmount")
                    .arg("--timeout")
                    .arg("10")
                    .arg(&self.mnt),
                Duration::from_secs(15),
            );
            force_unmount(&self.mnt);
        }
        if let Some(pid) = self.pid
            && !wait_pid_gone(pid, EXIT_TIMEOUT)
        {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            force_unmount(&self.mnt);
        }
    }
}

/// Runs a mount that must fail: `shufflefs mount [--foreground] ARGS`. Returns its exit
/// status and output, and asserts it left no new mount at `mnt`. If it unexpectedly
/// mounts, cleans up and panics.
#[track_caller]
pub fn mount_refused(mnt: &Path, args: &[OsString], foreground: bool) -> Refusal {
    let before = mount_count(mnt);
    let refusal = if foreground {
        match Daemon::try_start(mnt, args) {
            Ok(d) => {
                let line = d.ready_line.clone();
                drop(d);
                panic!("shufflefs mount {args:?} should have failed but mounted: {line}");
            }
            Err(r) => r,
        }
    } else {
        let out = run_with_timeout(shufflefs().arg("mount").args(args), MOUNT_TIMEOUT);
        if out.status.success() {
            let _guard = DetachedMount {
                mnt: mnt.to_path_buf(),
                pid: None,
            };
            panic!(
                "detached shufflefs mount {args:?} should have failed but succeeded: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        Refusal {
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    };
    let after = mount_count(mnt);
    if after > before {
        force_unmount(mnt);
    }
    assert_eq!(
        after,
        before,
        "a refused mount left a mount behind at {}; stderr:\n{}",
        mnt.display(),
        refusal.stderr
    );
    assert!(
        !refusal.status.success(),
        "refused mount exited 0; stderr:\n{}",
        refusal.stderr
    );
    refusal
}
