//! The plan: which rank owns which sample in every epoch.
//!
//! Pure and deterministic: no I/O, no clocks, no MPI. Every rank derives the same ownership
//! for any epoch from `(samples, world, fraction, seed)` alone (plus, under
//! `--exchange-scope node`, which host each rank is on), so no rank ever has to ask another
//! "what do you hold?" — the exchange (and a restart after a crash) only needs this.
//!
//! # Algorithm (Nguyen et al., "Why globally re-shuffle?", Section III-B, Algorithm 1)
//! Run on positions by [`local`]: each rank owns a fixed chunk of positions `0..N` (sizes
//! differ by at most one); epoch 0 deals a keyed permutation of the ids over them; each
//! epoch `e -> e+1`, with `k = floor(Q * min_share)` the same on every rank, rank `r` picks
//! a keyed random `k`-subset of its chunk in a random order, and for `i in 0..k` a keyed
//! permutation `σ_i` of the ranks sends its `i`-th pick to `σ_i(r)`, into the place that
//! rank vacated for slot `i`. Each rank receives exactly one sample per `i`; `σ_i(r) == r`
//! keeps the sample where it is, so about `Q * (M-1)/M` of a share moves.
//!
//! Every permutation is evaluated per index, so a rank computes its own part in O(k)
//! ([`Plan::own_unnamed`]: what arrives is named by its senders, [`unnamed`], or by a walk
//! back, [`Plan::own_step`]) and its share at any epoch by walking its positions back
//! ([`Plan::own_shares_at`]), with no other rank's share: no rank holds the job's plan.
//! An era after an elastic restart is walked back the same way, across its remap
//! ([`Plan::after`], [`local::Rechunk`]). [`Plan::step`] and [`Plan::shares_at`] compute
//! the whole job (tests, the coded plan, `elastic::ElasticPlan::shares_at`, the partial
//! cache's planner, equal shares).
//!
//! # Exchange scope
//! [`ExchangeScope::Node`] changes one thing: each `σ_i` permutes the ranks *within each
//! host* (a [`HostLayout`]) instead of all ranks. Every rank still sends and receives
//! exactly `k` and shares keep their sizes; but no sample ever leaves its host, so each
//! host's set of samples is the one epoch 0 dealt it, forever (the paper's local shuffling
//! at host granularity; within a host it is partial-local with `Q`). About `Q * (G-1)/G` of
//! a share moves on a host of `G` ranks; a host of one rank keeps its share. `k` stays
//! `floor(Q * min_share)` over all ranks: it is what keeps every rank sending as much as it
//! receives, whatever the hosts' sizes. Epoch 0 is the same in both scopes. Global scope
//! ignores hosts.
//!
//! # Why our own shuffle
//! `rand`'s `shuffle`/`gen_range` are allowed to change their output between releases; a cache
//! written by one build must plan identically under the next (resume after a crash), so the
//! Fisher–Yates and bounded-integer steps live here, on top of the ChaCha8 keystream, which is
//! fixed by its specification.

use std::sync::Arc;

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

use local::LocalPlan;

pub(crate) mod coded;
pub mod coded_keep;
pub mod elastic;
pub mod equal;
pub mod ids;
pub mod keep;
pub mod keep_local;
pub mod keyed;
pub mod local;
pub mod placement;
pub mod unnamed;

pub use coded::CodedShares;

/// Index of a sample in the manifest (samples sorted by class, then name).
pub type SampleId = u64;
/// An MPI rank.
pub type Rank = u32;

/// Inputs that fully determine the plan.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlanParams {
    pub samples: u64,
    pub world: u32,
    pub fraction: f64,
    pub seed: u64,
}

/// Which ranks a sample may move between (`--exchange-scope`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum ExchangeScope {
    /// Any rank to any rank (the paper's partial-local shuffling): the best shuffle.
    #[default]
    Global,
    /// Only between ranks on the same host, so nothing crosses the network; each host's set
    /// of samples is fixed at epoch 0 (local shuffling at host granularity).
    Node,
}

