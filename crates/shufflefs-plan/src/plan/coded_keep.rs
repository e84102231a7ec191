//! A coded run whose cache does not fit the disk: every rank keeps a planned part
//! `K_r(t)` of its coded cache `C_r(t)`, and the coded exchange is planned over the kept sets.
//!
//! # Why kept sets, not a smaller alpha
//! A coded rank's disk peaks at `view ∪ next cache` (`exchange::coded::side`): a fresh share
//! is drawn every epoch and arrives while the current one is read. Even at the smallest
//! `alpha = 1/M` (cache = share) that is about `(2 - 1/M) x share`, so a disk smaller than
//! that cannot be helped by lowering alpha; and a disk between the two would only move the
//! problem. Keeping a planned part of the cache covers every size with one rule.
//!
//! # The rule (clairvoyant, like `plan::keep`)
//! The room is counted in *slots* of one sample (the largest size the mount knows, so the
//! kept bytes never pass the room when sizes are known; the store's gate checks the real
//! bytes anyway). During the exchange into `t+1` a rank holds `K(t)` (its side information;
//! the kept part of the view is in it) and receives `K(t+1) \ K(t)`, so the plan keeps
//! `|K(t) ∪ K(t+1)| <= slots`: `K(t+1)` may bring at most `slots - |K(t)|` samples the rank
//! does not hold. For every sample of `C(t+1)` the plan looks `horizon` epochs ahead while
//! the sample stays in this rank's coded cache: the first epoch it is in the share (its
//! *distance*, 0: a hit next epoch) and how often it is (its *hits*). A sample with no hit
//! ahead is not kept. The others are taken in the order (distance, already kept first, most
//! hits, id) while they fit, and a sample not kept before must be in the new share (only
//! the share's samples travel in packets; what the rank holds already costs nothing). At
//! epoch 0 nothing is held: the share's samples fill half the slots (the other half is the
//! room the first exchange brings samples into), after which the size settles by itself
//! (a large kept set leaves little room for new samples the next epoch, and the reverse).
//!
//! # What the exchange moves
//! The problem of each step is the coded one with caches `K(t)` and demands
//! `D(t+1) ∩ K(t+1)` ([`CodedPlacement::advance`]): the server sends only what will be
//! cached, packets decode only with samples that are on disk, and the rest of each share is
//! read from the source when it is opened. The server and every rank re-derive the kept
//! sets from `(seed, alpha, slots, epoch)` alone, like the caches. The exchange's client
//! and the server step every rank's (the packets need them); a store's gate needs only its
//! own rank's, so it tracks that one ([`CodedPlacement::tracking`]), and is handed each
//! next one by the client (`cache::admission::Admission::prepare`): publishing an epoch
//! steps nothing while readers wait.

use std::collections::{BTreeSet, VecDeque};

use super::SampleId;
use super::placement::RandomPlacement;

/// Epochs looked ahead for a sample's hits.
pub const CODED_HORIZON: usize = 4;

/// `window[i]` is `(share, coded cache)` of one rank at epoch `t + 1 + i` (the epoch the kept
/// set is for first), `prev` its kept set at `t`, `new_room` how many samples it may take
/// that `prev` lacks. Returns `K(t + 1)` (see the module docs).
pub(crate) fn choose(
    window: &[(&BTreeSet<SampleId>, &BTreeSet<SampleId>)],
    prev: &BTreeSet<SampleId>,
    slots: usize,
    new_room: usize,
) -> BTreeSet<SampleId> {
    let Some(&(share, cache)) = window.first() else {
        return BTreeSet::new();
    };
    let mut order: Vec<(usize, bool, std::cmp::Reverse<usize>, SampleId)> = (cache.iter())
        .filter(|s| prev.contains(s) || share.contains(s))
        .filter_map(|&s| {
            let (first, hits) = hits(window, s)?;
            Some((first, !prev.contains(&s), std::cmp::Reverse(hits), s))
        })
        .collect();
    order.sort_unstable();
    let (mut kept, mut new) = (BTreeSet::new(), 0);
    for (_, fresh, _, s) in order {
        if kept.len() == slots {
            break;
        }
        if fresh {
            if new == new_room {
                continue;
            }
            new += 1;
        }
        kept.insert(s);
    }
    kept
}

/// `(distance, hits)` of `s` over `window` while it stays in the cache; `None`: no hit.
fn hits(
    window: &[(&BTreeSet<SampleId>, &BTreeSet<SampleId>)],
    s: SampleId,
) -> Option<(usize, usize)> {
    let (mut first, mut n) = (None, 0);
    for (i, (share, cache)) in window.iter().enumerate() {
        if !cache.contains(&s) {
            break;
        }
        if share.contains(&s) {
            first.get_or_insert(i);
            n += 1;
        }
    }
    first.map(|f| (f, n))
}

