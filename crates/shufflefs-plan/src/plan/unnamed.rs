//! A rank's step before it knows what arrives, and the two ways to name the arrivals.
//!
//! A rank computes its own part of a step in O(k) ([`local::LocalPlan::step`]): which of its
//! samples it sends where, and who sends into which of its slots. What it cannot know in
//! O(k) is *which sample* each arrival is: that is whatever sits at the sender's position,
//! which only the sender holds. Walking that position back to epoch 0 names it without
//! the sender ([`Plan::walked`]) but costs O(k · epoch) (3.2 CPU s at N = 5·10⁹, M = 4,096,
//! epoch 90); the sender can simply say so ([`Unnamed::told`]: 8 bytes an arrival, in slot
//! order, one message per peer the step moves samples to). A receiver checks what it heard
//! ([`Unnamed::named`]) and falls back to the walk when a peer cannot tell it, so both ways
//! give the same step.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::local::{GlobalId, LocalStep};
use super::{EpochShares, Plan, Rank, SampleId, Step, Transfer};

/// `rank`'s part of the step out of an epoch, its arrivals not named yet.
#[derive(Clone, Debug)]
pub struct Unnamed {
    rank: Rank,
    world: u32,
    samples: u64,
    /// The epoch stepped out of (this rank's own view).
    cur: Arc<EpochShares>,
    step: LocalStep,
}

/// Why the ids a peer told cannot be this step's arrivals: it plans another job (another
/// build, seed or history), or its cache's saved share is not the one the plan gave it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NamingError {
    #[error("rank {from} named {told} samples sent to this rank, the plan moves {planned}")]
    Count {
        from: Rank,
        told: usize,
        planned: usize,
    },
    #[error("rank {from} named sample {id}, past the dataset's {samples} samples")]
    Range {
        from: Rank,
        id: SampleId,
        samples: u64,
    },
    #[error("the samples named arriving would put sample {id} twice into this rank's share")]
    Twice { id: SampleId },
}

impl Unnamed {
    /// The epoch this step leads into.
    pub fn target(&self) -> u64 {
        self.step.epoch + 1
    }

    /// The ranks this step moves samples with, either way, ascending.
    pub fn peers(&self) -> Vec<Rank> {
        let mut peers: Vec<Rank> = (self.step.sends.iter().map(|s| s.to))
            .chain(self.step.receives.iter().map(|r| r.from))
            .collect();
        peers.sort_unstable();
        peers.dedup();
        peers
    }

    /// What this rank tells each receiver: the ids it sends there, in slot order.
    pub fn told(&self) -> BTreeMap<Rank, Vec<SampleId>> {
        let mut told: BTreeMap<Rank, Vec<SampleId>> = BTreeMap::new();
        for s in &self.step.sends {
            told.entry(s.to).or_default().push(s.sample);
        }
        told
    }

    /// How many ids each sender tells this rank.
    pub fn expected(&self) -> BTreeMap<Rank, usize> {
        let mut expected = BTreeMap::new();
        for r in &self.step.receives {
            *expected.entry(r.from).or_default() += 1;
        }
        expected
    }

    /// The step, from what each sender told (`told[from]`: its ids sent here, in slot
    /// order). Refused if a list does not fit the plan: a wrong count, an id past the
    /// dataset, or a sample arriving that this rank's next share would hold twice.
    pub fn named(&self, told: &BTreeMap<Rank, Vec<SampleId>>) -> Result<Step, NamingError> {
        let mut at: BTreeMap<Rank, usize> = BTreeMap::new();
        let mut arrived = Vec::with_capacity(self.step.receives.len());
        for (from, planned) in self.expected() {
            let got = told.get(&from).map_or(0, Vec::len);
            if got != planned {
                return Err(NamingError::Count {
                    from,
                    told: got,
                    planned,
                });
            }
        }
        for r in &self.step.receives {
            let i = at.entry(r.from).or_default();
            let id = told[&r.from][*i];
            *i += 1;
            if id >= self.samples {
                let (from, samples) = (r.from, self.samples);
                return Err(NamingError::Range { from, id, samples });
            }
            arrived.push(id);
        }
        let step = self.with_arrivals(&arrived);
        let share = step.next.share(self.rank);
        match share.windows(2).find(|w| w[0] == w[1]) {
            Some(w) => Err(NamingError::Twice { id: w[0] }),
            None => Ok(step),
        }
    }

    fn with_arrivals(&self, arrived: &[GlobalId]) -> Step {
        arrivals_step((self.rank, self.world), &self.cur, &self.step, arrived)
    }
}

