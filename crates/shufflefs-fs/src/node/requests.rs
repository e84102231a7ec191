//! Kernel requests this mount answered, by kind: what a read of a file costs in round trips
//! to the daemon (docs/read-paths.md), shown by the status (`fuse_requests`) and the
//! metrics (`shufflefs_fuse_requests_total{op}`). The FUSE adapter counts each request as
//! it arrives; a counter is one relaxed atomic add. The errors it answered, by operation and
//! errno (`fuse_errors`, `shufflefs_fuse_errors_total{op,errno}`), are counted where errors
//! become errnos (`fuse::fail`): a lock per error, which costs less than the round trip.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sys::sync::Locked;

/// The kinds counted apart; the rest are `Other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Lookup,
    Getattr,
    Open,
    Read,
    Release,
    Opendir,
    Readdir,
    Releasedir,
    Write,
    Other,
}

impl Op {
    pub const ALL: [Op; 10] = [
        Op::Lookup,
        Op::Getattr,
        Op::Open,
        Op::Read,
        Op::Release,
        Op::Opendir,
        Op::Readdir,
        Op::Releasedir,
        Op::Write,
        Op::Other,
    ];

    /// The name in the status and the metrics' `op` label.
    pub fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Getattr => "getattr",
            Op::Open => "open",
            Op::Read => "read",
            Op::Release => "release",
            Op::Opendir => "opendir",
            Op::Readdir => "readdir",
            Op::Releasedir => "releasedir",
            Op::Write => "write",
            Op::Other => "other",
        }
    }
}

/// Running counts per [`Op`], and of errors per operation and errno (see the module docs).
#[derive(Debug, Default)]
pub struct Requests {
    counts: [AtomicU64; Op::ALL.len()],
    errors: Mutex<BTreeMap<(&'static str, i32), u64>>,
}

impl Requests {
    pub fn count(&self, op: Op) {
        self.counts[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an error answered to operation `op` (as the log names it) with `errno`.
    pub fn failed(&self, op: &'static str, errno: i32) {
        *self.errors.locked().entry((op, errno)).or_default() += 1;
    }

    /// Each (operation, errno name) answered with an error, with its count.
    pub fn errors(&self) -> Vec<(&'static str, String, u64)> {
        let errors = self.errors.locked();
        (errors.iter())
            .map(|(&(op, errno), &n)| (op, errno_name(errno), n))
            .collect()
    }

    /// Each kind with its count, in [`Op::ALL`]'s order.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        Op::ALL
            .iter()
            .map(|&op| (op.name(), self.counts[op as usize].load(Ordering::Relaxed)))
            .collect()
    }
}

/// `ENOENT` for 2: the name a user looks up in errno(3).
fn errno_name(errno: i32) -> String {
    format!("{:?}", nix::errno::Errno::from_raw(errno))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_count_by_operation_and_errno() {
        let r = Requests::default();
        r.failed("lookup", libc::ENOENT);
        r.failed("lookup", libc::ENOENT);
        r.failed("write", libc::EROFS);
        assert_eq!(
            r.errors(),
            [
                ("lookup", "ENOENT".to_string(), 2),
                ("write", "EROFS".to_string(), 1)
            ]
        );
    }

    #[test]
    fn each_kind_counts_apart() {
        let r = Requests::default();
        r.count(Op::Open);
        r.count(Op::Open);
        r.count(Op::Other);
        let s = r.snapshot();
        assert_eq!(s.len(), Op::ALL.len());
        assert_eq!(s[2], ("open", 2));
        assert_eq!(s[9], ("other", 1));
        assert_eq!(s.iter().map(|(_, n)| n).sum::<u64>(), 3);
    }
}
