//! Seeded random caches and shares of coded shuffling: the plan variant `plan::coded`, the
//! calculator and the property tests.
//!
//! Model (the paper's Section 2, and the cache rule we state):
//! - `q` samples, `n` nodes, each node caches `s = floor(alpha * q)` samples, `s` at least
//!   the largest share `ceil(q / n)`.
//! - Every epoch each node gets a fresh uniformly random balanced share: a seeded
//!   permutation of all samples dealt into `n` contiguous chunks (sizes differ by at most one).
//! - Epoch 0's cache is the node's share plus `s - |D_i|` samples drawn uniformly from the
//!   rest.
//! - **Update rule.** When epoch `t + 1` starts, node `i` receives `D_i^{t+1} \ C_i^t`; its new
//!   cache `C_i^{t+1}` is `D_i^{t+1}` plus `s - |D_i^{t+1}|` samples retained from
//!   `C_i^t \ D_i^{t+1}`, drawn uniformly. The old cache always has enough to retain, since
//!   it holds `s` samples of which at most `|D_i^{t+1}|` are in the new share.
//!
//! So a cache always holds the current share, and a sample a node needs is cached by its
//! previous owner and by each other node roughly with probability
//! `p = (s - q/n) / (q - q/n)`, the regime of Theorem 2.
//!
//! Randomness is the project's ChaCha8 stream keyed by `(seed, domain, epoch, node)` with
//! its own domain tags, and the project's own Fisher–Yates ([`crate::plan`] explains why).
//!
//! It lives in `plan`, not `coded`, because it is ownership (who holds and who is assigned
//! which sample each epoch) and the plan holds it: `coded` builds its per-epoch problem from
//! it ([`coded::next_instance`](crate::coded::next_instance)) and imports `plan`, never the
//! other way round.

use std::collections::BTreeSet;

use super::{SampleId, partial_shuffle, shuffle, stream};

/// At most this many compute nodes: a set of nodes is a `u64` bit mask (`coded::index`).
pub const MAX_NODES: usize = 64;

const DOMAIN_SHARES: u64 = 0xC0DE_0001;
const DOMAIN_EXTRA: u64 = 0xC0DE_0002;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlacementError {
    #[error("{nodes} nodes: between 1 and {} are supported", MAX_NODES)]
    Nodes { nodes: usize },
    #[error(
        "a cache of {cache} samples (alpha = {alpha} of {samples} samples) cannot hold a share of {share} ({nodes} ranks): alpha must be at least 1/{nodes}, and a dataset smaller than expected may be the index an earlier source left in the cache (--reset-cache rebuilds it)"
    )]
    CacheTooSmall {
        alpha: f64,
        samples: u64,
        nodes: usize,
        cache: usize,
        share: usize,
    },
    #[error("alpha = {0} is not in (0, 1]")]
    Alpha(f64),
    #[error(
        "{0} samples: a coded run holds at most 4294967295 (its packets name samples in 32 bits); use --exchange partial (the default) for more"
    )]
    Samples(u64),
}

/// The evolving caches of `n` nodes over epochs.
#[derive(Clone, Debug)]
pub struct RandomPlacement {
    samples: u64,
    nodes: usize,
    cache_size: usize,
    seed: u64,
    epoch: u64,
    caches: Vec<BTreeSet<SampleId>>,
}

impl RandomPlacement {
    pub fn new(
        samples: u64,
        nodes: usize,
        alpha: f64,
        seed: u64,
    ) -> Result<RandomPlacement, PlacementError> {
        if nodes == 0 || nodes > MAX_NODES {
            return Err(PlacementError::Nodes { nodes });
        }
        if !(alpha > 0.0 && alpha <= 1.0) {
            return Err(PlacementError::Alpha(alpha));
        }
        if samples > u64::from(u32::MAX) {
            return Err(PlacementError::Samples(samples));
        }
        let cache_size = (alpha * samples as f64).floor() as usize;
        let share = (samples as usize).div_ceil(nodes);
        if cache_size < share {
            return Err(PlacementError::CacheTooSmall {
                alpha,
                samples,
                nodes,
                cache: cache_size,
                share,
            });
        }
        let mut p = RandomPlacement {
            samples,
            nodes,
            cache_size,
            seed,
            epoch: 0,
            caches: Vec::new(),
        };
        let shares = p.shares(0);
        p.caches = shares
            .into_iter()
            .enumerate()
            .map(|(node, share)| {
                let mut rest: Vec<SampleId> = (0..samples).filter(|s| !share.contains(s)).collect();
                let extra = cache_size - share.len();
                partial_shuffle(
                    &mut rest,
                    extra,
                    &mut stream(seed, DOMAIN_EXTRA, 0, node as u64),
                );
                share
                    .into_iter()
                    .chain(rest.into_iter().take(extra))
                    .collect()
            })
            .collect();
        Ok(p)
    }

    /// Samples each cache holds, `s`.
    pub fn cache_size(&self) -> usize {
        self.cache_size
    }

    /// The epoch whose caches [`caches`](Self::caches) holds (the next instance moves out
    /// of it).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Every node's cache `C_i` at `epoch`.
    pub fn caches(&self) -> &[BTreeSet<SampleId>] {
        &self.caches
    }

    /// Applies the update rule until the caches are those of `epoch` (no-op if already
    /// there or past it): what a restart at `epoch` re-derives.
    pub fn advance_to(&mut self, epoch: u64) {
        while self.epoch < epoch {
            self.advance();
        }
    }

    /// Epoch `epoch`'s balanced shares (a pure function of the seed and `epoch`).
    pub fn shares(&self, epoch: u64) -> Vec<BTreeSet<SampleId>> {
        let mut perm: Vec<SampleId> = (0..self.samples).collect();
        shuffle(&mut perm, &mut stream(self.seed, DOMAIN_SHARES, epoch, 0));
        let (q, n) = (self.samples as usize, self.nodes);
        (0..n)
            .map(|i| perm[i * q / n..(i + 1) * q / n].iter().copied().collect())
            .collect()
    }

    /// Moves to the next epoch: returns the caches it leaves and the shares it enters (the
    /// problem of moving from one to the other, `coded::next_instance`), then applies the
    /// update rule so the following call moves to the epoch after.
    pub(crate) fn advance(&mut self) -> (Vec<BTreeSet<SampleId>>, Vec<BTreeSet<SampleId>>) {
        self.epoch += 1;
        let demands = self.shares(self.epoch);
        let left = self.caches.clone();
        for (node, (cache, share)) in self.caches.iter_mut().zip(demands.clone()).enumerate() {
            let mut old: Vec<SampleId> = cache.difference(&share).copied().collect();
            let keep = self.cache_size - share.len();
            partial_shuffle(
                &mut old,
                keep,
                &mut stream(self.seed, DOMAIN_EXTRA, self.epoch, node as u64),
            );
            *cache = share
                .into_iter()
                .chain(old.into_iter().take(keep))
                .collect();
        }
        (left, demands)
    }
}