/// `rank`'s `step` out of `cur` (in a world of `world` ranks) with `arrived[j]` the sample
/// of the `j`-th receive (slot order). The next share is the current one less the sends
/// plus the arrivals, merged in order: O(share + k log k), where sorting it would be
/// O(share log share).
fn arrivals_step(
    (rank, world): (Rank, u32),
    cur: &EpochShares,
    step: &LocalStep,
    arrived: &[GlobalId],
) -> Step {
    let next = step.next_slots(&cur.slots[rank as usize], arrived);
    let mut sent: Vec<SampleId> = step.sends.iter().map(|s| s.sample).collect();
    sent.sort_unstable();
    let mut came = arrived.to_vec();
    came.sort_unstable();
    let share = merged(cur.share(rank), &sent, &came);
    let mut transfers: Vec<Transfer> = (step.sends.iter())
        .map(|s| Transfer {
            sample: s.sample,
            from: rank,
            to: s.to,
        })
        .chain(step.receives.iter().zip(arrived).map(|(r, &id)| Transfer {
            sample: id,
            from: r.from,
            to: rank,
        }))
        .collect();
    transfers.sort_unstable_by_key(|t| (t.from, t.to, t.sample));
    Step {
        next: EpochShares::own_sorted(step.epoch + 1, world, rank, next, share),
        transfers,
    }
}

/// `share` less `sent` (a sorted subset of it) plus `came` (sorted), in order; a sample in
/// both `share` (kept) and `came` shows twice.
fn merged(share: &[SampleId], sent: &[SampleId], came: &[SampleId]) -> Vec<SampleId> {
    let mut out = Vec::with_capacity(share.len() - sent.len() + came.len());
    let (mut s, mut c) = (0, 0);
    for &id in share {
        if sent.get(s) == Some(&id) {
            s += 1;
            continue;
        }
        while c < came.len() && came[c] <= id {
            out.push(came[c]);
            c += 1;
        }
        out.push(id);
    }
    out.extend_from_slice(&came[c..]);
    out
}

impl Plan {
    /// `rank`'s part of the step out of `cur` (its own view), its arrivals not named: O(k).
    /// `None` for a plan that is not per rank (coded: [`Plan::step`] names everything).
    pub fn own_unnamed(&self, rank: Rank, cur: &Arc<EpochShares>) -> Option<Unnamed> {
        if !self.is_per_rank() {
            return None;
        }
        let step = self.local.step(cur.epoch, rank, &cur.slots[rank as usize]);
        Some(Unnamed {
            rank,
            world: self.params.world,
            samples: self.params.samples,
            cur: cur.clone(),
            step,
        })
    }

    /// `unnamed` with its arrivals named by walking their senders' positions back to
    /// epoch 0: O(k · epoch), no peer asked.
    pub fn walked(&self, unnamed: &Unnamed) -> Step {
        let arrived: Vec<GlobalId> = (self.walk_back(&unnamed.step, |_| true).into_iter())
            .map(|(_, id)| id)
            .collect();
        unnamed.with_arrivals(&arrived)
    }

    /// [`Plan::walked`] for `rank`'s step out of `cur`, without holding `cur` (no copy of
    /// it): what [`Plan::own_step`] runs.
    pub(super) fn own_walked(&self, rank: Rank, cur: &EpochShares) -> Step {
        let step = self.local.step(cur.epoch, rank, &cur.slots[rank as usize]);
        let arrived: Vec<GlobalId> = (self.walk_back(&step, |_| true).into_iter())
            .map(|(_, id)| id)
            .collect();
        arrivals_step((rank, self.params.world), cur, &step, &arrived)
    }

    /// What the senders `silent` accepts would tell `unnamed`'s rank (their ids sent
    /// there, in slot order), named by walking back: for peers left out of the round.
    /// O(their arrivals · epoch).
    pub fn walked_lists(
        &self,
        unnamed: &Unnamed,
        silent: impl Fn(Rank) -> bool,
    ) -> BTreeMap<Rank, Vec<SampleId>> {
        let mut lists: BTreeMap<Rank, Vec<SampleId>> = BTreeMap::new();
        for (from, id) in self.walk_back(&unnamed.step, silent) {
            lists.entry(from).or_default().push(id);
        }
        lists
    }

