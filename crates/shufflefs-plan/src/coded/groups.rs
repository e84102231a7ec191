//! Communicator merging (paper Section 4.3): a bounded, fixed set of MPI communicators that
//! carries every multicast group of every epoch.
//!
//! # The problem
//!
//! A coded packet goes to its index set, any of the `2^n - n - 1` sets of two or more compute
//! nodes, and MPI multicasts to a set only through a communicator that contains it (plus the
//! server, the root). Creating a communicator is a collective call, far too slow to do per
//! packet, and the number that can exist at once is limited, so the paper creates a fixed set
//! at start-up and sends each packet on a communicator that is a *superset* of its group:
//! members that are not receivers get the packet and drop it ([`decode`](super::packet::decode)
//! returns nothing for them). The price is those extra receptions, which [`MergeCost`] counts.
//!
//! # What Open MPI allows
//!
//! - Every communicator takes a context id (CID). The ob1 PML (the default over TCP and shared
//!   memory, used here) puts it in the 16-bit `hdr_ctx` of each message header and declares
//!   `pml_max_contextid = 65535`; older releases stopped at 2^15 (the paper's Open MPI 1.6).
//!   Running out does not fail cleanly: the CID agreement loop of `ompi_comm_nextcid` is
//!   reported to hang (open-mpi users list).
//! - The CID must be free on every member, so creation is agreed with at least two
//!   allreduces over the parent communicator (`ompi_comm_nextcid`), plus the allgather of
//!   colours of `MPI_Comm_split`; the server is a member of every communicator here, so it
//!   holds one CID per communicator.
//! - Collective components may create hidden sub-communicators per communicator: Open MPI
//!   5's `coll/han` (on by default there, priority 35; off in the 4.1 installed here) splits
//!   each communicator into an intra-node and an inter-node one on first use, tripling the
//!   CIDs spent. Each communicator also costs memory for its collective modules (tens of KB).
//!
//! # The default limit: [`DEFAULT_LIMIT`] = 1024
//!
//! 1024 is 1/64 of ob1's CID space, leaving a factor 3 for hidden `han` sub-communicators and
//! ample room for the rest of the job. Creating them is a one-off start-up cost: measured
//! here (Open MPI 4.1.4, shared memory, 2 oversubscribed cores, a C program creating 1024
//! communicators of the server plus a subset), 0.4 s with 4 compute ranks and 0.7 s
//! (`MPI_Comm_create_group`, rsmpi's `split_by_subgroup`: collective over the members only)
//! or 1.1 s (`MPI_Comm_split`, rsmpi's `split_by_color`: collective over the world) with 8.
//! And 1024 is enough for an *exact* set (every group its own communicator, no extra
//! receptions) up to `n = 10` compute nodes (`2^10 - 11 = 1013`). A user can lower it (e.g.
//! with Open MPI 5 and many other communicators) or raise it; with 4096, `n = 11` and `12`
//! are exact too.
//!
//! # The fixed set
//!
//! It depends only on `(n, limit)` (and the cache fraction, for
//! [`Communicators::for_cache`]), so every rank builds the same one with no communication
//! and the transport creates it once at start-up, in the order of `Communicators::iter`:
//! - If all `2^n - n - 1` groups fit, each group is its own communicator.
//! - Otherwise, following Section 4.3, the nodes are cut into `b` contiguous blocks (sizes
//!   differ by at most one; the paper pairs nodes `2k-1, 2k`) and every union of blocks with
//!   two or more nodes is a communicator; a group goes to the union of the blocks it touches
//!   (the paper's `psi`). Groups of size 2..=`k` may also be kept exact: when caches are
//!   small most index sets are pairs (Theorem 2's terms fall geometrically with the set size
//!   for a small cache overlap `p`), and block merging hurts them most (a pair in two
//!   different blocks of 2 reaches 4 nodes, twice what it needs).
//!   [`Communicators::for_cache`] (the cache fraction is known at start-up) takes, among the
//!   `(k, b)` that fit the limit, the one with the fewest extra receptions under Theorem 2's
//!   traffic model at that fraction (`expected_cost`); `Communicators::new` averages the
//!   model over overlaps 0.05..0.95. Ties go to the larger `b`.
//! - A group goes to its smallest superset in the set: its exact communicator when it has
//!   one, else its block union; one node alone is a [`Route::Unicast`] (a point-to-point
//!   send needs no communicator). Every group has a route: the union of all blocks is all
//!   nodes.
//!
//! Measured on UberShuffle plans (n = 20, q = 4000, limit 1024, extra receptions per needed
//! one): alpha 0.06 (mean group 2.1 nodes): paper's pairing 0.94, `for_cache` 0.22 (pairs
//! exact, 9 blocks); alpha 0.1: 0.89 vs 0.74; alpha 0.2 / 0.35 / 0.55 / 0.8: both pick the
//! paper's ten blocks, 0.76 / 0.62 / 0.44 / 0.25. So at n = 20 merging costs up to about as
//! many bytes again at the receivers; what it costs the server's link depends on Open MPI's
//! broadcast algorithm (a pipelined chain sends each byte out of the root once, a binomial
//! tree once per child of the root, about log2 of the communicator size). At n <= 10 with
//! the default limit it costs nothing. `cargo test --lib coded::groups -- --ignored
//! --nocapture` prints these numbers and the shape chosen for other `n` and limits.
//!
//! # For the transport
//!
//! A packet's route is a function of its group alone, so every rank that runs
//! [`plan`](super::plan) on the epoch's instance knows, in order, which packets travel on each
//! communicator it belongs to (the server may pair samples with
//! [`plan_by_size`](super::plan_by_size): same groups, same order, other parts). Consecutive
//! packets on one communicator can go as one broadcast of their concatenation
//! (`packet::split`), as the paper does.
//!
//! An epoch-dependent merge (choosing communicators from the epoch's actual groups) could do
//! better, but would create communicators every epoch, which is what the paper avoids.

