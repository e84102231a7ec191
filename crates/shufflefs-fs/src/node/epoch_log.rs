//! One log line per epoch advance, saying what the new epoch cost this rank: how many samples
//! came into its share and how (received from peers over MPI, within a host or across hosts;
//! taken over from a same-host peer's cache on disk; fetched from the source because a peer
//! could not deliver them), how many bytes the source was read for since the previous advance
//! (staging, fallbacks and readers' on-demand fetches alike), and how long it took (the
//! exchange until this rank held its share, and the previous epoch's length).
//!
//! The exchange logs its own line when its last message completes ("exchange finished", the
//! transport's view); on one host every byte goes through the disk and that line reads as if
//! nothing moved, which is why this one names the ways apart.
//!
//! The ways are told from the report's totals, less what its peers say came by disk: the
//! coded exchange (`--exchange coded`) fills only the totals (its packets come from the
//! server, not from peers), and a line built from the peers alone would say nothing moved.

use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::cache::StoreStats;
use crate::exchange::{ExchangeReport, ExchangeState};
use crate::sys::sync::Locked;

/// What came into a share, by way (from one exchange report).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Moved {
    pub mpi_samples: u64,
    pub mpi_bytes: u64,
    /// Of `mpi_bytes`: from ranks on other hosts (the only network traffic).
    pub across_hosts_bytes: u64,
    pub disk_samples: u64,
    pub disk_bytes: u64,
    /// Samples a peer should have sent, fetched from the source instead.
    pub fallback_samples: u64,
}

impl Moved {
    /// The totals count disk hand-offs too (within hosts); everything else came over MPI.
    pub(crate) fn of(report: &ExchangeReport) -> Moved {
        let mut m = Moved::default();
        for p in &report.peers {
            if p.via == "disk" {
                m.disk_samples += p.samples_received;
                m.disk_bytes += p.bytes_received;
            }
            m.fallback_samples += p.fetched_from_source;
        }
        m.mpi_samples = report.samples_received.saturating_sub(m.disk_samples);
        m.mpi_bytes = report.bytes_received.saturating_sub(m.disk_bytes);
        m.across_hosts_bytes = report.bytes_across_hosts;
        m
    }
}

/// The source counters and the time at the previous advance (or the mount).
struct Mark {
    at: Instant,
    /// No advance yet: `at` is the mount.
    first: bool,
    source_samples: u64,
    source_bytes: u64,
}

pub(crate) struct EpochLog {
    mark: Mutex<Mark>,
}

impl EpochLog {
    pub(crate) fn new(stats: &StoreStats) -> EpochLog {
        EpochLog {
            mark: Mutex::new(Mark::now(stats)),
        }
    }

    /// Logs the advance to `epoch` (`samples` in this rank's share), from the report of the
    /// exchange into it (none: the job does not exchange, or it is not known any more).
    pub(crate) fn published(
        &self,
        epoch: u64,
        samples: usize,
        report: Option<&ExchangeReport>,
        stats: &StoreStats,
    ) {
        let now = Mark::now(stats);
        let (source_samples, source_bytes) = (now.source_samples, now.source_bytes);
        let mut mark = self.mark.locked();
        let before = std::mem::replace(
            &mut *mark,
            Mark {
                first: false,
                ..now
            },
        );
        drop(mark);
        let m = report.map(Moved::of).unwrap_or_default();
        tracing::info!(
            epoch,
            samples,
            from_peers = m.mpi_samples,
            from_peers_bytes = m.mpi_bytes,
            across_hosts_bytes = m.across_hosts_bytes,
            disk_handed_over = m.disk_samples,
            disk_handed_over_bytes = m.disk_bytes,
            fetched_instead = m.fallback_samples,
            source_samples = source_samples - before.source_samples,
            source_bytes = source_bytes - before.source_bytes,
            exchange = exchange_state(report),
            exchange_seconds = format!("{:.3}", exchange_seconds(report)),
            epoch_seconds = format!("{:.3}", before.at.elapsed().as_secs_f64()),
            epoch_since = if before.first {
                "mount"
            } else {
                "previous advance"
            },
            "epoch advanced"
        );
    }
}

