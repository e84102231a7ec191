//! A rank's table going down to its children in the view's tree (`tree`) at a bounded rate.
//! A table takes a frame per few rows (about [`ROWS_PER_FRAME`]); when rank 0 sent it to
//! every rank that shows it, sending it whole every second grew as ranks squared (64 ranks:
//! some 820 sends a second, 1024 ranks tens of thousands, all on the thread that also drives
//! the exchange). Down the tree a rank sends it to its children only (at most
//! `FAN_IN` leaders and its host's ranks), and the frames wait in a queue that each tick
//! drains by at most [`SENDS_PER_TICK`] (ticks come at most every 100 ms: at most
//! [`SENDS_PER_S`] a second, some 2 MB/s and a few ms of the MPI thread's time),
//! and a new table starts only once the last went out: the table's period is the larger of
//! a second and what the queue takes to drain ([`table_interval`]). Frames older than a
//! period are made again from the board before they are sent, so the ages they carry stay
//! true within a period.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::plan::Rank;

/// A rank's sends of the table, at most, per second.
pub(crate) const SENDS_PER_S: u32 = 1000;
/// And per tick (a tick looks at the transport at most every 100 ms).
pub(super) const SENDS_PER_TICK: usize = 100;
/// Rows a frame holds, about (a row is some 300 to 400 bytes of JSON; a frame 2 KiB).
const ROWS_PER_FRAME: u32 = 5;

/// About how often a job of `ranks` ranks, whose table goes to `recipients` of them, gets a
/// new table: the ranks other than 0 allow this much more before they call a row stale.
pub(crate) fn table_interval(period: Duration, ranks: u32, recipients: u32) -> Duration {
    let frames = ranks.div_ceil(ROWS_PER_FRAME);
    let drain = Duration::from_secs_f64(f64::from(frames * recipients) / f64::from(SENDS_PER_S));
    drain.max(period)
}

/// The table being sent: its frames, when they were made, and who gets which frame yet.
#[derive(Default)]
pub(super) struct Fanout {
    frames: Vec<Vec<u8>>,
    built: Option<Instant>,
    queue: VecDeque<(Rank, usize)>,
}

impl Fanout {
    /// Whether the last table went out (a new one may start).
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// A new table of `frames` for each of `to`.
    pub(super) fn start(&mut self, frames: Vec<Vec<u8>>, to: impl Iterator<Item = Rank>) {
        let n = frames.len();
        self.queue = to.flat_map(|r| (0..n).map(move |i| (r, i))).collect();
        self.frames = frames;
        self.built = Some(Instant::now());
    }

    /// The next frame to send and to whom; frames older than `max_age` are first made again
    /// by `remake`. `None` once the queue is empty.
    pub(super) fn next(
        &mut self,
        max_age: Duration,
        remake: impl FnOnce() -> Vec<Vec<u8>>,
    ) -> Option<(Rank, Vec<u8>)> {
        if self.built.is_some_and(|b| b.elapsed() >= max_age) {
            self.frames = remake();
            self.built = Some(Instant::now());
        }
        while let Some((to, i)) = self.queue.pop_front() {
            if let Some(f) = self.frames.get(i) {
                return Some((to, f.clone()));
            }
        }
        None
    }

    /// `peer` gets nothing more of this table.
    pub(super) fn drop_peer(&mut self, peer: Rank) {
        self.queue.retain(|(r, _)| *r != peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_grows_with_frames_times_recipients() {
        let s = |ranks, to| table_interval(Duration::from_secs(1), ranks, to).as_secs_f64();
        assert_eq!(s(8, 7), 1.0);
        assert!((s(64, 63) - 1.0).abs() < 0.01, "{}", s(64, 63));
        assert!((s(1024, 15) - 3.075).abs() < 0.01, "{}", s(1024, 15));
        assert!((s(4096, 15) - 12.3).abs() < 0.1, "{}", s(4096, 15));
    }

    #[test]
    fn frames_go_recipient_by_recipient_and_are_remade_when_old() {
        let mut f = Fanout::default();
        f.start(vec![vec![1], vec![2]], [3, 4].into_iter());
        let long = Duration::from_secs(60);
        assert_eq!(f.next(long, Vec::new), Some((3, vec![1])));
        f.drop_peer(4);
        assert_eq!(f.next(long, Vec::new), Some((3, vec![2])));
        assert!(f.next(long, Vec::new).is_none() && f.is_empty());
        f.start(vec![vec![1], vec![2]], [5].into_iter());
        // Remade with one frame only: the second index has nothing left to send.
        assert_eq!(f.next(Duration::ZERO, || vec![vec![9]]), Some((5, vec![9])));
        assert!(f.next(Duration::ZERO, || vec![vec![9]]).is_none());
    }
}
