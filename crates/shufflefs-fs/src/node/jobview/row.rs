//! One rank's line of the job view ([`RankRow`]), and how a rank makes its own ([`Sampler`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::cache::SampleStore;
use crate::exchange::{ExchangeReport, ExchangeState, ExchangeTracker};
use crate::node::coordinator::Coordinator;
use crate::node::staging::StagingProgress;

/// Longest host name and problem a row carries (a row must fit one frame, see `wire`).
const MAX_HOST: usize = 64;
const MAX_PROBLEM: usize = 240;
const MAX_GIVEN_UP: usize = 32;

/// A rank's summary, as the job view shows it (field names are the status's `job.ranks[]`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct RankRow {
    pub rank: u32,
    pub host: String,
    /// The epoch this rank serves.
    pub epoch: u64,
    pub staging: StagingRow,
    pub exchange: ExchangeRow,
    /// Peers the latest exchange stopped waiting for.
    pub given_up_peers: Vec<u32>,
    /// Samples the exchanges did not deliver that were fetched from the source instead,
    /// since this mount.
    pub source_fallbacks: u64,
    /// Source errors and checksum failures since this mount.
    pub problems: u64,
    /// The oldest problem still remembered (see the status's `cache.problems`).
    pub first_problem: Option<String>,
    pub cache_bytes: u64,
    /// The rank's view ended (it unmounted and left): its last row, never stale. Absent
    /// (false) on every other row, so the status of a running job is unchanged.
    #[serde(default, skip_serializing_if = "is_false")]
    pub left: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct StagingRow {
    /// As the status's `staging.state`: `idle`, `staging`, `done`, `incomplete`, ...
    /// (so a share with nothing to stage, or one that ended with errors, reads as finished).
    pub state: String,
    pub done: u64,
    pub total: u64,
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Samples staging could not copy.
    pub errors: u64,
}

/// The latest exchange: bytes sent and received so far, of all it moves.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ExchangeRow {
    /// `None` before the first exchange.
    pub into_epoch: Option<u64>,
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// This rank's side as a receiver (disk hand-offs from ranks of its host included,
    /// which only the receiver counts): what a job-wide sum of what moved adds up.
    pub received_bytes: u64,
    pub to_receive_bytes: u64,
    /// While it runs, over the last second or so; once it ended, its mean.
    pub rate_bytes_per_s: f64,
}

impl RankRow {
    /// Cuts what may grow without bound, so a row fits one frame.
    pub(crate) fn bounded(mut self) -> RankRow {
        truncate(&mut self.host, MAX_HOST);
        if let Some(p) = &mut self.first_problem {
            truncate(p, MAX_PROBLEM);
        }
        self.given_up_peers.truncate(MAX_GIVEN_UP);
        self
    }
}

fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// The parts of a node a row is read from.
#[derive(Clone)]
pub struct Parts {
    pub store: Arc<SampleStore>,
    pub epochs: Coordinator,
    pub staging: Arc<StagingProgress>,
    pub exchange: Arc<ExchangeTracker>,
}

/// Makes this rank's rows, remembering what a rate and a running total need: the bytes of
/// the exchange at the previous row, and what each recent exchange fetched from the source
/// (the tracker keeps the last few exchanges only).
pub struct Sampler {
    parts: Parts,
    host: String,
    /// The exchange the rows follow and its bytes done at each recent row (the last
    /// [`RATE_WINDOW`]), for its rate.
    last: Option<(u64, std::collections::VecDeque<(Instant, u64)>)>,
    fallbacks: BTreeMap<u64, u64>,
    retired_fallbacks: u64,
}

impl Sampler {
    pub(crate) fn new(parts: Parts) -> Sampler {
        Sampler {
            parts,
            host: hostname(),
            last: None,
            fallbacks: BTreeMap::new(),
            retired_fallbacks: 0,
        }
    }

    pub(crate) fn row(&mut self) -> RankRow {
        let reports = self.parts.exchange.snapshot();
        let exchange = self.exchange_row(reports.last());
        let source_fallbacks = self.fallbacks(&reports);
        let p = &self.parts;
        let stats = &p.store.stats;
        let staging = p.staging.snapshot();
        let problems = stats.problems();
        RankRow {
            rank: p.epochs.rank(),
            host: self.host.clone(),
            epoch: p.epochs.epoch(),
            staging: StagingRow {
                state: staging.state.to_string(),
                errors: staging.errors,
                done: staging.files_done,
                total: staging.files_total,
                done_bytes: staging.bytes_done,
                total_bytes: staging.bytes_total,
            },
            exchange,
            given_up_peers: (reports.last().into_iter())
                .flat_map(|r| r.peers.iter().filter(|p| p.given_up).map(|p| p.rank))
                .collect(),
            source_fallbacks,
            problems: stats.source_errors.load(Ordering::Relaxed)
                + stats.checksum_failures.load(Ordering::Relaxed),
            first_problem: problems.into_iter().next(),
            cache_bytes: stats.bytes.load(Ordering::Relaxed),
            left: false,
        }
        .bounded()
    }