/// How the exchange into the epoch ended: `done`, `failed` (the share was then filled
/// from the source), or `none` (no exchange, or its report is gone).
fn exchange_state(report: Option<&ExchangeReport>) -> &'static str {
    report.map_or("none", |r| match r.state {
        ExchangeState::Failed => "failed",
        _ => "done",
    })
}

/// Until the share was held; a failed exchange never held it: its time until it ended.
fn exchange_seconds(report: Option<&ExchangeReport>) -> f64 {
    report.map_or(0.0, |r| match r.state {
        ExchangeState::Failed => r.seconds.max(r.settled_seconds),
        _ => r.settled_seconds,
    })
}

impl Mark {
    fn now(stats: &StoreStats) -> Mark {
        Mark {
            at: Instant::now(),
            first: true,
            source_samples: stats.fetched_from_source.load(Ordering::Relaxed),
            source_bytes: stats.fetched_bytes_from_source.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::PeerReport;

    fn peer(rank: u32, via: &'static str, same_host: bool, n: u64, fetched: u64) -> PeerReport {
        PeerReport {
            rank,
            via,
            same_host,
            samples_received: n,
            bytes_received: n * 100,
            fetched_from_source: fetched,
            ..Default::default()
        }
    }

    #[test]
    fn moved_names_the_ways_apart() {
        let report = ExchangeReport {
            samples_received: 10,
            bytes_received: 1000,
            bytes_within_hosts: 800,
            bytes_across_hosts: 200,
            peers: vec![
                peer(1, "disk", true, 5, 0),
                peer(2, "mpi", true, 3, 1),
                peer(3, "mpi", false, 2, 2),
            ],
            ..Default::default()
        };
        let expected = Moved {
            mpi_samples: 5,
            mpi_bytes: 500,
            across_hosts_bytes: 200,
            disk_samples: 5,
            disk_bytes: 500,
            fallback_samples: 3,
        };
        assert_eq!(Moved::of(&report), expected);
    }

    /// `--exchange coded` fills only the totals (src/exchange/coded/client.rs): no peers.
    #[test]
    fn a_coded_report_is_told_from_its_totals() {
        let report = ExchangeReport {
            samples_received: 7,
            bytes_received: 7000,
            bytes_across_hosts: 7000,
            ..Default::default()
        };
        let expected = Moved {
            mpi_samples: 7,
            mpi_bytes: 7000,
            across_hosts_bytes: 7000,
            ..Moved::default()
        };
        assert_eq!(Moved::of(&report), expected);
    }

    #[test]
    fn a_failed_exchange_says_so_with_its_time() {
        let mut report = ExchangeReport {
            state: ExchangeState::Failed,
            seconds: 2.5,
            ..Default::default()
        };
        assert_eq!(exchange_state(Some(&report)), "failed");
        assert_eq!(exchange_seconds(Some(&report)), 2.5);
        report.state = ExchangeState::Done;
        report.settled_seconds = 1.5;
        assert_eq!(exchange_state(Some(&report)), "done");
        assert_eq!(exchange_seconds(Some(&report)), 1.5);
        assert_eq!(exchange_state(None), "none");
    }

    #[test]
    fn the_source_is_counted_between_advances() {
        let stats = StoreStats::default();
        let log = EpochLog::new(&stats);
        stats
            .fetched_bytes_from_source
            .store(700, Ordering::Relaxed);
        assert!(log.mark.lock().unwrap().first);
        log.published(1, 10, None, &stats);
        let mark = log.mark.lock().unwrap();
        assert_eq!(mark.source_bytes, 700);
        assert!(
            !mark.first,
            "the next advance counts from this one, not the mount"
        );
    }
}