impl ExchangeScope {
    /// The name `--exchange-scope` takes (and the status and state file show).
    pub(crate) fn name(self) -> &'static str {
        match self {
            ExchangeScope::Global => "global",
            ExchangeScope::Node => "node",
        }
    }

    pub fn is_global(&self) -> bool {
        *self == ExchangeScope::Global
    }
}

impl std::fmt::Display for ExchangeScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which host each rank is on: `hosts()[r]` is rank `r`'s host index, numbered in order of
/// first appearance (as `Comm::hosts` gives them; other labels are renumbered, so only
/// which ranks share a host matters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostLayout {
    hosts: Vec<u32>,
    /// The ranks of each host, ascending; hosts in order of their lowest rank.
    groups: Vec<Vec<Rank>>,
}

impl HostLayout {
    /// The layout of ranks `0..hosts.len()`, rank `r` on host label `hosts[r]`.
    pub fn new(hosts: &[u32]) -> HostLayout {
        let mut labels: Vec<u32> = Vec::new();
        let mut groups: Vec<Vec<Rank>> = Vec::new();
        let mut indices = Vec::with_capacity(hosts.len());
        // A map would be O(M) instead of O(M * hosts); this runs once per start.
        for (r, label) in hosts.iter().enumerate() {
            let h = match labels.iter().position(|l| l == label) {
                Some(h) => h,
                None => {
                    labels.push(*label);
                    groups.push(Vec::new());
                    labels.len() - 1
                }
            };
            groups[h].push(r as Rank);
            indices.push(h as u32);
        }
        HostLayout {
            hosts: indices,
            groups,
        }
    }

    /// Host index of every rank, numbered by first appearance.
    #[cfg(test)]
    pub(crate) fn hosts(&self) -> &[u32] {
        &self.hosts
    }

    /// The ranks of each host, ascending, indexed by host.
    pub fn groups(&self) -> &[Vec<Rank>] {
        &self.groups
    }

    pub(crate) fn host_of(&self, rank: Rank) -> u32 {
        self.hosts[rank as usize]
    }

    /// Whether two ranks are on one host.
    pub fn same_host(&self, a: Rank, b: Rank) -> bool {
        self.host_of(a) == self.host_of(b)
    }

    /// For messages: `"2 hosts (ranks 0-1 | 2-3)"`.
    pub fn describe(&self) -> String {
        let groups: Vec<String> = self.groups.iter().map(|g| ranges(g)).collect();
        let n = groups.len();
        format!(
            "{n} host{} (ranks {})",
            if n == 1 { "" } else { "s" },
            groups.join(" | ")
        )
    }
}

/// `[0, 1, 2, 5, 7, 8]` as `"0-2,5,7-8"`.
fn ranges(ranks: &[Rank]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    out.join(",")
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("--fraction must be between 0 and 1, got {0}")]
    Fraction(f64),
    #[error("world size must be at least 1")]
    EmptyWorld,
    #[error("the host layout names {hosts} ranks, but the world has {world}")]
    Hosts { hosts: usize, world: u32 },
    #[error("--cache-fraction: {0}")]
    Coded(#[from] placement::PlacementError),
    #[error("invalid history of world sizes ({0})")]
    History(String),
}

/// Who owns what in one epoch. Each share is sorted by sample id, which (because ids are
/// sorted by class and name) also groups it by class in listing order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochShares {
    pub epoch: u64,
    /// Each rank's share, sorted by sample id. In a rank's own view ([`Plan::own_initial`],
    /// [`Plan::own_step`], [`Plan::own_shares_at`]) only its own is filled.
    pub shares: Vec<Vec<SampleId>>,
    /// The same shares by chunk offset, the order the partial-local plan steps them in
    /// ([`local`]); empty for a coded plan, which does not need it.
    pub slots: Vec<Vec<SampleId>>,
}

impl EpochShares {
    pub fn share(&self, rank: Rank) -> &[SampleId] {
        &self.shares[rank as usize]
    }

