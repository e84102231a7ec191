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
//! Each size travels with the sample's id (64-bit) and its modification time in the source
//! (nanoseconds since 1970, 0 if unknown), so a received sample shows the source's time as a
//! fetched one does. The receiver checks every id against the one its plan expects: ranks
//! whose plans disagree (another build, another seed or dataset given to one rank) would
//! otherwise store one sample's bytes under another's id, since the checksums that follow
//! cover bytes, not names. A list that disagrees is given up whole: its bytes are drained and
//! dropped, and its samples fetched from the source (see [`Decoded::mismatch`]). The ids
//! are also what a plan that receivers cannot compute alone needs.
//!
//! A stream to a peer on this host moves no bytes: the receiver takes each sample's file from
//! the sender's cache folder (a disk hand-off). So the sender fetches into its cache every
//! sample of such a stream that it has not staged yet before it lists it ([`resolve_held`]),
//! whether its size is known or not. Before the fix a bucket's sizes (listed) needed no
//! fetch, the first exchange ran before staging, and the receivers found no file: those
//! samples were fetched from the bucket again at the advance, or failed with it away.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread;

use super::Sized;
use super::frames::idle_io_priority;
use crate::cache::SampleStore;
use crate::dataset::manifest::UNKNOWN_SIZE;
use crate::plan::SampleId;

/// Bytes per sample in a size list: its id, its size, then its source mtime.
pub(super) const ENTRY: usize = 24;

/// The size list of `ids` (sizes from `sizes`, in the same order).
pub(super) fn encode(store: &SampleStore, ids: &[SampleId], sizes: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ids.len() * ENTRY);
    for (&id, size) in ids.iter().zip(sizes) {
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&store.mtime_nanos(id).to_le_bytes());
    }
    out
}

/// What a size list says of its stream.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Decoded {
    /// The samples the sender sends, with their sizes, in stream order: they fix the
    /// stream's length whatever else the list says.
    pub sendable: Vec<Sized>,
    /// Those it cannot send.
    pub unsendable: Vec<SampleId>,
    /// The first entry whose id is not the one this rank's plan expects there: `(position,
    /// expected, sent)`. Nothing of such a stream may be stored.
    pub mismatch: Option<(usize, SampleId, u64)>,
}

/// The stream a size list describes, checked against `ids`, the samples this rank's plan
/// expects in it (the mtimes of those that agree are learned on the way).
pub(super) fn decode(store: &SampleStore, ids: &[SampleId], list: &[u8]) -> Decoded {
    let mut out = Decoded::default();
    for (k, (&id, entry)) in ids.iter().zip(list.chunks_exact(ENTRY)).enumerate() {
        let word = |i: usize| u64::from_le_bytes(entry[i..i + 8].try_into().expect("8 bytes"));
        let sent = word(0);
        if sent != id {
            out.mismatch.get_or_insert((k, id, sent));
        } else {
            store.learn_mtime_nanos(id, word(16));
        }
        match word(8) {
            UNKNOWN_SIZE => out.unsendable.push(id),
            size => out.sendable.push((id, size)),
        }
    }
    out
}

/// Whether [`resolve_held`] has nothing to fetch: every size known, and every sample that
/// `hold` marks in the cache.
pub(super) fn all_at_hand(store: &SampleStore, ids: &[SampleId], hold: &[bool]) -> bool {
    (ids.iter().enumerate())
        .all(|(i, &id)| store.size(id).is_some() && (!held(hold, i) || store.contains(id)))
}

fn held(hold: &[bool], i: usize) -> bool {
    hold.get(i) == Some(&true)
}

/// The sizes of `ids` ([`UNKNOWN_SIZE`] for one that cannot be read), fetching the samples
/// whose size is not known yet on a few threads: at the first exchange, part of what a rank
/// sends may not be staged yet, and one copy at a time from a parallel filesystem is slow.
/// The samples `hold` marks (those of a disk hand-off) are fetched into the cache first: one that cannot be (the source failing, a partial cache without room
/// for it) is [`UNKNOWN_SIZE`], and the receiver fetches it. Once the source answers
/// as a store that refuses every request or is away (`ConnectionRefused`), the held
/// samples left are not asked for (each would wait out the same answer): listed unknown.
pub(super) fn resolve_held(store: &SampleStore, ids: &[SampleId], hold: &[bool]) -> Vec<u64> {
    const THREADS: usize = 4;
    let away = std::sync::atomic::AtomicBool::new(false);
    let resolve = |i: usize| {
        let id = ids[i];
        let staged = match held(hold, i) && !store.contains(id) {
            false => Ok(()),
            true if away.load(Ordering::Relaxed) => return UNKNOWN_SIZE,
            true => store.ensure(id),
        };
        staged.and_then(|()| store.resolve_size(id)).unwrap_or_else(|e| {
            if e.kind() == std::io::ErrorKind::ConnectionRefused {
                away.store(true, Ordering::Relaxed);
            }
            tracing::warn!(sample = id, error = %e, "cannot read a sample to send; receiver will refetch");
            UNKNOWN_SIZE
        })
    };
    if all_at_hand(store, ids, hold) {
        return (0..ids.len()).map(resolve).collect();
    }
    let sizes: Vec<AtomicU64> = ids.iter().map(|_| AtomicU64::new(UNKNOWN_SIZE)).collect();
    let next = AtomicUsize::new(0);
    thread::scope(|scope| {
        for _ in 0..THREADS.min(ids.len()) {
            scope.spawn(|| {
                idle_io_priority();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= ids.len() {
                        break;
                    }
                    sizes[i].store(resolve(i), Ordering::Relaxed);
                }
            });
        }
    });
    sizes.into_iter().map(AtomicU64::into_inner).collect()
}
