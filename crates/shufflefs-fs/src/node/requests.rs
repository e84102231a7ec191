//! Kernel requests this mount answered, by kind: what a read of a file costs in round trips
//! to the daemon (docs/read-paths.md), shown by the status (`fuse_requests`) and the
//! metrics (`shufflefs_fuse_requests_total{op}`). The FUSE adapter counts each request as
//! it arrives; a counter is one relaxed atomic add.

use std::sync::atomic::{AtomicU64, Ordering};

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

/// Running counts per [`Op`] (see the module docs).
#[derive(Debug, Default)]
pub struct Requests {
    counts: [AtomicU64; Op::ALL.len()],
}

impl Requests {
    pub fn count(&self, op: Op) {
        self.counts[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Each kind with its count, in [`Op::ALL`]'s order.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        Op::ALL
            .iter()
            .map(|&op| (op.name(), self.counts[op as usize].load(Ordering::Relaxed)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