/// The coded caches epoch after epoch, and, for a cache that does not fit, every rank's kept
/// set: what the coded exchange's server and clients step through.
#[derive(Clone, Debug)]
pub struct CodedPlacement {
    placement: RandomPlacement,
    kept: Option<KeptSets>,
}

/// Every rank's share and coded cache at one epoch.
type Epoch = (Vec<BTreeSet<SampleId>>, Vec<BTreeSet<SampleId>>);

/// Every rank's kept set at the placement's epoch `t`, and the placement's shares and caches
/// of epochs `t ..= t + horizon`; with `only`, of that rank alone (the others' sets empty:
/// a rank's kept set depends on its own shares and caches only, so a store's gate tracks
/// its own at a fraction of the memory and time).
#[derive(Clone, Debug)]
struct KeptSets {
    slots: usize,
    only: Option<usize>,
    sets: Vec<BTreeSet<SampleId>>,
    /// Front: epoch `t`.
    window: VecDeque<Epoch>,
    /// At the window's last epoch.
    ahead: RandomPlacement,
}

impl CodedPlacement {
    /// At epoch 0; `slots`: the kept sets' room in samples (`None`: the cache fits).
    pub(crate) fn new(placement: RandomPlacement, slots: Option<usize>) -> CodedPlacement {
        CodedPlacement::tracking(placement, slots, None)
    }

    /// [`CodedPlacement::new`] whose kept sets are `only` that rank's (the others empty).
    pub(crate) fn tracking(
        placement: RandomPlacement,
        slots: Option<usize>,
        only: Option<usize>,
    ) -> CodedPlacement {
        debug_assert_eq!(placement.epoch(), 0);
        let kept = slots.map(|slots| KeptSets::new(&placement, slots, only));
        CodedPlacement { placement, kept }
    }

    pub fn epoch(&self) -> u64 {
        self.placement.epoch()
    }

    /// The samples each rank holds as side information: its kept set, or its whole cache.
    pub fn caches(&self) -> &[BTreeSet<SampleId>] {
        match &self.kept {
            Some(k) => &k.sets,
            None => self.placement.caches(),
        }
    }

    /// The full coded caches (the placement's), kept sets or not.
    pub fn coded_caches(&self) -> &[BTreeSet<SampleId>] {
        self.placement.caches()
    }

    /// Epoch `epoch`'s balanced shares.
    pub fn shares(&self, epoch: u64) -> Vec<BTreeSet<SampleId>> {
        self.placement.shares(epoch)
    }

    /// Whether the caches are kept sets (the cache does not fit).
    pub fn is_partial(&self) -> bool {
        self.kept.is_some()
    }

    /// Rank `r`'s kept set at the next epoch, without stepping; `None` when the caches are
    /// whole (the next share is then what arrives).
    pub fn next_kept(&self, r: usize) -> Option<BTreeSet<SampleId>> {
        let k = self.kept.as_ref()?;
        let prev = &k.sets[r];
        let room = k.slots.saturating_sub(prev.len());
        Some(choose(&k.view(r, 1), prev, k.slots, room))
    }

    /// Moves to the next epoch: returns what each rank holds as side information and what it
    /// must be sent (its new share, or the kept part of it not held), then steps on.
    pub fn advance(&mut self) -> (Vec<BTreeSet<SampleId>>, Vec<BTreeSet<SampleId>>) {
        let (left, shares) = self.placement.advance();
        let Some(kept) = &mut self.kept else {
            return (left, shares);
        };
        let held = kept.sets.clone();
        kept.advance();
        let demands = (shares.iter().zip(&kept.sets))
            .map(|(share, k)| share.intersection(k).copied().collect())
            .collect();
        (held, demands)
    }

    /// Steps until the epoch is `epoch` (no-op if there or past it).
    pub fn advance_to(&mut self, epoch: u64) {
        while self.epoch() < epoch {
            self.advance();
        }
    }
}

impl KeptSets {
    fn new(placement: &RandomPlacement, slots: usize, only: Option<usize>) -> KeptSets {
        let mut ahead = placement.clone();
        let first = (placement.shares(0), placement.caches().to_vec());
        let mut window = VecDeque::from([only_of(first, only)]);
        for _ in 0..CODED_HORIZON {
            let (_, shares) = ahead.advance();
            window.push_back(only_of((shares, ahead.caches().to_vec()), only));
        }
        let mut k = KeptSets {
            slots,
            only,
            sets: Vec::new(),
            window,
            ahead,
        };
        let nodes = placement.caches().len();
        let none = BTreeSet::new();
        k.sets = (0..nodes)
            .map(|r| match k.tracks(r) {
                true => choose(&k.view(r, 0), &none, slots, slots / 2),
                false => BTreeSet::new(),
            })
            .collect();
        k
    }

