//! Who talks to whom, when, about which samples: a [`Strategy`] turns the plan's transfers
//! into a [`Schedule`], a pure function of (transfers, ranks, hosts), so every rank derives
//! its part of the same schedule without any message. The executor then moves the bytes of
//! whatever schedule it is given, so a new way of moving samples (two-level over hosts,
//! multicast of a sample many ranks need, coded rounds) is a new strategy and, for a new kind
//! of operation, a new [`RoundOp`] variant the executor must learn (its `match` has no
//! catch-all arm, so adding one is a compile error until it does).
//!
//! What every strategy must guarantee, checked by [`check`] in the tests:
//! - each transfer is in exactly one `Send` on its sender and the matching `Recv` on its
//!   receiver, in the same round;
//! - both sides list a stream's samples in the same order (the stream order on the wire);
//! - within a round a rank sends at most one stream to a peer and receives at most one from
//!   it (messages of a pair are matched in order, so two would be ambiguous).

use std::collections::BTreeMap;

use crate::plan::{Rank, SampleId, Transfer};

/// The ranks an exchange runs on, as one rank sees them.
#[derive(Clone, Copy, Debug)]
pub struct Topology<'a> {
    pub me: Rank,
    /// Host of each rank (see `Comm::hosts`); its length is the number of ranks.
    pub hosts: &'a [u32],
}

impl Topology<'_> {
    pub fn size(&self) -> u32 {
        self.hosts.len() as u32
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
    #[default]
    Ring,
}

impl StrategyKind {
    pub fn strategy(self) -> &'static dyn Strategy {
        match self {
            StrategyKind::Ring => &Ring,
        }
    }
}

/// Rounds `d = 1..M` pair every rank `r` with `r+d` (send) and `r-d` (receive), so all links
/// are busy and no cycle of blocking sends can form. Every pair gets its streams even when
/// they are empty (the size list, trailer and confirmation still travel), which keeps the
/// wire protocol what it was before schedules existed. Streams run in sample id order.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ring;

impl Strategy for Ring {
    fn schedule(&self, topology: Topology<'_>, transfers: &[Transfer]) -> Schedule {
        let (me, world) = (topology.me, topology.size());
        let mut out: BTreeMap<Rank, Vec<SampleId>> = BTreeMap::new();
        let mut inc: BTreeMap<Rank, Vec<SampleId>> = BTreeMap::new();
        for t in transfers {
            if t.from == me && t.to != me {
                out.entry(t.to).or_default().push(t.sample);
            } else if t.to == me && t.from != me {
                inc.entry(t.from).or_default().push(t.sample);
            }
        }
        let stream = |lists: &mut BTreeMap<Rank, Vec<SampleId>>, peer: Rank| {
            let mut samples = lists.remove(&peer).unwrap_or_default();
            samples.sort_unstable();
            Stream { peer, samples }
        };
        let rounds = (1..world)
            .map(|d| {
                let (to, from) = ((me + d) % world, (me + world - d) % world);
                Round {
                    ops: vec![
                        RoundOp::Send(stream(&mut out, to)),
                        RoundOp::Recv(stream(&mut inc, from)),
                    ],
                }
            })
            .collect();
        Schedule { rounds }
    }
}

/// Checks the guarantees of the module docs for the schedules of all ranks; the error names
/// the first one broken.
pub fn check(strategy: &dyn Strategy, hosts: &[u32], transfers: &[Transfer]) -> Result<(), String> {
    let schedules: Vec<Schedule> = (0..hosts.len() as Rank)
        .map(|me| strategy.schedule(Topology { me, hosts }, transfers))
        .collect();
    // (round, from, to) -> the stream as the sender and as the receiver list it.
    let mut sent: BTreeMap<(usize, Rank, Rank), &[SampleId]> = BTreeMap::new();
    let mut received: BTreeMap<(usize, Rank, Rank), &[SampleId]> = BTreeMap::new();
    for (me, schedule) in schedules.iter().enumerate() {
        let me = me as Rank;
        for (k, round) in schedule.rounds.iter().enumerate() {
            for op in &round.ops {
                let (key, seen) = match op {
                    RoundOp::Send(s) => ((k, me, s.peer), &mut sent),
                    RoundOp::Recv(s) => ((k, s.peer, me), &mut received),
                };
                let stream = match op {
                    RoundOp::Send(s) | RoundOp::Recv(s) => s,
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
        .flat_map(|(&(_, from, to), ids)| ids.iter().map(move |&id| (id, from, to)))
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
        fn ring_schedules_fit_together(
            hosts in prop::collection::vec(0u32..3, 1..9),
            moves in prop::collection::vec((0u32..500, 0u32..64, 0u32..64), 0..200),
        ) {
            let t = transfers(hosts.len() as u32, &moves);
            prop_assert_eq!(check(&Ring, &hosts, &t), Ok(()));
        }
    }

    #[test]
    fn ring_pairs_every_rank_with_every_other_once() {
        let t = transfers(4, &[(5, 0, 1), (3, 0, 1), (9, 2, 0)]);
        let s = Ring.schedule(
            Topology {
                me: 0,
                hosts: &[0; 4],
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
            Ring.schedule(Topology { me: 0, hosts: &[0] }, &[])
                .rounds
                .is_empty()
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
                        RoundOp::Recv(s) => s.samples.reverse(),
                        RoundOp::Send(_) => {}
                    }),
                    // Sender sends twice to one peer.
                    (1, 0) => first.push(first[0].clone()),
                    // A transfer goes missing on both sides.
                    (2, 0) | (2, 1) => first.iter_mut().for_each(|op| match op {
                        RoundOp::Send(s) | RoundOp::Recv(s) => {
                            s.samples.retain(|&id| id != 3);
                        }
                    }),
                    _ => {}
                }
                s
            }
        }
        let t = transfers(2, &[(3, 0, 1), (4, 0, 1)]);
        assert_eq!(check(&Ring, &[0, 0], &t), Ok(()));
        for kind in 0..3 {
            assert!(check(&Broken(kind), &[0, 0], &t).is_err(), "{kind}");
        }
    }
}
