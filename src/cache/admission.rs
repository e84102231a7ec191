//! A partial cache's gate (issue 33): when a rank's share does not fit its cache, only the
//! samples the plan keeps (`plan::keep`) are written, and only while the cache's bytes stay
//! within its size, so a fetch never fills the disk. A sample refused here is not an error
//! of the source: the reader gets it from the source through memory
//! (`SampleStore::read_uncached`), staging and the epoch's fill skip it.

use std::io;
use std::sync::{Mutex, RwLock};

use crate::plan::keep::KeepPlanner;
use crate::plan::{Rank, SampleId};

/// The byte budget and the kept set of the current epoch.
pub(crate) struct Admission {
    capacity: u64,
    /// Size counted for a sample whose size is not known yet (the mount's estimate).
    mean_size: u64,
    /// Sorted.
    kept: RwLock<Vec<SampleId>>,
    /// Steps the kept sets with the epochs (`epoch`); `None` in tests of the gate alone.
    planner: Option<(Mutex<KeepPlanner>, Rank)>,
}

impl Admission {
    pub(crate) fn new(capacity: u64, mean_size: u64, kept: Vec<SampleId>) -> Admission {
        Admission {
            capacity,
            mean_size,
            kept: RwLock::new(kept),
            planner: None,
        }
    }

    /// The gate of `rank` following `planner`'s kept sets (from its current epoch).
    pub(crate) fn planned(planner: KeepPlanner, rank: Rank, mean_size: u64) -> Admission {
        let (kept, capacity) = (planner.kept(rank).to_vec(), planner.capacity());
        Admission {
            planner: Some((Mutex::new(planner), rank)),
            ..Admission::new(capacity, mean_size, kept)
        }
    }

    /// The current epoch is now `epoch`: its kept set from the planner.
    pub(crate) fn epoch(&self, epoch: u64) {
        let Some((planner, rank)) = &self.planner else {
            return;
        };
        let mut p = planner.lock().unwrap_or_else(|e| e.into_inner());
        while p.epoch() < epoch {
            p.advance();
        }
        self.set_kept(p.kept(*rank).to_vec());
    }

    /// The kept set of a new epoch (sorted).
    pub(crate) fn set_kept(&self, kept: Vec<SampleId>) {
        *self.kept.write().unwrap_or_else(|e| e.into_inner()) = kept;
    }

    /// Whether sample `id` (of `size` bytes, if known) may be written into a cache that
    /// holds `held` bytes.
    pub(crate) fn admits(&self, id: SampleId, size: Option<u64>, held: u64) -> bool {
        let kept = self.kept.read().unwrap_or_else(|e| e.into_inner());
        kept.binary_search(&id).is_ok() && held + size.unwrap_or(self.mean_size) <= self.capacity
    }
}

/// The error of a refused write: `StorageFull`, and it says why.
pub(crate) fn not_kept(id: SampleId) -> io::Error {
    io::Error::new(
        io::ErrorKind::StorageFull,
        format!("sample {id} is not in this rank's partial cache (read from the source)"),
    )
}

/// Whether `e` is a refusal of the partial cache (not a failure).
pub(crate) fn is_not_kept(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull
        && e.get_ref()
            .is_some_and(|i| i.to_string().contains("partial cache"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kept_samples_within_the_budget() {
        let a = Admission::new(100, 30, vec![1, 2, 3]);
        assert!(a.admits(1, Some(50), 50));
        assert!(!a.admits(1, Some(51), 50));
        assert!(!a.admits(4, Some(1), 0));
        assert!(a.admits(2, None, 70));
        assert!(!a.admits(2, None, 71));
        a.set_kept(vec![4]);
        assert!(a.admits(4, Some(1), 0) && !a.admits(1, Some(1), 0));
        assert!(is_not_kept(&not_kept(3)));
        assert!(!is_not_kept(&io::Error::from(io::ErrorKind::StorageFull)));
    }
}