    fn exchange_row(&mut self, latest: Option<&ExchangeReport>) -> ExchangeRow {
        let Some(r) = latest else {
            return ExchangeRow::default();
        };
        let done = r.bytes_sent + r.bytes_received;
        let now = Instant::now();
        let ended = matches!(r.state, ExchangeState::Done | ExchangeState::Failed);
        let seen = match self.last.take() {
            Some((epoch, seen)) if epoch == r.target_epoch => seen,
            _ => Default::default(),
        };
        let (rate, seen) = window_rate(seen, now, done);
        let rate = match ended && r.seconds > 0.0 {
            true => done as f64 / r.seconds,
            false => rate,
        };
        self.last = Some((r.target_epoch, seen));
        let to_receive = r.expected_bytes_to_receive(self.mean_sample_bytes());
        ExchangeRow {
            into_epoch: Some(r.target_epoch),
            done_bytes: done,
            total_bytes: r.bytes_to_send + to_receive,
            received_bytes: r.bytes_received,
            to_receive_bytes: to_receive,
            rate_bytes_per_s: rate.round(),
        }
    }

    /// The mean size of the samples this rank caches (0 before any): what a sample handed
    /// over on the disk is expected to bring before it is taken.
    fn mean_sample_bytes(&self) -> u64 {
        let stats = &self.parts.store.stats;
        let files = stats.files.load(Ordering::Relaxed);
        stats
            .bytes
            .load(Ordering::Relaxed)
            .checked_div(files)
            .unwrap_or(0)
    }

    /// Samples fetched from the source in a peer's stead, over every exchange seen.
    fn fallbacks(&mut self, reports: &[ExchangeReport]) -> u64 {
        let oldest = reports.first().map_or(u64::MAX, |r| r.target_epoch);
        let gone: Vec<u64> = (self.fallbacks.keys())
            .copied()
            .filter(|&e| e < oldest)
            .collect();
        for e in gone {
            self.retired_fallbacks += self.fallbacks.remove(&e).unwrap_or(0);
        }
        for r in reports {
            let n = r.peers.iter().map(|p| p.fetched_from_source).sum();
            self.fallbacks.insert(r.target_epoch, n);
        }
        self.retired_fallbacks + self.fallbacks.values().sum::<u64>()
    }
}

/// This machine's name, as `hostname` prints it.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// How far back a running exchange's rate looks: a paced or bursty exchange (frames go out
/// whole) would read 0 B/s between bursts over one second.
const RATE_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// The rate of bytes done over the rows of the last [`RATE_WINDOW`] (0 at the first), and
/// those rows with this one added.
fn window_rate(
    mut seen: std::collections::VecDeque<(Instant, u64)>,
    now: Instant,
    done: u64,
) -> (f64, std::collections::VecDeque<(Instant, u64)>) {
    while seen.len() > 1 && seen.front().is_some_and(|&(at, _)| now - at > RATE_WINDOW) {
        seen.pop_front();
    }
    let rate = match seen.front() {
        Some(&(at, before)) if now > at => {
            done.saturating_sub(before) as f64 / (now - at).as_secs_f64()
        }
        _ => 0.0,
    };
    seen.push_back((now, done));
    (rate, seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A paced exchange's bursts: the rate stays above 0 between them, over the window.
    #[test]
    fn a_running_rate_spans_the_window_not_the_last_row() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + std::time::Duration::from_secs(s);
        let (rate, seen) = window_rate(Default::default(), at(0), 0);
        assert_eq!(rate, 0.0);
        let (rate, seen) = window_rate(seen, at(1), 100_000);
        assert_eq!(rate, 100_000.0);
        // No burst for 4 s: the rate over the window, not 0.
        let (rate, mut seen) = window_rate(seen, at(5), 100_000);
        assert_eq!(rate, 20_000.0);
        for s in 6..=20 {
            (_, seen) = window_rate(seen, at(s), 100_000 + (s - 5) * 1000);
        }
        // Only the last 10 s count.
        let (rate, _) = window_rate(seen, at(21), 116_000);
        assert_eq!(rate, 1_000.0);
    }

    #[test]
    fn a_bounded_row_keeps_whole_characters() {
        let row = RankRow {
            host: "é".repeat(100),
            first_problem: Some("x".repeat(1000)),
            given_up_peers: (0..100).collect(),
            ..RankRow::default()
        }
        .bounded();
        assert!(row.host.len() <= MAX_HOST && row.host.chars().all(|c| c == 'é'));
        assert_eq!(row.first_problem.unwrap().len(), MAX_PROBLEM);
        assert_eq!(row.given_up_peers.len(), MAX_GIVEN_UP);
    }
}
