//! The background exchange of partial-local shuffling: move the samples the plan assigns
//! to other ranks for the next epoch, as raw bytes, while training reads the current one.
//!
//! Two halves, so the way samples travel can change without touching how bytes move:
//! - [`schedule`]: a [`Strategy`] turns the plan step's transfers into rounds of streams
//!   (pure, no I/O; [`Ring`] is today's, chosen by [`ExchangeConfig::strategy`]);
//! - `executor`: runs any schedule with the wire protocol documented there (sizes first,
//!   frames with per-sample checksums, a trailer of unreadable ids, one `syncfs`, then a
//!   confirmation per stream), the disk side of it in `frames`.
//!
//! Failures are [`ExchangeError`]s; the status shows each exchange through the
//! [`ExchangeTracker`].

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::cache::SampleStore;
use crate::comm::Comm;
use crate::plan::{SampleId, Step};

mod error;
mod executor;
mod frames;
pub mod schedule;
mod sizes;
mod tracker;

pub use error::{ExchangeError, Phase};
pub use schedule::{Ring, Schedule, Strategy, StrategyKind, Topology};
pub use tracker::{ExchangeReport, ExchangeState, ExchangeTracker};

/// Bytes per message: large enough to amortise per-message cost, small enough to pipeline.
pub const FRAME: usize = 8 << 20;
/// Frames buffered between the disk threads and the MPI thread, each way.
const DEPTH: usize = 4;

/// Settings of the exchange.
#[derive(Clone, Copy, Debug)]
pub struct ExchangeConfig {
    /// Cap on bytes sent per second by this rank; `None` is uncapped.
    pub rate: Option<u64>,
    pub frame: usize,
    /// How transfers are grouped into rounds; every rank must use the same.
    pub strategy: StrategyKind,
}

impl Default for ExchangeConfig {
    fn default() -> Self {
        ExchangeConfig {
            rate: None,
            frame: FRAME,
            strategy: StrategyKind::Ring,
        }
    }
}

/// Runs this rank's part of the exchange into `step.next.epoch`. Must be called by every
/// rank for the same step, on the thread that owns `comm`.
pub fn run(
    comm: &mut dyn Comm,
    store: &SampleStore,
    step: &Step,
    cfg: ExchangeConfig,
    tracker: &ExchangeTracker,
    abort: &AtomicBool,
) -> Result<(), ExchangeError> {
    let topology = Topology {
        me: comm.rank(),
        hosts: comm.hosts(),
    };
    let schedule = cfg.strategy.strategy().schedule(topology, &step.transfers);
    let target = step.next.epoch;
    executor::execute(comm, store, &schedule, target, cfg, tracker, abort)
}

/// Sample ids as little-endian bytes, for lists sent between ranks.
pub fn encode_ids(ids: &[SampleId]) -> Vec<u8> {
    ids.iter().flat_map(|id| id.to_le_bytes()).collect()
}

/// The inverse of [`encode_ids`] (a trailing partial id is ignored).
pub fn decode_ids(bytes: &[u8]) -> impl Iterator<Item = SampleId> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
}

/// A sample in a stream, with its size.
pub(crate) type Sized = (SampleId, u64);

/// Bytes of the stream that carries `samples`: each followed by its 4-byte checksum.
pub(crate) fn stream_len(samples: &[Sized]) -> u64 {
    samples.iter().map(|&(_, size)| size + 4).sum()
}

/// Commands for the thread that owns MPI.
pub enum MpiCmd {
    /// Drop the samples that left, then run the exchange for `step`.
    Exchange {
        evict: Vec<SampleId>,
        step: Arc<Step>,
    },
    /// The FUSE session ended.
    Shutdown,
}
