//! The first phase of the executor: settling every stream's length before any byte moves.
//!
//! A receiver may not know the size of a sample it never read (the scan does not stat; see
//! `manifest`), so each sender looks up (fetching if need be) the size of every sample it
//! sends and tells each receiver the sizes of its stream, in stream order, in the round the
//! schedule gives that stream: both sides know the message's length from the schedule, and
//! a shutdown can interrupt the wait (a collective could not be). A sample its sender cannot
//! read is marked [`UNKNOWN_SIZE`]: it is left out of both sides' streams and named in the
//! trailer, so the receiver fetches it from the source later.
//!
//! Each size travels with the sample's modification time in the source (nanoseconds since
//! 1970, 0 if unknown), so a received sample shows the source's time as a fetched one does.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread;

use super::executor::Ctx;
use super::frames::idle_io_priority;
use super::schedule::{RoundOp, Schedule, Stream};
use super::{ExchangeError, Phase, Sized};
use crate::cache::SampleStore;
use crate::comm::{Batch, Comm};
use crate::dataset::manifest::UNKNOWN_SIZE;
use crate::plan::{Rank, SampleId};

/// Bytes per sample in a size list: its size, then its source mtime.
const ENTRY: usize = 16;

/// One round of the schedule with every stream's sizes known.
pub(super) struct SizedRound {
    pub sends: Vec<OutStream>,
    pub recvs: Vec<InStream>,
}

pub(super) struct OutStream {
    pub peer: Rank,
    pub samples: Vec<Sized>,
    /// In the schedule but unreadable here: named in the trailer instead.
    pub unsendable: Vec<SampleId>,
}

pub(super) struct InStream {
    pub peer: Rank,
    pub samples: Vec<Sized>,
}

impl SizedRound {
    /// The peers of the round, senders' first: what an error names.
    pub fn peers(&self) -> Vec<Rank> {
        let sends = self.sends.iter().map(|s| s.peer);
        sends.chain(self.recvs.iter().map(|s| s.peer)).collect()
    }
}

/// Runs the size phase of `schedule`, one transfer per round.
pub(super) fn settle(
    comm: &mut dyn Comm,
    ctx: &Ctx,
    schedule: &Schedule,
) -> Result<Vec<SizedRound>, ExchangeError> {
    let mut outgoing: Vec<SampleId> = Vec::new();
    for op in schedule.rounds.iter().flat_map(|r| &r.ops) {
        match op {
            RoundOp::Send(s) => outgoing.extend_from_slice(&s.samples),
            RoundOp::Recv(_) => {}
        }
    }
    let known = resolve_sizes(ctx.store, &outgoing);
    let size_of: BTreeMap<SampleId, u64> = outgoing.into_iter().zip(known).collect();
    let mut rounds = Vec::with_capacity(schedule.rounds.len());
    for round in &schedule.rounds {
        let (mut sends, mut recvs): (Vec<&Stream>, Vec<&Stream>) = (Vec::new(), Vec::new());
        for op in &round.ops {
            match op {
                RoundOp::Send(s) => sends.push(s),
                RoundOp::Recv(s) => recvs.push(s),
            }
        }
        let batch = Batch {
            sends: sends
                .iter()
                .map(|s| {
                    let entries = s.samples.iter().flat_map(|&id| {
                        let mtime = ctx.store.mtime_nanos(id);
                        size_of[&id]
                            .to_le_bytes()
                            .into_iter()
                            .chain(mtime.to_le_bytes())
                    });
                    (s.peer, entries.collect())
                })
                .collect(),
            recvs: recvs
                .iter()
                .map(|s| (s.peer, vec![0u8; s.samples.len() * ENTRY]))
                .collect(),
        };
        let peers: Vec<Rank> = sends.iter().chain(&recvs).map(|s| s.peer).collect();
        let theirs = comm
            .transfer(ctx.tag, batch, ctx.abort)
            .map_err(|e| ctx.comm_error(Phase::Sizes, peers, e))?;
        let sends = sends
            .iter()
            .map(|s| {
                let (samples, unsendable): (Vec<Sized>, Vec<Sized>) = s
                    .samples
                    .iter()
                    .map(|&id| (id, size_of[&id]))
                    .partition(|&(_, size)| size != UNKNOWN_SIZE);
                OutStream {
                    peer: s.peer,
                    samples,
                    unsendable: unsendable.into_iter().map(|(id, _)| id).collect(),
                }
            })
            .collect();
        let recvs = recvs
            .iter()
            .zip(theirs.recvs)
            .map(|(s, (_, sizes))| InStream {
                peer: s.peer,
                samples: s
                    .samples
                    .iter()
                    .zip(sizes.chunks_exact(ENTRY))
                    .map(|(&id, entry)| {
                        let word = |i: usize| {
                            u64::from_le_bytes(entry[i..i + 8].try_into().expect("8 bytes"))
                        };
                        ctx.store.learn_mtime_nanos(id, word(8));
                        (id, word(0))
                    })
                    .filter(|&(_, size)| size != UNKNOWN_SIZE)
                    .collect(),
            })
            .collect();
        rounds.push(SizedRound { sends, recvs });
    }
    Ok(rounds)
}

/// The sizes of `ids` ([`UNKNOWN_SIZE`] for one that cannot be read), fetching the samples
/// whose size is not known yet on a few threads: at the first exchange, part of what a rank
/// sends may not be staged yet, and one copy at a time from a parallel filesystem is slow.
fn resolve_sizes(store: &SampleStore, ids: &[SampleId]) -> Vec<u64> {
    const THREADS: usize = 4;
    let resolve = |id: SampleId| {
        store.resolve_size(id).unwrap_or_else(|e| {
            tracing::warn!(sample = id, error = %e, "cannot read a sample to send; receiver will refetch");
            UNKNOWN_SIZE
        })
    };
    if ids.iter().all(|&id| store.size(id).is_some()) {
        return ids.iter().map(|&id| resolve(id)).collect();
    }
    let sizes: Vec<AtomicU64> = ids.iter().map(|_| AtomicU64::new(UNKNOWN_SIZE)).collect();
    let next = AtomicUsize::new(0);
    thread::scope(|scope| {
        for _ in 0..THREADS.min(ids.len()) {
            scope.spawn(|| {
                idle_io_priority();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&id) = ids.get(i) else { break };
                    sizes[i].store(resolve(id), Ordering::Relaxed);
                }
            });
        }
    });
    sizes.into_iter().map(AtomicU64::into_inner).collect()
}
