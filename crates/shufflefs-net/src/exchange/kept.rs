//! A partial cache's exchange moves only what the receiver keeps and gets through it
//! (`plan::keep`): two small rounds before the exchange tell each pair of ranks which of
//! their transfers go.
//!
//! Each rank plans only its own kept sets (`plan::keep_local`), so a receiver cannot know
//! alone whether its sender kept a sample (only a kept one is on the sender's disk to send).
//! First round: each sender tells each of its receivers, one bit per transfer to it in
//! sample order, whether it kept the sample. Second round: each receiver decides
//! ([`Handshake::wanted`]) and answers each sender with one bit per transfer. Both sides then
//! drop the same transfers, since each pair's decision is the receiver's, sent to the
//! sender. A peer with no transfer either way gets no message; a rank with none at all
//! sends and waits for nothing.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

use crate::comm::{Batch, Comm, CommError};
use crate::plan::keep_local::{Handshake, bit, bits};
use crate::plan::{Rank, Step, Transfer};

/// Tags of the two rounds (no other traffic uses them).
const TAG_KEPT: u16 = 0x5401;
const TAG_TAKEN: u16 = 0x5402;

/// `step` (this rank's part of the step out of an epoch) with only the transfers whose
/// receiver takes them through the exchange, agreed with every peer it has a transfer with
/// that `takes_part` accepts (collective over those peers). The transfers with a peer left
/// out stay as they are: the exchange leaves them out itself (and shows them given up).
pub fn filter(
    comm: &mut dyn Comm,
    hs: &Handshake,
    step: &Step,
    takes_part: &dyn Fn(Rank) -> bool,
    abort: &AtomicBool,
) -> Result<Step, CommError> {
    let me = comm.rank();
    let (mut sends, mut incoming) = (BTreeMap::new(), BTreeMap::new());
    let mut left_out = Vec::new();
    for t in &step.transfers {
        match (t.from == me, t.to == me) {
            (true, false) if !takes_part(t.to) => left_out.push(*t),
            (false, true) if !takes_part(t.from) => left_out.push(*t),
            (true, false) => sends.entry(t.to).or_insert_with(Vec::new).push(*t),
            (false, true) => incoming.entry(t.from).or_insert_with(Vec::new).push(*t),
            _ => {}
        }
    }
    sort_by_sample(&mut sends);
    sort_by_sample(&mut incoming);
    let kept = round(
        comm,
        TAG_KEPT,
        (sends.iter()).map(|(&p, ts)| (p, hs.kept_flags(ts))),
        &incoming,
        abort,
    )?;
    let mut all: Vec<(Transfer, bool)> = (incoming.iter())
        .flat_map(|(q, ts)| ts.iter().enumerate().map(|(i, t)| (*t, bit(&kept[q], i))))
        .collect();
    all.sort_unstable_by_key(|(t, _)| t.sample);
    let (ins, flags): (Vec<Transfer>, Vec<bool>) = all.into_iter().unzip();
    let wanted = hs.wanted(&ins, &flags);
    let taken_here: Vec<Transfer> = (ins.iter().zip(&wanted))
        .filter(|(_, w)| **w)
        .map(|(t, _)| *t)
        .collect();
    let answers = (incoming.iter()).map(|(&q, ts)| {
        let taken = |t: &Transfer| taken_here.binary_search_by_key(&t.sample, |x| x.sample);
        (q, bits(ts.iter().map(|t| taken(t).is_ok())))
    });
    let taken_there = round(comm, TAG_TAKEN, answers, &sends, abort)?;
    let mut transfers: Vec<Transfer> = (sends.iter())
        .flat_map(|(p, ts)| {
            let answer = &taken_there[p];
            (ts.iter().enumerate())
                .filter(|(i, _)| bit(answer, *i))
                .map(|(_, t)| *t)
        })
        .chain(taken_here)
        .chain(left_out)
        .collect();
    transfers.sort_unstable_by_key(|t| (t.from, t.to, t.sample));
    Ok(Step {
        next: step.next.clone(),
        transfers,
    })
}

