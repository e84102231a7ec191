//! Who talks to whom, when, about which samples: a [`Strategy`] turns the plan's transfers
//! into a [`Schedule`], a pure function of (transfers, ranks, hosts), so every rank derives
//! its part of the same schedule without any message. The executor then moves the bytes of
//! whatever schedule it is given, so a new way of moving samples (two-level over hosts,
//! multicast of a sample many ranks need, coded rounds) is a new strategy and, for a new kind
//! of operation, a new [`RoundOp`] variant the executor must learn (its `match` has no
//! catch-all arm, so adding one is a compile error until it does).
//!
//! Two ranks that share a disk (see `peers`) move samples by [`RoundOp::Hand`] and
//! [`RoundOp::Take`] instead of `Send`/`Recv`: the receiver takes them from the sender's cache
//! folder, and only their sizes and a confirmation cross the transport. Both built-in
//! strategies do so through [`point_to_point`].
//!
//! What every strategy must guarantee, checked by [`check`] in the tests:
//! - each transfer is in exactly one `Send` (or `Hand`) on its sender and the matching `Recv`
//!   (or `Take`) on its receiver, in the same round;
//! - both sides list a stream's samples in the same order (the stream order on the wire);
//! - within a round a rank sends at most one stream to a peer and receives at most one from
//!   it (messages of a pair are matched in order, so two would be ambiguous).

#[cfg(test)]
use std::collections::BTreeMap;

use crate::plan::{Rank, SampleId, Transfer};

/// The ranks an exchange runs on, as one rank sees them.
#[derive(Clone, Copy, Debug)]
pub struct Topology<'a> {
    pub me: Rank,
    /// Host of each rank (see `Comm::hosts`); its length is the number of ranks.
    pub hosts: &'a [u32],
    /// Disk group of each rank (see `Peers`): ranks of one group take samples from each
    /// other's caches.
    pub disks: &'a [u32],
}

impl Topology<'_> {
    pub(crate) fn size(&self) -> u32 {
        self.hosts.len() as u32
    }

    /// Whether `a` and `b` move samples through their shared disk.
    pub(crate) fn share_disk(&self, a: Rank, b: Rank) -> bool {
        self.disks[a as usize] == self.disks[b as usize]
    }
}

/// One rank's part of an exchange: rounds run one after the other; within a round, all
/// operations are in flight together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    pub rounds: Vec<Round>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub ops: Vec<RoundOp>,
}

/// One thing a rank does in a round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoundOp {
    /// Point-to-point: stream these samples to `peer`.
    Send(Stream),
    /// Point-to-point: receive these samples from `peer`.
    Recv(Stream),
    /// Same disk: `peer` takes these samples from this rank's cache (only their sizes and a
    /// confirmation travel).
    Hand(Stream),
    /// Same disk: take these samples from `peer`'s cache.
    Take(Stream),
}

impl RoundOp {
    pub(crate) fn stream(&self) -> &Stream {
        match self {
            RoundOp::Send(s) | RoundOp::Recv(s) | RoundOp::Hand(s) | RoundOp::Take(s) => s,
        }
    }

    /// Whether this rank is the one the samples leave.
    pub(crate) fn is_outgoing(&self) -> bool {
        matches!(self, RoundOp::Send(_) | RoundOp::Hand(_))
    }
}

/// Samples moving between this rank and one peer, in stream order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stream {
    pub peer: Rank,
    pub samples: Vec<SampleId>,
}

/// Turns a plan step's transfers into this rank's schedule. Must be deterministic: every
/// rank calls it on its own and the results must fit together (see the module docs).
pub trait Strategy {
    fn schedule(&self, topology: Topology<'_>, transfers: &[Transfer]) -> Schedule;
}

/// The strategies the exchange can be told to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StrategyKind {
    /// Every peer at once ([`Direct`]).
    #[default]
    Direct,
    /// One peer each way per round ([`Ring`]).
    Ring,
}

impl StrategyKind {
    pub(crate) fn strategy(self) -> &'static dyn Strategy {
        match self {
            StrategyKind::Direct => &Direct,
            StrategyKind::Ring => &Ring,
        }
    }
}

/// The pair of operations that move `out` to `to` and `inc` from `from`: over the shared
/// disk where the topology allows, else point-to-point.
pub(crate) fn point_to_point(topology: Topology<'_>, to: Stream, from: Stream) -> [RoundOp; 2] {
    let me = topology.me;
    let send = if topology.share_disk(me, to.peer) {
        RoundOp::Hand(to)
    } else {
        RoundOp::Send(to)
    };
    let recv = if topology.share_disk(me, from.peer) {
        RoundOp::Take(from)
    } else {
        RoundOp::Recv(from)
    };
    [send, recv]
}

