//! Answering requests that wait when their caller is signalled or the mount goes away.
//!
//! A request the daemon has not answered keeps its caller in the kernel, in state D
//! (`request_wait_answer`), whatever signal it gets, `SIGKILL` included: the kernel only
//! sends an INTERRUPT for the request's unique id and goes on waiting. fuser 0.18 cannot
//! pass that on: its dispatcher answers FUSE_INTERRUPT with ENOSYS ("TODO: handle
//! FUSE_INTERRUPT", src/request.rs) and `Filesystem` has no method for it; the ENOSYS makes
//! the kernel set `fc->no_interrupt` and send no INTERRUPT again for the mount.
//!
//! So the binding watches for itself what the INTERRUPT would have said. Every request that
//! may advance the epoch (`vfs::Wait::Advance`) is listed here with its caller's thread id
//! (the request header's pid) and a [`Cancel`] token; while any is listed, a watcher
//! thread looks every [`POLL`] at
//! - the caller's pending signals (`/proc/TID/status`: `SigPnd | ShdPnd`, less `SigBlk`;
//!   a fatal signal shows as `SIGKILL` pending on every thread): any one pending cancels the
//!   wait with EINTR, as the kernel's INTERRUPT would have; the caller cannot exit, so its
//!   thread id cannot be reused meanwhile;
//! - the mount: once it left the mount table (`umount -l`, `shufflefs unmount --lazy`, a
//!   daemon's detach after a refused unmount) every waiter is answered (EIO: the daemon is
//!   going away), and so is every later one. A detached mount's session only ends when its
//!   last open file is closed, which a blocked writer would otherwise never do.
//!
//! The end of the session (`destroy`) also answers every waiter.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use crate::sys::sync::Locked;
use crate::vfs::{Cancel, Cancelled};

/// How often waiting callers and the mount are looked at, while any request waits.
pub(super) const POLL: Duration = Duration::from_millis(100);

#[derive(Default)]
struct State {
    /// Request unique id -> (caller's thread id, token).
    waiting: HashMap<u64, (u32, Cancel)>,
    /// Set once the mount is gone: every wait, present or later, is cancelled so.
    closed: Option<Cancelled>,
    /// The mount's device (`MAJ:MIN`), to tell whether it is still in the mount table.
    device: Option<String>,
    /// The adapter is gone: the watcher ends.
    stopped: bool,
}

/// The requests that wait, and the watcher that cancels them.
#[derive(Default)]
pub(super) struct Waiters {
    state: Mutex<State>,
    wake: Condvar,
}

/// A request listed in [`Waiters`]; unlisted when dropped (answered).
pub(super) struct Waiting {
    waiters: Arc<Waiters>,
    unique: u64,
    cancel: Cancel,
}

impl Waiting {
    pub(super) fn cancel(&self) -> &Cancel {
        &self.cancel
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.waiters.state().waiting.remove(&self.unique);
    }
}

