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

use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::cache::StoreStats;
use crate::exchange::ExchangeReport;

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
    pub(crate) fn of(report: &ExchangeReport) -> Moved {
        let mut m = Moved::default();
        for p in &report.peers {
            if p.via == "disk" {
                m.disk_samples += p.samples_received;
                m.disk_bytes += p.bytes_received;
            } else {
                m.mpi_samples += p.samples_received;
                m.mpi_bytes += p.bytes_received;
                if !p.same_host {
                    m.across_hosts_bytes += p.bytes_received;
                }
            }
            m.fallback_samples += p.fetched_from_source;
        }
        m
    }
}

/// The source counters and the time at the previous advance (or the start).
struct Mark {
    at: Instant,
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
        let mut mark = self.mark.lock().unwrap_or_else(|e| e.into_inner());
        let before = std::mem::replace(&mut *mark, now);
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
            exchange_seconds = format!("{:.3}", report.map_or(0.0, |r| r.settled_seconds)),
            epoch_seconds = format!("{:.3}", before.at.elapsed().as_secs_f64()),
            "epoch advanced"
        );
    }
}

impl Mark {
    fn now(stats: &StoreStats) -> Mark {
        Mark {
            at: Instant::now(),
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

    #[test]
    fn the_source_is_counted_between_advances() {
        let stats = StoreStats::default();
        let log = EpochLog::new(&stats);
        stats
            .fetched_bytes_from_source
            .store(700, Ordering::Relaxed);
        log.published(1, 10, None, &stats);
        let mark = log.mark.lock().unwrap();
        assert_eq!(mark.source_bytes, 700);
    }
}
