//! Prefetch of a partial cache's streamed samples. When a folder of the current
//! epoch is listed, the loader is about to read the samples listed; those the cache does not
//! keep would each be read from the source as they are opened, one at a time. A background
//! thread reads them ahead, in listing order, into memory, within [`BUDGET`] bytes; an open
//! takes its sample's bytes (dropping them) instead of reading the source. Whatever is not
//! read by the next epoch is dropped with the epoch. A loader that reads in another order
//! than the listing's still gets every sample right; the prefetch then waits, its budget
//! full of samples read later, and helps less.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::plan::SampleId;
use crate::sys::sync::Locked;

/// Bytes held in memory ahead of the readers at most.
pub(crate) const BUDGET: u64 = 64 << 20;

/// The largest sample read ahead (what a reader reads through memory: `vfs::UNCACHED_MAX`).
pub(crate) const LARGEST: u64 = 16 << 20;

/// How long a reader waits for a sample being read ahead before reading it itself (a
/// source read that hangs, or a prefetch thread that died, never holds a reader longer).
const READ_WAIT: Duration = Duration::from_secs(30);

/// The samples to read ahead and those read.
#[derive(Default)]
pub(crate) struct Prefetch {
    state: Mutex<State>,
    /// Signalled when bytes are taken or the epoch changes.
    taken: Condvar,
}

#[derive(Default)]
struct State {
    epoch: u64,
    queue: VecDeque<SampleId>,
    /// Queued this epoch (a second listing queues nothing again).
    queued: std::collections::HashSet<SampleId>,
    ready: HashMap<SampleId, Vec<u8>>,
    bytes: u64,
    /// Being read ahead now: a reader of it waits for it rather than read it twice.
    reading: Option<SampleId>,
    /// A thread is working through `queue`.
    running: bool,
}

impl Prefetch {
    /// `ids` (of epoch `epoch`) were listed: queues those not queued this epoch yet;
    /// true when a thread must start to read them ([`SampleStore::read_ahead_listed`],
    /// which owns the thread: this module knows no store).
    ///
    /// [`SampleStore::read_ahead_listed`]: super::SampleStore::read_ahead_listed
    pub(crate) fn listed(&self, epoch: u64, ids: Vec<SampleId>) -> bool {
        let mut st = self.state.locked();
        if st.epoch != epoch {
            return false;
        }
        let fresh: Vec<SampleId> = ids.into_iter().filter(|&i| st.queued.insert(i)).collect();
        st.queue.extend(fresh);
        let start = !st.running && !st.queue.is_empty();
        st.running |= start;
        start
    }

    /// The thread could not start: the next listing tries again.
    pub(crate) fn not_started(&self) {
        self.state.locked().running = false;
    }

    /// The bytes of `id` read ahead, if any (handed out once); waits while it is being
    /// read ahead.
    /// The wait is bounded ([`READ_WAIT`]): past it the reader reads the source itself.
    pub(crate) fn take(&self, id: SampleId) -> Option<Vec<u8>> {
        let mut st = self.state.locked();
        let deadline = std::time::Instant::now() + READ_WAIT;
        while st.reading == Some(id) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            st = (self.taken.wait_timeout(st, left))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let bytes = st.ready.remove(&id)?;
        st.bytes -= bytes.len() as u64;
        self.taken.notify_all();
        Some(bytes)
    }

    /// The current epoch is now `epoch`: what was read ahead or queued is dropped.
    pub(crate) fn epoch(&self, epoch: u64) {
        let mut st = self.state.locked();
        st.epoch = epoch;
        st.queue.clear();
        st.queued.clear();
        st.ready.clear();
        st.bytes = 0;
        // A read still in flight is dropped when it ends (`ready` checks the epoch).
        st.reading = None;
        self.taken.notify_all();
    }

    /// The next sample to read (marked as being read), once there is room for `size_of`
    /// it (a size not known yet counts as [`LARGEST`], so at most [`BUDGET`] is held); `Next::Wait` after waiting a while for room (the caller lets the store go
    /// meanwhile), `Next::Done` when the queue is empty (the thread ends).
    pub(crate) fn next(&self, size_of: &dyn Fn(SampleId) -> u64) -> Next {
        let mut st = self.state.locked();
        let Some(&id) = st.queue.front() else {
            st.running = false;
            return Next::Done;
        };
        let size = match size_of(id) {
            0 => LARGEST,
            n => n,
        };
        if st.bytes == 0 || st.bytes + size <= BUDGET {
            st.queue.pop_front();
            st.reading = Some(id);
            return Next::Read(st.epoch, id);
        }
        let wait = Duration::from_millis(200);
        drop(self.taken.wait_timeout(st, wait));
        Next::Wait
    }

    /// `id`, read for `epoch`, is done: its bytes if read (dropped if the epoch moved on).
    pub(crate) fn ready(&self, epoch: u64, id: SampleId, bytes: Option<Vec<u8>>) {
        let mut st = self.state.locked();
        st.reading = None;
        if let (true, Some(bytes)) = (st.epoch == epoch, bytes) {
            st.bytes += bytes.len() as u64;
            st.ready.insert(id, bytes);
        }
        self.taken.notify_all();
    }
}

/// What the prefetch thread does next.
#[derive(Debug, PartialEq)]
pub(crate) enum Next {
    Read(u64, SampleId),
    Wait,
    Done,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_ahead_bytes_are_taken_once_and_dropped_with_the_epoch() {
        let p = Prefetch::default();
        p.ready(0, 3, Some(vec![1; 10]));
        p.ready(1, 4, Some(vec![1; 10]));
        assert_eq!(p.take(3), Some(vec![1; 10]));
        assert_eq!(p.take(3), None);
        assert_eq!(p.take(4), None, "read for another epoch");
        p.ready(0, 5, Some(vec![2; 5]));
        p.epoch(1);
        assert_eq!(p.take(5), None);
        assert_eq!(p.state.lock().unwrap().bytes, 0);
    }

    #[test]
    fn the_queue_waits_for_room_within_the_budget() {
        let p = Prefetch::default();
        p.state.lock().unwrap().queue.extend([1, 2]);
        let big = |_| BUDGET;
        assert_eq!(p.next(&big), Next::Read(0, 1), "the first always goes");
        // A reader of sample 1 waits while it is read ahead.
        let got = std::thread::scope(|s| {
            let reader = s.spawn(|| p.take(1));
            std::thread::sleep(Duration::from_millis(50));
            p.ready(0, 1, Some(vec![0; 8]));
            reader.join().unwrap()
        });
        assert_eq!(got, Some(vec![0; 8]));
        p.ready(0, 9, Some(vec![0; 8]));
        assert_eq!(p.next(&big), Next::Wait, "no room");
        assert!(p.take(9).is_some());
        assert_eq!(p.next(&big), Next::Read(0, 2));
        p.ready(0, 2, None);
        assert_eq!(p.next(&big), Next::Done);
        assert!(!p.state.lock().unwrap().running);
    }
}
