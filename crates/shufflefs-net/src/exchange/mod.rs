//! The background exchange of partial-local shuffling: move the samples the plan assigns
//! to other ranks for the next epoch, as raw bytes, while training reads the current one.
//!
//! The node runs every exchange through one seam, [`EpochExchange`]: [`Partial`] (this
//! module) or the [`coded`] client. The partial exchange has two halves, so the way samples
//! travel can change without touching how bytes move:
//! - `schedule`: a [`Strategy`] turns the plan step's transfers into rounds of streams
//!   (pure, no I/O; [`Direct`], every peer at once, is the default, chosen by
//!   [`ExchangeConfig::strategy`]); ranks that share a disk ([`Peers`]) hand samples over
//!   through it instead of the transport;
//! - `executor`: runs any schedule with the wire protocol documented there (sizes first,
//!   frames with per-sample checksums, one `syncfs`, then a confirmation per stream), each
//!   stream at its own pace, giving up peers far slower than the rest (`deadline`); the disk
//!   side of it in `frames`.
//!
//! Failures are [`ExchangeError`]s; the status shows each exchange through the
//! [`ExchangeTracker`].

use std::sync::atomic::AtomicBool;

use crate::cache::SampleStore;
use crate::comm::Comm;
use crate::plan::{SampleId, Step};

pub mod arrivals;
pub use arrivals::is_names_tag;
pub mod coded;
pub(crate) mod deadline;
mod error;
mod executor;
mod frames;
pub mod kept;
mod peers;
pub(crate) mod schedule;
mod seam;
mod sizes;
mod tracker;

pub use deadline::SlowPeers;
pub use error::{ExchangeError, Phase};
pub use peers::Peers;
pub use schedule::{Direct, Ring, Schedule, Strategy, StrategyKind, Topology};
pub use seam::{EpochExchange, ExchangeCtx, Partial, Settled};
pub use tracker::{ExchangeReport, ExchangeState, ExchangeTracker, PeerReport};

/// Bytes per message: large enough to amortise per-message cost, small enough to pipeline,
/// and small enough that a round's few pooled frame buffers are reused many times over (8 MiB
/// frames meant nearly every frame of an exchange faulted in a fresh buffer, a sixth of the
/// exchange's CPU on 2 cores; see docs/performance.md).
pub const FRAME: usize = 1 << 20;
/// Frames buffered between the disk threads and the MPI thread, each way.
const DEPTH: usize = 4;
/// What all of a rank's frames may hold at once, whatever the number of ranks (see the
/// executor's docs, "A frame budget for any number of ranks").
pub const FRAME_BUDGET: usize = 256 << 20;

/// Settings of the exchange.
#[derive(Clone, Copy, Debug)]
pub struct ExchangeConfig {
    /// Cap on bytes sent per second by this rank; `None` is uncapped.
    pub rate: Option<u64>,
    pub frame: usize,
    /// Bytes all of this rank's frames may hold at once ([`FRAME_BUDGET`]); every rank must
    /// use the same, since it sets how streams are grouped into waves.
    pub frame_budget: usize,
    /// How transfers are grouped into rounds; every rank must use the same.
    pub strategy: StrategyKind,
    /// When to stop waiting for a peer far slower than the others.
    pub slow_peers: SlowPeers,
    /// How long the fetch of what the exchange did not deliver may go without any sample
    /// arriving from the source before the epoch is published without them.
    pub fallback_stall: std::time::Duration,
}

impl Default for ExchangeConfig {
    fn default() -> Self {
        ExchangeConfig {
            rate: None,
            frame: FRAME,
            frame_budget: FRAME_BUDGET,
            strategy: StrategyKind::default(),
            slow_peers: SlowPeers::default(),
            fallback_stall: std::time::Duration::from_secs(30),
        }
    }
}

/// Runs this rank's part of the exchange into `step.next.epoch` over the transport alone
/// (no rank takes samples from another's cache), returning once every message of it
/// completed: the [`Partial`] exchange without the early word, for tools and tests.
pub fn run(
    comm: &mut dyn Comm,
    store: &SampleStore,
    step: &Step,
    cfg: ExchangeConfig,
    tracker: &ExchangeTracker,
    abort: &AtomicBool,
) -> Result<(), ExchangeError> {
    let mut partial = Partial {
        cfg,
        peers: Peers::separate(comm.size()),
    };
    let ctx = ExchangeCtx {
        store,
        tracker,
        abort,
    };
    partial.run(comm, step, ctx, &mut |_| {})
}

/// Bytes of one sample id in a list sent between ranks.
pub(crate) const ID_BYTES: usize = std::mem::size_of::<SampleId>();

/// Sample ids as little-endian bytes, for lists sent between ranks.
pub fn encode_ids(ids: &[SampleId]) -> Vec<u8> {
    ids.iter().flat_map(|id| id.to_le_bytes()).collect()
}

/// The inverse of [`encode_ids`] (a trailing partial id is ignored).
pub fn decode_ids(bytes: &[u8]) -> impl Iterator<Item = SampleId> + '_ {
    bytes
        .chunks_exact(ID_BYTES)
        .map(|c| SampleId::from_le_bytes(c.try_into().expect("one id's bytes")))
}

/// A sample in a stream, with its size.
pub(crate) type Sized = (SampleId, u64);

/// Bytes of the stream that carries `samples`: each followed by its 4-byte checksum.
pub(crate) fn stream_len(samples: &[Sized]) -> u64 {
    samples.iter().map(|&(_, size)| size + 4).sum()
}
