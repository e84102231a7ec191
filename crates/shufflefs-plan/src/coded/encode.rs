//! Alg. 2 (encoding): for each index set, packet `t` XORs the `t`-th sample of every column
//! that still has one, and is multicast to the whole set.
//!
//! Any member decodes its part (Alg. 3, [`decode`](super::decode)) because every other part
//! sits in a column whose samples all of the set but their owner cache; carpool moves keep
//! that true since they only move a sample into a subset of the nodes that cache it.
//!
//! Which samples share a row is free: any pairing decodes. [`encode_by_size`] pairs the
//! longest samples of each column with each other (each column sorted by length, longest
//! first), so that with samples of different sizes a packet's zero padding (it is as long
//! as its longest part, see [`packet`](super::packet)) is small. It changes only the
//! pairing, never how many packets a set sends, so every rank can still count the packets
//! of each group with plain [`plan`](super::plan).

use super::Transmission;
use super::index::{Table, members};
use crate::plan::SampleId;

/// Packets in ascending mask order, then row order.
pub(crate) fn encode(table: &Table) -> Vec<Transmission> {
    rows(table)
}

/// Like [`encode`], with each column ordered by `len` (longest first, ties by sample id).
pub(crate) fn encode_by_size(table: &Table, len: &dyn Fn(SampleId) -> u64) -> Vec<Transmission> {
    let mut sorted = table.clone();
    for col in sorted.sets.values_mut().flat_map(|cols| cols.values_mut()) {
        col.sort_by_key(|&s| (std::cmp::Reverse(len(s)), s));
    }
    rows(&sorted)
}

fn rows(table: &Table) -> Vec<Transmission> {
    let mut out = Vec::with_capacity(table.packet_count());
    for (&set, cols) in &table.sets {
        let group: Vec<_> = members(set).collect();
        let rows = cols.values().map(Vec::len).max().unwrap_or(0);
        for t in 0..rows {
            let parts = cols
                .iter()
                .filter_map(|(&node, col)| col.get(t).map(|&s| (s, node)))
                .collect();
            out.push(Transmission {
                parts,
                group: group.clone(),
            });
        }
    }
    out
}
