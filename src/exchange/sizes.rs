//! The first message of every stream: its size list, so both sides know the stream's
//! length before any byte moves.
//!
//! A receiver may not know the size of a sample it never read (the scan does not stat; see
//! `manifest`), so each sender looks up (fetching if need be) the size of every sample it
//! sends and tells the receiver the sizes of its stream, in stream order: the message's
//! length follows from the schedule (16 bytes per sample), and it is a point-to-point
//! message, so a shutdown can interrupt the wait (a collective could not be). A sample its
//! sender cannot read is marked [`UNKNOWN_SIZE`]: it is left out of both sides' streams, and
//! the receiver fetches it from the source later.
//!
//! Each size travels with the sample's modification time in the source (nanoseconds since
//! 1970, 0 if unknown), so a received sample shows the source's time as a fetched one does.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread;

use super::Sized;
use super::frames::idle_io_priority;
use crate::cache::SampleStore;
use crate::dataset::manifest::UNKNOWN_SIZE;
use crate::plan::SampleId;

/// Bytes per sample in a size list: its size, then its source mtime.
pub(super) const ENTRY: usize = 16;

/// The size list of `ids` (sizes from `sizes`, in the same order).
pub(super) fn encode(store: &SampleStore, ids: &[SampleId], sizes: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ids.len() * ENTRY);
    for (&id, size) in ids.iter().zip(sizes) {
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&store.mtime_nanos(id).to_le_bytes());
    }
    out
}

/// The stream a size list describes: the samples of `ids` the sender can send, with their
/// sizes (the mtimes are learned on the way), and those it cannot.
pub(super) fn decode(
    store: &SampleStore,
    ids: &[SampleId],
    list: &[u8],
) -> (Vec<Sized>, Vec<SampleId>) {
    let (mut sendable, mut unsendable) = (Vec::new(), Vec::new());
    for (&id, entry) in ids.iter().zip(list.chunks_exact(ENTRY)) {
        let word = |i: usize| u64::from_le_bytes(entry[i..i + 8].try_into().expect("8 bytes"));
        store.learn_mtime_nanos(id, word(8));
        match word(0) {
            UNKNOWN_SIZE => unsendable.push(id),
            size => sendable.push((id, size)),
        }
    }
    (sendable, unsendable)
}

/// The sizes of `ids` ([`UNKNOWN_SIZE`] for one that cannot be read), fetching the samples
/// whose size is not known yet on a few threads: at the first exchange, part of what a rank
/// sends may not be staged yet, and one copy at a time from a parallel filesystem is slow.
pub(super) fn resolve_sizes(store: &SampleStore, ids: &[SampleId]) -> Vec<u64> {
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