/// Streams from and to each peer, in sample id order (empty where nothing moves).
fn streams(me: Rank, world: u32, transfers: &[Transfer]) -> (Vec<Stream>, Vec<Stream>) {
    let mut out: Vec<Stream> = (0..world)
        .map(|peer| Stream {
            peer,
            samples: Vec::new(),
        })
        .collect();
    let mut inc = out.clone();
    for t in transfers {
        if t.from == me && t.to != me {
            out[t.to as usize].samples.push(t.sample);
        } else if t.to == me && t.from != me {
            inc[t.from as usize].samples.push(t.sample);
        }
    }
    for s in out.iter_mut().chain(&mut inc) {
        s.samples.sort_unstable();
    }
    (out, inc)
}

/// One round with every peer, both ways: each stream is paced by its own peer and link, so
/// a slow peer holds only its streams, and every link of the rank is busy from the start.
/// Peers are listed from `me + 1` on, so ranks start on different peers. Every pair gets
/// its streams even when they are empty (the size list and confirmation still travel).
#[derive(Clone, Copy, Debug, Default)]
pub struct Direct;

impl Strategy for Direct {
    fn schedule(&self, topology: Topology<'_>, transfers: &[Transfer]) -> Schedule {
        let (me, world) = (topology.me, topology.size());
        if world < 2 {
            return Schedule::default();
        }
        let (mut out, mut inc) = streams(me, world, transfers);
        let ops = (1..world)
            .flat_map(|d| {
                let peer = (me + d) % world;
                let (to, from) = (
                    std::mem::take(&mut out[peer as usize]),
                    std::mem::take(&mut inc[peer as usize]),
                );
                point_to_point(topology, to, from)
            })
            .collect();
        Schedule {
            rounds: vec![Round { ops }],
        }
    }
}

/// Rounds `d = 1..M` pair every rank `r` with `r+d` (send) and `r-d` (receive): one peer
/// each way at a time, the exchange's shape before [`Direct`]; it keeps fewer disk threads
/// busy at once, but a slow peer holds every later round. Every pair gets its streams even
/// when they are empty (the size list and confirmation still travel). Streams run in sample
/// id order.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ring;

impl Strategy for Ring {
    fn schedule(&self, topology: Topology<'_>, transfers: &[Transfer]) -> Schedule {
        let (me, world) = (topology.me, topology.size());
        let (mut out, mut inc) = streams(me, world, transfers);
        let rounds = (1..world)
            .map(|d| {
                let (to, from) = ((me + d) % world, (me + world - d) % world);
                let ops = point_to_point(
                    topology,
                    std::mem::take(&mut out[to as usize]),
                    std::mem::take(&mut inc[from as usize]),
                );
                Round { ops: ops.into() }
            })
            .collect();
        Schedule { rounds }
    }
}

