//! Coded shuffling (UberShuffle, Chung et al.): the pure planning layer.
//!
//! Setting: one server holds the whole dataset, `n` compute nodes each cache a set
//! `C_i` of samples, and every epoch node `i` is assigned a fresh share `D_i`. The server must
//! send every node the samples of its share it does not cache. This module decides *what* the
//! server sends, as plain functions of `(C, D)`: no I/O, no clocks, no MPI, so the same inputs
//! give the same packets on the server and on every node (which re-run the indexing to learn
//! what each packet they receive carries, as the paper's Section 2.2 describes).
//!
//! Three schemes ([`Scheme`]):
//! - `uncoded`: one unicast per missing demand (paper Section 2.1, Theorem 1).
//! - `coded`: Alg. 1 indexes each missing sample by the exact set of nodes that cache it plus
//!   its new owner; Alg. 2 XORs one sample per member column of each such set into a packet
//!   multicast to the set; Alg. 3 decodes by XORing out the cached samples (`index`,
//!   `encode`).
//! - `ubershuffle`: Alg. 4 moves samples from a column of a superset's table into the same
//!   column of a subset's table where it fills a gap ("carpool"), searching supersets up to
//!   `nu` sizes larger (`carpool`).
//!
//! A [`Transmission`] is the list of `(sample, receiver)` pairs it carries (the packet is the
//! XOR of those samples) and the group it is multicast to. [`verify`] is the decoder check:
//! every missing demand arrives exactly once and each receiver caches every other sample of
//! its packet. [`next_instance`] turns the seeded random caches and shares of
//! `plan::placement` (the plan's, also averaged over by the calculator, [`calc`]) into one
//! epoch's problem. [`packet`] is the wire format of one transmission (samples of
//! different sizes XORed with zero padding, CRC-checked on decode); [`groups`] is the fixed,
//! bounded set of MPI communicators every multicast group rides on (communicator merging,
//! Section 4.3). Not in this module: the server rank, the transport and the exchange that
//! moves the bytes (`exchange::coded`, following the plan variant `plan::coded`).

pub mod calc;
pub(crate) mod carpool;
pub(crate) mod encode;
pub mod groups;
pub(crate) mod index;
pub mod packet;

use std::collections::{BTreeMap, BTreeSet};

use crate::plan::SampleId;
use crate::plan::coded_keep::CodedPlacement;
pub use crate::plan::placement::MAX_NODES;
use crate::plan::placement::RandomPlacement;

/// A compute node, `0..n`.
pub type Node = usize;

/// UberShuffle's default search depth: the paper's simulations (Fig. 5) use `nu = 2`.
pub const DEFAULT_NU: usize = 2;

/// Which packets the server sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Uncoded,
    Coded,
    /// Coded plus carpool reallocation up to `nu` sizes up.
    Ubershuffle {
        nu: usize,
    },
}

impl Scheme {
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Uncoded => "uncoded",
            Scheme::Coded => "coded",
            Scheme::Ubershuffle { .. } => "ubershuffle",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum InstanceError {
    #[error("{0} compute nodes: between 1 and {MAX_NODES} are supported")]
    Nodes(usize),
    #[error("caches and demands must both name {nodes} nodes (got {caches} and {demands})")]
    Shape {
        nodes: usize,
        caches: usize,
        demands: usize,
    },
    #[error("sample {sample} is demanded by both node {a} and node {b}")]
    SharedDemand { sample: SampleId, a: Node, b: Node },
}

/// One epoch's shuffling problem: what each node caches and what it needs next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    caches: Vec<BTreeSet<SampleId>>,
    demands: Vec<BTreeSet<SampleId>>,
}

impl Instance {
    /// Demands must be disjoint (each sample has one new owner, as in the paper).
    pub(crate) fn new(
        caches: Vec<BTreeSet<SampleId>>,
        demands: Vec<BTreeSet<SampleId>>,
    ) -> Result<Instance, InstanceError> {
        let n = caches.len();
        if demands.len() != n {
            return Err(InstanceError::Shape {
                nodes: n,
                caches: caches.len(),
                demands: demands.len(),
            });
        }
        if n == 0 || n > MAX_NODES {
            return Err(InstanceError::Nodes(n));
        }
        let mut owner: BTreeMap<SampleId, Node> = BTreeMap::new();
        for (node, d) in demands.iter().enumerate() {
            for &s in d {
                if let Some(a) = owner.insert(s, node) {
                    return Err(InstanceError::SharedDemand {
                        sample: s,
                        a,
                        b: node,
                    });
                }
            }
        }
        Ok(Instance { caches, demands })
    }

    pub fn nodes(&self) -> usize {
        self.caches.len()
    }

    pub(crate) fn cache(&self, node: Node) -> &BTreeSet<SampleId> {
        &self.caches[node]
    }

    pub(crate) fn demand(&self, node: Node) -> &BTreeSet<SampleId> {
        &self.demands[node]
    }

    /// `U_i = D_i \ C_i`: what node `i` needs from the server, ascending.
    pub fn missing(&self, node: Node) -> impl Iterator<Item = SampleId> + '_ {
        self.demands[node].difference(&self.caches[node]).copied()
    }

    /// Total missing demands: the uncoded transmission count.
    #[cfg(test)]
    pub(crate) fn missing_count(&self) -> usize {
        (0..self.nodes()).map(|i| self.missing(i).count()).sum()
    }
}