fn sort_by_sample(by_peer: &mut BTreeMap<Rank, Vec<Transfer>>) {
    (by_peer.values_mut()).for_each(|ts| ts.sort_unstable_by_key(|t| t.sample));
}

/// One round: `out` to its peers, and from each peer of `from` one bit per transfer.
fn round(
    comm: &mut dyn Comm,
    tag: u16,
    out: impl Iterator<Item = (Rank, Vec<u8>)>,
    from: &BTreeMap<Rank, Vec<Transfer>>,
    abort: &AtomicBool,
) -> Result<BTreeMap<Rank, Vec<u8>>, CommError> {
    let batch = Batch {
        sends: out.collect(),
        recvs: (from.iter())
            .map(|(&q, ts)| (q, vec![0; ts.len().div_ceil(8)]))
            .collect(),
    };
    if batch.sends.is_empty() && batch.recvs.is_empty() {
        return Ok(BTreeMap::new());
    }
    Ok(comm
        .transfer(tag, batch, abort)?
        .recvs
        .into_iter()
        .collect())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::comm::LocalComm;
    use crate::plan::keep::KeepPlanner;
    use crate::plan::keep_local::{LocalKeep, SizeOf};
    use crate::plan::{Plan, PlanParams};

    /// Four ranks in one process, each planning only its own kept sets, agree through the
    /// two rounds on exactly the transfers the whole-job planner lets through, epoch after
    /// epoch; the sender's and the receiver's halves of each transfer match.
    #[test]
    fn ranks_agree_on_the_whole_job_planners_transfers() {
        let (n, world, horizon) = (160u64, 4u32, 3);
        let size = |s: u64| 1 + s % 5;
        // A share (about 40 x 3 units) fits with room for some arrivals, not all (Q = 0.5).
        let cap = 156;
        let plan = Plan::new(PlanParams {
            samples: n,
            world,
            fraction: 0.5,
            seed: 5,
        })
        .unwrap();
        let sizes: Vec<u64> = (0..n).map(size).collect();
        let mut whole = KeepPlanner::new(plan.clone(), sizes, cap, horizon);
        let mut expected = Vec::new();
        for _ in 0..4 {
            let step = plan.step(whole.shares());
            expected.push(whole.exchanged(&step));
            whole.advance();
        }
        let ranks: Vec<_> = (LocalComm::world(world).into_iter())
            .map(|mut comm| {
                let plan = plan.clone();
                std::thread::spawn(move || {
                    let me = comm.rank();
                    let sized: SizeOf = Arc::new(size);
                    let mut cur = plan.own_initial(me);
                    let mut keep =
                        LocalKeep::new(plan.clone(), me, cur.clone(), &[], (sized, cap), horizon);
                    let mut moved = Vec::new();
                    for epoch in 0..4 {
                        let step = plan.own_step(me, &cur);
                        let hs = keep.handshake(epoch).unwrap();
                        let abort = AtomicBool::new(false);
                        moved.push(
                            filter(&mut comm, &hs, &step, &|_| true, &abort)
                                .unwrap()
                                .transfers,
                        );
                        cur = step.next;
                        keep.advance();
                    }
                    moved
                })
            })
            .collect();
        let moved: Vec<Vec<Vec<Transfer>>> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
        for (epoch, want) in expected.iter().enumerate() {
            assert!(!want.is_empty(), "epoch {epoch} moves something");
            let mut all: Vec<Transfer> = (moved.iter())
                .flat_map(|m| m[epoch].iter().copied())
                .collect();
            all.sort_unstable_by_key(|t| (t.from, t.to, t.sample));
            all.dedup();
            assert_eq!(&all, want, "epoch {epoch}");
            for r in 0..world as usize {
                for t in &moved[r][epoch] {
                    let other = if t.from as usize == r { t.to } else { t.from };
                    assert!(
                        moved[other as usize][epoch].contains(t),
                        "both halves of {t:?}"
                    );
                }
            }
        }
    }
}