use std::collections::BTreeMap;

use super::index::{NodeSet, members};
use super::{MAX_NODES, Node, Transmission};

/// Communicators created at most, by default (module docs explain the choice).
pub const DEFAULT_LIMIT: usize = 1024;

/// The most a limit may be: ob1's whole context-id space (65535), which the job's other
/// communicators share.
pub(crate) const MAX_LIMIT: usize = 65_535;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GroupsError {
    #[error("{0} compute nodes: between 1 and {MAX_NODES} are supported")]
    Nodes(usize),
    #[error(
        "a communicator limit of 0 cannot carry a multicast: use at least 1 (one broadcast communicator)"
    )]
    ZeroLimit,
    #[error(
        "a communicator limit of {0} exceeds Open MPI's {MAX_LIMIT} context ids (ob1), which the whole job shares: use at most a few thousand (default {DEFAULT_LIMIT})"
    )]
    LimitTooHigh(usize),
    #[error("group {group:#x} is not a non-empty set of nodes 0..{nodes}")]
    BadGroup { group: NodeSet, nodes: usize },
}

/// How a group's packet travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Route {
    /// A one-node group: a point-to-point send from the server to that node.
    Unicast(Node),
    /// Broadcast from the server on communicator `i` of `Communicators::iter`.
    Comm(usize),
}

/// The fixed communicator set for `n` nodes under a limit. Each communicator is the server
/// plus the compute nodes of its mask; the server is rank 0 (the root) in each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Communicators {
    nodes: usize,
    /// Groups up to this size have their own communicator (1: none do).
    exact_upto: usize,
    /// Block of each node.
    block_of: Vec<usize>,
    /// Nodes of each block.
    blocks: Vec<NodeSet>,
    /// Member masks, ascending.
    comms: Vec<NodeSet>,
    index: BTreeMap<NodeSet, usize>,
}

