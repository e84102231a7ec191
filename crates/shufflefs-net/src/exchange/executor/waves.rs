//! Waves: how a round's streams are run a few at a time when all of them at once would
//! hold more frames than the budget allows (see the executor's docs, "A frame budget for
//! any number of ranks").
//!
//! The stream from rank `a` to rank `b` of an `M`-rank job has the shift
//! `d = (b - a) mod M`, in `1..M`: at each shift every rank sends one stream and receives
//! one. A wave is `width` consecutive shifts, so in any wave a rank has at most `width`
//! streams out and `width` in, whatever `M` is, and both ends of a stream put it in the same
//! wave: the wave is a function of (a, b, M, width), all of which both ends know.
//! A round's waves run as rounds of their own, in order (a rank skips the waves it has no
//! stream in).

use std::collections::BTreeMap;

use super::super::schedule::{Round, RoundOp, Schedule};
use crate::plan::Rank;

/// The wave of the stream from `from` to `to` among `size` ranks.
pub(super) fn wave(from: Rank, to: Rank, size: u32, width: usize) -> usize {
    let size = u64::from(size.max(1));
    let shift = (u64::from(to) + size - u64::from(from) % size) % size;
    (shift.max(1) as usize - 1) / width.max(1)
}

/// `schedule` as `me` runs it: each round split into its waves, in order; waves where `me`
/// has no stream are left out.
pub(super) fn split(schedule: &Schedule, me: Rank, size: u32, width: usize) -> Schedule {
    let mut rounds = Vec::new();
    for round in &schedule.rounds {
        let mut waves: BTreeMap<usize, Vec<RoundOp>> = BTreeMap::new();
        for op in &round.ops {
            let peer = op.stream().peer;
            let (from, to) = match op.is_outgoing() {
                true => (me, peer),
                false => (peer, me),
            };
            (waves.entry(wave(from, to, size, width)).or_default()).push(op.clone());
        }
        rounds.extend(waves.into_values().map(|ops| Round { ops }));
    }
    Schedule { rounds }
}

#[cfg(test)]
mod tests {
    use super::super::super::schedule::Stream;
    use super::*;

    /// Every rank streams to and receives from every other rank in one round.
    fn all_to_all(me: Rank, size: u32) -> Schedule {
        let stream = |peer| Stream {
            peer,
            samples: vec![u64::from(peer)],
        };
        let ops = (0..size).filter(|&p| p != me).flat_map(|p| {
            let (out, inc) = (stream(p), stream(p));
            [RoundOp::Send(out), RoundOp::Recv(inc)]
        });
        Schedule {
            rounds: vec![Round { ops: ops.collect() }],
        }
    }

    #[test]
    fn both_ends_of_a_stream_run_it_in_the_same_wave_and_no_wave_is_wider() {
        for (size, width) in [(2, 1), (7, 2), (16, 3), (64, 14), (65, 64)] {
            let splits: Vec<Schedule> = (0..size)
                .map(|r| split(&all_to_all(r, size), r, size, width))
                .collect();
            for (me, s) in splits.iter().enumerate() {
                let me = me as Rank;
                for (k, round) in s.rounds.iter().enumerate() {
                    let outs = round.ops.iter().filter(|o| o.is_outgoing()).count();
                    assert!(outs <= width && round.ops.len() - outs <= width);
                    for op in &round.ops {
                        let (from, to) = match op.is_outgoing() {
                            true => (me, op.stream().peer),
                            false => (op.stream().peer, me),
                        };
                        assert_eq!(k, wave(from, to, size, width), "{from}->{to}");
                    }
                }
                let all: usize = s.rounds.iter().map(|r| r.ops.len()).sum();
                assert_eq!(all, 2 * (size as usize - 1));
                assert_eq!(s.rounds.len(), (size as usize - 1).div_ceil(width));
            }
        }
    }

    #[test]
    fn a_width_covering_every_peer_keeps_the_round_whole() {
        let s = all_to_all(3, 8);
        assert_eq!(split(&s, 3, 8, 7), s);
    }
}
