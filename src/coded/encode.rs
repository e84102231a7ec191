//! Alg. 2 (encoding): for each index set, packet `t` XORs the `t`-th sample of every column
//! that still has one, and is multicast to the whole set.
//!
//! Any member decodes its part (Alg. 3, [`decode`](super::decode)) because every other part
//! sits in a column whose samples all of the set but their owner cache; carpool moves keep
//! that true since they only move a sample into a subset of the nodes that cache it.

use super::Transmission;
use super::index::{Table, members};

/// Packets in ascending mask order, then row order.
pub fn encode(table: &Table) -> Vec<Transmission> {
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