impl Communicators {
    /// The set [`Communicators::new`] picks for `n` nodes and `limit` communicators.
    #[cfg(any(test, feature = "testing"))]
    pub fn new(nodes: usize, limit: usize) -> Result<Communicators, GroupsError> {
        Communicators::choose(nodes, limit, &TRAFFIC_OVERLAPS)
    }

    /// Like `new`, tuned for a known cache fraction `alpha` (each node caches
    /// `alpha q` samples): the traffic model uses the cache overlap `p` that `alpha` gives
    /// (Theorem 2) instead of a spread of overlaps. Still fixed for the whole job.
    pub fn for_cache(nodes: usize, limit: usize, alpha: f64) -> Result<Communicators, GroupsError> {
        let nf = nodes as f64;
        let p = ((alpha - 1.0 / nf) / (1.0 - 1.0 / nf)).clamp(0.01, 0.99);
        Communicators::choose(nodes, limit, &[if p.is_finite() { p } else { 0.5 }])
    }

    fn choose(nodes: usize, limit: usize, overlaps: &[f64]) -> Result<Communicators, GroupsError> {
        if nodes == 0 || nodes > MAX_NODES {
            return Err(GroupsError::Nodes(nodes));
        }
        if limit == 0 {
            return Err(GroupsError::ZeroLimit);
        }
        if limit > MAX_LIMIT {
            return Err(GroupsError::LimitTooHigh(limit));
        }
        if nodes < 63 && (1u64 << nodes) - nodes as u64 - 1 <= limit as u64 {
            return Ok(Communicators::shape(nodes, nodes, nodes));
        }
        // Block unions alone number about 2^b: no b above log2(limit + n) + 1 can fit.
        let b_max = nodes.min((usize::BITS - (limit + nodes).leading_zeros()) as usize + 1);
        debug_assert!(b_max <= 18, "limit <= MAX_LIMIT bounds the block count");
        let mut best: Option<(f64, Communicators)> = None;
        for k in 1..nodes {
            if exact_count(nodes, k) >= limit as u64 {
                break;
            }
            // The largest block count that still fits with groups up to k exact.
            let Some(c) = (1..=b_max)
                .rev()
                .map(|b| Communicators::shape(nodes, k, b))
                .find(|c| c.len() <= limit)
            else {
                continue;
            };
            let cost = expected_cost(&c, overlaps);
            if best.as_ref().is_none_or(|(b, _)| cost < *b - 1e-9) {
                best = Some((cost, c));
            }
        }
        Ok(best
            .expect("k = 1, b = 1 (one broadcast communicator) always fits")
            .1)
    }

    /// Groups of size `2..=exact_upto` exact, `blocks` contiguous blocks for the rest. The
    /// caller bounds the size (`new` only asks for shapes near the limit).
    fn shape(nodes: usize, exact_upto: usize, blocks: usize) -> Communicators {
        let b = blocks.clamp(1, nodes);
        let block_of: Vec<usize> = (0..nodes).map(|i| i * b / nodes).collect();
        let mut block_sets: Vec<NodeSet> = vec![0; b];
        for (i, &blk) in block_of.iter().enumerate() {
            block_sets[blk] |= 1 << i;
        }
        let mut all: Vec<NodeSet> = Vec::new();
        if exact_upto >= 2 {
            subsets_upto(nodes, exact_upto.min(nodes), &mut all);
        }
        if exact_upto < nodes {
            for pick in 1u64..(1 << b) {
                let set = members(pick).fold(0, |m, blk| m | block_sets[blk]);
                if set.count_ones() >= 2 {
                    all.push(set);
                }
            }
        }
        all.sort_unstable();
        all.dedup();
        let index = all.iter().enumerate().map(|(i, &s)| (s, i)).collect();
        Communicators {
            nodes,
            exact_upto: exact_upto.min(nodes),
            block_of,
            blocks: block_sets,
            comms: all,
            index,
        }
    }