impl Waiters {
    /// The waiters, and their watcher thread (which ends once they are dropped).
    pub(super) fn start() -> std::io::Result<Arc<Waiters>> {
        let waiters = Arc::new(Waiters::default());
        let weak = Arc::downgrade(&waiters);
        std::thread::Builder::new()
            .name("shufflefs-intr".into())
            .spawn(move || watch(&weak))?;
        Ok(waiters)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Remembers the mount's device, to notice when it leaves the mount table.
    pub(super) fn mounted(&self, device: Option<String>) {
        self.state().device = device;
    }

    /// Lists request `unique` of caller thread `pid` as waiting.
    pub(super) fn register(self: &Arc<Self>, unique: u64, pid: u32) -> Waiting {
        let cancel = Cancel::default();
        let mut state = self.state();
        if let Some(why) = state.closed {
            cancel.cancel(why);
        }
        state.waiting.insert(unique, (pid, cancel.clone()));
        drop(state);
        self.wake.notify_all();
        Waiting {
            waiters: self.clone(),
            unique,
            cancel,
        }
    }

    /// Ends the watcher thread (the adapter is dropped).
    pub(super) fn stop(&self) {
        self.state().stopped = true;
        self.wake.notify_all();
    }

    /// Cancels every wait, now and later (the mount is gone, or the session ends).
    pub(super) fn close(&self, why: Cancelled) {
        let mut state = self.state();
        state.closed.get_or_insert(why);
        let count = state.waiting.len();
        state.waiting.values().for_each(|(_, c)| c.cancel(why));
        if count > 0 {
            tracing::info!(
                requests = count,
                "the mount is going away: answering every waiting request"
            );
        }
    }

    /// One look at the waiting callers and the mount (see the module docs).
    fn check(&self) {
        let device = self.state().device.clone();
        if device.is_some_and(|d| !crate::sys::mounts::device_mounted(&d)) {
            self.close(Cancelled::ShuttingDown);
            return;
        }
        let state = self.state();
        for (unique, (pid, cancel)) in &state.waiting {
            if cancel.cancelled().is_none() && signalled(*pid) {
                tracing::info!(
                    unique,
                    pid,
                    "the caller of a waiting request was signalled: answering EINTR"
                );
                cancel.cancel(Cancelled::Interrupted);
            }
        }
    }
}

/// The watcher: sleeps while nothing waits, looks every [`POLL`] otherwise; ends when
/// stopped (or the waiters are gone).
fn watch(waiters: &Weak<Waiters>) {
    while let Some(w) = waiters.upgrade() {
        let state = w.state();
        if state.stopped {
            return;
        }
        let idle = state.waiting.is_empty();
        // Wake up now and then even when idle, to notice that the waiters are gone.
        let timeout = if idle { Duration::from_secs(5) } else { POLL };
        drop(w.wake.wait_timeout(state, timeout));
        if !idle {
            w.check();
        }
    }
}

/// Whether thread `tid` has a signal pending that it does not block (SIGKILL always
/// counts), or is gone. Thread id 0 (a caller in another pid namespace) cannot be looked
/// at: never.
fn signalled(tid: u32) -> bool {
    if tid == 0 {
        return false;
    }
    let text = match std::fs::read_to_string(format!("/proc/{tid}/status")) {
        Ok(text) => text,
        Err(e) => return e.kind() == std::io::ErrorKind::NotFound,
    };
    pending_unblocked(&text)
}

/// From a `/proc/TID/status` text: whether a signal is pending and not blocked, or the
/// task is exiting.
fn pending_unblocked(status: &str) -> bool {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    let exiting = status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .is_some_and(|s| matches!(s.trim_start().chars().next(), Some('Z' | 'X')));
    let kill = 1u64 << (libc::SIGKILL - 1);
    let pending = field("SigPnd:") | field("ShdPnd:");
    exiting || pending & (!field("SigBlk:") | kill) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(state: char, pnd: &str, shd: &str, blk: &str) -> String {
        format!(
            "Name:\techo\nState:\t{state} (x)\nSigQ:\t0/1\nSigPnd:\t{pnd}\nShdPnd:\t{shd}\nSigBlk:\t{blk}\nSigIgn:\t0\n"
        )
    }

    #[test]
    fn pending_signals_count_unless_blocked_and_sigkill_always() {
        let none = "0000000000000000";
        assert!(!pending_unblocked(&status('D', none, none, none)));
        // SIGTERM (15) pending for the process.
        assert!(pending_unblocked(&status(
            'D',
            none,
            "0000000000004000",
            none
        )));
        // ... but blocked.
        let term = "0000000000004000";
        assert!(!pending_unblocked(&status('D', none, term, term)));
        // SIGKILL (9) even when the mask says blocked.
        let kill = "0000000000000100";
        assert!(pending_unblocked(&status(
            'D',
            kill,
            none,
            "ffffffffffffffff"
        )));
        assert!(pending_unblocked(&status('Z', none, none, none)));
    }

    #[test]
    fn closing_cancels_present_and_later_waits() {
        let w = Waiters::start().unwrap();
        let first = w.register(1, 0);
        w.close(Cancelled::ShuttingDown);
        assert_eq!(first.cancel().cancelled(), Some(Cancelled::ShuttingDown));
        let later = w.register(2, 0);
        assert_eq!(later.cancel().cancelled(), Some(Cancelled::ShuttingDown));
        drop((first, later));
        assert!(w.state().waiting.is_empty());
    }

    #[test]
    fn a_signalled_caller_is_cancelled_by_the_watcher() {
        // A child that blocks SIGUSR1 would not count; an exited one (gone) does.
        let w = Waiters::start().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let waiting = w.register(7, pid);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while waiting.cancel().cancelled().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        assert_eq!(waiting.cancel().cancelled(), Some(Cancelled::Interrupted));
    }
}