/// Checks the guarantees of the module docs for the schedules of all ranks; the error names
/// the first one broken.
#[cfg(test)]
pub(crate) fn check(
    strategy: &dyn Strategy,
    topology: Topology<'_>,
    transfers: &[Transfer],
) -> Result<(), String> {
    let schedules: Vec<Schedule> = (0..topology.size())
        .map(|me| strategy.schedule(Topology { me, ..topology }, transfers))
        .collect();
    // (round, from, to, by disk) -> the stream as the sender and as the receiver list it.
    type Key = (usize, Rank, Rank, bool);
    let mut sent: BTreeMap<Key, &[SampleId]> = BTreeMap::new();
    let mut received: BTreeMap<Key, &[SampleId]> = BTreeMap::new();
    for (me, schedule) in schedules.iter().enumerate() {
        let me = me as Rank;
        for (k, round) in schedule.rounds.iter().enumerate() {
            for op in &round.ops {
                let stream = op.stream();
                let disk = matches!(op, RoundOp::Hand(_) | RoundOp::Take(_));
                if disk != topology.share_disk(me, stream.peer) {
                    return Err(format!(
                        "ranks {me} and {} move samples the wrong way (by disk: {disk})",
                        stream.peer
                    ));
                }
                let (key, seen) = if op.is_outgoing() {
                    ((k, me, stream.peer, disk), &mut sent)
                } else {
                    ((k, stream.peer, me, disk), &mut received)
                };
                if seen.insert(key, &stream.samples).is_some() {
                    return Err(format!(
                        "two streams {key:?} (round, from, to) in one round"
                    ));
                }
            }
        }
    }
    if sent != received {
        let bad = sent
            .iter()
            .find(|(k, v)| received.get(k) != Some(v))
            .map(|(k, _)| *k)
            .or_else(|| received.keys().find(|k| !sent.contains_key(k)).copied());
        return Err(format!("sender and receiver disagree on stream {bad:?}"));
    }
    let mut moved: Vec<(SampleId, Rank, Rank)> = sent
        .iter()
        .flat_map(|(&(_, from, to, _), ids)| ids.iter().map(move |&id| (id, from, to)))
        .collect();
    let mut want: Vec<(SampleId, Rank, Rank)> = transfers
        .iter()
        .filter(|t| t.from != t.to)
        .map(|t| (t.sample, t.from, t.to))
        .collect();
    moved.sort_unstable();
    want.sort_unstable();
    if moved != want {
        return Err("the streams do not carry exactly the transfers, once each".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Strategy;
    use super::*;
    use proptest::prelude::*;

    fn transfers(world: u32, moves: &[(SampleId, u32, u32)]) -> Vec<Transfer> {
        let mut out: Vec<Transfer> = moves
            .iter()
            .map(|&(sample, a, b)| Transfer {
                sample,
                from: a % world,
                to: b % world,
            })
            .filter(|t| t.from != t.to)
            .collect();
        // A sample moves once per step.
        out.sort_unstable_by_key(|t| t.sample);
        out.dedup_by_key(|t| t.sample);
        out.sort_unstable_by_key(|t| (t.from, t.to, t.sample));
        out
    }

    proptest! {
        #[test]
        fn schedules_fit_together(
            layout in prop::collection::vec((0u32..3, any::<bool>()), 1..9),
            moves in prop::collection::vec((0u64..500, 0u32..64, 0u32..64), 0..200),
        ) {
            // A rank that cannot share its host's disk is a disk group of its own.
            let hosts: Vec<u32> = layout.iter().map(|&(h, _)| h).collect();
            let disks: Vec<u32> = (layout.iter().enumerate())
                .map(|(r, &(h, shared))| if shared { h } else { 100 + r as u32 })
                .collect();
            let topology = Topology { me: 0, hosts: &hosts, disks: &disks };
            let t = transfers(hosts.len() as u32, &moves);
            for kind in [StrategyKind::Direct, StrategyKind::Ring] {
                prop_assert_eq!(check(kind.strategy(), topology, &t), Ok(()));
            }
        }
    }

    #[test]
    fn ring_pairs_every_rank_with_every_other_once() {
        let t = transfers(4, &[(5, 0, 1), (3, 0, 1), (9, 2, 0)]);
        let s = Ring.schedule(
            Topology {
                me: 0,
                hosts: &[0; 4],
                disks: &[0, 1, 2, 3],
            },
            &t,
        );
        let ops: Vec<_> = s.rounds.iter().map(|r| r.ops.clone()).collect();
        let st = |peer, samples: &[SampleId]| Stream {
            peer,
            samples: samples.to_vec(),
        };
        assert_eq!(
            ops,
            vec![
                vec![RoundOp::Send(st(1, &[3, 5])), RoundOp::Recv(st(3, &[]))],
                vec![RoundOp::Send(st(2, &[])), RoundOp::Recv(st(2, &[9]))],
                vec![RoundOp::Send(st(3, &[])), RoundOp::Recv(st(1, &[]))],
            ]
        );
        assert!(
            Ring.schedule(
                Topology {
                    me: 0,
                    hosts: &[0],
                    disks: &[0]
                },
                &[]
            )
            .rounds
            .is_empty()
        );
    }

    /// Direct: one round, every peer both ways, by disk on a shared disk.
    #[test]
    fn direct_talks_to_every_peer_at_once() {
        let t = transfers(3, &[(5, 0, 1), (3, 0, 2), (9, 2, 0)]);
        let s = Direct.schedule(
            Topology {
                me: 0,
                hosts: &[0, 0, 1],
                disks: &[0, 0, 1],
            },
            &t,
        );
        let st = |peer, samples: &[SampleId]| Stream {
            peer,
            samples: samples.to_vec(),
        };
        assert_eq!(
            s.rounds,
            vec![Round {
                ops: vec![
                    RoundOp::Hand(st(1, &[5])),
                    RoundOp::Take(st(1, &[])),
                    RoundOp::Send(st(2, &[3])),
                    RoundOp::Recv(st(2, &[9])),
                ]
            }]
        );
    }

    /// The checker itself catches a schedule that breaks each rule.
    #[test]
    fn check_catches_broken_schedules() {
        struct Broken(u8);
        impl Strategy for Broken {
            fn schedule(&self, topology: Topology<'_>, transfers: &[Transfer]) -> Schedule {
                let mut s = Ring.schedule(topology, transfers);
                let first = &mut s.rounds[0].ops;
                match (self.0, topology.me) {
                    // Receiver lists its samples in another order.
                    (0, 1) => first.iter_mut().for_each(|op| match op {
                        RoundOp::Recv(s) | RoundOp::Take(s) => s.samples.reverse(),
                        RoundOp::Send(_) | RoundOp::Hand(_) => {}
                    }),
                    // Sender sends twice to one peer.
                    (1, 0) => first.push(first[0].clone()),
                    // A transfer goes missing on both sides.
                    (2, 0) | (2, 1) => first.iter_mut().for_each(|op| match op {
                        RoundOp::Send(s)
                        | RoundOp::Recv(s)
                        | RoundOp::Hand(s)
                        | RoundOp::Take(s) => {
                            s.samples.retain(|&id| id != 3);
                        }
                    }),
                    _ => {}
                }
                s
            }
        }
        let t = transfers(2, &[(3, 0, 1), (4, 0, 1)]);
        let topology = Topology {
            me: 0,
            hosts: &[0, 0],
            disks: &[0, 1],
        };
        assert_eq!(check(&Ring, topology, &t), Ok(()));
        for kind in 0..3 {
            assert!(check(&Broken(kind), topology, &t).is_err(), "{kind}");
        }
    }
}