    /// The senders and ids of `step`'s receives from the ranks `from` accepts, in slot
    /// order, each named by walking its sender's position back to epoch 0.
    fn walk_back(&self, step: &LocalStep, from: impl Fn(Rank) -> bool) -> Vec<(Rank, GlobalId)> {
        let epoch = step.epoch;
        let picked: Vec<_> = step.receives.iter().filter(|r| from(r.from)).collect();
        let sources: Vec<u64> = picked.iter().map(|r| self.local.source(epoch, r)).collect();
        let ids = self.local.ids_at(epoch, &sources, super::threads());
        picked.iter().map(|r| r.from).zip(ids).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(samples: u64, world: u32) -> Plan {
        crate::plan::tests::plan(samples, world, 0.5, 7)
    }

    /// Every rank's step named from what its senders told equals the walked one, epoch
    /// after epoch; and each rank's next share is the whole job's.
    #[test]
    fn told_names_what_the_walk_names() {
        let (n, m) = (1_003, 5);
        let p = plan(n, m);
        let mut own: Vec<Arc<EpochShares>> = (0..m).map(|r| Arc::new(p.own_initial(r))).collect();
        let mut whole = p.initial();
        for _ in 0..6 {
            let unnamed: Vec<Unnamed> = (0..m)
                .map(|r| p.own_unnamed(r, &own[r as usize]).unwrap())
                .collect();
            let told: Vec<_> = unnamed.iter().map(Unnamed::told).collect();
            whole = p.step(&whole).next;
            for (r, u) in unnamed.iter().enumerate() {
                let heard: BTreeMap<Rank, Vec<SampleId>> = (told.iter().enumerate())
                    .filter_map(|(q, t)| Some((q as Rank, t.get(&(r as Rank))?.clone())))
                    .collect();
                let named = u.named(&heard).unwrap();
                let walked = p.walked(u);
                assert_eq!(named.next, walked.next);
                assert_eq!(named.transfers, walked.transfers);
                assert_eq!(named.next.share(r as Rank), whole.share(r as Rank));
                own[r] = Arc::new(named.next);
            }
        }
    }

    /// Lists from some senders and the walk's for the others name the same step.
    #[test]
    fn lists_walked_for_silent_senders_complete_the_told_ones() {
        let p = plan(600, 4);
        let cur = Arc::new(p.own_initial(2));
        let u = p.own_unnamed(2, &cur).unwrap();
        let mut heard = p.walked_lists(&u, |q| q != 0);
        assert!(
            !heard.contains_key(&0) && heard.len() == 2,
            "{:?}",
            heard.keys()
        );
        let told = Arc::new(p.own_initial(0));
        let from_0 = p.own_unnamed(0, &told).unwrap().told().remove(&2).unwrap();
        heard.insert(0, from_0);
        assert_eq!(u.named(&heard).unwrap().next, p.walked(&u).next);
    }

    /// A list that does not fit the plan is refused, naming the peer and what is wrong.
    #[test]
    fn a_wrong_list_is_refused() {
        let p = plan(400, 4);
        let cur = Arc::new(p.own_initial(1));
        let u = p.own_unnamed(1, &cur).unwrap();
        let walked = p.walked(&u);
        let mut heard: BTreeMap<Rank, Vec<SampleId>> = BTreeMap::new();
        for t in walked.transfers.iter().filter(|t| t.to == 1) {
            heard.entry(t.from).or_default().push(t.sample);
        }
        // The walk's transfers are in sample order; a sender tells them in slot order.
        for (from, ids) in heard.iter_mut() {
            let senders = Arc::new(p.own_initial(*from));
            let told = p.own_unnamed(*from, &senders).unwrap().told();
            *ids = told[&1].clone();
        }
        assert_eq!(u.named(&heard).unwrap().next, walked.next);
        let from = *heard.keys().next().unwrap();
        let mut short = heard.clone();
        short.get_mut(&from).unwrap().pop();
        assert!(matches!(u.named(&short), Err(NamingError::Count { .. })));
        let mut past = heard.clone();
        past.get_mut(&from).unwrap()[0] = 400;
        assert!(matches!(
            u.named(&past),
            Err(NamingError::Range { id: 400, .. })
        ));
        // A sample this rank keeps, told as arriving too.
        let arriving: Vec<SampleId> = heard.values().flatten().copied().collect();
        let stays = (walked.next.share(1).iter())
            .find(|id| !arriving.contains(id))
            .unwrap();
        let mut twice = heard.clone();
        twice.get_mut(&from).unwrap()[0] = *stays;
        let e = u.named(&twice).unwrap_err();
        assert!(matches!(e, NamingError::Twice { .. }), "{e}");
    }
}