    /// How many communicators the transport creates.
    pub fn len(&self) -> usize {
        self.comms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Groups up to this size travel on a communicator of exactly their members.
    pub fn exact_upto(&self) -> usize {
        self.exact_upto
    }

    /// The node blocks used for larger groups (one block per node when all are exact).
    pub(crate) fn blocks(&self) -> &[NodeSet] {
        &self.blocks
    }

    /// Communicator `i`'s compute nodes (the server is in every one).
    pub fn members(&self, i: usize) -> NodeSet {
        self.comms[i]
    }

    /// Member masks in creation order (ascending mask), the same on every rank.
    pub fn iter(&self) -> impl Iterator<Item = NodeSet> + '_ {
        self.comms.iter().copied()
    }

    /// The communicators node `node` belongs to (and must take part in creating), ascending.
    #[cfg(test)]
    pub(crate) fn containing(&self, node: Node) -> impl Iterator<Item = usize> + '_ {
        (self.comms.iter().enumerate())
            .filter(move |&(_, &m)| node < 64 && m >> node & 1 == 1)
            .map(|(i, _)| i)
    }

    /// World ranks of communicator `i` in its rank order: the server first (rank 0, the root
    /// of every broadcast), then the nodes ascending, mapped by `rank_of`.
    #[cfg(test)]
    pub(crate) fn ranks<R>(&self, i: usize, server: R, rank_of: impl Fn(Node) -> R) -> Vec<R> {
        std::iter::once(server)
            .chain(members(self.comms[i]).map(rank_of))
            .collect()
    }

    /// The route of a group (a mask of compute nodes): its smallest superset in the set.
    pub fn route(&self, group: NodeSet) -> Result<Route, GroupsError> {
        let all = if self.nodes == 64 {
            u64::MAX
        } else {
            (1 << self.nodes) - 1
        };
        if group == 0 || group & !all != 0 {
            return Err(GroupsError::BadGroup {
                group,
                nodes: self.nodes,
            });
        }
        if group.count_ones() == 1 {
            return Ok(Route::Unicast(group.trailing_zeros() as Node));
        }
        let target = if group.count_ones() as usize <= self.exact_upto {
            group
        } else {
            members(group).fold(0, |m, i| m | self.blocks[self.block_of[i]])
        };
        Ok(Route::Comm(self.index[&target]))
    }

    /// Compute nodes that receive a packet sent on `route`.
    pub fn reached(&self, route: Route) -> NodeSet {
        match route {
            Route::Unicast(n) => 1 << n,
            Route::Comm(i) => self.comms[i],
        }
    }
}

/// `sum_{i=2..=k} C(n, i)`, saturating.
fn exact_count(n: usize, k: usize) -> u64 {
    let mut c: u64 = n as u64; // C(n, 1)
    let mut total: u64 = 0;
    for i in 2..=k.min(n) {
        c = c.saturating_mul((n - i + 1) as u64) / i as u64;
        total = total.saturating_add(c);
    }
    total
}

/// Every subset of `0..n` with 2..=k members.
fn subsets_upto(n: usize, k: usize, out: &mut Vec<NodeSet>) {
    fn rec(n: usize, k: usize, start: usize, set: NodeSet, out: &mut Vec<NodeSet>) {
        if set.count_ones() >= 2 {
            out.push(set);
        }
        if set.count_ones() as usize == k {
            return;
        }
        for i in start..n {
            rec(n, k, i + 1, set | 1 << i, out);
        }
    }
    rec(n, k, 0, 0, out);
}

/// Cache overlaps [`Communicators::new`] weighs equally when the cache fraction is unknown.
#[cfg(any(test, feature = "testing"))]
pub(crate) const TRAFFIC_OVERLAPS: [f64; 10] =
    [0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95];