    /// Shares of `slots` (sorted copies of them).
    pub fn from_slots(epoch: u64, slots: Vec<Vec<SampleId>>) -> EpochShares {
        let shares = (slots.iter())
            .map(|s| {
                let mut share = s.clone();
                share.sort_unstable();
                share
            })
            .collect();
        EpochShares {
            epoch,
            shares,
            slots,
        }
    }

    /// `rank`'s own view of an epoch in a world of `world` ranks: its slots alone.
    fn own(epoch: u64, world: u32, rank: Rank, slots: Vec<SampleId>) -> EpochShares {
        let mut all = vec![Vec::new(); world as usize];
        all[rank as usize] = slots;
        EpochShares::from_slots(epoch, all)
    }

    /// [`EpochShares::own`] with the share already sorted (`share`: `slots`, sorted).
    fn own_sorted(
        epoch: u64,
        world: u32,
        rank: Rank,
        slots: Vec<SampleId>,
        share: Vec<SampleId>,
    ) -> EpochShares {
        let (mut all, mut shares) = (
            vec![Vec::new(); world as usize],
            vec![Vec::new(); world as usize],
        );
        all[rank as usize] = slots;
        shares[rank as usize] = share;
        EpochShares {
            epoch,
            shares,
            slots: all,
        }
    }
}

/// One sample moving between ranks when epoch `epoch` becomes `epoch + 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Transfer {
    pub sample: SampleId,
    pub from: Rank,
    pub to: Rank,
}

/// The result of advancing one epoch: the new ownership and the samples that changed owner.
#[derive(Clone, Debug)]
pub struct Step {
    pub next: EpochShares,
    /// Only real moves (`from != to`), sorted by `(from, to, sample)`.
    pub transfers: Vec<Transfer>,
}

/// Which plan this is: the variants exclude each other (a coded plan has no exchange
/// scope). Shared parts sit behind an `Arc`, so a clone of the plan stays cheap.
#[derive(Clone, Debug)]
pub(crate) enum PlanKind {
    /// Partial-local shuffling between any ranks.
    Global,
    /// Partial-local shuffling within each host of the layout (node scope).
    Node(Arc<HostLayout>),
    /// `--exchange coded`: a full reshuffle every epoch ([`coded`]).
    Coded(Arc<CodedShares>),
}

#[derive(Clone, Debug)]
pub struct Plan {
    params: PlanParams,
    kind: PlanKind,
    /// The partial-local plan's permutations (not used by a coded plan); after an elastic
    /// restart, chained to the eras before ([`LocalPlan::after`]).
    local: Arc<LocalPlan>,
}

impl Plan {
    /// The global-scope plan: samples move between any ranks.
    pub fn new(params: PlanParams) -> Result<Plan, PlanError> {
        if !(0.0..=1.0).contains(&params.fraction) || params.fraction.is_nan() {
            return Err(PlanError::Fraction(params.fraction));
        }
        if params.world == 0 {
            return Err(PlanError::EmptyWorld);
        }
        Ok(Plan {
            params,
            kind: PlanKind::Global,
            local: Arc::new(LocalPlan::new(local_params(&params), None)),
        })
    }

    /// The plan of a coded run: fresh random balanced shares every epoch, caches of `alpha`
    /// of the dataset (`params.fraction` is ignored).
    pub fn coded(params: PlanParams, alpha: f64) -> Result<Plan, PlanError> {
        let shares = CodedShares::new(params.samples, params.world, alpha, params.seed)?;
        let mut plan = Plan::new(PlanParams {
            fraction: 1.0,
            ..params
        })?;
        plan.kind = PlanKind::Coded(Arc::new(shares));
        Ok(plan)
    }

    /// This coded plan with kept sets of `slots` samples per rank (`coded_keep`: the cache
    /// does not fit the disk); any other plan unchanged.
    pub fn with_coded_slots(mut self, slots: Option<usize>) -> Plan {
        if let PlanKind::Coded(c) = &self.kind {
            self.kind = PlanKind::Coded(Arc::new(CodedShares::clone(c).with_slots(slots)));
        }
        self
    }