    fn tracks(&self, r: usize) -> bool {
        self.only.is_none_or(|o| o == r)
    }

    /// Rank `r`'s `(share, cache)` of the window's epochs from index `from` on.
    fn view(&self, r: usize, from: usize) -> Vec<(&BTreeSet<SampleId>, &BTreeSet<SampleId>)> {
        (self.window.iter().skip(from))
            .map(|(shares, caches)| (&shares[r], &caches[r]))
            .collect()
    }

    fn advance(&mut self) {
        let sets: Vec<BTreeSet<SampleId>> = (self.sets.iter().enumerate())
            .map(|(r, prev)| {
                if !self.tracks(r) {
                    return BTreeSet::new();
                }
                let room = self.slots.saturating_sub(prev.len());
                choose(&self.view(r, 1), prev, self.slots, room)
            })
            .collect();
        self.sets = sets;
        self.window.pop_front();
        let (_, shares) = self.ahead.advance();
        let next = only_of((shares, self.ahead.caches().to_vec()), self.only);
        self.window.push_back(next);
    }
}

/// `epoch` with the sets of every rank but `only` emptied (all kept without `only`).
fn only_of(epoch: Epoch, only: Option<usize>) -> Epoch {
    let Some(o) = only else { return epoch };
    let keep = |sets: Vec<BTreeSet<SampleId>>| {
        (sets.into_iter().enumerate())
            .map(|(r, s)| if r == o { s } else { BTreeSet::new() })
            .collect()
    };
    (keep(epoch.0), keep(epoch.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[SampleId]) -> BTreeSet<SampleId> {
        v.iter().copied().collect()
    }

    /// The order: a hit next epoch first (what is held before what must travel), then
    /// later hits; nothing without a hit ahead; new samples only from the share and within
    /// their room.
    #[test]
    fn next_hits_first_held_before_new() {
        // Epoch t+1: share {1, 2, 3}, cache {1..=6}; t+2: share {4}, cache {1, 4, 5}.
        let (s1, c1) = (set(&[1, 2, 3]), set(&[1, 2, 3, 4, 5, 6]));
        let (s2, c2) = (set(&[4]), set(&[1, 4, 5]));
        let window = [(&s1, &c1), (&s2, &c2)];
        let prev = set(&[3, 4, 6]);
        assert_eq!(choose(&window, &prev, 10, 10), set(&[1, 2, 3, 4]));
        assert_eq!(choose(&window, &prev, 2, 10), set(&[1, 3]));
        assert_eq!(choose(&window, &prev, 3, 0), set(&[3, 4]));
        assert_eq!(choose(&window, &prev, 10, 1), set(&[1, 3, 4]));
    }

    /// Every step's held and received samples fit the slots, demands are kept parts of
    /// the shares, and two placements step alike.
    #[test]
    fn kept_sets_fit_their_slots() {
        let p = RandomPlacement::new(90, 3, 0.5, 5).unwrap();
        let mut a = CodedPlacement::new(p.clone(), Some(8));
        let mut b = CodedPlacement::new(p, Some(8));
        for _ in 0..6 {
            let next: Vec<_> = (0..3).map(|r| a.next_kept(r).unwrap()).collect();
            let (held, demands) = a.advance();
            assert_eq!(next, a.caches());
            assert_eq!(b.advance(), (held.clone(), demands.clone()));
            for r in 0..3 {
                let union: BTreeSet<_> = held[r].union(&a.caches()[r]).collect();
                assert!(union.len() <= 8, "{union:?}");
                assert!(a.caches()[r].is_subset(&a.coded_caches()[r]));
                let share = &a.shares(a.epoch())[r];
                assert!(demands[r].is_subset(share));
                assert_eq!(
                    demands[r],
                    share.intersection(&a.caches()[r]).copied().collect()
                );
            }
        }
    }

    /// A placement tracking one rank's kept set steps it exactly as the full one does.
    #[test]
    fn tracking_one_rank_keeps_its_set() {
        let p = RandomPlacement::new(90, 3, 0.5, 5).unwrap();
        let mut all = CodedPlacement::new(p.clone(), Some(8));
        let mut one = CodedPlacement::tracking(p, Some(8), Some(2));
        for _ in 0..8 {
            assert_eq!(one.caches()[2], all.caches()[2]);
            assert!(one.caches()[0].is_empty());
            assert_eq!(one.next_kept(2), all.next_kept(2));
            all.advance();
            one.advance();
        }
    }
}