/// Expected extra receptions per needed reception of a fixed set under Theorem 2's traffic
/// model, the mean of that ratio over the cache overlaps `p` given (the probability that a
/// node other than the previous owner caches a sample): a set of size `i`
/// carries packets in proportion to `(i - 1) p^(i-2) (1-p)^(n-i+1)`, the same for every set
/// of that size. The extra receptions of one set of size `i` depend only on which blocks it
/// touches, so they are counted by block occupancy (exactly, by dynamic programming over the
/// blocks) rather than by listing all `2^n` sets.
pub(crate) fn expected_cost(c: &Communicators, overlaps: &[f64]) -> f64 {
    let n = c.nodes;
    // reach[i] = sum over sets of size i of |route(set)| (for i > exact_upto).
    let sizes: Vec<usize> = c.blocks.iter().map(|b| b.count_ones() as usize).collect();
    // poly[i] = (number of sets of size i, total reached nodes over them)
    let mut poly = vec![(0f64, 0f64); n + 1];
    poly[0] = (1.0, 0.0);
    for &s in &sizes {
        let mut next = vec![(0f64, 0f64); n + 1];
        for (i, &(cnt, reach)) in poly.iter().enumerate() {
            if cnt == 0.0 {
                continue;
            }
            for j in 0..=s {
                if i + j > n {
                    break;
                }
                let ways = binom(s, j);
                let add = if j > 0 { s as f64 } else { 0.0 };
                next[i + j].0 += cnt * ways;
                next[i + j].1 += (reach + cnt * add) * ways;
            }
        }
        poly = next;
    }
    let mut sum = 0.0;
    for &p in overlaps {
        let (mut need_total, mut extra_total) = (0.0, 0.0);
        for (i, &(cnt, reach)) in poly.iter().enumerate().skip(2) {
            let per_set =
                (i - 1) as f64 * p.powi(i as i32 - 2) * (1.0 - p).powi((n - i + 1) as i32);
            let need = cnt * i as f64;
            let extra = if i <= c.exact_upto { 0.0 } else { reach - need };
            need_total += per_set * need;
            extra_total += per_set * extra;
        }
        if need_total > 0.0 {
            sum += extra_total / need_total;
        }
    }
    sum / overlaps.len().max(1) as f64
}

fn binom(n: usize, k: usize) -> f64 {
    (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
}

/// The mask of a transmission's group.
pub fn group_mask(tx: &Transmission) -> NodeSet {
    tx.group.iter().fold(0, |m, &i| m | 1 << i)
}

/// What merging cost one epoch: receptions (one node getting one packet) and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MergeCost {
    pub packets: u64,
    /// Receptions by group members (what an exact communicator per group would deliver).
    pub needed_receptions: u64,
    /// Receptions by non-members, who discard the packet.
    pub extra_receptions: u64,
    pub needed_bytes: u64,
    pub extra_bytes: u64,
}

impl MergeCost {
    /// Extra bytes received per needed byte (0 when nothing is sent).
    pub fn extra_ratio(&self) -> f64 {
        if self.needed_bytes == 0 {
            0.0
        } else {
            self.extra_bytes as f64 / self.needed_bytes as f64
        }
    }
}

/// The routes of an epoch's packets, given as `(group, packet bytes)`, and what merging
/// costs over exact communicators.
pub fn route_all(
    comms: &Communicators,
    packets: impl IntoIterator<Item = (NodeSet, u64)>,
) -> Result<(Vec<Route>, MergeCost), GroupsError> {
    let mut cost = MergeCost::default();
    let mut routes = Vec::new();
    for (group, bytes) in packets {
        let route = comms.route(group)?;
        let need = u64::from(group.count_ones());
        let extra = u64::from(comms.reached(route).count_ones()) - need;
        cost.packets += 1;
        cost.needed_receptions += need;
        cost.extra_receptions += extra;
        cost.needed_bytes += need * bytes;
        cost.extra_bytes += extra * bytes;
        routes.push(route);
    }
    Ok((routes, cost))
}

#[cfg(test)]
mod tests;