    /// The coded variant's shares and caches, if this is one.
    pub fn coded_shares(&self) -> Option<&CodedShares> {
        match &self.kind {
            PlanKind::Coded(c) => Some(c),
            _ => None,
        }
    }

    /// Samples `rank` keeps cached at `epoch` beyond its share: the retained samples of a
    /// coded run, none otherwise. Ascending.
    pub fn retained(&self, rank: Rank, epoch: u64) -> Vec<SampleId> {
        self.coded_shares()
            .map_or_else(Vec::new, |c| c.cache(rank, epoch))
    }

    /// The plan for `scope`. `hosts[r]` is rank `r`'s host (as `Comm::hosts` gives it): used
    /// by node scope only, where it must name every rank; global scope ignores it (pass `&[]`
    /// if you like) and is exactly `Plan::new(params)`.
    pub fn with_scope(
        params: PlanParams,
        scope: ExchangeScope,
        hosts: &[u32],
    ) -> Result<Plan, PlanError> {
        let mut plan = Plan::new(params)?;
        if scope == ExchangeScope::Node {
            if hosts.len() != params.world as usize {
                return Err(PlanError::Hosts {
                    hosts: hosts.len(),
                    world: params.world,
                });
            }
            let layout = Arc::new(HostLayout::new(hosts));
            plan.local = Arc::new(LocalPlan::new(local_params(&params), Some(layout.clone())));
            plan.kind = PlanKind::Node(layout);
        }
        Ok(plan)
    }

    pub fn params(&self) -> &PlanParams {
        &self.params
    }

    /// This plan as the era of an elastic job that starts at `epoch` after `previous`'s
    /// (global scope: the world changed, nothing else). A rank still walks its own share
    /// back, across the remap at `epoch` ([`local::Rechunk`]) into the eras before.
    pub(crate) fn after(mut self, epoch: u64, previous: &Plan) -> Plan {
        let local = LocalPlan::clone(&self.local).after(epoch, LocalPlan::clone(&previous.local));
        self.local = Arc::new(local);
        self
    }

    /// The exchange scope (a coded plan shows as global: samples go anywhere).
    pub fn scope(&self) -> ExchangeScope {
        match self.kind {
            PlanKind::Node(_) => ExchangeScope::Node,
            PlanKind::Global | PlanKind::Coded(_) => ExchangeScope::Global,
        }
    }

    /// The hosts the plan keeps moves within: `Some` exactly under node scope.
    pub fn layout(&self) -> Option<&HostLayout> {
        match &self.kind {
            PlanKind::Node(layout) => Some(layout),
            _ => None,
        }
    }

    /// Samples each rank sends (and receives) per epoch, moves to itself included.
    pub fn exchange_count(&self) -> usize {
        let min_share = self.params.samples / u64::from(self.params.world);
        (self.params.fraction * min_share as f64).floor() as usize
    }

    /// Epoch 0: a keyed permutation dealt into balanced contiguous chunks ([`local`]).
    pub fn initial(&self) -> EpochShares {
        if let PlanKind::Coded(c) = &self.kind {
            return c.shares(0);
        }
        let slots = (0..self.params.world)
            .map(|r| self.local.initial_slots(r))
            .collect();
        EpochShares::from_slots(0, slots)
    }

    /// Algorithm 1, for the whole job: ownership in `cur.epoch + 1` and the transfers that
    /// get there. O(N); a daemon steps its own share with [`Plan::own_step`].
    pub fn step(&self, cur: &EpochShares) -> Step {
        if let PlanKind::Coded(c) = &self.kind {
            return c.step(cur);
        }
        let all = self.local.step_all(cur.epoch, &cur.slots);
        let mut transfers: Vec<Transfer> = (all.moves.iter())
            .map(|&(sample, from, to)| Transfer { sample, from, to })
            .collect();
        transfers.sort_unstable_by_key(|t| (t.from, t.to, t.sample));
        Step {
            next: EpochShares::from_slots(cur.epoch + 1, all.next),
            transfers,
        }
    }

