//! A partial cache within its size from the mount on: a cache filled under a
//! larger room (a full cache remounted with a smaller `--cache-size`, a disk that shrank)
//! would otherwise stay over its size for good, since the gate only refuses new writes
//! (a rank stayed at 3 MB under `--cache-size 1M`, its status claiming a hit rate of 0.34
//! next to a measured 1.0). At the mount, after the gate is set and before staging, the
//! samples the plan does not keep now go until the cache is within its size; the kept ones
//! stay (the plan fits them in the room). Only samples of this store, in its own folder.

use super::SampleStore;
use crate::plan::SampleId;

/// Drops cached samples the partial cache's gate does not want, those outside `share`
/// first, until the cache holds no more than its size; how many went. Nothing outside a
/// partial cache.
pub fn to_room(store: &SampleStore, share: &[SampleId]) -> usize {
    let Some(gate) = store.partial() else {
        return 0;
    };
    if store.held_bytes() <= gate.capacity() {
        return 0;
    }
    let in_share = |id: &SampleId| share.binary_search(id).is_ok();
    let unkept: Vec<SampleId> = (store.held().into_iter())
        .filter(|&id| !gate.wanted(id))
        .collect();
    let (outside, inside): (Vec<SampleId>, Vec<SampleId>) =
        unkept.into_iter().partition(|id| !in_share(id));
    let mut dropped = 0;
    for id in outside.into_iter().chain(inside) {
        if store.held_bytes() <= gate.capacity() {
            break;
        }
        match store.remove(id) {
            Ok(()) => dropped += 1,
            Err(e) => {
                tracing::warn!(sample = id, error = %e, "could not drop a sample the partial cache does not keep")
            }
        }
    }
    if dropped > 0 {
        tracing::info!(
            dropped,
            held = store.held_bytes(),
            size = gate.capacity(),
            "dropped cached samples the partial cache does not keep, to be within its size"
        );
    }
    dropped
}
