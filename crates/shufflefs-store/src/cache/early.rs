//! Early refill of a partial cache: the room of a kept sample that leaves this
//! rank after the current epoch is reused within the epoch, as the clairvoyant bound does.
//!
//! The planned kept sets (`plan::keep`) change only between epochs, so the room a leaving
//! sample frees would stay empty for an epoch. Here, once the exchange out of the epoch is
//! done (the leaver was sent if its receiver keeps it) and the leaver has been read this
//! epoch, it is evicted, and the next epoch's new kept samples that are on this rank already
//! may be written when read, within the cache's size: they hit one epoch earlier. The kept
//! sets are unchanged, so the plan's hit rate is a floor; how much more depends on the order
//! the loader reads in (a leaver read late frees its room late).

use std::collections::HashSet;

use crate::plan::SampleId;

/// The current epoch's leavers and next-new samples, and what happened to them so far.
#[derive(Default)]
pub(crate) struct Early {
    epoch: u64,
    /// The exchange out of `epoch` is done.
    exchanged: bool,
    /// Kept now, not in the share next epoch (sorted).
    leavers: Vec<SampleId>,
    /// Kept next epoch, not now, in the share now (sorted).
    next_new: Vec<SampleId>,
    /// Leavers read before the exchange was done.
    waiting: Vec<SampleId>,
    /// Leavers evicted this epoch.
    gone: HashSet<SampleId>,
}

impl Early {
    pub(crate) fn new(epoch: u64, leavers: Vec<SampleId>, next_new: Vec<SampleId>) -> Early {
        Early {
            epoch,
            leavers,
            next_new,
            ..Early::default()
        }
    }

    /// `id` was read: the leaver to evict now, if it is one and the exchange is done.
    pub(crate) fn read(&mut self, id: SampleId) -> Option<SampleId> {
        if self.leavers.binary_search(&id).is_err() || self.gone.contains(&id) {
            return None;
        }
        if !self.exchanged {
            self.waiting.push(id);
            return None;
        }
        self.gone.insert(id);
        Some(id)
    }

    /// The exchange into `target` is done: the leavers read so far, to evict now.
    pub(crate) fn exchange_done(&mut self, target: u64) -> Vec<SampleId> {
        if target != self.epoch + 1 || self.exchanged {
            return Vec::new();
        }
        self.exchanged = true;
        let out = std::mem::take(&mut self.waiting);
        self.gone.extend(out.iter().copied());
        out
    }

    /// Whether `id` may be written now as a sample kept next epoch.
    pub(crate) fn admits(&self, id: SampleId) -> bool {
        self.exchanged && self.next_new.binary_search(&id).is_ok()
    }

    /// Whether `id` was evicted early (it is not written again this epoch).
    pub(crate) fn gone(&self, id: SampleId) -> bool {
        self.gone.contains(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leavers_go_once_read_and_exchanged_then_next_samples_come_in() {
        let mut e = Early::new(3, vec![1, 2], vec![7]);
        assert_eq!(e.read(1), None);
        assert!(!e.admits(7));
        assert_eq!(e.exchange_done(5), Vec::<SampleId>::new());
        assert_eq!(e.exchange_done(4), vec![1]);
        assert!(e.gone(1) && e.admits(7) && !e.admits(8));
        assert_eq!(e.read(2), Some(2));
        assert_eq!(e.read(2), None);
        assert_eq!(e.read(9), None);
    }
}