    /// Whether `rank` can plan alone ([`Plan::own_step`]): a partial-local plan, whose
    /// shares it walks back to epoch 0 (across elastic restarts too). A coded plan needs
    /// the whole job's shares.
    pub fn is_per_rank(&self) -> bool {
        !matches!(self.kind, PlanKind::Coded(_))
    }

    /// The first epoch of this world's era: 0, or the epoch an elastic restart (M -> M')
    /// resumed at. Epochs before it were planned for another number of ranks.
    pub fn era_start(&self) -> u64 {
        self.local.origin()
    }

    /// `rank`'s view of epoch 0 (the whole job's, for a plan that is not per rank). Of a
    /// plan resized by an elastic restart, only a view of its own era is one this plan
    /// steps on ([`Plan::era_start`]).
    pub fn own_initial(&self, rank: Rank) -> EpochShares {
        if !self.is_per_rank() {
            return self.initial();
        }
        let slots = self.local.initial_slots(rank);
        EpochShares::own(0, self.params.world, rank, slots)
    }

    /// `rank`'s view of `epoch`: its slots walked back to epoch 0, O(share · epoch), no
    /// other rank's share (the whole job's replay for a plan that is not per rank).
    pub fn own_shares_at(&self, rank: Rank, epoch: u64) -> EpochShares {
        if !self.is_per_rank() {
            return self.shares_at(epoch);
        }
        let slots = self.local.slots_at(epoch, rank, threads());
        EpochShares::own(epoch, self.params.world, rank, slots)
    }

    /// `rank`'s part of the step out of `cur` (its own view): its sends, its receives
    /// (named by walking their sources back, O(k · epoch): [`Plan::walked`]; a daemon asks
    /// its senders instead, [`unnamed`]), its next share. The whole job's step for a plan
    /// that is not per rank.
    pub fn own_step(&self, rank: Rank, cur: &EpochShares) -> Step {
        match self.is_per_rank() {
            true => self.own_walked(rank, cur),
            false => self.step(cur),
        }
    }

    /// `rank`'s view of `epoch` from its slots there (chunk order) as saved earlier
    /// (`cache::slots`), O(share); `None` for a plan that is not per rank or slots of
    /// another length than `rank`'s chunk.
    pub fn own_from_slots(
        &self,
        rank: Rank,
        epoch: u64,
        slots: Vec<SampleId>,
    ) -> Option<EpochShares> {
        let chunk = self.local.params().chunk(rank);
        let fits = rank < self.params.world
            && slots.len() as u64 == chunk.end - chunk.start
            && slots.iter().all(|&id| id < self.params.samples);
        (self.is_per_rank() && fits)
            .then(|| EpochShares::own(epoch, self.params.world, rank, slots))
    }

    /// A digest of what shapes the plan's history beyond its [`PlanParams`]: the kind, the
    /// host layout, the world sizes of its eras. Saved with a rank's slots, so slots saved
    /// under another layout are not taken for this plan's.
    pub fn fingerprint(&self) -> u64 {
        let eras = self.local.eras();
        let mut words: Vec<u64> = (eras.iter())
            .flat_map(|&(e, w)| [e, u64::from(w)])
            .collect();
        match &self.kind {
            PlanKind::Global => words.push(0),
            PlanKind::Node(layout) => {
                words.push(1);
                words.extend(layout.hosts.iter().map(|&h| u64::from(h)));
            }
            PlanKind::Coded(_) => words.push(2),
        }
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        u64::from(crc32c::crc32c(&bytes)) | (words.len() as u64) << 32
    }

    /// Ownership at `epoch`, computed by stepping from epoch 0.
    pub fn shares_at(&self, epoch: u64) -> EpochShares {
        let mut cur = self.initial();
        while cur.epoch < epoch {
            cur = self.step(&cur).next;
        }
        cur
    }
}

