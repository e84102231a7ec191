//! Whether the server's process still exists, as a compute rank on its host can see.
//!
//! MPI tells a rank nothing when a peer dies: a receive from a server that was killed
//! waits forever (shared memory and TCP alike, measured with Open MPI 4.1). `mpirun` ends
//! the job when one of its processes dies (SIGTERM to the others, SIGKILL a second later), but
//! a rank waiting in an exchange cannot stop cleanly in that second, and another launcher may
//! wait longer or not at all. So the server says who it is at start-up ([`ServerId`]: pid,
//! start time, and the pid namespace it lives in), and a compute rank in the same pid
//! namespace watches that process while it waits on the server (`client`): once it is gone the
//! rank gives the exchange up at once (the transfers are abandoned, the daemon unmounts and
//! exits with code 3, and a restart resumes). A rank on another host cannot see the process;
//! there the launcher ends the job, as for any rank that dies.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How often a waiting rank looks at the server's process.
pub(crate) const WATCH_EVERY: Duration = Duration::from_millis(50);

/// The server's process, as the server describes itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerId {
    pub(crate) pid: u32,
    /// Start time in clock ticks after boot (`/proc/PID/stat` field 22): a pid reused by
    /// another process after the server died has another. 0 if unknown (not compared).
    pub(crate) start: u64,
    /// The boot and pid namespace the pid is valid in; empty if unknown.
    pub(crate) space: String,
}

impl ServerId {
    /// This process.
    pub fn mine() -> ServerId {
        let pid = std::process::id();
        ServerId {
            pid,
            start: start_time(pid).unwrap_or(0),
            space: pid_space().unwrap_or_default(),
        }
    }

    /// Whether this process can see the server's pid (same boot, same pid namespace).
    pub(crate) fn visible(&self) -> bool {
        !self.space.is_empty() && pid_space().is_some_and(|s| s == self.space)
    }

    /// True once the server's process has ended (or is a zombie); false while it runs or
    /// when this process cannot tell ([`visible`](Self::visible) false).
    pub(crate) fn gone(&self) -> bool {
        if !self.visible() {
            return false;
        }
        match stat(self.pid) {
            None => true,
            Some((state, start)) => {
                matches!(state, 'Z' | 'X') || (self.start != 0 && start != self.start)
            }
        }
    }
}

/// `boot_id/pid-namespace`: equal in two processes that share pid numbers.
fn pid_space() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    Some(format!("{}/{}", boot.trim(), ns.display()))
}

/// State and start time of `pid`, if it exists.
fn stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: fields after the
    // last ')' are plain. State is field 3, start time field 22.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|(_, s)| s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_an_ended_one_is_gone() {
        let me = ServerId::mine();
        assert!(me.visible() && me.start > 0, "{me:?}");
        assert!(!me.gone());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = ServerId {
            pid: child.id(),
            start: start_time(child.id()).unwrap_or(0),
            space: me.space.clone(),
        };
        child.wait().unwrap();
        assert!(id.gone(), "reaped: no such pid");
        let reused = ServerId {
            start: me.start + 1,
            ..me.clone()
        };
        assert!(reused.gone(), "another process under the same pid");
        let elsewhere = ServerId {
            space: "another host".into(),
            ..reused
        };
        assert!(!elsewhere.gone(), "cannot tell from another host");
    }
}
