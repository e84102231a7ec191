//! Alg. 1 (indexing): every missing sample goes to the table of the exact set of nodes that
//! cache it plus its new owner, in its owner's column.
//!
//! A set of nodes is a `u64` bit mask, so tables are keyed and ordered by mask and a node's
//! membership is one bit test; this bounds `n` at [`MAX_NODES`](super::MAX_NODES), far above
//! the node counts where coding pays (the paper's Section 4.3 merges communicators long
//! before). The table is a plain map so the carpool step can move samples between columns.

use std::collections::BTreeMap;

use super::{Instance, Node};
use crate::plan::SampleId;

/// A set of nodes as a bit mask (bit `i` = node `i`).
pub(crate) type NodeSet = u64;

/// `Z(I, i)`: for each index set `I` (mask) the columns `i in I` that hold samples, each
/// column the samples node `i` needs that (after Alg. 1) the nodes `I \ {i}` all cache.
/// Empty columns and tables are not stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    pub sets: BTreeMap<NodeSet, BTreeMap<Node, Vec<SampleId>>>,
}

impl Table {
    /// `|Z(I, i)|`.
    pub(crate) fn column_len(&self, set: NodeSet, node: Node) -> usize {
        self.sets
            .get(&set)
            .and_then(|cols| cols.get(&node))
            .map_or(0, Vec::len)
    }

    /// Packets the table encodes to: the longest column of each set, summed.
    pub(crate) fn packet_count(&self) -> usize {
        self.sets
            .values()
            .map(|cols| cols.values().map(Vec::len).max().unwrap_or(0))
            .sum()
    }
}

/// The members of `set`, ascending.
pub(crate) fn members(set: NodeSet) -> impl Iterator<Item = Node> {
    (0..64).filter(move |i| set >> i & 1 == 1)
}

/// Alg. 1. Samples are visited in ascending id order, so each column is ascending.
pub(crate) fn index(inst: &Instance) -> Table {
    let mut holders: BTreeMap<SampleId, NodeSet> = BTreeMap::new();
    for node in 0..inst.nodes() {
        for &s in inst.cache(node) {
            *holders.entry(s).or_default() |= 1 << node;
        }
    }
    let mut wanted: Vec<(SampleId, Node)> = (0..inst.nodes())
        .flat_map(|i| inst.missing(i).map(move |s| (s, i)))
        .collect();
    wanted.sort_unstable();
    let mut table = Table::default();
    for (s, owner) in wanted {
        let set = holders.get(&s).copied().unwrap_or(0) | 1 << owner;
        table
            .sets
            .entry(set)
            .or_default()
            .entry(owner)
            .or_default()
            .push(s);
    }
    table
}