/// The per-rank plan's parameters of `params`.
fn local_params(params: &PlanParams) -> local::LocalParams {
    local::LocalParams {
        samples: params.samples,
        world: params.world,
        fraction: params.fraction,
        seed: params.seed,
    }
}

/// Threads a rank may use to walk its share back (resume, naming arrivals).
fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// A ChaCha8 stream keyed by `(seed, domain, a, b)`: independent for every distinct tuple.
pub fn stream(seed: u64, domain: u64, a: u64, b: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    for (chunk, word) in key.chunks_exact_mut(8).zip([seed, domain, a, b]) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    ChaCha8Rng::from_seed(key)
}

/// Uniform integer in `0..n` (n > 0), unbiased (Lemire's multiply-and-reject).
fn below(rng: &mut ChaCha8Rng, n: u64) -> u64 {
    let threshold = n.wrapping_neg() % n;
    loop {
        let wide = u128::from(rng.next_u64()) * u128::from(n);
        if (wide as u64) >= threshold {
            return (wide >> 64) as u64;
        }
    }
}

/// Fisher–Yates shuffle of the whole slice.
pub fn shuffle<T>(items: &mut [T], rng: &mut ChaCha8Rng) {
    let len = items.len();
    partial_shuffle(items, len, rng);
}

/// Puts a uniformly random `k`-subset, in random order, at the front of `items`.
pub(crate) fn partial_shuffle<T>(items: &mut [T], k: usize, rng: &mut ChaCha8Rng) {
    let len = items.len();
    for i in 0..k.min(len.saturating_sub(1)) {
        let j = i + below(rng, (len - i) as u64) as usize;
        items.swap(i, j);
    }
}