/// The problem of moving `placement` from its current epoch to the next, then applies the
/// update rule so the following call plans the epoch after.
pub fn next_instance(placement: &mut RandomPlacement) -> Instance {
    let (caches, demands) = placement.advance();
    Instance::new(caches, demands).expect("balanced shares of a permutation are disjoint")
}

/// [`next_instance`] of a coded run's placement: over the kept sets when its cache does not
/// fit (`plan::coded_keep`), else the same problem.
pub fn next_placed_instance(placement: &mut CodedPlacement) -> Instance {
    let (caches, demands) = placement.advance();
    Instance::new(caches, demands).expect("parts of balanced shares of a permutation are disjoint")
}

/// One packet from the server: the XOR of `parts`' samples, multicast to `group`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmission {
    /// `(sample, receiver)`: `receiver` decodes `sample` from this packet. Distinct receivers.
    pub parts: Vec<(SampleId, Node)>,
    /// The nodes the packet is sent to, ascending: every receiver, and for coded packets the
    /// whole index set (members with nothing to decode discard it).
    pub group: Vec<Node>,
}

impl Transmission {
    /// The nodes that must decode this packet, in `parts` order.
    pub fn receivers(&self) -> impl Iterator<Item = Node> + '_ {
        self.parts.iter().map(|&(_, r)| r)
    }
}

/// The server's packets for `inst` under `scheme`, in a deterministic order.
pub fn plan(inst: &Instance, scheme: Scheme) -> Vec<Transmission> {
    match scheme {
        Scheme::Uncoded => uncoded(inst),
        Scheme::Coded => encode::encode(&index::index(inst)),
        Scheme::Ubershuffle { nu } => {
            let mut table = index::index(inst);
            carpool::carpool(&mut table, nu);
            encode::encode(&table)
        }
    }
}

/// [`plan`] with the samples of each packet matched by length (`len` gives a sample's
/// bytes), so packets of samples with different sizes carry little zero padding; the same
/// packets per group as [`plan`] (see `encode::encode_by_size`). Uncoded plans are the
/// same.
pub fn plan_by_size(
    inst: &Instance,
    scheme: Scheme,
    len: &dyn Fn(SampleId) -> u64,
) -> Vec<Transmission> {
    match scheme {
        Scheme::Uncoded => uncoded(inst),
        Scheme::Coded => encode::encode_by_size(&index::index(inst), len),
        Scheme::Ubershuffle { nu } => {
            let mut table = index::index(inst);
            carpool::carpool(&mut table, nu);
            encode::encode_by_size(&table, len)
        }
    }
}

/// Section 2.1: node by node, each missing demand as a unicast.
fn uncoded(inst: &Instance) -> Vec<Transmission> {
    (0..inst.nodes())
        .flat_map(|i| {
            inst.missing(i).map(move |s| Transmission {
                parts: vec![(s, i)],
                group: vec![i],
            })
        })
        .collect()
}

/// Alg. 3 on sample ids: what `node` recovers from `tx` given its cache, or `None` when the
/// packet carries nothing for it or it lacks another sample of the packet.
pub(crate) fn decode(
    tx: &Transmission,
    node: Node,
    cache: &BTreeSet<SampleId>,
) -> Option<SampleId> {
    let mut mine = tx.parts.iter().filter(|&&(_, r)| r == node);
    let &(want, _) = mine.next()?;
    if mine.next().is_some() {
        return None;
    }
    tx.parts
        .iter()
        .filter(|&&(s, r)| !(s == want && r == node))
        .all(|(s, _)| cache.contains(s))
        .then_some(want)
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("packet {packet} is empty")]
    Empty { packet: usize },
    #[error("packet {packet}: node {node} decodes it but is not in its group")]
    NotInGroup { packet: usize, node: Node },
    #[error("packet {packet}: node {node} cannot decode sample {sample}")]
    Undecodable {
        packet: usize,
        node: Node,
        sample: SampleId,
    },
    #[error("sample {sample} sent to node {node}, which caches it or does not need it")]
    Unneeded { sample: SampleId, node: Node },
    #[error("sample {sample} reaches node {node} {times} times")]
    Duplicate {
        sample: SampleId,
        node: Node,
        times: usize,
    },
    #[error("sample {sample} never reaches node {node}")]
    Missing { sample: SampleId, node: Node },
}

/// The decoder check: every packet is decodable by each of its receivers (Alg. 3) and every
/// missing demand is delivered exactly once, nothing else.
pub fn verify(inst: &Instance, txs: &[Transmission]) -> Result<(), DecodeError> {
    let mut got: BTreeMap<(SampleId, Node), usize> = BTreeMap::new();
    for (packet, tx) in txs.iter().enumerate() {
        if tx.parts.is_empty() {
            return Err(DecodeError::Empty { packet });
        }
        for &(sample, node) in &tx.parts {
            if node >= inst.nodes() || tx.group.binary_search(&node).is_err() {
                return Err(DecodeError::NotInGroup { packet, node });
            }
            if !inst.demand(node).contains(&sample) || inst.cache(node).contains(&sample) {
                return Err(DecodeError::Unneeded { sample, node });
            }
            if decode(tx, node, inst.cache(node)) != Some(sample) {
                return Err(DecodeError::Undecodable {
                    packet,
                    node,
                    sample,
                });
            }
            *got.entry((sample, node)).or_default() += 1;
        }
    }
    for node in 0..inst.nodes() {
        for sample in inst.missing(node) {
            match got.get(&(sample, node)) {
                None => return Err(DecodeError::Missing { sample, node }),
                Some(&1) => {}
                Some(&times) => {
                    return Err(DecodeError::Duplicate {
                        sample,
                        node,
                        times,
                    });
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
