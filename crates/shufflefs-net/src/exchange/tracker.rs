//! What the status shows of recent exchanges: progress counters, written by the exchange
//! as it runs.
//!
//! Whether the next epoch is ready is not asked here: the node's coordinator owns that
//! (`Coordinator::is_ready`), fed by the exchange's `settled` word. The `state` of a report
//! is how far this run of the exchange got, shown per exchange in the status.

use std::sync::Mutex;

use crate::sys::sync::Locked;
use serde::Serialize;

/// How far a run of the exchange got. The status shows it as the lowercase name (`"pending"`, ...).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExchangeState {
    /// Announced; its size lists are being settled.
    #[default]
    Pending,
    Running,
    Done,
    Failed,
}

impl ExchangeState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ExchangeState::Pending => "pending",
            ExchangeState::Running => "running",
            ExchangeState::Done => "done",
            ExchangeState::Failed => "failed",
        }
    }
}

impl std::fmt::Display for ExchangeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One exchange as the status shows it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ExchangeReport {
    pub target_epoch: u64,
    pub state: ExchangeState,
    pub samples_to_send: u64,
    pub samples_to_receive: u64,
    pub bytes_to_send: u64,
    pub bytes_to_receive: u64,
    pub samples_sent: u64,
    pub samples_received: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub failed_samples: u64,
    /// Samples that arrived (over the transport or a disk hand-off) for which a partial
    /// cache had no room: not stored, read from the source when opened.
    pub not_kept_samples: u64,
    /// Bytes received from ranks of this host (over the shared disk or the transport) and
    /// from other hosts (the only network traffic).
    pub bytes_within_hosts: u64,
    pub bytes_across_hosts: u64,
    /// The most bytes this rank's frames held at once (posted to the transport, queued for
    /// or held by its disk threads): at most the frame budget, whatever the number of ranks.
    pub frame_bytes_peak: u64,
    /// Seconds until this rank held what it needs (or gave slow peers up); `seconds` also
    /// counts serving peers and draining late bytes after that.
    pub settled_seconds: f64,
    /// Seconds spent making received samples durable (`syncfs` of the cache).
    pub sync_seconds: f64,
    /// Seconds until every message of the exchange completed (late bytes of given-up peers
    /// drained, own streams confirmed); 0 until then.
    pub seconds: f64,
    pub error: Option<String>,
    /// Per peer, in the order the schedule lists them.
    pub peers: Vec<PeerReport>,
    /// Under `--exchange coded`: packets, decoding and plain samples from the server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coded: Option<super::coded::CodedReport>,
}

/// One peer of an exchange as the status shows it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PeerReport {
    pub rank: u32,
    /// `"mpi"` (the transport) or `"disk"` (taken from its cache on this host).
    pub via: &'static str,
    pub same_host: bool,
    pub samples_to_receive: u64,
    pub samples_received: u64,
    pub bytes_received: u64,
    pub samples_to_send: u64,
    pub bytes_sent: u64,
    /// Seconds from the start until its stream to this rank was complete (0: not yet).
    pub seconds: f64,
    /// Whether this rank stopped waiting for it (see `deadline`): its late bytes are dropped.
    pub given_up: bool,
    /// Samples it should have sent that were fetched from the source instead.
    pub fetched_from_source: u64,
}

impl ExchangeReport {
    /// The entry of peer `rank`, added if missing.
    pub fn peer(&mut self, rank: u32) -> &mut PeerReport {
        let i = match self.peers.iter().position(|p| p.rank == rank) {
            Some(i) => i,
            None => {
                self.peers.push(PeerReport {
                    rank,
                    ..Default::default()
                });
                self.peers.len() - 1
            }
        };
        &mut self.peers[i]
    }

    /// Bytes this rank expects to receive in all. `bytes_to_receive` counts the transport's
    /// streams only: a sample handed over on this host's disk has no byte count before it is
    /// taken, so each of a disk peer's is expected at `mean` bytes (what it handed over
    /// already counts as it is). Never less than what arrived (a table showed `50.0 kB/0 B`
    /// during hand-offs), and exactly that once the exchange is done.
    pub fn expected_bytes_to_receive(&self, mean: u64) -> u64 {
        if self.state == ExchangeState::Done {
            return self.bytes_received;
        }
        let disk: u64 = (self.peers.iter().filter(|p| p.via == "disk"))
            .map(|p| {
                p.bytes_received
                    .max(p.samples_to_receive.saturating_mul(mean))
            })
            .sum();
        (self.bytes_to_receive + disk).max(self.bytes_received)
    }
}

/// Reports of recent exchanges.
#[derive(Default)]
pub struct ExchangeTracker {
    reports: Mutex<Vec<ExchangeReport>>,
}

impl ExchangeTracker {
    pub fn update(&self, target: u64, f: impl FnOnce(&mut ExchangeReport)) {
        let mut reports = self.reports.locked();
        if let Some(r) = reports.iter_mut().find(|r| r.target_epoch == target) {
            f(r);
        } else {
            let mut r = ExchangeReport {
                target_epoch: target,
                ..Default::default()
            };
            f(&mut r);
            reports.push(r);
            // Keep the last few only.
            let excess = reports.len().saturating_sub(4);
            reports.drain(..excess);
        }
    }

    pub fn snapshot(&self) -> Vec<ExchangeReport> {
        self.reports.locked().clone()
    }

    /// Records an exchange that will run, shown as pending until it starts.
    pub fn announce(&self, target: u64) {
        self.update(target, |_| {});
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// During disk hand-offs what arrived is more than `bytes_to_receive` counts (the job
    /// table showed `->1 50.0 kB/0 B`): the hand-offs are expected at the mean size.
    #[test]
    fn disk_hand_offs_are_expected_at_the_mean_size() {
        let disk = |to: u64, got: u64, bytes: u64| PeerReport {
            via: "disk",
            samples_to_receive: to,
            samples_received: got,
            bytes_received: bytes,
            ..Default::default()
        };
        let mut r = ExchangeReport {
            state: ExchangeState::Running,
            bytes_to_receive: 1_000,
            bytes_received: 50_000 + 400,
            peers: vec![disk(10, 5, 50_000), disk(4, 0, 0)],
            ..Default::default()
        };
        // The first peer's 10 at 10 kB = 100 kB; the second's 4 at 10 kB; the stream's 1 kB.
        assert_eq!(r.expected_bytes_to_receive(10_000), 141_000);
        // With no mean (nothing cached yet), never less than what arrived.
        assert_eq!(r.expected_bytes_to_receive(0), 51_000);
        r.bytes_received = 60_000;
        assert_eq!(r.expected_bytes_to_receive(0), 60_000);
        r.state = ExchangeState::Done;
        assert_eq!(r.expected_bytes_to_receive(10_000), 60_000);
    }

    /// The status JSON shows the states as it always did.
    #[test]
    fn states_serialize_to_their_lowercase_names() {
        for (state, name) in [
            (ExchangeState::Pending, "pending"),
            (ExchangeState::Running, "running"),
            (ExchangeState::Done, "done"),
            (ExchangeState::Failed, "failed"),
        ] {
            assert_eq!(
                serde_json::to_string(&state).unwrap(),
                format!("\"{name}\"")
            );
            assert_eq!(state.to_string(), name);
        }
        let tracker = ExchangeTracker::default();
        tracker.announce(3);
        assert_eq!(tracker.snapshot()[0].state, ExchangeState::Pending);
        tracker.update(3, |r| r.state = ExchangeState::Done);
        assert_eq!(tracker.snapshot()[0].state, ExchangeState::Done);
    }
}