/// Samples of `share` whose ids fall in `range`, using that both are sorted.
pub fn share_in_range(share: &[SampleId], range: std::ops::Range<SampleId>) -> &[SampleId] {
    let lo = share.partition_point(|&s| s < range.start);
    let hi = share.partition_point(|&s| s < range.end);
    &share[lo..hi]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan of `samples` on `world` ranks (also for the sibling modules' tests).
    pub(super) fn plan(samples: u64, world: u32, fraction: f64, seed: u64) -> Plan {
        Plan::new(PlanParams {
            samples,
            world,
            fraction,
            seed,
        })
        .unwrap()
    }

    #[test]
    fn fraction_is_validated() {
        let p = PlanParams {
            samples: 1,
            world: 1,
            fraction: 1.5,
            seed: 0,
        };
        assert_eq!(Plan::new(p).unwrap_err(), PlanError::Fraction(1.5));
        let p = PlanParams {
            fraction: f64::NAN,
            ..p
        };
        assert!(Plan::new(p).is_err());
        let p = PlanParams {
            fraction: 0.5,
            world: 0,
            ..p
        };
        assert_eq!(Plan::new(p).unwrap_err(), PlanError::EmptyWorld);
    }

    /// Past 2^32 samples (5·10^9 could not be named with 32-bit ids): a rank's
    /// share, its step and a walk back name ids above `u32::MAX`, all below N, and the
    /// step keeps the share's length.
    #[test]
    fn ids_past_32_bits_are_named_and_stepped() {
        let n = 5_000_000_000;
        let world = 1 << 20;
        let p = plan(n, world, 0.3, 7);
        let rank = world - 1;
        let e0 = p.own_initial(rank);
        let share = e0.share(rank);
        assert!(share.iter().all(|&id| id < n));
        assert!(share.iter().any(|&id| id > u64::from(u32::MAX)));
        let step = p.own_step(rank, &e0);
        let next = step.next.share(rank);
        assert_eq!(next.len(), share.len());
        assert!(next.iter().all(|&id| id < n));
        let moved = step.transfers.iter().filter(|t| t.to == rank);
        assert!(moved.clone().any(|t| t.sample > u64::from(u32::MAX)));
        assert!(moved.clone().all(|t| next.binary_search(&t.sample).is_ok()));
        assert_eq!(p.own_shares_at(rank, 1).share(rank), next);
    }

    #[test]
    fn known_answer_pins_the_stream() {
        // Changing this output breaks resume of existing caches: bump the cache format instead.
        let p = plan(10, 2, 0.5, 42);
        let e0 = p.initial();
        let e1 = p.step(&e0).next;
        assert_eq!(
            e0.shares.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![5, 5]
        );
        let snapshot = format!("{:?} {:?}", e0.shares, e1.shares);
        assert_eq!(snapshot, KNOWN_ANSWER, "plan output changed");
    }
    const KNOWN_ANSWER: &str =
        "[[1, 4, 6, 7, 9], [0, 2, 3, 5, 8]] [[0, 1, 6, 7, 9], [2, 3, 4, 5, 8]]";

    #[test]
    fn known_answer_pins_the_node_scope_stream() {
        // As above: node-scope caches resume by recomputing this.
        let params = plan(12, 4, 1.0, 42).params;
        let p = Plan::with_scope(params, ExchangeScope::Node, &[0, 0, 1, 1]).unwrap();
        let e1 = p.step(&p.initial()).next;
        let e2 = p.step(&e1).next;
        let snapshot = format!("{:?} {:?}", e1.shares, e2.shares);
        assert_eq!(
            snapshot, KNOWN_ANSWER_NODE,
            "node-scope plan output changed"
        );
    }
    const KNOWN_ANSWER_NODE: &str = "[[4, 9, 10], [1, 3, 6], [0, 7, 11], [2, 5, 8]] \
         [[1, 9, 10], [3, 4, 6], [0, 8, 11], [2, 5, 7]]";

    #[test]
    fn node_scope_on_one_host_is_the_global_plan() {
        let global = plan(50, 5, 0.6, 9);
        let node = Plan::with_scope(global.params, ExchangeScope::Node, &[3; 5]).unwrap();
        assert_eq!(node.scope(), ExchangeScope::Node);
        assert_eq!(node.shares_at(4), global.shares_at(4));
    }

    #[test]
    fn global_scope_ignores_hosts() {
        let global = plan(50, 4, 0.6, 9);
        for hosts in [&[][..], &[0, 1, 2, 3], &[0, 0, 1]] {
            let p = Plan::with_scope(global.params, ExchangeScope::Global, hosts).unwrap();
            assert_eq!(p.scope(), ExchangeScope::Global);
            assert!(p.layout().is_none());
            assert_eq!(p.shares_at(3), global.shares_at(3));
        }
    }

    #[test]
    fn node_scope_needs_a_host_per_rank() {
        let params = plan(10, 3, 0.5, 1).params;
        assert_eq!(
            Plan::with_scope(params, ExchangeScope::Node, &[0, 0]).unwrap_err(),
            PlanError::Hosts { hosts: 2, world: 3 }
        );
    }

    #[test]
    fn host_labels_are_renumbered_by_first_appearance() {
        let a = HostLayout::new(&[7, 7, 3, 9, 3]);
        assert_eq!(a.hosts(), [0, 0, 1, 2, 1]);
        assert_eq!(a.groups(), [vec![0, 1], vec![2, 4], vec![3]]);
        assert_eq!(a, HostLayout::new(&[0, 0, 1, 2, 1]));
        assert_eq!(a.describe(), "3 hosts (ranks 0-1 | 2,4 | 3)");
        assert_eq!(HostLayout::new(&[0]).describe(), "1 host (ranks 0)");
        assert!(a.same_host(2, 4) && !a.same_host(1, 2));
    }

    #[test]
    fn one_rank_full_fraction_keeps_everything() {
        let p = plan(7, 1, 1.0, 3);
        let s = p.step(&p.initial());
        assert!(s.transfers.is_empty());
        assert_eq!(s.next.shares[0], (0..7).collect::<Vec<_>>());
    }

    #[test]
    fn below_is_in_range() {
        let mut rng = stream(1, 2, 3, 4);
        for n in [1u64, 2, 3, 7, 1 << 40, u64::MAX] {
            for _ in 0..100 {
                assert!(below(&mut rng, n) < n);
            }
        }
    }
}
